// The "kivi" KV quantizer (docs/quantizers.md): KIVI's K per channel in groups of g tokens, V per token in groups of g
// channels, min-offset grids; the n_b most recent tokens (and a last partial group) in fp16.
#include "qattn/reference/kv_quant.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "kv_files.h"
#include "qattn/reference/quant.h"

namespace qattn::ref {
namespace {

using kv_files::check_heads;
using kv_files::round_fp16;

class KiviKv final : public KvQuantizer {
 public:
  explicit KiviKv(const ParamMap& p)
      : bits_(static_cast<int>(p.integer("bits"))), group_(p.integer("g")), residual_(p.integer("nb")) {}
  KvQuantized apply(const std::vector<MatrixView>& k, const std::vector<MatrixView>& v) const override {
    check_heads(k, v);
    const QuantGrid grid = QuantGrid::unsigned_bits(bits_, QuantMode::min_offset);
    KvQuantized out;
    for (std::size_t h = 0; h < k.size(); ++h) {
      const Eigen::Index L = k[h].rows();
      // Whole groups of g tokens older than the n_b most recent are quantized; the rest stays in fp16.
      const Eigen::Index nq = L > residual_ ? (L - residual_) / group_ * group_ : 0;
      RowMatrixXd kh = round_fp16(k[h]), vh = round_fp16(v[h]);
      double kb = 16 * static_cast<double>(L - nq) * k[h].cols(), vb = 16 * static_cast<double>(L - nq) * v[h].cols();
      if (nq > 0) {
        const QuantizedMatrix qk = quantize(k[h].topRows(nq), grid, Tiling{group_, 1});  // per channel, g tokens
        const QuantizedMatrix qv = quantize(v[h].topRows(nq), grid, Tiling{1, group_});  // per token, g channels
        kh.topRows(nq) = qk.dequantize();
        vh.topRows(nq) = qv.dequantize();
        kb += bits_per_element(qk, bits_) * static_cast<double>(qk.codes.size());
        vb += bits_per_element(qv, bits_) * static_cast<double>(qv.codes.size());
      }
      out.k_bits += kb / static_cast<double>(k[h].size()) / k.size();
      out.v_bits += vb / static_cast<double>(v[h].size()) / k.size();
      out.k.push_back(std::move(kh));
      out.v.push_back(std::move(vh));
    }
    return out;
  }

 private:
  int bits_;
  Eigen::Index group_, residual_;
};

}  // namespace

void register_kivi_kv(KvRegistry& r) {
  r.add({{"kivi", "KIVI: K per channel in groups of g tokens, V per token in groups of g channels, min-offset grids; "
                  "the n_b most recent tokens (and a last partial group) stay in fp16",
          {int_param("bits", "2", "code bits", 1, 8), int_param("g", "32", "group size G", 1, 1 << 20),
           int_param("nb", "32", "residual: most recent tokens kept in fp16 (KIVI's R; 128 in the paper, which "
                                 "would keep all of a 128-token dump)", 0, 1 << 30)},
          {}, nullptr},
         [](const ParamMap& p) { return std::make_unique<KiviKv>(p); }});
}

}  // namespace qattn::ref

// The "gear" KV quantizer (docs/quantizers.md): GEAR-L, a uniform min-offset backbone plus the rank-r truncated SVD
// of its residual in fp16; the n_b most recent tokens in fp16.
#include "qattn/reference/kv_quant.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <Eigen/SVD>

#include "kv_files.h"
#include "qattn/reference/quant.h"

namespace qattn::ref {
namespace {

using kv_files::check_heads;
using kv_files::round_fp16;

constexpr Choice<bool> kGearBackbones[] = {{"kcvt", false}, {"kivi", true}};  // true: KIVI's groups of g

class GearKv final : public KvQuantizer {
 public:
  explicit GearKv(const ParamMap& p)
      : bits_(static_cast<int>(p.integer("bits"))), kivi_(choice_value(p, "backbone", kGearBackbones)),
        group_(p.integer("g")), rank_(p.integer("rank")), residual_(p.integer("nb")) {}
  KvQuantized apply(const std::vector<MatrixView>& k, const std::vector<MatrixView>& v) const override {
    check_heads(k, v);
    KvQuantized out;
    for (std::size_t h = 0; h < k.size(); ++h) {
      const Eigen::Index L = k[h].rows();
      // The tokens older than the n_b most recent are compressed (KIVI backbone: whole groups of g of them); the
      // rest stays in fp16.
      Eigen::Index nq = L > residual_ ? L - residual_ : 0;
      if (kivi_) nq = nq / group_ * group_;
      double kb = 0, vb = 0;
      out.k.push_back(compress(k[h], nq, true, kb));
      out.v.push_back(compress(v[h], nq, false, vb));
      out.k_bits += kb / static_cast<double>(k[h].size()) / k.size();
      out.v_bits += vb / static_cast<double>(v[h].size()) / k.size();
    }
    return out;
  }

 private:
  // Rows [0, nq) of x: the backbone's uniform min-offset grid (KCVT: K per channel over the nq tokens, V per token;
  // KIVI: K per channel in groups of g tokens, V per token in groups of g channels), then the rank-r truncated SVD of
  // the residual X - D, its factors U_r Sigma_r and V_r stored in fp16. Rows [nq, L) in fp16. `bits` gets the
  // stored bits: codes, scales and offsets, factors, fp16 rows.
  RowMatrixXd compress(const MatrixView& x, Eigen::Index nq, bool is_key, double& bits) const {
    const Eigen::Index d = x.cols();
    RowMatrixXd out = round_fp16(x);
    bits = 16.0 * static_cast<double>(x.rows() - nq) * static_cast<double>(d);
    if (nq == 0) return out;
    const QuantGrid grid = QuantGrid::unsigned_bits(bits_, QuantMode::min_offset);
    const Tiling tiling = is_key ? Tiling{kivi_ ? group_ : nq, 1} : Tiling{1, kivi_ ? group_ : d};
    const QuantizedMatrix q = quantize(x.topRows(nq), grid, tiling);
    const RowMatrixXd backbone = q.dequantize();
    bits += bits_per_element(q, bits_) * static_cast<double>(q.codes.size());
    const Eigen::Index r = std::min({rank_, nq, d});
    if (r == 0) {
      out.topRows(nq) = backbone;
      return out;
    }
    const RowMatrixXd residual = RowMatrixXd(x.topRows(nq)) - backbone;
    const Eigen::BDCSVD<Eigen::MatrixXd> svd(residual, Eigen::ComputeThinU | Eigen::ComputeThinV);
    const RowMatrixXd a = round_fp16(RowMatrixXd(svd.matrixU().leftCols(r) * svd.singularValues().head(r).asDiagonal()));
    const RowMatrixXd b = round_fp16(RowMatrixXd(svd.matrixV().leftCols(r)));
    out.topRows(nq) = backbone + a * b.transpose();
    bits += 16.0 * static_cast<double>(r) * static_cast<double>(nq + d);
    return out;
  }
  int bits_;
  bool kivi_;
  Eigen::Index group_, rank_, residual_;
};

}  // namespace

void register_gear_kv(KvRegistry& r) {
  r.add({{"gear", "GEAR-L: a uniform min-offset backbone (KCVT: K per channel, V per token; or KIVI's groups) plus the "
                  "rank-r truncated SVD of its residual in fp16; the n_b most recent tokens in fp16",
          {int_param("bits", "4", "backbone code bits", 1, 8),
           choice_param("backbone", "kcvt", "kcvt: K per channel, V per token, over every compressed token; kivi: "
                                            "groups of g tokens (K) and g channels (V)", choice_names(kGearBackbones)),
           int_param("g", "64", "KIVI backbone group size g", 1, 1 << 20),
           int_param("rank", "4", "rank r of the residual's low-rank part (per head, for K and V each); 0: none", 0, 1 << 20),
           int_param("nb", "64", "residual: most recent tokens kept in fp16", 0, 1 << 30)},
          {{"kcvt", {{"bits", "4"}, {"backbone", "kcvt"}, {"rank", "4"}, {"nb", "64"}},
            "TurboAttention Table 2's GEAR-L_{r=4}^{(KCVT)} at 4 bits"},
           {"kivi", {{"bits", "3"}, {"backbone", "kivi"}, {"g", "64"}, {"rank", "4"}, {"nb", "64"}},
            "TurboAttention Table 2's GEAR-L_{r=4}^{(KIVI)} at 3 bits"}},
          nullptr},
         [](const ParamMap& p) { return std::make_unique<GearKv>(p); }});
}

}  // namespace qattn::ref

// The "rtn" KV quantizer (docs/quantizers.md): one uniform grid for K and V at a named granularity.
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

constexpr Choice<bool> kRtnModes[] = {{"asym", false}, {"sym", true}};

class RtnKv final : public KvQuantizer {
 public:
  explicit RtnKv(const ParamMap& p)
      : bits_(static_cast<int>(p.integer("bits"))), group_(p.integer("g")),
        k_gran_(choice_value(p, "k", kGranularities)), v_gran_(choice_value(p, "v", kGranularities)),
        sym_(choice_value(p, "mode", kRtnModes)) {}
  KvQuantized apply(const std::vector<MatrixView>& k, const std::vector<MatrixView>& v) const override {
    check_heads(k, v);
    const QuantGrid grid = sym_ ? QuantGrid::symmetric_bits(bits_) : QuantGrid::unsigned_bits(bits_, QuantMode::asymmetric);
    KvQuantized out;
    for (std::size_t h = 0; h < k.size(); ++h) {
      const QuantizedMatrix qk = quantize(k[h], grid, tiling_for(k_gran_, group_));
      const QuantizedMatrix qv = quantize(v[h], grid, tiling_for(v_gran_, group_));
      out.k.push_back(qk.dequantize());
      out.v.push_back(qv.dequantize());
      out.k_bits += bits_per_element(qk, bits_) / k.size();
      out.v_bits += bits_per_element(qv, bits_) / k.size();
    }
    return out;
  }

 private:
  int bits_;
  Eigen::Index group_;
  Granularity k_gran_, v_gran_;
  bool sym_;
};

}  // namespace

void register_rtn_kv(KvRegistry& r) {
  const std::vector<std::string> grans = choice_names(kGranularities);
  r.add({{"rtn", "round-to-nearest baseline: one uniform grid for K and V at a named granularity",
          {int_param("bits", "4", "code bits", 2, 8),
           choice_param("k", "channel", "K granularity", grans),
           choice_param("v", "token", "V granularity", grans),
           int_param("g", "32", "group size (channels of a token for group, tokens for block)", 1, 1 << 20),
           choice_param("mode", "asym", "asym: integer zero point, range holding 0; sym: +-(2^(b-1) - 1)", choice_names(kRtnModes))},
          {}, nullptr},
         [](const ParamMap& p) { return std::make_unique<RtnKv>(p); }});
}

}  // namespace qattn::ref

// The NVFP4 KV cache (docs/quantizers.md "nvfp4"): K and V as E2M1 codes in blocks of 16 channels with UE4M3 block
// scales under a float32 global scale, quantised by Transformer Engine's recipe (lowp_convert.h nvfp4_quantize), and
// read back exactly, through bfloat16, or through bfloat16 and then an FP8 attention's E4M3.
#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "qattn/reference/kv_quant.h"
#include "qattn/reference/lowp_convert.h"
#include "qattn/reference/lowp_float.h"

namespace qattn::ref {
namespace {

enum class Nvfp4Read { exact, bf16, bf16_e4m3 };
constexpr Choice<Nvfp4Read> kNvfp4Reads[] = {
    {"exact", Nvfp4Read::exact}, {"bf16", Nvfp4Read::bf16}, {"bf16-e4m3", Nvfp4Read::bf16_e4m3}};
constexpr Choice<bool> kNvfp4Globals[] = {{"layer", true}, {"head", false}};  // true: one global scale per layer

constexpr Eigen::Index kBlock = 16;

class Nvfp4Kv final : public KvQuantizer {
 public:
  explicit Nvfp4Kv(const ParamMap& p)
      : read_(choice_value(p, "read", kNvfp4Reads)), per_layer_(choice_value(p, "global", kNvfp4Globals)) {}

  KvQuantized apply(const std::vector<MatrixView>& k, const std::vector<MatrixView>& v) const override {
    if (k.size() != v.size() || k.empty()) throw std::invalid_argument("nvfp4: k and v need the same, nonzero, head count");
    KvQuantized out;
    double k_bits = 0, v_bits = 0;
    out.k = cache(k, k_bits);
    out.v = cache(v, v_bits);
    out.k_bits = k_bits, out.v_bits = v_bits;
    return out;
  }

 private:
  // Every head of one side (K or V) through the quantiser, under one global scale (per layer) or one per head.
  std::vector<RowMatrixXd> cache(const std::vector<MatrixView>& heads, double& bits) const {
    const Eigen::Index d = heads.front().cols();
    for (const MatrixView& h : heads)
      if (h.cols() != d || d % kBlock != 0)
        throw SpecError("nvfp4: head_dim " + std::to_string(h.cols()) + " is not whole blocks of " +
                        std::to_string(kBlock) + " channels (NVFP4 scales 16 elements each), or differs between heads");
    std::vector<RowMatrixXd> out;
    const std::size_t groups = per_layer_ ? 1 : heads.size();
    const std::size_t per_group = heads.size() / groups;
    for (std::size_t g = 0; g < groups; ++g) {
      // The group's values as float32 rows (the cache is written from a 16-bit or float32 tensor; a float64 dump is
      // rounded to float32 first), the heads one above the other.
      std::vector<float> x;
      std::size_t rows = 0;
      for (std::size_t h = g * per_group; h < (g + 1) * per_group; ++h) {
        for (Eigen::Index t = 0; t < heads[h].rows(); ++t)
          for (Eigen::Index c = 0; c < d; ++c) x.push_back(static_cast<float>(heads[h](t, c)));
        rows += static_cast<std::size_t>(heads[h].rows());
      }
      const Nvfp4Quantized q = nvfp4_quantize(x, rows, static_cast<std::size_t>(d));
      std::vector<double> value(x.size());
      for (std::size_t i = 0; i < x.size(); ++i)  // e2m1 x s_b exact (6 bits), x S_dec exact in double (30 bits)
        value[i] = lowp_decode_code(q.codes[i], LowpCode::e2m1) *
                   lowp_decode_code(q.scales[i / kBlock], LowpCode::ue4m3) * static_cast<double>(q.global_scale);
      read_back(value);
      std::size_t at = 0;
      for (std::size_t h = g * per_group; h < (g + 1) * per_group; ++h) {
        RowMatrixXd m(heads[h].rows(), d);
        std::copy(value.begin() + static_cast<std::ptrdiff_t>(at), value.begin() + static_cast<std::ptrdiff_t>(at + m.size()),
                  m.data());
        at += static_cast<std::size_t>(m.size());
        out.push_back(std::move(m));
      }
      // 4 bits of code and 8 of scale per 16 elements, and the float32 global scale over the group's elements
      bits += (4.0 + 8.0 / kBlock + (x.empty() ? 0.0 : 32.0 / static_cast<double>(x.size()))) * per_group /
              static_cast<double>(heads.size());
    }
    return out;
  }

  // What attention reads: the dequantised values as they are, rounded to bfloat16 (a dequantising kernel's
  // output), or then to E4M3 under a per-tensor float32 scale amax / 448 (what an FP8 attention does with its input:
  // v' = e4m3(v / s) x s, each float32 operation rounded to nearest even).
  void read_back(std::vector<double>& value) const {
    if (read_ == Nvfp4Read::exact) return;
    for (double& x : value) x = lowp_round(x, bf16_bfloat16(), LowpRounding::rne, LowpOverflow::saturate);
    if (read_ == Nvfp4Read::bf16) return;
    double amax = 0;
    for (double x : value) amax = std::max(amax, std::fabs(x));
    const float s = amax == 0 ? 1.0f : static_cast<float>(amax) / 448.0f;
    for (double& x : value) {
      const float code = e4m3_round_saturate(static_cast<float>(x) / s);
      x = static_cast<double>(code * s);
    }
  }

  Nvfp4Read read_;
  bool per_layer_;
};

}  // namespace

void register_nvfp4_kv(KvRegistry& r) {
  r.add({{"nvfp4", "NVFP4: E2M1 codes per block of 16 channels, UE4M3 block scales under a float32 global scale "
                   "(Transformer Engine's recipe); read exactly, through bf16, or through bf16 then an FP8 attention's "
                   "E4M3",
          {choice_param("read", "exact", "what attention reads: exact (e2m1 x s_b x S_dec), bf16 (rounded to "
                                         "bfloat16), bf16-e4m3 (then E4M3 under a per-tensor scale amax/448)",
                        choice_names(kNvfp4Reads)),
           choice_param("global", "layer", "the global scale's extent: the layer's K (or V) over all heads, or each "
                                           "head", choice_names(kNvfp4Globals))},
          {{"fp8-attention", {{"read", "bf16-e4m3"}},
            "dequantised to bf16, then quantised to E4M3 by an FP8 attention: the double rounding of a "
            "dequantise-then-FP8 serving path"}},
          nullptr},
         [](const ParamMap& p) { return std::make_unique<Nvfp4Kv>(p); }});
}

}  // namespace qattn::ref

// The "flashq" KV quantizer (docs/quantizers.md): TurboAttention's FlashQ cache (qattn/reference/flashq.h), INT8 per
// block of b_c tokens, then progressive INT4/INT2 per channel; the n_h lowest-priority heads at 2 bits.
#include "qattn/reference/kv_quant.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "kv_files.h"
#include "qattn/reference/flashq.h"
#include "qattn/reference/quant.h"

namespace qattn::ref {
namespace {

using kv_files::check_heads;

constexpr Choice<IntScaleRounding> kZscales[] = {{"round", IntScaleRounding::round}, {"ceil", IntScaleRounding::ceil}};
constexpr Choice<int> kInt8Max[] = {{"119", kFlashQRange}, {"126", kFlashQRangeEq}};
constexpr Choice<HeadPriority> kPriorities[] = {{"channel-gaps", HeadPriority::channel_gaps},
                                                {"entries", HeadPriority::entries}};

class FlashQKv final : public KvQuantizer {
 public:
  explicit FlashQKv(const ParamMap& p)
      : bits_(static_cast<int>(p.integer("bits"))), block_(p.integer("bc")), nh_(static_cast<int>(p.integer("nh"))),
        buffer_(p.integer("nb")), rounding_(choice_value(p, "zscale", kZscales)),
        priority_(choice_value(p, "priority", kPriorities)), int8_max_(choice_value(p, "int8-max", kInt8Max)) {
    if (bits_ != 8 && (bits_ < 2 || bits_ > 4))
      throw SpecError("flashq: bits must be 8, 4, 3 or 2 (3: not in the paper; the same progressive step with 8 levels)");
  }
  KvQuantized apply(const std::vector<MatrixView>& k, const std::vector<MatrixView>& v) const override {
    check_heads(k, v);
    std::vector<double> priority;
    for (std::size_t h = 0; h < k.size(); ++h) priority.push_back(flashq_head_priority(k[h], v[h], priority_));
    const std::vector<int> head_bits = flashq_head_bits(priority, nh_, 2, bits_);
    KvQuantized out;
    for (std::size_t h = 0; h < k.size(); ++h) {
      double kb = 0, vb = 0;
      out.k.push_back(compress(k[h], head_bits[h], &kb));
      out.v.push_back(compress(v[h], head_bits[h], &vb));
      out.k_bits += kb / k.size();
      out.v_bits += vb / k.size();
    }
    return out;
  }

 private:
  // One head's K or V: INT8 blocks of b_c tokens, each compressed to `bits` per channel; *bits_out gets the mean
  // bits per element (codes, the block's fp32 scale, an INT8 scale and zero point per channel of the block).
  // With a decode buffer of n_b tokens, the last n_b tokens are the buffer as a decode step sees it when full: INT8
  // under the universal scale s_u = the largest scale of the compressed blocks, new outliers clamped to +-119.
  RowMatrixXd compress(const MatrixView& x, int bits, double* bits_out) const {
    RowMatrixXd out(x.rows(), x.cols());
    double total = 0, s_u = 0;
    const Eigen::Index buffered = std::min(buffer_, x.rows() - 1 > 0 ? x.rows() - 1 : 0);  // >= 1 compressed token
    const Eigen::Index compressed = x.rows() - buffered;
    for (Eigen::Index r0 = 0; r0 < compressed; r0 += block_) {
      const Eigen::Index n = std::min(block_, compressed - r0);
      const FlashQBlock b = flashq_quantize_block(x.middleRows(r0, n), int8_max_);
      RowMatrixXi32 q = b.values;
      total += 32 + static_cast<double>(bits) * n * x.cols();
      if (bits < 8) {
        q = flashq_decompress(flashq_compress(b.values, bits, rounding_));
        total += 16.0 * x.cols();
      }
      out.middleRows(r0, n) = q.cast<double>() * b.scale;
      s_u = std::max(s_u, b.scale);
    }
    if (buffered > 0) {
      out.bottomRows(buffered) = flashq_quantize_with_scale(x.bottomRows(buffered), s_u, nullptr, int8_max_).cast<double>() * s_u;
      total += 32 + 8.0 * buffered * x.cols();
    }
    *bits_out = total / static_cast<double>(x.size());
    return out;
  }
  int bits_;
  Eigen::Index block_;
  int nh_;
  Eigen::Index buffer_;
  IntScaleRounding rounding_;
  HeadPriority priority_;
  int int8_max_;
};

}  // namespace

void register_flashq_kv(KvRegistry& r) {
  r.add({{"flashq", "TurboAttention FlashQ cache: INT8 per block of b_c tokens (/119), progressive INT4/INT2 per "
                    "channel (integer scale, zero point); the n_h lowest-priority heads at 2 bits",
          {int_param("bits", "4", "cache bits: 8 (INT8 kept), 4, 3 or 2 (3: not in the paper, for comparisons at 3 bits)", 2, 8),
           int_param("bc", "64", "tokens per block b_c", 1, 1 << 20),
           int_param("nh", "0", "heads of the layer at 2 bits (lowest priority gap x std)", 0, 1 << 20),
           int_param("nb", "0", "decode buffer: the last n_b tokens in INT8 under the universal scale (max block "
                                "scale of the compressed tokens), clamped to +-119; 0 = none", 0, 1 << 30),
           choice_param("zscale", "round", "integer scale of the step: round (Eq. 9) or ceil", choice_names(kZscales)),
           choice_param("priority", "channel-gaps", "Eq. 11's std: of the channel-wise gaps (the text) or of all entries",
                        choice_names(kPriorities)),
           choice_param("int8-max", "119", "INT8 range R: 119 (Algorithm 1) or 126 (the scale equation after Eq. 3)",
                        choice_names(kInt8Max))},
          {{"mixed", {{"bits", "4"}, {"nh", "2"}}, "head-wise mixed 2/4 bits: 2 of the layer's heads at 2 bits"}},
          nullptr},
         [](const ParamMap& p) { return std::make_unique<FlashQKv>(p); }});
}

}  // namespace qattn::ref

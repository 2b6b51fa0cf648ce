// The "saw" KV quantizer (docs/quantizers.md): SAW-INT4, block-diagonal normalized Hadamard on K (and V optionally),
// per-token asymmetric INT4 packed two per byte.
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

constexpr Choice<bool> kSawV[] = {{"int4", true}, {"fp16", false}};  // true: V stored in INT4

class SawKv final : public KvQuantizer {
 public:
  explicit SawKv(const ParamMap& p)
      : block_(p.integer("block")), rotate_v_(p.boolean("rotate-v")), v_int4_(choice_value(p, "v", kSawV)),
        first_chunk_(p.integer("first-chunk")) {
    if (rotate_v_ && !v_int4_) throw SpecError("saw: rotate-v=true needs v=int4 (a rotated V is stored in INT4)");
  }
  KvQuantized apply(const std::vector<MatrixView>& k, const std::vector<MatrixView>& v) const override {
    check_heads(k, v);
    KvQuantized out;
    const Eigen::Index d = k.front().cols(), dv = v.front().cols();
    out.rotation = block_hadamard(d, block_);
    out.v_rotated = rotate_v_;
    out.raw_query_rows = first_chunk_;
    if (rotate_v_ && dv != d) throw SpecError("SAW: rotating V needs d_v = d");
    for (std::size_t h = 0; h < k.size(); ++h) {
      if (k[h].cols() != d) throw SpecError("SAW: heads of one layer need the same head_dim");
      out.k.push_back(int4_tokens(k[h] * out.rotation));  // rows: k' = H k (H symmetric)
      out.k_bits += (4 + 64.0 / d) / k.size();
      if (!v_int4_) {  // qattn's earlier reading (@fp16-v): V kept in fp16
        out.v.push_back(round_fp16(v[h]));
        out.v_bits += 16.0 / k.size();
        continue;
      }
      out.v.push_back(int4_tokens(rotate_v_ ? RowMatrixXd(v[h] * out.rotation) : RowMatrixXd(v[h])));  // store_kv: V always INT4
      out.v_bits += (4 + 64.0 / dv) / k.size();
    }
    return out;
  }

 private:
  // Per token: scale = max(max - min, 1e-8) / 15, zero = -min / scale, code = clamp(round(x / scale + zero), 0, 15)
  // (round half to even, as torch.round), packed two per byte; x^ = (code - zero) scale.
  static RowMatrixXd int4_tokens(const MatrixView& x) {
    RowMatrixXd out(x.rows(), x.cols());
    std::vector<std::int32_t> codes(static_cast<std::size_t>(x.cols()));
    for (Eigen::Index t = 0; t < x.rows(); ++t) {
      const double mn = x.row(t).minCoeff(), mx = x.row(t).maxCoeff();
      const double scale = std::max(mx - mn, 1e-8) / 15, zero = -mn / scale;
      for (Eigen::Index c = 0; c < x.cols(); ++c)
        codes[c] = static_cast<std::int32_t>(std::clamp(std::nearbyint(x(t, c) / scale + zero), 0.0, 15.0));
      const std::vector<std::int32_t> stored = unpack_codes(pack_codes(codes, 4, false), codes.size(), 4, false);
      for (Eigen::Index c = 0; c < x.cols(); ++c) out(t, c) = (stored[c] - zero) * scale;
    }
    return out;
  }
  Eigen::Index block_;
  bool rotate_v_, v_int4_;
  Eigen::Index first_chunk_;
};

}  // namespace

void register_saw_kv(KvRegistry& r) {
  r.add({{"saw", "SAW-INT4: block-diagonal normalized Hadamard on K (V optionally), K and V per-token asymmetric "
                 "INT4 packed two per byte; Q rotated alike, O rotated back when V is",
          {int_param("block", "16", "Hadamard block order (a power of two dividing head_dim)", 1, 1 << 20),
           choice_param("v", "int4", "V cache: int4 per token (the primer's store_kv) or fp16 (qattn's earlier reading)",
                        choice_names(kSawV)),
           ParamInfo{"rotate-v", ParamType::boolean, "false", "rotate V too before INT4 (rotate_v; O rotated back)", {}},
           int_param("first-chunk", "0", "serving path (FlashInfer): the queries of the first prompt chunk, this many "
                                         "tokens, attend to the raw K and V; the later ones read the cache. 0: every "
                                         "query reads the cache", 0, 1 << 30)},
          {{"fp16-v", {{"v", "fp16"}, {"rotate-v", "false"}}, "V kept in fp16, K alone in INT4 (qattn's earlier reading)"}},
          nullptr},
         [](const ParamMap& p) { return std::make_unique<SawKv>(p); }});
}

}  // namespace qattn::ref

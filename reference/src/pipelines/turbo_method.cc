// The "turbo" method: TurboAttention (FlashQ + SAS) in the registry.
#include "qattn/error.h"
#include "qattn/reference/kernel_file.h"
#include "qattn/reference/method_entries.h"
#include "qattn/reference/turbo.h"

namespace qattn::ref {
namespace {

class TurboMethod final : public Method {
 public:
  explicit TurboMethod(TurboParams p) : p_(p) {}
  RowMatrixXd softmax_rows_impl(const MatrixView&) const override {
    throw SpecError("turbo is an attention pipeline; its softmax alone is the method 'sas'");
  }
  AttentionResult attention_impl(const MatrixView& q, const MatrixView& k, const MatrixView& v, double scale,
                            const AttentionMask& mask) const override {
    return turbo_attention(q, k, v, scale, mask, p_, p_.kv_bits);
  }
  std::unique_ptr<PreparedCall> prepare_impl(const MatrixView& q, const MatrixView& k, const MatrixView& v,
                                             double scale, const AttentionMask& mask) const override {
    return prepare_turbo(q, k, v, scale, mask, p_, p_.kv_bits);
  }
  std::vector<AttentionResult> attention_heads_impl(const std::vector<MatrixView>& q, const std::vector<MatrixView>& k,
                                               const std::vector<MatrixView>& v, double scale,
                                               const AttentionMask& mask) const override {
    return turbo_attention_heads(q, k, v, scale, mask, p_);
  }

 private:
  TurboParams p_;
};

constexpr Choice<bool> kExactExp[] = {{"sas", false}, {"exact", true}};
constexpr Choice<TurboMode> kModes[] = {{"prefill", TurboMode::prefill}, {"decode", TurboMode::decode}};
constexpr Choice<IntScaleRounding> kZscales[] = {{"round", IntScaleRounding::round}, {"ceil", IntScaleRounding::ceil}};
constexpr Choice<int> kInt8Max[] = {{"119", kFlashQRange}, {"126", kFlashQRangeEq}};
constexpr Choice<HeadPriority> kPriorities[] = {{"channel-gaps", HeadPriority::channel_gaps},
                                                {"entries", HeadPriority::entries}};

}  // namespace

void register_turbo_method(Registry& registry) {
  MethodEntry e;
  e.name = "turbo";
  e.summary = "TurboAttention: FlashQ per-block INT8 (/119 or /126) Q, K, V and P~, SAS online softmax, INT4/INT2 KV cache";
  e.params = {
      {"br", ParamType::integer, "64", "query block rows B_r (prefill)", {}, 1, 1 << 20},
      {"bc", ParamType::integer, "64", "key/value block rows B_c", {}, 1, 1 << 20},
      {"nr", ParamType::real, "-6", "SAS sparsity threshold n_r < 0", {}, -64, -1e-3},
      {"poly", ParamType::choice, "paper", "SAS cubic: paper (Eq. 15) or lsq (least-squares refit)", sas_poly_names()},
      {"half", ParamType::boolean, "false", "SAS in emulated binary16 (LUT, POLY, product)"},
      {"exp", ParamType::choice, "sas", "exponential of P~ and of the rescale: sas, or exact e^x (FlashQ error alone)",
       choice_names(kExactExp)},
      {"mode", ParamType::choice, "prefill", "prefill (Algorithm 1) or decode (Algorithm 2: each query a decode step)",
       choice_names(kModes)},
      {"kv", ParamType::integer, "4", "decode KV cache bits: 8 (INT8 kept), 4, 3 or 2 (3: not in the paper)", {}, 2, 8},
      {"nh", ParamType::integer, "0", "heads of a layer whose KV cache takes 2 bits (lowest priority gap x std)", {}, 0, 1 << 20},
      {"int8-max", ParamType::choice, "119",
       "INT8 range R of Q, K, V blocks and P~: 119 (Algorithm 1) or 126 = 2^(8-1) - 2 (the scale equation after Eq. 3)",
       choice_names(kInt8Max)},
      {"priority", ParamType::choice, "channel-gaps",
       "Eq. 11's std: of the channel-wise gaps (the text) or of all entries", choice_names(kPriorities)},
      {"nb", ParamType::integer, "64", "decode buffer n_b: tokens kept in INT8 before compression", {}, 1, 1 << 20},
      {"prefill-len", ParamType::integer, "-1", "decode: keys that came through prefill; -1 = min(L, B_c max(1, L / 2B_c))",
       {}, -1, 1e15},
      {"zscale", ParamType::choice, "round", "integer scale of the INT4/INT2 step: round (Eq. 9 as printed) or ceil",
       choice_names(kZscales)},
  };
  e.presets = {
      {"paper", {{"half", "true"}, {"poly", "paper"}, {"nr", "-6"}, {"exp", "sas"}},
       "SAS in binary16 as the paper runs it; B_r = B_c = 64 (no official code exists)"},
      {"decode", {{"half", "true"}, {"mode", "decode"}, {"kv", "4"}},
       "Algorithm 2: INT4 cache, n_b = 64 INT8 buffer, SAS in binary16"},
  };
  e.make = [](const ParamMap& m) -> std::unique_ptr<Method> {
    TurboParams p;
    p.block_r = m.integer("br");
    p.block_c = m.integer("bc");
    p.sas = sas_params(m);
    p.exact_exp = choice_value(m, "exp", kExactExp);
    p.mode = choice_value(m, "mode", kModes);
    p.kv_bits = static_cast<int>(m.integer("kv"));
    if (p.kv_bits != 8 && (p.kv_bits < 2 || p.kv_bits > 4)) throw SpecError("method 'turbo': kv must be 8, 4, 3 or 2");
    p.heads_2bit = static_cast<int>(m.integer("nh"));
    p.priority = choice_value(m, "priority", kPriorities);
    p.int8_max = choice_value(m, "int8-max", kInt8Max);
    p.buffer = m.integer("nb");
    p.prefill_len = m.integer("prefill-len");
    if (p.prefill_len == 0) throw SpecError("method 'turbo': prefill-len must be >= 1 or -1 (auto)");
    p.int_scale = choice_value(m, "zscale", kZscales);
    // prefill is its description on the flash loop (kernel show, file:PATH); decode's cache is the loop's key side
    if (p.mode == TurboMode::prefill) return make_flash_method(turbo_kernel(p));
    return std::make_unique<TurboMethod>(p);
  };
  e.overflow = OverflowRule::refuse;
  e.overflow_note = "S = alpha * (Q K^T) per block in float32; an entry beyond 3.4e38 is refused";
  e.kind = MethodKind::attention_pipeline;
  e.doc = "docs/pipelines/turbo.md";
  // FlashQ scales per block of B_c keys: reordering keys regroups them. Prefill holds K and V in INT8 blocks,
  // decode in the compressed cache.
  // With nh > 0 its head-wise KV precision ranks the heads of a layer: a head's bits depend on the others.
  // Q is quantised per block of B_r rows, each on its own: blocks of B_r rows stream (a B_r beyond 2^20 / 2 is left
  // to whole heads).
  e.traits = [](const ParamMap& m) {
    return MethodTraits{
        .rows_independent = false,
        .key_order_tolerance = std::nullopt,
        .masked_keys_dropped = false,
        .kv_bits = choice_value(m, "mode", kModes) == TurboMode::decode ? static_cast<double>(m.integer("kv")) : 8,
        .heads_independent = m.integer("nh") == 0,
        .query_block_rows = m.integer("br") <= (1 << 19) ? static_cast<int>(m.integer("br")) : 0};
  };
  registry.add(std::move(e));
}

}  // namespace qattn::ref

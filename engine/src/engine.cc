// The engine: a method spec onto the fused kernels where they compute its reference model's bits, else onto the
// reference model. The table kFusedPlans is the one place that says which specs the fused kernels run.
#include "qattn/engine.h"

#include <cmath>
#include <functional>
#include <iostream>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <stdexcept>
#include <vector>

#include "qattn/choice.h"
#include "qattn/error.h"
#include "qattn/parallel.h"
#include "qattn/quantize.h"
#include "qattn/reference/int_pipelines.h"
#include "qattn/reference/method_entries.h"
#include "qattn/reference/registry.h"

namespace qattn {
namespace {

// How the fused kernels run one resolved spec, or why they do not.
struct FusedPlan {
  bool supported = false;
  std::string why_not;
  IntPipeline pipeline = IntPipeline::intattention;
  IndexSoftmaxParams softmax;
  ref::CintEvaluation cint_eval = ref::CintEvaluation::f64;
  Int8Rounding qround = Int8Rounding::rne;  // the INT8 codes of Q, K, V (IntAttention's qround)
  Eigen::Index key_block = 0;               // K scales per block of keys, Eq. 16-18 clipping (k-group)
  GroupMax group_max = GroupMax::global;
};

FusedPlan unsupported(std::string why) { return {false, std::move(why)}; }

FusedPlan plan_intattention(const ParamMap& m) {
  const ref::IntAttentionSettings s = ref::intattention_settings(m);
  if (s.groups.q_rows != 0)
    return unsupported("q-group=" + std::to_string(s.groups.q_rows) + ": the fused kernels take one Q scale per call");
  if (s.groups.v != ref::VGroup::tensor)
    return unsupported("v-group=" + m.choice("v-group") + ": the fused kernels take one V scale per call");
  FusedPlan p{true};
  p.softmax = s.softmax;
  p.cint_eval = s.cint_eval;
  p.qround = s.qround;
  p.key_block = s.groups.k_rows;
  p.group_max = s.groups.group_max;
  return p;
}

FusedPlan plan_quant_only(const ParamMap& m) {
  if (ref::quant_only_softmax(m) != ref::QuantOnlySoftmax::lanes16)
    return unsupported("softmax=" + m.choice("softmax") +
                       ": the fused float softmax is exp_f32_poly with the 16-lane sum (softmax=lanes16)");
  FusedPlan p{true};
  p.pipeline = IntPipeline::quant_only;
  return p;
}

// The methods the fused kernels implement, each with the rule that says which of its parameters they support.
struct FusedEntry {
  std::string_view method;
  FusedPlan (*plan)(const ParamMap&);
};
constexpr FusedEntry kFusedPlans[] = {
    {"intattention", plan_intattention},
    {"quant-only", plan_quant_only},
};

std::vector<std::int8_t> narrow_int8(const RowMatrixXi32& values) {
  std::vector<std::int8_t> out(static_cast<std::size_t>(values.size()));
  for (Eigen::Index i = 0; i < values.size(); ++i) out[i] = static_cast<std::int8_t>(values.data()[i]);
  return out;
}

// A float32 view as the float64 matrix the reference model takes (exact); a float64 view as it is.
RowMatrixXd widened(const MatrixViewF& x) { return x.cast<double>(); }
const MatrixView& widened(const MatrixView& x) { return x; }

// A pipeline on the fused kernels. It quantises with the library's quantize_int8_symmetric, which the reference's
// quantize_symmetric_int8 calls, and derives c_int with the reference's intattention_cint, so those steps are shared
// by construction; the GEMMs, IndexSoftmax and the dequantisation are the kernels' own, tested bit-exact against the
// reference model. It reads float64 and float32 inputs as they are: the codes come straight from the caller's buffer
// (exact widening of each float32 value), with no float64 copy. The reference method answers what the kernels do not
// compute: shapes or masks that do not fit (its errors), softmax-only calls, and Quant-Only calls whose float32
// logits could overflow (it names the entry it refuses).
class FusedMethod final : public Method {
 public:
  FusedMethod(FusedPlan plan, std::unique_ptr<Method> reference, Isa isa, const EngineOptions& options)
      : plan_(std::move(plan)),
        reference_(std::move(reference)),
        isa_(isa),
        threads_(options.threads),
        probs_(options.probs),
        o_float32_(options.o_float32) {}

 protected:
  RowMatrixXd softmax_rows_impl(const MatrixView& logits) const override { return reference_->softmax_rows(logits); }
  IntegerSoftmaxResult softmax_integer_impl(const IntegerLogits& logits) const override {
    return reference_->softmax_integer(logits);
  }

  AttentionResult attention_impl(const MatrixView& q, const MatrixView& k, const MatrixView& v, double scale,
                                 const AttentionMask& mask) const override {
    return fused(q, k, v, scale, mask);
  }
  std::unique_ptr<PreparedCall> prepare_impl(const MatrixView& q, const MatrixView& k, const MatrixView& v,
                                             double scale, const AttentionMask& mask) const override {
    std::optional<Setup> st = setup(q, k, v, scale, mask);
    if (!st) return reference_->prepare(q, k, v, scale, mask);
    return std::make_unique<Call>(*this, std::move(*st), scale, mask);
  }

  // Head by head (the fused pipelines look at one head at a time), each read in place.
  std::vector<AttentionResult> attention_heads_f32_impl(const std::vector<MatrixViewF>& q,
                                                        const std::vector<MatrixViewF>& k,
                                                        const std::vector<MatrixViewF>& v, double scale,
                                                        const AttentionMask& mask) const override {
    std::vector<AttentionResult> out;
    out.reserve(q.size());
    for (std::size_t h = 0; h < q.size(); ++h) out.push_back(fused(q[h], k[h], v[h], scale, mask));
    return out;
  }

 private:
  struct Quantized {
    std::vector<std::int8_t> values;
    double scale = 1;
  };

  // The codes of x, written as bytes at once (no int32 codes, no float64 copy) into r.values, sized by the caller.
  template <class View>
  void quantize(const View& x, Quantized& r) const {
    using Scalar = typename View::Scalar;
    Eigen::Matrix<Scalar, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor> storage;
    r.scale = quantize_int8_symmetric(std::span<const Scalar>(packed_rows(x, storage), r.values.size()),
                                      std::span<std::int8_t>(r.values), plan_.qround);
  }

  // What the kernels take for one call, computed once: the codes and scales of Q, K and V and the configuration
  // (c_int, key-block clips) of the call's per-tensor scales.
  struct Setup {
    Quantized qi, ki, vi;
    Eigen::Index lq = 0, lk = 0, d = 0, dv = 0;
    IntAttentionConfig cfg;
    int p_scale = 127;
  };

  // The setup of a call, or nothing where the reference model must answer it (see the class comment).
  template <class View>
  std::optional<Setup> setup(const View& q, const View& k, const View& v, double scale, const AttentionMask& mask) const {
    Setup st;
    st.lq = q.rows(), st.lk = k.rows(), st.d = q.cols(), st.dv = v.cols();
    const bool mask_fits = mask.valid.size() == 0 || (mask.valid.rows() == st.lq && mask.valid.cols() == st.lk);
    if (q.cols() != k.cols() || k.rows() != v.rows() || !mask_fits) return std::nullopt;
    const bool key_blocks = plan_.key_block > 0 && st.lk > 0;
    if (key_blocks && st.d > kMaxKeyBlockHeadDim) return std::nullopt;  // the kernels' anchor bound
    std::optional<ref::KeyBlocks> kb;
    if (key_blocks) kb = ref::quantize_key_blocks(k, plan_.key_block, plan_.qround);
    // Q, V and K are quantised side by side on the call's threads (each tensor's codes do not depend on the others),
    // into buffers allocated here, on the calling thread's heap rather than in a helper thread's own malloc arena:
    // a program that advises only its main heap for huge pages (docs/kernels.md, "Huge pages for fresh buffers";
    // the CLI advises its helpers' arenas too) gets them for these as well.
    st.qi.values.resize(static_cast<std::size_t>(q.size()));
    st.vi.values.resize(static_cast<std::size_t>(v.size()));
    st.ki.values.resize(key_blocks ? 0 : static_cast<std::size_t>(k.size()));
    parallel_for(key_blocks ? 2 : 3, threads_, [&](std::size_t i) {
      if (i == 0) quantize(q, st.qi);
      else if (i == 1) quantize(v, st.vi);
      else quantize(k, st.ki);
    });
    if (key_blocks) st.ki = Quantized{narrow_int8(kb->codes.values), kb->scales.front()};
    IntAttentionConfig& cfg = st.cfg;
    cfg.pipeline = plan_.pipeline;
    cfg.isa = isa_;
    cfg.threads = threads_;
    if (plan_.pipeline == IntPipeline::intattention) {
      cfg.softmax = plan_.softmax;
      if (key_blocks) {  // the reference's clip per key block (Eq. 16), so that step is shared by construction
        const ref::KeyGroupClip clip = ref::key_group_clip(*kb, plan_.key_block, st.qi.scale, scale, plan_.softmax,
                                                           plan_.cint_eval, plan_.group_max);
        cfg.key_block = plan_.key_block;
        cfg.key_c_int = clip.c_int;
        cfg.key_ratio = clip.ratio;
        cfg.group_max = plan_.group_max;
        cfg.group_offset_scale = clip.offset_scale;
        cfg.c_int = clip.c_int.front();
      } else {
        cfg.c_int = ref::intattention_cint(st.qi.scale, st.ki.scale, scale, plan_.softmax, plan_.cint_eval);
      }
      st.p_scale = plan_.softmax.p_scale();
    } else {
      // |A| <= 127^2 d, so |fl32(A) alpha| <= fl32(127^2 d) alpha (rounding is monotone): finite means no entry of
      // the float32 logits overflows.
      const float alpha = static_cast<float>(st.qi.scale * st.ki.scale * scale);
      if (!std::isfinite(static_cast<float>(127.0 * 127.0 * static_cast<double>(st.d)) * alpha)) return std::nullopt;
    }
    return st;
  }

  // Rows [r0, r0 + n) of a set-up call: each output row depends only on its own query row and on what the setup
  // holds (the kernels' rows are independent), so a block gives the whole call's rows.
  AttentionResult run(const Setup& st, Eigen::Index r0, Eigen::Index n, double scale, const AttentionMask& mask) const {
    IntAttentionConfig cfg = st.cfg;
    // The kernels' causal rule has no shift: a block of a causal call (a shifted diagonal) goes in as the padding
    // mask it amounts to; so does a block of a padding mask.
    AttentionMask part;
    const AttentionMask* block = &mask;  // the whole call's mask as it is (no copy of an [L_q, L_k] padding mask)
    if (r0 != 0 || n != st.lq) part = mask.rows(r0, n, st.lq), block = &part;
    const RowMatrixXb shifted = block->causal && block->causal_shift != 0 ? block->visible(n, st.lk) : RowMatrixXb();
    cfg.causal = block->causal && block->causal_shift == 0;
    cfg.valid = shifted.size() ? shifted.data() : block->valid.size() ? block->valid.data() : nullptr;
    std::vector<std::uint8_t> p;
    if (probs_) {
      p.assign(static_cast<std::size_t>(n * st.lk), 0);
      cfg.p_out = p.data();
    }
    AttentionResult r;
    r.o_f32.resize(n, st.dv);
    int_attention_fused({st.qi.values.data() + r0 * st.d, n, st.d, st.qi.scale}, {st.ki.values.data(), st.lk, st.d, st.ki.scale},
                        {st.vi.values.data(), st.lk, st.dv, st.vi.scale}, scale, cfg, r.o_f32.data());
    if (!o_float32_) {
      r.o = r.o_f32.cast<double>();
      r.o_f32.resize(0, 0);
    }
    r.p_scale = st.p_scale;
    r.p_dtype = st.p_scale == 255 ? DType::u8 : DType::i8;
    if (probs_) {
      r.p_int = Eigen::Map<const Eigen::Matrix<std::uint8_t, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>(
                    p.data(), n, st.lk).cast<std::int32_t>();
      r.p = r.p_int.cast<double>() / st.p_scale;
    }
    return r;
  }

  template <class View>
  AttentionResult fused(const View& q, const View& k, const View& v, double scale, const AttentionMask& mask) const {
    const std::optional<Setup> st = setup(q, k, v, scale, mask);
    if (!st) return reference_->attention(widened(q), widened(k), widened(v), scale, mask);
    return run(*st, 0, st->lq, scale, mask);
  }

  // A prepared call on the kernels: the setup once, then any block of rows.
  class Call final : public PreparedCall {
   public:
    Call(const FusedMethod& method, Setup setup, double scale, const AttentionMask& mask)
        : PreparedCall(setup.lq), method_(method), setup_(std::move(setup)), scale_(scale), mask_(mask) {}

   protected:
    AttentionResult rows_impl(Eigen::Index r0, Eigen::Index n) const override {
      return method_.run(setup_, r0, n, scale_, mask_);
    }

   private:
    const FusedMethod& method_;
    Setup setup_;
    double scale_;
    const AttentionMask& mask_;
  };

  FusedPlan plan_;
  std::unique_ptr<Method> reference_;
  Isa isa_;
  int threads_;
  bool probs_;
  bool o_float32_;
};

constexpr Choice<Engine> kEngines[] = {
    {"auto", Engine::automatic}, {"fast", Engine::fast}, {"reference", Engine::reference}};

}  // namespace

std::string_view engine_name(Engine engine) { return name_of(kEngines, engine); }

Engine parse_engine(std::string_view name) {
  if (const std::optional<Engine> engine = value_named(kEngines, name)) return *engine;
  throw SpecError("unknown engine '" + std::string(name) + "' (valid: auto, fast, reference)");
}

BuiltMethod build_method(const MethodSpec& spec, const EngineOptions& options) {
  const Registry& registry = ref::reference_registry();
  BuiltMethod built;
  built.method = registry.create(spec);  // a bad spec fails here, with the registry's message
  if (options.threads < 1) throw SpecError("engine: threads must be >= 1");
  if (options.engine == Engine::reference) {
    built.path = "reference model (engine=reference)";
    return built;
  }
  FusedPlan plan = unsupported("no fused kernels for '" + spec.name + "'");
  for (const FusedEntry& e : kFusedPlans)
    if (e.method == spec.name) plan = e.plan(registry.resolve(spec));
  if (!plan.supported) {
    if (options.engine == Engine::fast)
      throw SpecError("engine=fast: " + registry.canonical(spec) + " has no fused path: " + plan.why_not);
    built.path = "reference model (" + plan.why_not + ")";
    return built;
  }
  Isa isa;
  if (options.isa) {
    isa = *options.isa;
    if (!isa_available(isa))
      throw SpecError("ISA " + std::string(isa_name(isa)) + " is not available here (available: " + available_isa_names() + ")");
  } else {
    try {
      isa = default_isa();
    } catch (const std::runtime_error& e) {
      throw SpecError(e.what());
    }
  }
  const IntAttentionKernels k = int_attention_kernels(isa, plan.pipeline, plan.key_block > 0);
  built.path = "fused kernels (" + std::string(isa_name(isa)) + ": " + k.qk + ", " + k.softmax + ", " + k.pv + ")";
  built.fast = true;
  built.method = std::make_unique<FusedMethod>(std::move(plan), std::move(built.method), isa, options);
  return built;
}

std::unique_ptr<Method> make_method(const MethodSpec& spec, const EngineSetting& setting, int threads, bool probs,
                                    bool o_float32) {
  EngineOptions options;
  options.o_float32 = o_float32;
  options.engine = setting.engine;
  options.threads = threads;
  options.probs = probs;
  BuiltMethod built = build_method(spec, options);
  if (setting.verbose) {
    static std::mutex mutex;
    static std::set<std::string> said;
    const std::string canonical = ref::reference_registry().canonical(spec);
    std::lock_guard<std::mutex> lock(mutex);
    if (said.insert(canonical).second) std::cerr << "qattn: " << canonical << ": " << built.path << "\n";
  }
  return std::move(built.method);
}

std::unique_ptr<Method> make_method(const std::string& spec, const EngineSetting& setting, int threads, bool probs) {
  return make_method(parse_method_spec(spec), setting, threads, probs);
}

}  // namespace qattn

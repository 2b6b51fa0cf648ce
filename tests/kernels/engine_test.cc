// The engine (qattn/engine.h): a spec it routes to the fused kernels gives the reference model's bits, O and P, on
// every available ISA; a spec it cannot route runs the reference model under auto and is refused under fast.
#include <catch2/catch.hpp>

#include <limits>
#include <random>
#include <typeinfo>
#include <sstream>

#include "qattn/engine.h"
#include "qattn/error.h"
#include "support/random_matrix.h"

namespace qattn {
namespace {

using test::random_matrix;

struct Case {
  Eigen::Index lq, lk, d, dv;
  bool causal, padding;
};

// O and the integer P of both engines, equal bit for bit, whole and in blocks of a prepared call; P empty when
// probs is off.
void check_same(const std::string& spec, const Case& c, std::mt19937_64& g) {
  const RowMatrixXd q = random_matrix(c.lq, c.d, 1.5, g), k = random_matrix(c.lk, c.d, 1.5, g),
                    v = random_matrix(c.lk, c.dv, 1.0, g);
  AttentionMask mask;
  mask.causal = c.causal;
  if (c.padding) {
    std::bernoulli_distribution keep(0.7);
    mask.valid.resize(c.lq, c.lk);
    for (Eigen::Index i = 0; i < mask.valid.size(); ++i) mask.valid.data()[i] = keep(g);
    mask.valid.row(0).setConstant(false);  // a fully masked row
  }
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.d));
  EngineOptions reference_options;
  reference_options.engine = Engine::reference;
  const AttentionResult expect = build_method(spec, reference_options).method->attention(q, k, v, scale, mask);
  for (const Isa isa : available_isas())
    for (const int threads : {1, 2}) {
      EngineOptions fast;
      fast.engine = Engine::fast;
      fast.isa = isa;
      fast.threads = threads;
      const BuiltMethod built = build_method(spec, fast);
      REQUIRE(built.fast);
      std::ostringstream what;
      what << spec << " lq " << c.lq << " lk " << c.lk << " d " << c.d << " dv " << c.dv << " causal " << c.causal
           << " padding " << c.padding << " isa " << isa_name(isa) << " threads " << threads;
      INFO(what.str());
      const AttentionResult got = built.method->attention(q, k, v, scale, mask);
      CHECK(got.o == expect.o);
      CHECK(got.p_int == expect.p_int);
      CHECK(got.p == expect.p);
      CHECK(got.p_scale == expect.p_scale);
      CHECK(got.p_dtype == expect.p_dtype);
      // Prepared once (Method::prepare), then in blocks of 5 rows (the last one partial): the whole call's rows.
      const std::unique_ptr<PreparedCall> call = built.method->prepare(q, k, v, scale, mask);
      for (Eigen::Index r0 = 0; r0 < c.lq; r0 += 5) {
        const Eigen::Index n = std::min<Eigen::Index>(5, c.lq - r0);
        const AttentionResult rows = call->rows(r0, n);
        CHECK(rows.o == expect.o.middleRows(r0, n));
        CHECK(rows.p_int == expect.p_int.middleRows(r0, n));
      }
      fast.probs = false;
      const AttentionResult no_p = build_method(spec, fast).method->attention(q, k, v, scale, mask);
      CHECK(no_p.o == expect.o);
      CHECK(no_p.p.size() == 0);
      CHECK(no_p.o_f32.size() == 0);
      // O handed over as float32 (what `qattn attention` writes): the same values, with no float64 copy.
      fast.o_float32 = true;
      const AttentionResult f32 = build_method(spec, fast).method->attention(q, k, v, scale, mask);
      CHECK(f32.o.size() == 0);
      CHECK(f32.o_f32.rows() == expect.o.rows());
      CHECK(f32.o_f32.cast<double>() == expect.o);
    }
}

TEST_CASE("engine: the fused path gives the reference model's O and P for every IntAttention choice", "[engine]") {
  std::mt19937_64 g(20261124);
  // Every preset, both P formats, both c_int evaluations, table sizes at the ends of the range and each index and
  // normalisation rule.
  const std::vector<std::string> specs = {
      "intattention",          "intattention@paper",           "intattention@upstream-sim",
      "intattention@upstream-neon", "intattention@paper:p=s8", "intattention:b=1,c=3",
      "intattention:b=8,c=12,index=round,norm=f32-rne", "intattention:index=q26-floor,norm=q8-reciprocal",
      "intattention:cint-eval=f32,cint=trunc,index=floor-f32", "quant-only:softmax=lanes16",
      // group-wise clipping over key blocks (Eq. 16-18), both readings, blocks shorter than, equal to and across
      // the vector widths
      "intattention:k-group=16", "intattention:k-group=7,group-max=offset", "intattention@upstream-neon:k-group=24",
      "intattention@paper:k-group=1,group-max=offset", "intattention@upstream-sim:k-group=32",
      "intattention:b=8,index=round,norm=f32-rne,k-group=64,group-max=offset"};
  const std::vector<Case> cases = {
      {16, 16, 64, 64, false, false},  // square, tile-aligned
      {23, 37, 20, 9, true, false},    // L_q != L_k, d and d_v off every unroll, causal (bottom-right)
      {37, 23, 8, 16, true, true},     // L_q > L_k: early rows fully masked by causality; padding on top
      {5, 70, 33, 3, false, true},     // padding, a fully masked row
  };
  for (const auto& spec : specs)
    for (const Case& c : cases) check_same(spec, c, g);
}

TEST_CASE("engine: auto falls back to the reference model, fast refuses, for what the kernels do not run", "[engine]") {
  for (const std::string spec : {"intattention:q-group=4", "intattention:v-group=channel", "quant-only", "fp32",
                                 "index@paper", "sage2@paper-8b"}) {
    INFO(spec);
    const BuiltMethod automatic = build_method(spec);
    CHECK_FALSE(automatic.fast);
    CHECK(automatic.path.rfind("reference model (", 0) == 0);
    EngineOptions fast;
    fast.engine = Engine::fast;
    CHECK_THROWS_AS(build_method(spec, fast), SpecError);
    // o_float32 concerns the fused path only: the reference model still fills o.
    EngineOptions f32;
    f32.o_float32 = true;
    std::mt19937_64 g(5);
    const RowMatrixXd q = random_matrix(4, 8, 1.0, g), k = random_matrix(6, 8, 1.0, g), v = random_matrix(6, 8, 1.0, g);
    const AttentionResult r = build_method(spec, f32).method->attention(q, k, v, 0.35, {});
    CHECK(r.o.rows() == 4);
    CHECK(r.o_f32.size() == 0);
  }
  EngineOptions reference;
  reference.engine = Engine::reference;
  CHECK_FALSE(build_method("intattention", reference).fast);
  CHECK(build_method("intattention").fast);
  CHECK(build_method("quant-only:softmax=lanes16").fast);
  CHECK_THROWS_AS(build_method("intattention:b=9"), SpecError);  // the registry's validation still applies
  CHECK_THROWS_AS(parse_engine("turbo"), SpecError);
  CHECK(parse_engine("auto") == Engine::automatic);
  for (const Engine e : {Engine::automatic, Engine::fast, Engine::reference}) CHECK(parse_engine(engine_name(e)) == e);
}

// Both engines must say the same thing about bad or overflowing input: same exception type, same text.
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return std::string(typeid(e).name()) + ": " + e.what();
  }
  return "no error";
}

TEST_CASE("engine: refusals and errors of the fused path equal the reference model's", "[engine]") {
  std::mt19937_64 g(7);
  EngineOptions fast, reference;
  fast.engine = Engine::fast;
  reference.engine = Engine::reference;
  const RowMatrixXd q = random_matrix(6, 8, 1.0, g), k = random_matrix(5, 8, 1.0, g), v = random_matrix(5, 4, 1.0, g);
  for (const std::string spec : {"intattention@upstream-sim", "intattention", "quant-only:softmax=lanes16"}) {
    INFO(spec);
    const auto f = build_method(spec, fast).method, r = build_method(spec, reference).method;
    // The error text of both engines (or "no error"), checked equal; where neither refuses, O must agree too.
    auto same = [&](const RowMatrixXd& qq, const RowMatrixXd& kk, const RowMatrixXd& vv, const AttentionMask& m) {
      const std::string ef = error_of([&] { f->attention(qq, kk, vv, 0.25, m); });
      CHECK(ef == error_of([&] { r->attention(qq, kk, vv, 0.25, m); }));
      if (ef == "no error") CHECK(f->attention(qq, kk, vv, 0.25, m).o == r->attention(qq, kk, vv, 0.25, m).o);
      return ef;
    };
    // The logit scale overflows float64 (s_Q s_K scale), or float32 for quant-only: refused by every pipeline.
    CHECK(same(q * 1e200, k * 1e200, v, {}) != "no error");
    // Float32 logits beyond 3.4e38: quant-only refuses, naming the entry (the fused path hands the call to the
    // reference model); IntAttention's integer logits do not overflow.
    const std::string big = same(q * 1e20, k * 1e20, v, {});
    if (spec.rfind("quant-only", 0) == 0) CHECK(big.find("float32") != std::string::npos);
    RowMatrixXd bad = q;
    bad(2, 3) = std::numeric_limits<double>::quiet_NaN();
    CHECK(same(bad, k, v, {}).find("[2, 3]") != std::string::npos);  // non-finite input, named with its index
    CHECK(same(q, random_matrix(5, 7, 1.0, g), v, {}) != "no error");  // shapes that do not fit
    AttentionMask wrong;
    wrong.valid = RowMatrixXb::Constant(5, 5, true);
    CHECK(same(q, k, v, wrong) != "no error");  // a mask of the wrong shape
  }
}

}  // namespace
}  // namespace qattn

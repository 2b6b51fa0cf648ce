// qattn/testing.h, the harness users test their own kernels with: each generator makes the rows its documentation
// promises, and each checker passes qattn's own implementations and fails a mutated one with a message that names
// the spec and the first differing index.
#include <rapidcheck.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <limits>

#include "qattn/engine.h"
#include "qattn/reference/index_softmax.h"
#include "qattn/reference/registry.h"
#include "qattn/testing.h"

namespace qt = qattn::testing;

namespace {

constexpr double kMinusInf = -std::numeric_limits<double>::infinity();

// A kernel that is qattn's own reference model of `spec`, through the public interface a user would call.
std::vector<double> reference_softmax(std::span<const double> x, const std::string& spec) {
  qattn::RowMatrixXd m(1, static_cast<Eigen::Index>(x.size()));
  std::copy(x.begin(), x.end(), m.data());
  const qattn::RowMatrixXd p = qattn::ref::reference_registry().create(spec)->softmax_rows(m);
  return {p.data(), p.data() + p.size()};
}

}  // namespace

TEST_CASE("the generators make the rows they document", "[testing][property]") {
  REQUIRE(rc::check("lengths lie around vector widths", [] {
    const int n = *qt::lengths_around_widths();
    RC_ASSERT(n >= 1 && n <= 257);
    RC_ASSERT(n <= 3 || n % 4 <= 1 || n % 4 == 3);
  }));
  REQUIRE(rc::check("masked rows hold -inf, fully masked rows only -inf", [] {
    const qt::LogitRow r = *qt::masked_rows();
    const auto masked = std::count(r.logits.begin(), r.logits.end(), kMinusInf);
    if (r.family == "fully masked") RC_ASSERT(masked == static_cast<long>(r.logits.size()));
    for (double x : r.logits) RC_ASSERT(x == kMinusInf || std::isfinite(x));
  }));
  REQUIRE(rc::check("a skyscraper stands at least 20 above the rest, ties hold at most 4 values", [] {
    const qt::LogitRow s = *qt::skyscraper_rows();
    std::vector<double> v = s.logits;
    std::sort(v.begin(), v.end());
    if (v.size() > 1) RC_ASSERT(v.back() - v[v.size() - 2] >= 20 - 2 * 3.3);
    qt::LogitRow t = *qt::tied_rows();
    std::sort(t.logits.begin(), t.logits.end());
    RC_ASSERT(std::unique(t.logits.begin(), t.logits.end()) - t.logits.begin() <= 4);
  }));
  REQUIRE(rc::check("integer row lengths lie around vector widths or past 257, up to 4096", [] {
    const int n = *qt::integer_row_lengths();
    RC_ASSERT(n >= 1 && n <= 4096);
    RC_ASSERT(n <= 257 || n >= 258);
  }));
  // Half the lengths are past 257, and one row in four is near-top: a uint16 sum of the row's table entries wraps in
  // about one row in ten. Over 400 rows that is a certainty (the chance of none is below 1e-15).
  int wraps = 0;
  for (int i = 0; i < 400; ++i) {
    const qt::IntegerRow r = qt::saturating_integer_rows()(rc::Random(static_cast<std::uint64_t>(1000 + i)), 100).value();
    const std::int64_t m = *std::max_element(r.logits.begin(), r.logits.end());
    std::int64_t at_top = 0;
    for (std::int32_t a : r.logits) at_top += (m - a) * 31 < r.c_int;  // table index 0: E = 255
    wraps += 255 * at_top > 65535;
  }
  CHECK(wraps > 0);
  REQUIRE(rc::check("saturating integer rows reach the clip and stay inside it too", [] {
    const qt::IntegerRow r = *qt::saturating_integer_rows(rc::gen::just(256));
    const std::int64_t m = *std::max_element(r.logits.begin(), r.logits.end());
    long beyond = 0, inside = 0;
    for (std::int32_t a : r.logits) (m - a >= r.c_int ? beyond : inside) += 1;
    RC_ASSERT(r.c_int >= 1 && r.c_int <= (1 << 20));
    RC_ASSERT(beyond > 0);
    RC_ASSERT(inside > 0);
  }));
  REQUIRE(rc::check("a given length is kept; huge rows are huge", [] {
    RC_ASSERT((*qt::gaussian_rows(rc::gen::just(64))).logits.size() == 64u);
    RC_ASSERT((*qt::heavy_tailed_rows(rc::gen::just(5))).logits.size() == 5u);
    RC_ASSERT((*qt::huge_rows()).logits.size() >= 4096u);
  }));
}

TEST_CASE("the checkers pass the reference itself and catch a mutation", "[testing][property]") {
  for (const char* spec : {"fp32", "index@upstream-neon", "exaq", "sas"}) {
    INFO(spec);
    CHECK(rc::check(std::string("reference ") + spec + " is bit-exact to itself", [spec](const qt::LogitRow& row) {
      qt::expect_bit_exact([spec](std::span<const double> x) { return reference_softmax(x, spec); }, spec, row);
    }));
  }
  CHECK(rc::check("the integer reference is bit-exact to index@upstream-neon", [](const qt::IntegerRow& row) {
    qt::expect_bit_exact(
        [](std::span<const std::int32_t> a, std::int64_t c_int) {
          qattn::IndexSoftmaxParams p;  // upstream-neon: b = 5, c = 6.6, q26-round index, round table, q8 norm
          p.index_rule = qattn::IndexRule::q26_round;
          p.lut_rounding = qattn::LutRounding::round;
          p.normalization = qattn::Normalization::q8_reciprocal;
          const qattn::RowMatrixXi32 x = Eigen::Map<const qattn::RowMatrixXi32>(a.data(), 1, static_cast<Eigen::Index>(a.size()));
          const qattn::RowMatrixXi32 r = qattn::ref::index_softmax(x, c_int, p);
          return std::vector<std::int32_t>(r.data(), r.data() + r.size());
        },
        "index@upstream-neon", row);
  }));
  CHECK(rc::check("the engine's fused kernels are bit-exact to intattention@upstream-neon", [] {
    const qt::AttentionInput in = *qt::attention_inputs(rc::gen::element(1, 7, 16, 33, 65));
    const auto fused = qattn::build_method("intattention@upstream-neon");
    qt::expect_bit_exact([&](const qt::AttentionInput& a) { return fused.method->attention(a.q, a.k, a.v, a.scale, a.mask).o; },
                         "intattention@upstream-neon", in);
  }));
  CHECK_FALSE(rc::check("quant-only is not intattention (must fail)", [] {
    const qt::AttentionInput in = *qt::attention_inputs(rc::gen::element(3, 9, 17));
    const auto other = qattn::ref::reference_registry().create("quant-only");
    qt::expect_bit_exact([&](const qt::AttentionInput& a) { return other->attention(a.q, a.k, a.v, a.scale, a.mask).o; },
                         "intattention@upstream-neon", in);
  }));
  CHECK(rc::check("fp64 is within its declared contract of the exact softmax", [](const qt::LogitRow& row) {
    qt::expect_within_contract([](std::span<const double> x) { return reference_softmax(x, "fp64"); }, "exact",
                               qt::fp64_contract(), row);
  }));
  // Mutations: fp32 claimed to be fp64; bf16 within fp64's contract. Both must be falsified. Their rows are not shrunk
  // (rc::gen::noShrink): a falsified row is all these checks need, and shrinking a long one against the 50-digit
  // softmax can take minutes under the sanitizers, whichever row the seed finds first.
  CHECK_FALSE(rc::check("fp32 is not bit-exact to fp64 (must fail)", [] {
    const qt::LogitRow row = *rc::gen::noShrink(qt::any_rows());
    qt::expect_bit_exact([](std::span<const double> x) { return reference_softmax(x, "fp32"); }, "fp64", row);
  }));
  CHECK_FALSE(rc::check("bf16 is not within 1e-6 of the exact softmax (must fail)", [] {
    const qt::LogitRow row = *rc::gen::noShrink(qt::any_rows());
    qt::expect_within_contract([](std::span<const double> x) { return reference_softmax(x, "bf16"); }, "exact",
                               {.element = 1e-6}, row);
  }));
  CHECK_FALSE(rc::check("fp32 is not within fp64's contract (must fail)", [] {
    const qt::LogitRow row = *rc::gen::noShrink(qt::any_rows());
    qt::expect_within_contract([](std::span<const double> x) { return reference_softmax(x, "fp32"); }, "exact",
                               qt::fp64_contract(), row);
  }));
  CHECK_THROWS_AS(qt::expect_within_contract([](std::span<const double> x) { return std::vector<double>(x.size()); },
                                             "fp16", {}, qt::LogitRow{"one", {0.0}}),
                  std::invalid_argument);
}

// IndexSoftmax reference model: golden vectors worked out from the official code, every rule against an
// independent exact computation, and the exact row-sum range of each normalisation.
#include <boost/multiprecision/cpp_int.hpp>
#include <catch2/catch.hpp>
#include <random>

#include "qattn/error.h"
#include "qattn/reference/index_softmax.h"
#include "qattn/reference/registry.h"

using namespace qattn;
using namespace qattn::ref;

namespace {

const std::vector<std::int32_t> kGoldenRow = {500, 480, 450, 420, 400, 300};

IndexSoftmaxParams preset(CintRounding cr, LutRounding lr, IndexRule ir, Normalization nr) {
  IndexSoftmaxParams p;
  p.bits = 5;
  p.c = 6.6;
  p.cint_rounding = cr;
  p.lut_rounding = lr;
  p.index_rule = ir;
  p.normalization = nr;
  return p;
}

struct Golden {
  std::vector<int> idx, e;
  std::int64_t s, ns;
  std::vector<std::int32_t> p;
};

void check_golden(const IndexSoftmaxParams& params, const Golden& g) {
  const auto lut = index_lut(params.bits, params.c, params.lut_rounding);
  std::vector<std::int32_t> p(6);
  IndexSoftmaxTrace t;
  index_softmax_row(kGoldenRow.data(), nullptr, 6, 100, params, lut, p.data(), &t);
  CHECK(t.idx == g.idx);
  CHECK(t.e == g.e);
  CHECK(t.row_sum == g.s);
  CHECK(t.q8_ns == g.ns);
  CHECK(p == g.p);
}

}  // namespace

TEST_CASE("b=5, c=6.6 round LUT equals the official hard-coded table", "[index]") {
  const std::vector<std::uint8_t> official = {255, 206, 167, 135, 109, 88, 71, 57, 46, 38, 30, 25, 20, 16, 13, 10,
                                              8,   7,   6,   4,   4,   3,  2,  2,  2,  1,  1,  1,  1,  1,  0,  0};
  CHECK(index_lut(5, 6.6, LutRounding::round) == official);
  const auto fl = index_lut(5, 6.6, LutRounding::floor);
  CHECK(fl[0] == 255);
  CHECK(fl[31] == 0);
  for (int i = 1; i < 31; ++i) CHECK((fl[i] == official[i] || fl[i] + 1 == official[i]));  // floor <= round <= floor + 1
  CHECK(index_lut(1, 3.0, LutRounding::floor) == std::vector<std::uint8_t>{255, 0});
  // The last entry is forced to 0 even where floor(255 e^-c) is not (c = 2: 255 e^-2 = 34.5).
  CHECK(index_lut(3, 2.0, LutRounding::floor)[7] == 0);
  CHECK_THROWS_AS(index_lut(9, 6.6, LutRounding::floor), std::invalid_argument);
  CHECK_THROWS_AS(index_lut(5, 0.0, LutRounding::floor), std::invalid_argument);
}

TEST_CASE("golden vectors: upstream simulation and upstream NEON vector path", "[index][golden]") {
  check_golden(preset(CintRounding::trunc, LutRounding::round, IndexRule::floor_f32, Normalization::f32_rne),
               {{0, 6, 15, 24, 31, 31}, {255, 71, 10, 2, 0, 0}, 338, -1, {192, 54, 8, 2, 0, 0}});
  check_golden(preset(CintRounding::round, LutRounding::round, IndexRule::q26_round, Normalization::q8_reciprocal),
               {{0, 6, 16, 25, 31, 31}, {255, 71, 8, 1, 0, 0}, 335, 195, {194, 54, 6, 1, 0, 0}});
  // The paper's formulas (floor everywhere), worked by hand: E = 255, 71, 10, 1 (255 e^{-6.6*24/31} = 1.54), S = 337.
  check_golden(preset(CintRounding::round, LutRounding::floor, IndexRule::floor, Normalization::floor),
               {{0, 6, 15, 24, 31, 31}, {255, 71, 10, 1, 0, 0}, 337, -1, {192, 53, 7, 0, 0, 0}});
  CHECK(q26_multiplier(100, 5) == 20803748);  // (int)(31 * 2^26 / 100 + 0.5)
}

TEST_CASE("c_int: rounding modes, saturation and argument checks", "[index]") {
  CHECK(cint_from_alpha(6.6, 0.066, CintRounding::round) == 100);
  CHECK(cint_from_alpha(6.6, 6.6 / 100.5, CintRounding::round) == 101);  // 100.5 (in double) rounds away from zero
  CHECK(cint_from_alpha(6.6, 6.6 / 100.7, CintRounding::trunc) == 100);
  CHECK(cint_from_alpha(6.6, 6.6 / 100.7, CintRounding::floor) == 100);
  CHECK(cint_from_alpha(6.6, 1e-300, CintRounding::round) == kCintMax);  // c / alpha = inf: saturates
  CHECK(cint_from_alpha(6.6, 1e6, CintRounding::trunc) == 1);            // 6.6e-6 truncates to 0: saturates to 1
  CHECK_THROWS_AS(cint_from_alpha(6.6, 0.0, CintRounding::round), std::invalid_argument);
  CHECK_THROWS_AS(cint_from_alpha(-1.0, 1.0, CintRounding::round), std::invalid_argument);
  // Upstream expression c sqrt(d) / (sQ sK): d = 64, sQ = sK = 0.1 -> 6.6 * 8 / 0.01 = 5280.
  CHECK(cint_from_scales(6.6, 0.1, 0.1, 64, CintRounding::round) == 5280);
}

TEST_CASE("index rules against exact rational arithmetic", "[index]") {
  using boost::multiprecision::cpp_int;
  std::mt19937_64 g(17);
  for (int trial = 0; trial < 20000; ++trial) {
    const int bits = 1 + static_cast<int>(g() % 8);
    const std::int64_t last = (1 << bits) - 1;
    const std::int64_t c_int = 1 + static_cast<std::int64_t>(g() % (trial % 2 ? 1000 : 1000000));
    const std::int64_t delta = static_cast<std::int64_t>(g() % (c_int + 1));
    const cpp_int num = cpp_int(delta) * last;
    INFO("bits " << bits << " c_int " << c_int << " delta " << delta);
    CHECK(index_of(delta, c_int, bits, IndexRule::floor) == static_cast<int>(num / c_int));
    CHECK(index_of(delta, c_int, bits, IndexRule::round) == static_cast<int>((2 * num + c_int) / (2 * c_int)));
    const double exact = static_cast<double>(delta * last) / static_cast<double>(c_int);
    const int f32 = index_of(delta, c_int, bits, IndexRule::floor_f32);
    CHECK(std::abs(f32 - std::floor(exact)) <= 1);  // float32 may step across an integer, never further
    const int q = index_of(delta, c_int, bits, IndexRule::q26_round);
    CHECK(std::abs(q - exact) <= 0.5 + static_cast<double>(c_int) / (1 << 27) + 1e-12);
  }
}

TEST_CASE("normalisation: each rule against its exact definition", "[index]") {
  using boost::multiprecision::cpp_int;
  for (std::int64_t s : {255, 256, 300, 338, 1000, 65280, 130559, 130560, 130561, 1 << 24, (1 << 24) + 1}) {
    for (int e = 0; e <= 255; ++e) {
      INFO("S " << s << " E " << e);
      CHECK(normalize(e, s, 255, Normalization::floor) == static_cast<std::int32_t>(255 * e / s));
      CHECK(normalize(e, s, 127, Normalization::floor) == static_cast<std::int32_t>(127 * e / s));
      const float q = static_cast<float>(255 * e) / static_cast<float>(s);
      CHECK(normalize(e, s, 255, Normalization::f32_rne) == static_cast<std::int32_t>(std::nearbyint(q)));
      const std::int64_t ns = s == 255 ? -1 : static_cast<std::int64_t>(std::floor(65280.0 / static_cast<double>(s) + 0.5));
      CHECK(normalize(e, s, 255, Normalization::q8_reciprocal) == (s == 255 ? e : static_cast<std::int32_t>((e * ns + 128) >> 8)));
    }
  }
  CHECK(normalize(255, 130561, 255, Normalization::q8_reciprocal) == 0);  // ns rounds to 0 once S > 512 * 255
}

TEST_CASE("masks: masked entries are 0, a fully masked row is all zeros", "[index]") {
  const auto params = preset(CintRounding::round, LutRounding::round, IndexRule::floor, Normalization::floor);
  RowMatrixXi32 a(2, 4);
  a << 10, 1000000, 5, 7, 1, 2, 3, 4;
  RowMatrixXb valid(2, 4);
  valid << true, false, true, true, false, false, false, false;
  const RowMatrixXi32 p = index_softmax(a, 50, params, valid);
  CHECK(p(0, 1) == 0);
  CHECK(p(0, 0) > p(0, 3));  // the huge masked logit did not become the row max
  CHECK(p(0, 0) > 0);
  CHECK(p.row(1).isZero());
  CHECK_THROWS_AS(index_softmax(a, 50, params, RowMatrixXb(1, 4)), std::invalid_argument);
}

TEST_CASE("extreme logits: |a| up to 2^31 - 1, L up to 70000, no overflow anywhere", "[index]") {
  auto params = preset(CintRounding::round, LutRounding::round, IndexRule::floor, Normalization::floor);
  RowMatrixXi32 a(1, 4);
  a << std::numeric_limits<std::int32_t>::max(), std::numeric_limits<std::int32_t>::min(), 0, -1;
  for (IndexRule rule : {IndexRule::floor, IndexRule::round, IndexRule::floor_f32, IndexRule::q26_round, IndexRule::q26_floor}) {
    params.index_rule = rule;
    const RowMatrixXi32 p = index_softmax(a, kCintMax, params);
    CHECK(p(0, 0) >= p(0, 2));
    CHECK(p(0, 1) <= p(0, 3));
  }
  // 70000 equal logits: S = 255 * 70000 > 2^24 (no 16-bit wrap); floor gives 0 everywhere, q8 gives ns = 0.
  const RowMatrixXi32 flat = RowMatrixXi32::Zero(1, 70000);
  params.index_rule = IndexRule::floor;
  CHECK(index_softmax(flat, 100, params).maxCoeff() == 0);
  params.normalization = Normalization::f32_rne;
  CHECK(index_softmax(flat, 100, params).maxCoeff() == 0);
  RowMatrixXi32 two = RowMatrixXi32::Zero(1, 2);
  params.normalization = Normalization::floor;
  CHECK(index_softmax(two, 100, params) == (RowMatrixXi32(1, 2) << 127, 127).finished());
}

TEST_CASE("the index method in the registry: presets, integer and FP paths", "[index]") {
  const Registry& r = reference_registry();
  CHECK(r.canonical(parse_method_spec("index@upstream-sim")) ==
        "index:b=5,c=6.6,cint=trunc,lut=round,index=floor-f32,norm=f32-rne,p=u8");
  CHECK_THROWS_AS(r.create("index:p=s8,norm=q8-reciprocal"), SpecError);
  RowMatrixXi32 golden(1, 6);
  for (int j = 0; j < 6; ++j) golden(0, j) = kGoldenRow[j];
  const IntegerLogits in{golden, std::int64_t{100}, std::nullopt};
  const IntegerSoftmaxResult sim = r.create("index@upstream-sim")->softmax_integer(in);
  REQUIRE(sim.raw);
  CHECK(sim.raw->dtype == DType::u8);
  CHECK(sim.raw_scale == 255);
  CHECK(sim.probabilities(0, 0) == 192.0 / 255);
  // alpha instead of cint. 6.6 / 0.066 is 99.99999999999999 in double: truncation (upstream-sim) gives c_int = 99,
  // rounding gives 100, and the NEON preset then reproduces its golden vector.
  CHECK(cint_from_alpha(6.6, 0.066, CintRounding::trunc) == 99);
  IntegerLogits by_alpha{in.values, std::nullopt, 0.066};
  CHECK(r.create("index@upstream-sim")->softmax_integer(by_alpha).probabilities != sim.probabilities);
  CHECK(r.create("index@upstream-neon")->softmax_integer(by_alpha).probabilities ==
        r.create("index@upstream-neon")->softmax_integer(in).probabilities);
  const IntegerSoftmaxResult s8 = r.create("index:p=s8")->softmax_integer(in);
  CHECK(s8.raw->dtype == DType::i8);
  CHECK(s8.raw_scale == 127);
  // int16 and int8 buffers are read as they are, row by row: the same bits as their int32 values. Two rows (the
  // golden row and the same row less 400, which fits int8) so that a wrong row stride shows.
  RowMatrixXi32 two(2, 6);
  two.row(0) = golden.row(0);
  two.row(1) = golden.row(0).array() - 400;
  std::vector<std::int16_t> w16(two.data(), two.data() + two.size());
  const std::vector<std::int8_t> w8 = {100, 80, 50, 20, 0, -100, 100, 80, 50, 20, 0, -100};
  const IntegerLogits in16{{w16.data(), 2, 6}, std::int64_t{100}, std::nullopt};
  const IntegerLogits in8{{w8.data(), 2, 6}, std::int64_t{100}, std::nullopt};
  CHECK(in16.values.dtype() == DType::i16);
  for (Eigen::Index i = 0; i < two.rows(); ++i)
    for (Eigen::Index j = 0; j < two.cols(); ++j) CHECK(in16.values(i, j) == two(i, j));
  CHECK(in8.values(1, 5) == -100);
  const IntegerSoftmaxResult p32 = r.create("index@upstream-neon")->softmax_integer(IntegerLogits{two, std::int64_t{100}, std::nullopt});
  CHECK(p32.probabilities.row(0) == p32.probabilities.row(1));  // shift-invariant: the check below compares real rows
  for (const IntegerLogits* narrow : {&in16, &in8}) {
    const IntegerSoftmaxResult pn = r.create("index@upstream-neon")->softmax_integer(*narrow);
    CHECK(pn.probabilities == p32.probabilities);
    CHECK(pn.raw->bytes == p32.raw->bytes);
  }
  // FP logits: IndexSoftmaxOnly. Logits 0.066 * a reproduce the upstream-sim indices with c = 6.6 in double.
  RowMatrixXd x(1, 6);
  for (int j = 0; j < 6; ++j) x(0, j) = 0.066 * kGoldenRow[j];
  const RowMatrixXd pf = r.create("index:lut=round")->softmax_rows(x);
  CHECK(pf(0, 0) == Approx(255.0 / 338));
  CHECK(pf.sum() == Approx(1.0));
  CHECK_THROWS_AS(r.create("fp32")->softmax_integer(in), SpecError);
}

TEST_CASE("IndexSoftmax validate(): the one check the registry, the reference and the kernels share") {
  IndexSoftmaxParams ok;
  CHECK_NOTHROW(validate(ok));
  CHECK_NOTHROW(validate(ok, 1));
  CHECK_NOTHROW(validate(ok, kCintMax));
  CHECK_THROWS_AS(validate(ok, 0), std::invalid_argument);
  CHECK_THROWS_AS(validate(ok, kCintMax + 1), std::invalid_argument);
  for (const int bits : {0, 9, -1}) {
    IndexSoftmaxParams p;
    p.bits = bits;
    CHECK_THROWS_AS(validate(p), std::invalid_argument);
    CHECK_THROWS_AS(index_lut(bits, 6.6, LutRounding::floor), std::invalid_argument);  // the reference's table
  }
  for (const double c : {0.0, -1.0, std::nan(""), static_cast<double>(INFINITY)}) {
    IndexSoftmaxParams p;
    p.c = c;
    CHECK_THROWS_AS(validate(p), std::invalid_argument);
  }
  IndexSoftmaxParams q8s8;
  q8s8.normalization = Normalization::q8_reciprocal;
  q8s8.p_format = PFormat::s8;
  CHECK_THROWS_AS(validate(q8s8), std::invalid_argument);
  q8s8.p_format = PFormat::u8;
  CHECK_NOTHROW(validate(q8s8));
  // The registry's parser reports the same refusal as a SpecError; the reference row refuses a c_int out of range.
  CHECK_THROWS_AS(reference_registry().create("index:norm=q8-reciprocal,p=s8"), SpecError);
  const RowMatrixXi32 s = RowMatrixXi32::Zero(1, 4);
  CHECK_THROWS_AS(index_softmax(s, 0, ok), std::invalid_argument);
}

// The matrix units no machine here has (Blackwell, Ada, CDNA3) against vectors computed from MMA-Sim's published
// bit-accurate model (not measured on a GPU: tests/fixtures/mmasim/README.md): every such preset bit for bit on the
// embedded subset, and on the whole file where ../shared/data/mmasim is present; the H100's HMMA exponent rule on
// f16 subnormal operands (the probe set measured on an H100); and the rules of the new step kinds, case by case.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "qattn/reference/lowp_float.h"
#include "qattn/reference/mma.h"
#include "qattn/reference/mma_vectors.h"
#include "qattn/tensor_io.h"

namespace {

namespace fs = std::filesystem;
using qattn::ref::MmaModel;
using qattn::ref::MmaVectorSet;

const fs::path kMmaSimSubset = fs::path(QATTN_FIXTURES) / "mmasim" / "mmasim_subset.safetensors";

// Every set against the preset its name designates; returns the presets seen, with the outputs each checked.
std::map<std::string, std::size_t> check_named_sets(const fs::path& file) {
  const std::vector<MmaVectorSet> sets = qattn::ref::mma_vector_sets(qattn::read_tensor_file(file), file.string());
  std::map<std::string, std::size_t> seen;
  for (const MmaVectorSet& set : sets) {
    const std::string preset = qattn::ref::mma_set_preset(set.name);
    INFO(file.string() << ": set " << set.name);
    REQUIRE(!preset.empty());
    const qattn::ref::MmaAgreement r = qattn::ref::mma_agreement(qattn::ref::mma_preset(preset), set);
    INFO(preset << ": " << r.equal << " of " << r.outputs << " bit-equal, max rel. error " << r.max_rel_error);
    CHECK(r.outputs == set.batch * set.rows * set.cols);
    CHECK(r.equal == r.outputs);
    seen[preset] += r.outputs;
  }
  return seen;
}

const std::set<std::string> kMmaSimPresets{
    "b200-tcgen05-f16", "b200-tcgen05-bf16", "b200-tcgen05-f16-acc16", "b200-tcgen05-e4m3", "b200-tcgen05-e5m2",
    "b200-mxf8-e4m3",   "b200-mxf4",         "b200-nvf4",              "ada-mma-e4m3",      "mi300-mfma-f16",
    "mi300-mfma-bf16",  "mi300-mfma-e4m3fnuz"};

TEST_CASE("every MMA-Sim preset reproduces the embedded subset of its vectors bit for bit", "[mma][mmasim]") {
  const std::map<std::string, std::size_t> seen = check_named_sets(kMmaSimSubset);
  std::set<std::string> names;
  for (const auto& [name, outputs] : seen) {
    names.insert(name);
    CHECK(outputs >= 1536);  // 3 sets x 4 tests x 128 outputs at least
  }
  CHECK(names == kMmaSimPresets);
}

TEST_CASE("every MMA-Sim preset reproduces the whole vector file, where present", "[mma][mmasim]") {
  const fs::path file = fs::path(QATTN_SHARED_DATA) / "mmasim" / "mmasim_vectors.npz";
  if (!fs::exists(file)) {
    WARN("the whole MMA-Sim vector file is not here (" << file.string() << "): the embedded subset only");
    return;
  }
  if (!qattn::have_npz()) {
    WARN("built without libzip: " << file.string() << " cannot be read here");
    return;
  }
  std::size_t outputs = 0;
  for (const auto& [name, n] : check_named_sets(file)) outputs += n;
  CHECK(outputs == 138240);
}

TEST_CASE("the MMA-Sim presets say where their validation comes from", "[mma][mmasim]") {
  for (const MmaModel& m : qattn::ref::mma_presets()) {
    INFO(m.name);
    const bool from_model = kMmaSimPresets.count(m.name) == 1;
    CHECK(m.measured == (m.name.rfind("h100-", 0) == 0));
    if (from_model) {
      CHECK(m.validated);
      CHECK(m.provenance.find("MMA-Sim model, not measured here") != std::string::npos);
    }
  }
}

// The probe set an H100 returned for f16 subnormal operands (experiments/data/h100-mma/README.md): the field rule
// (a subnormal at binary16's minimum exponent -14, a zero operand at -126) reproduces all of it, the leading-bit rule
// qattn had before 32,459 of the 32,768 outputs.
TEST_CASE("f16 subnormal inputs: h100-hmma-f16 reproduces every probe output, the leading-bit rule 32459", "[mma][h100]") {
  const fs::path file = fs::path(QATTN_SAMPLE_DATA) / "h100-mma" / "probe_f16f32_subnormal.safetensors";
  const std::vector<MmaVectorSet> sets = qattn::ref::mma_vector_sets(qattn::read_tensor_file(file), file.string());
  REQUIRE(sets.size() == 1);
  const MmaModel& hmma = qattn::ref::mma_preset("h100-hmma-f16");
  CHECK(hmma.exponent_rule == qattn::ref::MmaExponentRule::field_zero_low);
  const qattn::ref::MmaAgreement r = qattn::ref::mma_agreement(hmma, sets[0]);
  CHECK(r.outputs == 32768);
  CHECK(r.equal == 32768);
  MmaModel leading = hmma;
  leading.exponent_rule = qattn::ref::MmaExponentRule::leading_bit;
  const qattn::ref::MmaAgreement old = qattn::ref::mma_agreement(leading, sets[0]);
  CHECK(old.equal == 32459);
}

// ---- the step kinds, case by case --------------------------------------------------------------------------------

std::uint16_t code_of(double x, const qattn::ref::LowpFormat& f) {
  return static_cast<std::uint16_t>(qattn::ref::lowp_encode(x, f));
}

TEST_CASE("MX scales: UE8M0 exponents add to every product's exponent, and a NaN scale gives NaN", "[mma][mmasim]") {
  const MmaModel& mx = qattn::ref::mma_preset("b200-mxf8-e4m3");
  const auto& e4m3 = qattn::ref::fp8_e4m3fn();
  std::vector<std::uint16_t> a(32, code_of(1.0, e4m3)), b(32, code_of(1.5, e4m3));
  const std::vector<std::uint8_t> one{127}, four{129}, half{126}, nan{0xff};
  CHECK(qattn::ref::mma_dot(mx, a, b, 0.0f, one, one) == 48.0f);
  CHECK(qattn::ref::mma_dot(mx, a, b, 0.0f, four, half) == 96.0f);   // 2^2 * 2^-1
  CHECK(qattn::ref::mma_dot(mx, a, b, 1.0f, one, one) == 49.0f);
  CHECK(std::isnan(qattn::ref::mma_dot(mx, a, b, 0.0f, nan, one)));
  // The scales move E: with C = 1 and products scaled to 2^-30 x 1.5 each, the step's E is C's (0) and 25 fraction
  // bits keep nothing of the products (2^-30 < 2^-25); unscaled they would add 48.
  const std::vector<std::uint8_t> tiny{97};  // 2^-30
  CHECK(qattn::ref::mma_dot(mx, a, b, 1.0f, tiny, one) == 1.0f);
}

TEST_CASE("NVFP4: the UE4M3 scale's sign bit is ignored, groups align by the scales' exponents", "[mma][mmasim]") {
  const MmaModel& nv = qattn::ref::mma_preset("b200-nvf4");
  const auto& e2m1 = qattn::ref::fp4_e2m1();
  const auto& e4m3 = qattn::ref::fp8_e4m3fn();
  std::vector<std::uint16_t> a(64, code_of(6.0, e2m1)), b(64, code_of(6.0, e2m1));
  const auto s = static_cast<std::uint8_t>(code_of(1.5, e4m3));
  const std::vector<std::uint8_t> sa(4, s), sb(4, static_cast<std::uint8_t>(code_of(1.0, e4m3)));
  const std::vector<std::uint8_t> sa_signed(4, static_cast<std::uint8_t>(s | 0x80));
  const float d = qattn::ref::mma_dot(nv, a, b, 0.0f, sa, sb);
  CHECK(d == 64 * 36 * 1.5f);
  CHECK(qattn::ref::mma_dot(nv, a, b, 0.0f, sa_signed, sb) == d);
  // Alignment by the scale exponents only: a group of 16 products of 6 x 6 = 36 sums to 576 (2^9.17) at scale
  // exponent 0, so E = 0 and C = 2^-36 (below E - 35) is cut to 0 however large the groups' sums are.
  CHECK(qattn::ref::mma_dot(nv, a, b, std::ldexp(1.0f, -36), sa, sb) == d);
  CHECK(qattn::ref::mma_dot(nv, a, b, std::ldexp(1.0f, -35), sa, sb) == d);  // 2^-35 kept, lost in RZ to float32
  std::vector<std::uint16_t> zero(64, 0);
  CHECK(qattn::ref::mma_dot(nv, zero, b, std::ldexp(1.0f, -35), sa, sb) == std::ldexp(1.0f, -35));
  CHECK(qattn::ref::mma_dot(nv, zero, b, std::ldexp(1.0f, -36), sa, sb) == 0.0f);
}

TEST_CASE("CDNA3 FP8: C more than 25 binades below the group's sum is dropped, while f16 keeps it", "[mma][mmasim]") {
  const MmaModel& fp8 = qattn::ref::mma_preset("mi300-mfma-e4m3fnuz");
  const MmaModel& f16 = qattn::ref::mma_preset("mi300-mfma-f16");
  const auto& fnuz = qattn::ref::fp8_e4m3fnuz();
  std::vector<std::uint16_t> a(16, 0), b(16, 0);
  a[0] = code_of(128.0, fnuz), b[0] = code_of(128.0, fnuz);  // one product 2^14: E_g = 14
  const float c_kept = std::ldexp(1.0f, -11), c_dropped = std::ldexp(1.0f, -12);  // 25 and 26 binades below
  CHECK(qattn::ref::mma_dot(fp8, a, b, c_kept, {}, {}) == 16384.0f + c_kept);
  CHECK(qattn::ref::mma_dot(fp8, a, b, c_dropped, {}, {}) == 16384.0f);
  // f16: no drop rule; C at 2^-12 is 2^-26 relative, kept in the 31-bit sum, then rounded away onto float32 (RNE)
  const auto& h = qattn::ref::fp16_binary16();
  std::vector<std::uint16_t> ha(8, 0), hb(8, 0);
  ha[0] = code_of(128.0, h), hb[0] = code_of(128.0, h);
  CHECK(qattn::ref::mma_dot(f16, ha, hb, std::ldexp(1.0f, -9), {}, {}) == 16384.0f + std::ldexp(1.0f, -9));
  // downward truncation of C at 24 fraction bits below E = 14: -2^-11 - 2^-12 floors to -2^-10 (toward -inf)
  CHECK(qattn::ref::mma_dot(f16, ha, hb, -std::ldexp(1.5f, -11), {}, {}) == 16384.0f - std::ldexp(1.0f, -10));
  // the even/odd split: the 0x80 code is FNUZ's NaN
  std::vector<std::uint16_t> nan_a = a;
  nan_a[3] = 0x80;
  CHECK(std::isnan(qattn::ref::mma_dot(fp8, nan_a, b, 0.0f, {}, {})));
}

TEST_CASE("Ada's FP8 mma keeps 13 fraction bits per step of 16, Blackwell's tcgen05 keeps 25 per step of 32", "[mma][mmasim]") {
  const MmaModel& ada = qattn::ref::mma_preset("ada-mma-e4m3");
  const MmaModel& b200 = qattn::ref::mma_preset("b200-tcgen05-e4m3");
  const auto& e4m3 = qattn::ref::fp8_e4m3fn();
  std::vector<std::uint16_t> a(32, code_of(std::ldexp(1.0, -9), e4m3)), b(32, code_of(1.0, e4m3));
  a[0] = code_of(256.0, e4m3);  // E = 8: 2^-9 is 17 binades below, below 13 fraction bits
  CHECK(qattn::ref::mma_dot(ada, a, b, 0.0f) == 256.0f);  // the second step's E is acc's (8): its products are cut too
  a[0] = code_of(std::ldexp(1.0, -9), e4m3);
  a[16] = code_of(256.0, e4m3);  // the large product in the second step: the first step's 16 small ones survive
  CHECK(qattn::ref::mma_dot(ada, a, b, 0.0f) == 256.0f + 16 * std::ldexp(1.0f, -9));
  CHECK(qattn::ref::mma_dot(b200, a, b, 0.0f) == 256.0f + 31 * std::ldexp(1.0f, -9));
}

TEST_CASE("an exact zero sum is +0 whatever the signs of zero C and zero products", "[mma][mmasim]") {
  const auto& h = qattn::ref::fp16_binary16();
  std::vector<std::uint16_t> neg_zero(16, code_of(-0.0, h)), one(16, code_of(1.0, h));
  for (const char* name : {"b200-tcgen05-f16", "h100-hmma-f16", "mi300-mfma-f16"}) {
    INFO(name);
    const float d = qattn::ref::mma_dot(qattn::ref::mma_preset(name), neg_zero, one, -0.0f);
    CHECK(d == 0.0f);
    CHECK(!std::signbit(d));
  }
  // a nonzero sum that rounds away keeps its sign: -2^-150 of products is below float32's least subnormal (RZ: -0)
  const MmaModel& b200 = qattn::ref::mma_preset("b200-tcgen05-f16");
  std::vector<std::uint16_t> tiny(16, 0), tiny_b(16, 0);
  tiny[0] = 0x8001, tiny_b[0] = 0x0001;  // -2^-24 x 2^-24 = -2^-48
  CHECK(qattn::ref::mma_dot(b200, tiny, tiny_b, 0.0f) == -std::ldexp(1.0f, -48));
}

TEST_CASE("E2M1 and E4M3FNUZ codes decode and encode as their specifications say", "[lowp][mmasim]") {
  const auto& e2m1 = qattn::ref::fp4_e2m1();
  const double values[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  for (std::uint32_t c = 0; c < 16; ++c) {
    const double v = (c & 8 ? -1 : 1) * values[c & 7];
    CHECK(qattn::ref::lowp_decode(c, e2m1) == v);
    if (c != 8) CHECK(qattn::ref::lowp_encode(v, e2m1) == c);  // -0 encodes as 0x8 too: checked below
  }
  CHECK(qattn::ref::lowp_encode(-0.0, e2m1) == 8u);
  CHECK(e2m1.max_finite() == 6.0);
  CHECK(qattn::ref::lowp_round(7.0, e2m1, qattn::ref::LowpRounding::rne, qattn::ref::LowpOverflow::non_saturating) == 6.0);
  const auto& fnuz = qattn::ref::fp8_e4m3fnuz();
  CHECK(fnuz.max_finite() == 240.0);
  CHECK(std::isnan(qattn::ref::lowp_decode(0x80, fnuz)));
  CHECK(qattn::ref::lowp_decode(0x7f, fnuz) == 240.0);
  CHECK(qattn::ref::lowp_decode(0x01, fnuz) == std::ldexp(1.0, -10));
  CHECK(qattn::ref::lowp_encode(-0.0, fnuz) == 0u);
  CHECK(qattn::ref::lowp_encode(std::numeric_limits<double>::quiet_NaN(), fnuz) == 0x80u);
  CHECK(!std::signbit(qattn::ref::lowp_round(-1e-9, fnuz, qattn::ref::LowpRounding::rne,
                                              qattn::ref::LowpOverflow::saturate)));
  CHECK(std::isnan(qattn::ref::lowp_round(300.0, fnuz, qattn::ref::LowpRounding::rne,
                                          qattn::ref::LowpOverflow::non_saturating)));
}

}  // namespace

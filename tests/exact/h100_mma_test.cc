// The tensor-core MMA models (qattn/reference/mma.h) against what an H100 returned: every preset bit for bit on the
// embedded vectors (tests/fixtures/h100-mma), and on the whole measurement where it is present; the per-product FP22
// bound's measured distance from the hardware, as docs/mma.md states it.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "qattn/reference/mma.h"
#include "qattn/reference/mma_vectors.h"
#include "qattn/tensor_io.h"

namespace {

namespace fs = std::filesystem;
using qattn::ref::MmaModel;
using qattn::ref::MmaVectorSet;

const fs::path kEmbedded = fs::path(QATTN_FIXTURES) / "h100-mma";

// The whole measurement: $QATTN_H100_VECTORS, else ../shared/data/h100-fp8 beside the source tree.
std::optional<fs::path> full_vectors() {
  if (const char* v = std::getenv("QATTN_H100_VECTORS"); v != nullptr && *v != '\0') return fs::path(v);
  const fs::path shared = fs::path(QATTN_SHARED_DATA) / "h100-fp8";
  if (fs::is_directory(shared)) return shared;
  return std::nullopt;
}

// Which preset stands for which file, and which output variant of it ("" = every variant).
struct Stands {
  const char* file;
  const char* preset;
  const char* variant;
};
constexpr Stands kStands[] = {
    {"wgmma_cublaslt_e4m3", "h100-wgmma-e4m3", "fast"},
    {"wgmma_cublaslt_e4m3", "h100-wgmma-e4m3-promote", "default"},
    {"mma_sync_m16n8k32_e4m3", "h100-mma-e4m3", ""},
    {"mma_sync_m16n8k16_f16f32", "h100-hmma-f16", ""},
    {"mma_sync_m16n8k16_bf16f32", "h100-hmma-bf16", ""},
    {"mma_sync_m16n8k16_f16f16", "h100-hmma-f16-acc16", ""},
};

void check_bit_exact(const fs::path& file, const Stands& s) {
  const std::vector<MmaVectorSet> sets = qattn::ref::mma_vector_sets(qattn::read_tensor_file(file), file.string());
  const MmaModel& m = qattn::ref::mma_preset(s.preset);
  std::size_t checked = 0;
  for (const MmaVectorSet& set : sets) {
    if (*s.variant != '\0' && set.variant != s.variant) continue;
    const qattn::ref::MmaAgreement r = qattn::ref::mma_agreement(m, set);
    INFO(file.string() << ": " << s.preset << " on set " << set.name << " " << set.variant << ": " << r.equal << " of "
                       << r.outputs << " bit-equal, max rel. error " << r.max_rel_error);
    CHECK(r.outputs == set.batch * set.rows * set.cols);
    CHECK(r.equal == r.outputs);
    checked += r.outputs;
  }
  CHECK(checked > 0);
}

TEST_CASE("every H100 MMA preset reproduces the embedded H100 vectors bit for bit", "[mma][h100]") {
  for (const Stands& s : kStands) check_bit_exact(kEmbedded / (std::string(s.file) + ".safetensors"), s);
}

TEST_CASE("every preset that claims hardware validation stands for a vector file, and no other does", "[mma][h100]") {
  std::set<std::string> standing;
  for (const Stands& s : kStands) standing.insert(s.preset);
  for (const MmaModel& m : qattn::ref::mma_presets()) {
    INFO(m.name);
    CHECK(m.validated == (standing.count(m.name) == 1));
  }
}

TEST_CASE("every H100 MMA preset reproduces every vector of the whole measurement, where present", "[mma][h100]") {
  const std::optional<fs::path> dir = full_vectors();
  if (!dir) {
    WARN("the whole H100 measurement is not here (set QATTN_H100_VECTORS): the embedded subset only");
    return;
  }
  if (!qattn::have_npz()) {
    WARN("built without libzip: the .npz files of " << dir->string() << " cannot be read here");
    return;
  }
  for (const Stands& s : kStands) check_bit_exact(*dir / (std::string(s.file) + ".npz"), s);
}

TEST_CASE("the fast and promoting wgmma presets differ once K passes one promotion interval (128)", "[mma][h100]") {
  const fs::path file = kEmbedded / "wgmma_cublaslt_e4m3.safetensors";
  const std::vector<MmaVectorSet> sets = qattn::ref::mma_vector_sets(qattn::read_tensor_file(file), file.string());
  for (const MmaVectorSet& set : sets) {
    const MmaModel& other = qattn::ref::mma_preset(set.variant == "fast" ? "h100-wgmma-e4m3-promote" : "h100-wgmma-e4m3");
    const qattn::ref::MmaAgreement r = qattn::ref::mma_agreement(other, set);
    INFO(set.name << " " << set.variant << " under " << other.name << ": " << r.equal << " of " << r.outputs);
    if (set.depth <= 128) CHECK(r.equal == r.outputs);
    else CHECK(r.share() < 0.2);
  }
}

// Each rule of the fused step, on one hand-made dot product whose exact result the rule changes.
TEST_CASE("the fused step truncates each term toward zero below 2^(E - fraction bits), then the sum", "[mma]") {
  const MmaModel& wgmma = qattn::ref::mma_preset("h100-wgmma-e4m3");
  const MmaModel& fp22 = qattn::ref::mma_preset("per-product-fp22");
  const auto e4m3 = [](double v) { return static_cast<std::uint16_t>(qattn::ref::lowp_encode(v, qattn::ref::fp8_e4m3fn())); };
  // 1·1 + (-2^-9)·2^-6: E = 0, the second term (-2^-15) is below 2^-13 and truncates to 0, so D = 1; the per-product
  // bound rounds the exact 1 - 2^-15 toward zero onto 1 - 2^-14.
  const std::vector<std::uint16_t> a{e4m3(1), e4m3(-std::ldexp(1.0, -9))}, b{e4m3(1), e4m3(std::ldexp(1.0, -6))};
  CHECK(qattn::ref::mma_dot(wgmma, a, b, 0.0f) == 1.0f);
  CHECK(qattn::ref::mma_dot(fp22, a, b, 0.0f) == static_cast<float>(1 - std::ldexp(1.0, -14)));
  // 448·448 + 3·8: E = 16, both terms are multiples of 2^3 and kept; the sum 200728 needs 18 bits and keeps 14,
  // toward zero: 200720 (to nearest it would be 200736). And 448·448 + 1·1: the 1 is below 2^3 and truncates away.
  const std::vector<std::uint16_t> a2{e4m3(448), e4m3(3)}, b2{e4m3(448), e4m3(8)};
  CHECK(qattn::ref::mma_dot(wgmma, a2, b2, 0.0f) == 200720.0f);
  const std::vector<std::uint16_t> a3{e4m3(448), e4m3(1)}, b3{e4m3(448), e4m3(1)};
  CHECK(qattn::ref::mma_dot(wgmma, a3, b3, 0.0f) == 200704.0f);
  // The accumulator is a term too: C = 2^20 sets E = 20, and 1·1 is below 2^(20-13): D = C.
  CHECK(qattn::ref::mma_dot(wgmma, std::vector<std::uint16_t>{e4m3(1)}, std::vector<std::uint16_t>{e4m3(1)},
                            1048576.0f) == 1048576.0f);
  // HMMA with C added after the two halves (h100-mma-e4m3): C + 1 rounds to nearest even in float32.
  const MmaModel& mma8 = qattn::ref::mma_preset("h100-mma-e4m3");
  std::vector<std::uint16_t> ones(4, e4m3(0)), unit(4, e4m3(0));
  ones[0] = e4m3(1), unit[0] = e4m3(1);
  CHECK(qattn::ref::mma_dot(mma8, ones, unit, 16777216.0f) == 16777216.0f);     // 2^24 + 1: a tie, to even
  CHECK(qattn::ref::mma_dot(mma8, ones, unit, 16777218.0f) == 16777220.0f);     // 2^24 + 3: a tie, up to even
}

// Median relative error against the exact sum, over the outputs of one wgmma set.
double median_rel_error(const std::vector<double>& got, const std::vector<double>& exact) {
  std::vector<double> e;
  for (std::size_t i = 0; i < got.size(); ++i)
    if (exact[i] != 0) e.push_back(std::fabs(got[i] - exact[i]) / std::fabs(exact[i]));
  std::nth_element(e.begin(), e.begin() + static_cast<std::ptrdiff_t>(e.size() / 2), e.end());
  return e[e.size() / 2];
}

// docs/mma.md "The per-product bound", measured on wgmma_cublaslt_e4m3 (fast): the share of outputs the per-product
// FP22 model gets bit-equal to the H100, and its median relative error against the exact sum over the hardware's.
TEST_CASE("per-product-fp22 against the H100's fast wgmma: the agreement and error ratio docs/mma.md states", "[mma][h100]") {
  struct Row {
    std::size_t k;
    double share_percent;  // rounded to 0.01
    double error_ratio;    // rounded to 0.1
  };
  const Row table[] = {{32, 3.49, 6.3}, {64, 1.54, 9.6}, {128, 0.59, 14.7},
                       {256, 0.24, 21.1}, {1024, 0.02, 42.7}, {4096, 0.00, 85.1}};
  const fs::path file = kEmbedded / "wgmma_cublaslt_e4m3.safetensors";
  const std::vector<MmaVectorSet> sets = qattn::ref::mma_vector_sets(qattn::read_tensor_file(file), file.string());
  const MmaModel& fp22 = qattn::ref::mma_preset("per-product-fp22");
  for (const Row& row : table) {
    const auto it = std::find_if(sets.begin(), sets.end(),
                                 [&](const MmaVectorSet& s) { return s.depth == row.k && s.variant == "fast"; });
    REQUIRE(it != sets.end());
    const MmaVectorSet& s = *it;
    std::vector<double> exact, hw, bound;
    std::size_t equal = 0;
    for (std::size_t i = 0; i < s.rows; ++i)
      for (std::size_t j = 0; j < s.cols; ++j) {
        const std::span<const std::uint16_t> a(s.a.data() + i * s.depth, s.depth), b(s.bt.data() + j * s.depth, s.depth);
        // Every E4M3 product is a multiple of 2^-18 below 2^18, so the sum in units of 2^-18 is an exact int64.
        std::int64_t units = 0;
        for (std::size_t k = 0; k < s.depth; ++k)
          units += static_cast<std::int64_t>(std::ldexp(qattn::ref::lowp_decode(a[k], qattn::ref::fp8_e4m3fn()) *
                                                            qattn::ref::lowp_decode(b[k], qattn::ref::fp8_e4m3fn()),
                                                        18));
        exact.push_back(std::ldexp(static_cast<double>(units), -18));
        hw.push_back(s.d[i * s.cols + j]);
        bound.push_back(qattn::ref::mma_dot(fp22, a, b, 0.0f));
        equal += std::bit_cast<std::uint32_t>(static_cast<float>(bound.back())) ==
                 std::bit_cast<std::uint32_t>(static_cast<float>(hw.back()));
      }
    const double share = 100.0 * static_cast<double>(equal) / static_cast<double>(exact.size());
    const double ratio = median_rel_error(bound, exact) / median_rel_error(hw, exact);
    INFO("K = " << row.k << ": per-product-fp22 bit-equal to the H100 in " << share << " % of outputs, median relative "
                << "error " << ratio << " x the hardware's");
    CHECK(std::round(share * 100) / 100 == Approx(row.share_percent).margin(1e-9));
    CHECK(std::round(ratio * 10) / 10 == Approx(row.error_ratio).margin(1e-9));
  }
}

}  // namespace

namespace {

// The case the H100 vectors left open, measured by experiments/mma-probe: f16 subnormal inputs with an f32
// accumulator. The leading-bit model reproduces 32,459 of the 32,768 outputs; the rest differ by a few units of
// 2^(E-25) (docs/mma.md "Open: f16 subnormal inputs"). The count is pinned so that a change of the model shows here.
TEST_CASE("f16 subnormal inputs: h100-hmma-f16 reproduces 32459 of 32768 probe outputs (an open case)", "[mma][h100]") {
  const fs::path file = kEmbedded / "probe_f16f32_subnormal.safetensors";
  const std::vector<MmaVectorSet> sets = qattn::ref::mma_vector_sets(qattn::read_tensor_file(file), file.string());
  REQUIRE(sets.size() == 1);
  const qattn::ref::MmaAgreement r = qattn::ref::mma_agreement(qattn::ref::mma_preset("h100-hmma-f16"), sets[0]);
  CHECK(r.outputs == 32768);
  CHECK(r.equal == 32459);
  CHECK(r.max_rel_error < 3e-5);
}

}  // namespace

// float32 -> FP8 conversions against the codes an H100 wrote (tests/fixtures/h100-fp8/README.md): PTX
// cvt.rn.satfinite over every float32 (both sides of every code change the GPU recorded), and torch's casts over the
// measured patterns (the fixture's subset).
#include <catch2/catch.hpp>

#include <bit>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "qattn/reference/lowp_float.h"
#include "qattn/tensor_io.h"

namespace {

using qattn::ref::Fp8Cast;
using qattn::ref::LowpFormat;

const std::filesystem::path kH100 = std::filesystem::path(QATTN_FIXTURES) / "h100-fp8";

std::uint8_t convert(std::uint32_t bits, const LowpFormat& f, Fp8Cast cast) {
  return qattn::ref::fp8_from_float(std::bit_cast<float>(bits), f, cast);
}

std::string hex(std::uint32_t v) {
  std::ostringstream s;
  s << std::hex << v;
  return s.str();
}

// Every code change of cvt.rn.satfinite: at pattern u the GPU writes `code`, at u - 1 the previous code of the half,
// and in the middle of each interval the interval's code.
TEST_CASE("fp8_from_float ptx_satfinite is cvt.rn.satfinite on every float32 (both sides and the middle of every interval)",
          "[lowp][h100]") {
  std::ifstream in(kH100 / "cvt_satfinite_transitions.txt");
  REQUIRE(in);
  std::map<std::string, std::vector<std::pair<std::uint32_t, std::uint32_t>>> halves;  // "e4m3 +" -> (u, code)
  std::string line, current;
  while (std::getline(in, line)) {
    if (line.rfind("## ", 0) == 0) {
      std::istringstream h(line.substr(3));
      std::string fmt, sign;
      h >> fmt >> sign;
      current = fmt + (sign == "positive" ? " +" : " -");
      continue;
    }
    if (line.empty() || line[0] == '#') continue;
    std::istringstream l(line);
    std::string fmt, u, code;
    l >> fmt >> u >> code;
    halves[current].emplace_back(static_cast<std::uint32_t>(std::stoul(u, nullptr, 16)),
                                 static_cast<std::uint32_t>(std::stoul(code, nullptr, 16)));
  }
  REQUIRE(halves.size() == 4);
  std::size_t checked = 0;
  for (const auto& [name, changes] : halves) {
    const LowpFormat& f = name.rfind("e4m3", 0) == 0 ? qattn::ref::fp8_e4m3fn() : qattn::ref::fp8_e5m2();
    REQUIRE(changes.size() >= 125);
    for (std::size_t i = 0; i < changes.size(); ++i) {
      const auto [u, code] = changes[i];
      INFO(name << ": float32 pattern 0x" << hex(u));
      CHECK(convert(u, f, Fp8Cast::ptx_satfinite) == code);
      if (i > 0) CHECK(convert(u - 1, f, Fp8Cast::ptx_satfinite) == changes[i - 1].second);
      if (i + 1 < changes.size())  // the middle of the interval the code holds on
        CHECK(convert(u + (changes[i + 1].first - u) / 2, f, Fp8Cast::ptx_satfinite) == code);
      checked += 3;
    }
    // the last pattern of the half (a NaN) keeps the last code
    const std::uint32_t last = name.back() == '+' ? 0x7fffffffu : 0xffffffffu;
    CHECK(convert(last, f, Fp8Cast::ptx_satfinite) == changes.back().second);
  }
  CHECK(checked > 1000);
}

// `bits` holds float32 patterns (as int32 or uint32), `codes` what the GPU's torch casts gave for each (uint8).
void check_torch_casts(const qattn::Tensor& bits, const std::map<std::string, qattn::Tensor>& codes,
                       const std::string& source) {
  const std::size_t n = bits.bytes.size() / 4;
  REQUIRE(n > 10000);
  for (const auto& [key, f] : {std::pair<std::string, const LowpFormat*>{"e4m3fn", &qattn::ref::fp8_e4m3fn()},
                                {"e5m2", &qattn::ref::fp8_e5m2()}}) {
    const qattn::Tensor& c = codes.at(key);
    REQUIRE(c.bytes.size() == n);
    std::size_t wrong = 0;
    std::uint32_t first_wrong = 0;
    for (std::size_t i = 0; i < n; ++i) {
      std::uint32_t u;
      std::memcpy(&u, bits.bytes.data() + 4 * i, 4);
      const auto want = std::to_integer<std::uint8_t>(c.bytes[i]);
      if (convert(u, *f, Fp8Cast::torch) != want && wrong++ == 0) first_wrong = u;
    }
    INFO(source << ", " << key << ": first differing float32 pattern 0x" << hex(first_wrong));
    CHECK(wrong == 0);
  }
}

// The embedded subset: plain .npy files (bits.npy as int32, e4m3fn.npy, e5m2.npy), read on builds without libzip too.
TEST_CASE("fp8_from_float torch is torch's .to(float8_e4m3fn / float8_e5m2) on the GPU", "[lowp][h100]") {
  const std::filesystem::path dir = kH100 / "torch_casts_subset";
  check_torch_casts(qattn::read_npy(dir / "bits.npy"),
                    {{"e4m3fn", qattn::read_npy(dir / "e4m3fn.npy")}, {"e5m2", qattn::read_npy(dir / "e5m2.npy")}},
                    dir.string());
}

// All 2^18 measured patterns, where the whole measurement is present (QATTN_H100_VECTORS or ../shared/data/h100-fp8).
TEST_CASE("fp8_from_float torch on every pattern of the whole measurement, where present", "[lowp][h100]") {
  std::filesystem::path dir = std::filesystem::path(QATTN_SHARED_DATA) / "h100-fp8";
  if (const char* v = std::getenv("QATTN_H100_VECTORS"); v != nullptr && *v != '\0') dir = v;
  const std::filesystem::path file = dir / "torch_casts.npz";
  if (!std::filesystem::exists(file) || !qattn::have_npz()) {
    WARN(file.string() << " is not here, or this build has no .npz support: the embedded subset only");
    return;
  }
  std::map<std::string, qattn::Tensor> by;
  for (auto& t : qattn::read_npz(file)) by[t.name] = std::move(t.tensor);
  REQUIRE(by.count("bits"));
  CHECK(by.at("bits").dtype == qattn::DType::u32);
  check_torch_casts(by.at("bits"), by, file.string());
}

TEST_CASE("fp8_from_float: the rules the H100 data shows, stated", "[lowp][h100]") {
  const LowpFormat& e4m3 = qattn::ref::fp8_e4m3fn();
  const LowpFormat& e5m2 = qattn::ref::fp8_e5m2();
  CHECK(qattn::ref::fp8_from_float(464.0f, e4m3, Fp8Cast::torch) == 0x7e);       // the tie rounds to 448 (even)
  CHECK(qattn::ref::fp8_from_float(464.5f, e4m3, Fp8Cast::torch) == 0x7f);       // beyond: NaN
  CHECK(qattn::ref::fp8_from_float(-1e6f, e4m3, Fp8Cast::torch) == 0xff);        // a negative overflow: -NaN
  CHECK(qattn::ref::fp8_from_float(-1e6f, e4m3, Fp8Cast::ptx_satfinite) == 0xfe);  // -448
  CHECK(qattn::ref::fp8_from_float(1e6f, e5m2, Fp8Cast::torch) == 0x7c);         // +inf
  CHECK(qattn::ref::fp8_from_float(-INFINITY, e5m2, Fp8Cast::ptx_satfinite) == 0xfb);  // -57344
  CHECK(qattn::ref::fp8_from_float(-NAN, e5m2, Fp8Cast::ptx_satfinite) == 0x7f);
  CHECK_THROWS_AS(qattn::ref::fp8_from_float(1.0f, qattn::ref::fp16_binary16(), Fp8Cast::torch), std::invalid_argument);
}

}  // namespace

namespace {

// e4m3_round_saturate is the bit-operation form of lowp_round(rne, saturate) used in SageAttention2's hot loop: the
// two agree on every 61st float32 pattern of both signs up to 2^10 (every E4M3 interval, its ties and the overflow
// range are hit many times over) and on every pattern within 64 of each tie.
TEST_CASE("e4m3_round_saturate is lowp_round(e4m3fn, rne, saturate)", "[lowp]") {
  const LowpFormat& f = qattn::ref::fp8_e4m3fn();
  auto agree = [&](std::uint32_t u) {
    const float x = std::bit_cast<float>(u);
    return std::bit_cast<std::uint32_t>(qattn::ref::e4m3_round_saturate(x)) ==
           std::bit_cast<std::uint32_t>(static_cast<float>(
               qattn::ref::lowp_round(x, f, qattn::ref::LowpRounding::rne, qattn::ref::LowpOverflow::saturate)));
  };
  std::size_t wrong = 0;
  std::uint32_t first = 0;
  for (std::uint32_t sign : {0u, 0x80000000u})
    for (std::uint32_t u = 0; u <= 0x44800000u; u += 61)
      if (!agree(sign | u) && wrong++ == 0) first = sign | u;
  for (std::uint32_t code = 0; code < 0x7e; ++code) {  // around the midpoint between each code and the next
    const double mid = (qattn::ref::lowp_decode(code, f) + qattn::ref::lowp_decode(code + 1, f)) / 2;
    const std::uint32_t u = std::bit_cast<std::uint32_t>(static_cast<float>(mid));
    for (std::uint32_t d = u - 64; d <= u + 64; ++d)
      if (!agree(d) && wrong++ == 0) first = d;
  }
  INFO("first differing pattern 0x" << hex(first));
  CHECK(wrong == 0);
}

}  // namespace

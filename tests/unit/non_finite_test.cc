// The registry's non-finite policy (qattn/method.h, docs/non-finite.md), checked on every registered method and
// preset without naming any: NaN and +-inf in Q, K, V and NaN / +inf in logits are refused with an InputError naming
// the tensor and index; -inf logits are masked; finite inputs that overflow a method's arithmetic give what its
// OverflowRule declares, never a finite wrong answer. The table in docs/non-finite.md must list every method with the
// rule its registry entry declares.
#include <catch2/catch.hpp>
#include <cmath>
#include <fstream>
#include <limits>
#include <map>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "qattn/error.h"
#include "qattn/reference/registry.h"
#include "support/registry_specs.h"
#include "qattn/tensor.h"
#include "support/random_matrix.h"

using namespace qattn;
using qattn::test::random_matrix;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Every method of the registry, bare (support/registry_specs.h) and under each preset.
std::vector<std::pair<std::string, const MethodEntry*>> all_specs() {
  std::vector<std::pair<std::string, const MethodEntry*>> out;
  for (const MethodEntry& e : ref::reference_registry().entries()) {
    for (const std::string& s : test::bare_specs(e)) out.emplace_back(s, &e);
    for (const PresetInfo& p : e.presets) out.emplace_back(e.name + "@" + p.name, &e);
  }
  return out;
}

// Random signs times `magnitude`: logits of +-d * magnitude^2 that differ from row to row.
RowMatrixXd signs(Eigen::Index rows, Eigen::Index cols, double magnitude, std::mt19937_64& g) {
  std::bernoulli_distribution coin(0.5);
  RowMatrixXd m(rows, cols);
  for (Eigen::Index i = 0; i < m.size(); ++i) m.data()[i] = coin(g) ? magnitude : -magnitude;
  return m;
}

template <class F>
void require_input_error(F&& f, const std::string& source, const std::string& field) {
  try {
    f();
    FAIL("no InputError; expected one for " << source << field);
  } catch (const InputError& e) {
    CHECK(e.source() == source);
    CHECK(e.field() == field);
  }
}

}  // namespace

// finite_prefix finds the first non-finite entry wherever it sits: at each position of arrays that end at, before and
// after its 256-entry blocks and 16 lanes, for NaN (quiet, signalling, negative), +-inf, next to the extremes of the
// finite range (largest, smallest normal and subnormal, -0), in float and double.
template <class T>
void check_finite_prefix() {
  using L = std::numeric_limits<T>;
  const T finite[] = {T(0), -T(0), L::max(), -L::max(), L::min(), L::denorm_min(), -L::denorm_min(), T(1.5)};
  const T bad[] = {L::quiet_NaN(), -L::quiet_NaN(), L::signaling_NaN(), L::infinity(), -L::infinity()};
  std::mt19937_64 g(9);
  std::uniform_int_distribution<int> pick(0, 7);
  for (const std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{15}, std::size_t{16}, std::size_t{17},
                              std::size_t{255}, std::size_t{256}, std::size_t{257}, std::size_t{600}}) {
    std::vector<T> x(n);
    for (T& v : x) v = finite[pick(g)];
    CHECK(finite_prefix(std::span<const T>(x)) == n);
    for (std::size_t i = 0; i < n; ++i)
      for (const T b : bad) {
        std::vector<T> y = x;
        y[i] = b;
        if (i + 1 < n) y[n - 1] = L::infinity();  // a later one does not hide the first
        INFO("n " << n << " at " << i << " value " << b);
        CHECK(finite_prefix(std::span<const T>(y)) == i);
      }
  }
}

TEST_CASE("finite_prefix: the index of the first NaN or +-inf in float and double", "[non-finite]") {
  check_finite_prefix<float>();
  check_finite_prefix<double>();
}

TEST_CASE("every method refuses NaN and +-inf in Q, K and V, naming the tensor and index", "[non-finite]") {
  std::mt19937_64 g(11);
  const RowMatrixXd q = random_matrix(6, 8, 1.0, g), k = random_matrix(7, 8, 1.0, g), v = random_matrix(7, 4, 1.0, g);
  for (const auto& [spec, entry] : all_specs()) {
    INFO(spec);
    const auto m = ref::reference_registry().create(spec);
    RowMatrixXd bad = q;
    bad(2, 1) = NAN;
    require_input_error([&] { m->attention(bad, k, v, 0.35, {}); }, "Q", "[2, 1]");
    bad = k;
    bad(6, 7) = kInf;
    require_input_error([&] { m->attention(q, bad, v, 0.35, {}); }, "K", "[6, 7]");
    bad = v;
    bad(0, 3) = -kInf;
    require_input_error([&] { m->attention(q, k, bad, 0.35, {}); }, "V", "[0, 3]");
    require_input_error([&] { m->attention_heads({q, q}, {k, k}, {v, bad}, 0.35, {}); }, "V", "[0, 3]");
    CHECK_THROWS_AS(m->attention(q, k, v, NAN, {}), InputError);
    CHECK_THROWS_AS(m->attention(q, k, v, -1.0, {}), InputError);
  }
}

TEST_CASE("softmax models refuse NaN and +inf logits and read -inf as masked", "[non-finite]") {
  std::mt19937_64 g(12);
  const RowMatrixXd logits = random_matrix(4, 9, 2.0, g);
  int models = 0;
  for (const auto& [spec, entry] : all_specs()) {
    INFO(spec);
    const auto m = ref::reference_registry().create(spec);
    if (!entry->has_softmax_form()) continue;
    ++models;
    RowMatrixXd bad = logits;
    bad(3, 8) = NAN;
    require_input_error([&] { m->softmax_rows(bad); }, "logits", "[3, 8]");
    bad = logits;
    bad(1, 0) = kInf;
    require_input_error([&] { m->softmax_rows(bad); }, "logits", "[1, 0]");
    RowMatrixXd masked = logits;
    masked(0, 2) = masked(0, 5) = -kInf;
    masked.row(2).setConstant(-kInf);  // fully masked
    const RowMatrixXd p = m->softmax_rows(masked);
    REQUIRE(p.allFinite());
    CHECK(p(0, 2) == 0.0);
    CHECK(p(0, 5) == 0.0);
    CHECK(p.row(2).isZero(0.0));
    for (int r : {0, 1, 3}) CHECK(p.row(r).sum() > 0.5);
  }
  CHECK(models >= 7);  // fp64, fp32, fp16, bf16, index, exaq, sas
}

TEST_CASE("overflowing logits give each method's declared rule, never a finite wrong answer", "[non-finite]") {
  std::mt19937_64 g(13);
  const RowMatrixXd v = random_matrix(12, 4, 1.0, g);
  const auto fp64 = ref::reference_registry().create("fp64");
  // 1e20: logits up to 8e40, beyond float32 and its 16-bit formats but finite in float64. 1e200: beyond float64.
  for (const double magnitude : {1e20, 1e200}) {
    const RowMatrixXd q = signs(10, 8, magnitude, g), k = signs(12, 8, magnitude, g);
    const AttentionResult ref = fp64->attention(q, k, v, 0.35, {});
    const bool ref_finite = ref.o.allFinite();
    CHECK(ref_finite == (magnitude < 1e100));
    for (const auto& [spec, entry] : all_specs()) {
      INFO(spec << " with |q| = |k| = " << magnitude);
      const auto m = ref::reference_registry().create(spec);
      std::optional<AttentionResult> r;
      try {
        r = m->attention(q, k, v, 0.35, {});
      } catch (const InputError& e) {
        CHECK(entry->overflow == OverflowRule::refuse);  // only refusing methods may throw
        // the logits, or (fa3-fp8, sage1) the tensor the method reads in a narrower format first
        CHECK((e.source() == "logits" || e.source() == "Q" || e.source() == "K"));
        continue;
      }
      for (Eigen::Index i = 0; i < r->o.rows(); ++i) {
        INFO("row " << i);
        if (!r->o.row(i).allFinite()) {
          CHECK(entry->overflow == OverflowRule::propagate);  // a refusing method never returns non-finite output
          continue;
        }
        if (!ref_finite) CHECK(entry->overflow == OverflowRule::refuse);  // computed from beyond-float64 logits
        // A finite row must be an attention output: a weighted mean of V's rows, so within each column's range (5 %
        // margin for quantised V). How close it comes to fp64 on such extreme rows is the method's own accuracy
        // (coarse methods differ by platform in the last bits of their clip statistics), but garbage such as an
        // overflow cast to integers (|O| ~ 1e9 for |V| ~ 1) lands far outside.
        for (Eigen::Index c = 0; c < v.cols(); ++c) {
          const double lo = v.col(c).minCoeff(), hi = v.col(c).maxCoeff(), margin = 0.05 * (hi - lo);
          CHECK(r->o(i, c) >= lo - margin);
          CHECK(r->o(i, c) <= hi + margin);
        }
      }
    }
  }
}

TEST_CASE("docs/non-finite.md lists every method with its registry overflow rule", "[non-finite][docs]") {
  std::ifstream doc(std::string(QATTN_FIXTURES) + "/../../docs/non-finite.md");
  REQUIRE(doc);
  std::map<std::string, std::string> rules;  // rows "| `name` | refuse | ..."
  for (std::string line; std::getline(doc, line);) {
    if (line.rfind("| `", 0) != 0) continue;
    const std::size_t name_end = line.find('`', 3);
    if (name_end == std::string::npos || line.compare(name_end, 4, "` | ") != 0) continue;
    const std::size_t rule_end = line.find(" |", name_end + 4);
    if (rule_end == std::string::npos) continue;
    rules[line.substr(3, name_end - 3)] = line.substr(name_end + 4, rule_end - name_end - 4);
  }
  for (const MethodEntry& e : ref::reference_registry().entries()) {
    INFO(e.name);
    REQUIRE(rules.count(e.name) == 1);
    CHECK(rules[e.name] == (e.overflow == OverflowRule::refuse ? "refuse" : "propagate"));
    CHECK(!e.overflow_note.empty());
  }
  CHECK(rules.size() == ref::reference_registry().entries().size());
}

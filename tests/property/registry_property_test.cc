// The registry-driven property suite: every registered method, bare and under each preset, through the properties
// its entry declares (MethodEntry::kind and MethodTraits, qattn/method.h), without naming a method. A method added to
// the registry is tested here without a line of test. The non-finite policy, also registry-driven, is
// tests/unit/non_finite_test.cc.
//
//   determinism           two calls give the same O, P and integer P, bit for bit (softmax_rows too)
//   row shift             softmax_rows(x + c) == softmax_rows(x), bit for bit, where row_shift_invariant
//   row independence      softmax_rows of one row alone == that row of the batch, bit for bit, where rows_independent
//   key order             keys and values reordered: O within key_order_tolerance * max|V|, P's columns reordered
//   masks                 padding and causal (bottom-right, L_q != L_k both ways): P = 0 on masked pairs, fully
//                         masked rows give P = 0 and O = 0 exactly; masking a key = dropping it where
//                         masked_keys_dropped
//   shapes                L_q != L_k: O [L_q, d_v], P [L_q, L_k], both finite
//   heads                 attention_heads == attention per head, bit for bit, where heads_independent
//   query blocks          blocks of query_block_rows rows (and of twice that) of a prepared call (Method::prepare),
//                         and a softmax model's blocks from the fp64 reference's logits (rows_from_logits),
//                         unmasked, causal or with a padding mask, == the whole call's rows of O and P, bit for
//                         bit, where query_block_rows > 0
//
// Inputs are seeded (the seed is in each INFO) and small: the suite runs every configuration the registry has.
#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <algorithm>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "qattn/error.h"
#include "qattn/reference/float_attention.h"
#include "qattn/reference/registry.h"
#include "support/random_matrix.h"
#include "support/registry_specs.h"

using namespace qattn;
using qattn::test::random_matrix;

namespace {

struct Config {
  std::string spec;
  const MethodEntry* entry;
  MethodTraits traits;
};

// Every method of the registry, bare (support/registry_specs.h) and under each preset.
std::vector<Config> all_configs() {
  const Registry& r = ref::reference_registry();
  std::vector<Config> out;
  for (const MethodEntry& e : r.entries()) {
    std::vector<std::string> specs = test::bare_specs(e);
    for (const PresetInfo& p : e.presets) specs.push_back(e.name + "@" + p.name);
    for (const std::string& s : specs) out.push_back({s, &e, r.traits(parse_method_spec(s))});
  }
  return out;
}

// Logits every format of the registry holds exactly: multiples of 1/8 in [-8, 8] (8 significant bits at most, also
// after a shift by 16 or -16: bfloat16 holds them).
RowMatrixXd dyadic_logits(Eigen::Index rows, Eigen::Index cols, std::mt19937_64& g) {
  std::uniform_int_distribution<int> k(-64, 64);
  RowMatrixXd m(rows, cols);
  for (Eigen::Index i = 0; i < m.size(); ++i) m.data()[i] = k(g) / 8.0;
  return m;
}

double max_abs(const RowMatrixXd& m) { return m.size() ? m.cwiseAbs().maxCoeff() : 0.0; }

}  // namespace

TEST_CASE("registry: the suite sees every method, and every entry describes itself", "[registry]") {
  const auto configs = all_configs();
  CHECK(configs.size() >= ref::reference_registry().entries().size());
  int references = 0;
  for (const MethodEntry& e : ref::reference_registry().entries()) {
    INFO(e.name);
    CHECK(!e.summary.empty());
    CHECK(e.doc.rfind("docs/", 0) == 0);
    CHECK(!e.overflow_note.empty());
    references += e.reference;
  }
  CHECK(references == 1);  // the error tables have one reference
}

TEST_CASE("registry: every method is deterministic bit for bit", "[registry]") {
  std::mt19937_64 g(101);
  const RowMatrixXd q = random_matrix(9, 16, 1.0, g), k = random_matrix(11, 16, 1.0, g), v = random_matrix(11, 5, 1.0, g);
  for (const Config& c : all_configs()) {
    INFO(c.spec << " (seed 101)");
    const auto m = ref::reference_registry().create(c.spec);
    const AttentionResult a = m->attention(q, k, v, 0.25, {}), b = m->attention(q, k, v, 0.25, {});
    CHECK(a.o == b.o);
    CHECK(a.p == b.p);
    CHECK(a.p_int == b.p_int);
    if (c.entry->has_softmax_form()) {
      const RowMatrixXd x = dyadic_logits(4, 12, g);
      CHECK(m->softmax_rows(x) == m->softmax_rows(x));
    }
  }
}

TEST_CASE("registry: a softmax form exactly where the kind says so", "[registry]") {
  for (const Config& c : all_configs()) {
    INFO(c.spec);
    const auto m = ref::reference_registry().create(c.spec);
    if (c.entry->has_softmax_form())
      CHECK(m->softmax_rows(RowMatrixXd::Zero(2, 3)).rows() == 2);
    else
      CHECK_THROWS_AS(m->softmax_rows(RowMatrixXd::Zero(2, 3)), SpecError);
  }
}

TEST_CASE("registry: row shift invariance where declared, bit for bit", "[registry]") {
  std::mt19937_64 g(102);
  const RowMatrixXd x = dyadic_logits(6, 16, g);
  for (const Config& c : all_configs()) {
    if (!c.entry->has_softmax_form() || !c.traits.row_shift_invariant) continue;
    const auto m = ref::reference_registry().create(c.spec);
    const RowMatrixXd p = m->softmax_rows(x);
    for (const double shift : {16.0, -16.0, 3.5}) {
      INFO(c.spec << " shift " << shift << " (seed 102)");
      CHECK(m->softmax_rows((x.array() + shift).matrix()) == p);
    }
  }
}

TEST_CASE("registry: rows independent where declared, bit for bit", "[registry]") {
  std::mt19937_64 g(103);
  RowMatrixXd x = dyadic_logits(5, 16, g);
  x.row(3) *= 0.25;  // rows of different spread, so a tensor-wide statistic would differ from a row's own
  for (const Config& c : all_configs()) {
    if (!c.entry->has_softmax_form() || !c.traits.rows_independent) continue;
    const auto m = ref::reference_registry().create(c.spec);
    const RowMatrixXd p = m->softmax_rows(x);
    for (Eigen::Index i = 0; i < x.rows(); ++i) {
      INFO(c.spec << " row " << i << " (seed 103)");
      CHECK(m->softmax_rows(x.row(i)) == p.row(i));
    }
  }
}

TEST_CASE("registry: reordering keys reorders P and leaves O, to the declared tolerance", "[registry]") {
  std::mt19937_64 g(104);
  const Eigen::Index lk = 24;
  const RowMatrixXd q = random_matrix(7, 16, 1.0, g), k = random_matrix(lk, 16, 1.0, g), v = random_matrix(lk, 6, 1.0, g);
  std::vector<Eigen::Index> perm(lk);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), g);
  RowMatrixXd kp(lk, 16), vp(lk, 6);
  for (Eigen::Index j = 0; j < lk; ++j) kp.row(j) = k.row(perm[j]), vp.row(j) = v.row(perm[j]);
  for (const Config& c : all_configs()) {
    if (!c.traits.key_order_tolerance) continue;
    INFO(c.spec << " tolerance " << *c.traits.key_order_tolerance << " (seed 104)");
    const auto m = ref::reference_registry().create(c.spec);
    const AttentionResult a = m->attention(q, k, v, 0.25, {}), b = m->attention(q, kp, vp, 0.25, {});
    const double tol = *c.traits.key_order_tolerance;
    CHECK(max_abs(a.o - b.o) <= tol * max_abs(v));
    if (a.p.size() == 0) continue;
    RowMatrixXd ap(a.p.rows(), lk);
    for (Eigen::Index j = 0; j < lk; ++j) ap.col(j) = a.p.col(perm[j]);
    CHECK(max_abs(ap - b.p) <= std::max(tol, 0.0));
  }
}

TEST_CASE("registry: padding and causal masks, L_q != L_k both ways, fully masked rows", "[registry]") {
  std::mt19937_64 g(105);
  for (const auto& [lq, lk] : {std::pair<Eigen::Index, Eigen::Index>{3, 7}, {7, 3}, {5, 5}}) {
    const RowMatrixXd q = random_matrix(lq, 8, 1.0, g), k = random_matrix(lk, 8, 1.0, g), v = random_matrix(lk, 3, 1.0, g);
    AttentionMask causal;
    causal.causal = true;
    const RowMatrixXb visible = causal.visible(lq, lk);
    AttentionMask pad;
    pad.valid = RowMatrixXb::Constant(lq, lk, true);
    pad.valid.row(1).setConstant(false);  // query 1 sees nothing
    pad.valid(lq - 1, 0) = false;
    for (const Config& c : all_configs()) {
      INFO(c.spec << " L_q " << lq << " L_k " << lk << " (seed 105)");
      const auto m = ref::reference_registry().create(c.spec);
      const AttentionResult plain = m->attention(q, k, v, 0.3, {});
      CHECK(plain.o.rows() == lq);
      CHECK(plain.o.cols() == 3);
      CHECK(plain.o.allFinite());
      if (plain.p.size()) {
        CHECK(plain.p.rows() == lq);
        CHECK(plain.p.cols() == lk);
        CHECK(plain.p.allFinite());
      }
      const AttentionResult cr = m->attention(q, k, v, 0.3, causal);
      for (Eigen::Index i = 0; i < lq; ++i) {
        if (!visible.row(i).any()) CHECK(cr.o.row(i).isZero(0));
        for (Eigen::Index j = 0; j < lk; ++j)
          if (!visible(i, j) && cr.p.size()) CHECK(cr.p(i, j) == 0);
      }
      const AttentionResult pr = m->attention(q, k, v, 0.3, pad);
      CHECK(pr.o.row(1).isZero(0));
      if (pr.p.size()) {
        CHECK(pr.p.row(1).isZero(0));
        CHECK(pr.p(lq - 1, 0) == 0);
      }
    }
  }
}

TEST_CASE("registry: masking a key for every query equals dropping it, where declared", "[registry]") {
  std::mt19937_64 g(106);
  const RowMatrixXd q = random_matrix(6, 8, 1.0, g);
  RowMatrixXd k = random_matrix(9, 8, 1.0, g), v = random_matrix(9, 4, 1.0, g);
  k.row(8) *= 4;  // the masked key holds the largest |K| and |V|: a scale computed over masked keys shows
  v.row(8) *= 4;
  AttentionMask mask;
  mask.valid = RowMatrixXb::Constant(6, 9, true);
  mask.valid.col(8).setConstant(false);
  for (const Config& c : all_configs()) {
    if (!c.traits.masked_keys_dropped || !c.traits.key_order_tolerance) continue;
    INFO(c.spec << " (seed 106)");
    const auto m = ref::reference_registry().create(c.spec);
    const RowMatrixXd masked = m->attention(q, k, v, 0.3, mask).o;
    const RowMatrixXd dropped = m->attention(q, k.topRows(8), v.topRows(8), 0.3, {}).o;
    CHECK(max_abs(masked - dropped) <= *c.traits.key_order_tolerance * max_abs(v.topRows(8)));
  }
}

TEST_CASE("registry: heads evaluated together equal heads evaluated alone, where declared", "[registry]") {
  std::mt19937_64 g(108);
  std::vector<RowMatrixXd> q, k, v;
  for (int h = 0; h < 3; ++h) {  // heads of different spread, so that a ranking across them has something to rank
    const double s = 0.5 + h;
    q.push_back(random_matrix(7, 16, s, g)), k.push_back(random_matrix(10, 16, s, g)), v.push_back(random_matrix(10, 4, s, g));
  }
  for (const Config& c : all_configs()) {
    if (!c.traits.heads_independent) continue;
    INFO(c.spec << " (seed 108)");
    const auto m = ref::reference_registry().create(c.spec);
    const std::vector<AttentionResult> together = m->attention_heads(views(q), views(k), views(v), 0.25, {});
    REQUIRE(together.size() == 3);
    for (std::size_t h = 0; h < 3; ++h) {
      const AttentionResult alone = m->attention(q[h], k[h], v[h], 0.25, {});
      CHECK(together[h].o == alone.o);
      CHECK(together[h].p == alone.p);
      CHECK(together[h].p_int == alone.p_int);
    }
  }
}

TEST_CASE("registry: blocks of query rows of a prepared call equal the whole call's rows, where declared", "[registry]") {
  std::mt19937_64 g(109);
  for (const Config& c : all_configs()) {
    const Eigen::Index n = c.traits.query_block_rows;
    if (n == 0) continue;
    const Eigen::Index lq = 2 * n + 37, lk = 100;  // a partial last block; L_q != L_k moves the causal diagonal
    const RowMatrixXd q = random_matrix(lq, 64, 2.0, g), k = random_matrix(lk, 64, 1.0, g), v = random_matrix(lk, 16, 1.0, g);
    RowMatrixXb padding(lq, lk);  // about one pair in five masked, and one query row with no key at all
    for (Eigen::Index i = 0; i < padding.size(); ++i) padding.data()[i] = g() % 5 != 0;
    padding.row(n + 3).setConstant(false);
    const auto m = ref::reference_registry().create(c.spec);
    for (const int mode : {0, 1, 2}) {
      const AttentionMask mask = mode == 0 ? AttentionMask{} : mode == 1 ? AttentionMask{RowMatrixXb(), true} : AttentionMask{padding};
      INFO(c.spec << (mode == 1 ? ", causal" : mode == 2 ? ", padding mask" : "") << " (seed 109), L_q " << lq
                  << ", blocks of " << n << " rows");
      const AttentionResult whole = m->attention(q, k, v, 0.125, mask);
      const std::unique_ptr<PreparedCall> call = m->prepare(q, k, v, 0.125, mask);
      for (const Eigen::Index rows : {n, 2 * n})
        for (Eigen::Index r0 = 0; r0 < lq; r0 += rows) {
          const Eigen::Index count = std::min(rows, lq - r0);
          const AttentionResult block = call->rows(r0, count);
          CHECK(block.o == whole.o.middleRows(r0, count));
          CHECK(block.p == whole.p.middleRows(r0, count));
          if (whole.p_int.size()) CHECK(block.p_int == whole.p_int.middleRows(r0, count));
          // The fp64 reference's logits of the block: a softmax model's rows from them are the same bits; every
          // other method declines them.
          RowMatrixXd logits;
          const AttentionMask block_mask = mask.rows(r0, count, lq);
          ref::float_attention(q.middleRows(r0, count), k, v, 0.125, ref::FloatPrecision::fp64, block_mask, &logits);
          const std::optional<AttentionResult> shared = call->rows_from_logits(r0, count, logits);
          REQUIRE(shared.has_value() == (c.entry->kind == MethodKind::softmax_model));
          if (shared) {
            CHECK(shared->o == block.o);
            CHECK(shared->p == block.p);
          }
        }
    }
  }
}

TEST_CASE("registry: K/V bits are declared for every attention pipeline and float format below fp64", "[registry]") {
  for (const Config& c : all_configs()) {
    INFO(c.spec);
    if (c.entry->kind == MethodKind::attention_pipeline) CHECK(c.traits.kv_bits > 0);
    if (c.entry->kind == MethodKind::softmax_model) CHECK(c.traits.kv_bits == 0);  // P V in fp64 around it
    if (c.entry->reference) CHECK(c.traits.kv_bits == 0);
  }
}

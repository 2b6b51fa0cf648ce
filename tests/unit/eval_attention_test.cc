// eval::attention, the composition behind `qattn attention` and Python's qattn.attention: float32 inputs read in
// place give the float64 call's bits, mixed dtypes widen, grouped-query K/V are the repeated heads' views, and each
// bad input is refused naming the tensor and field. The helpers live in a named namespace: the unity build puts this
// file in one translation unit with others.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "qattn/engine.h"
#include "qattn/eval/attention.h"
#include "support/input_error.h"

using namespace qattn;

namespace eval_attention_test {

std::vector<double> values(std::size_t n, double seed) {
  std::vector<double> x(n);
  for (std::size_t i = 0; i < n; ++i) x[i] = std::sin(seed + 0.37 * static_cast<double>(i)) * 2.5;
  return x;
}

eval::TensorRef tensor(const char* name, std::vector<std::int64_t> shape, const std::vector<double>& x) {
  return {name, std::move(shape), nullptr, x.data()};
}

eval::TensorRef tensor(const char* name, std::vector<std::int64_t> shape, const std::vector<float>& x) {
  return {name, std::move(shape), x.data(), nullptr};
}

std::vector<float> narrow(const std::vector<double>& x) { return {x.begin(), x.end()}; }

std::string error_of(const eval::AttentionRequest& r) {
  return test::input_error_text([&] { eval::attention(r); });
}

}  // namespace eval_attention_test

TEST_CASE("eval::attention: float32 in place, mixed dtypes and grouped-query K/V give the float64 call's bits") {
  using namespace eval_attention_test;
  const std::int64_t lq = 5, lk = 7, d = 8;
  const std::vector<double> q = values(2 * 4 * lq * d, 0.1), k = values(2 * 2 * lk * d, 1.3),
                            v = values(2 * 2 * lk * d, 2.9);
  // float32 values widened: the float64 call and the float32 one see the same numbers
  const std::vector<float> qf = narrow(q), kf = narrow(k), vf = narrow(v);
  const std::vector<double> qw(qf.begin(), qf.end()), kw(kf.begin(), kf.end()), vw(vf.begin(), vf.end());
  for (const char* spec : {"fp32", "intattention", "sage2@paper-8b"}) {
    const BuiltMethod built = build_method(spec);
    const auto run = [&](eval::TensorRef a, eval::TensorRef b, eval::TensorRef c) {
      eval::AttentionRequest r{std::move(a), std::move(b), std::move(c), built.method.get(), spec};
      r.mask.causal = true;
      return eval::attention(r);
    };
    const std::vector<std::int64_t> qs{2, 4, lq, d}, ks{2, 2, lk, d};
    const eval::AttentionOutput f64 = run(tensor("q", qs, qw), tensor("k", ks, kw), tensor("v", ks, vw));
    const eval::AttentionOutput f32 = run(tensor("q", qs, qf), tensor("k", ks, kf), tensor("v", ks, vf));
    const eval::AttentionOutput mixed = run(tensor("q", qs, qf), tensor("k", ks, kw), tensor("v", ks, vf));
    CHECK(f64.o_shape == std::vector<std::int64_t>{2, 4, lq, d});
    CHECK(f64.p_shape == std::vector<std::int64_t>{2, 4, lq, lk});
    REQUIRE(f64.entries.size() == 8);
    // K/V repeated by hand: query head h of batch b reads K/V head h / 2
    std::vector<double> k_rep, v_rep;
    for (std::int64_t e = 0; e < 8; ++e) {
      const std::int64_t src = e / 4 * 2 + e % 4 / 2;
      k_rep.insert(k_rep.end(), kw.begin() + src * lk * d, kw.begin() + (src + 1) * lk * d);
      v_rep.insert(v_rep.end(), vw.begin() + src * lk * d, vw.begin() + (src + 1) * lk * d);
    }
    const eval::AttentionOutput repeated = run(tensor("q", qs, qw), tensor("k", {2, 4, lk, d}, k_rep), tensor("v", {2, 4, lk, d}, v_rep));
    for (std::size_t e = 0; e < 8; ++e) {
      INFO(spec << " entry " << e);
      const RowMatrixXd o32 = f32.entries[e].o_f32.size() ? f32.entries[e].o_f32.cast<double>() : f32.entries[e].o;
      CHECK(o32 == f64.entries[e].o);
      CHECK(mixed.entries[e].o == f64.entries[e].o);
      CHECK(repeated.entries[e].o == f64.entries[e].o);
    }
  }
}

TEST_CASE("eval::attention refuses bad shapes, scales and masks naming the tensor and field") {
  using namespace eval_attention_test;
  const BuiltMethod built = build_method("fp64");
  const std::vector<double> x = values(2 * 4 * 8, 0.5);
  const auto request = [&](std::vector<std::int64_t> qs, std::vector<std::int64_t> ks, std::vector<std::int64_t> vs) {
    return eval::AttentionRequest{tensor("q.npy", std::move(qs), x), tensor("k.npy", std::move(ks), x),
                                  tensor("v.npy", std::move(vs), x), built.method.get(), "fp64"};
  };
  CHECK(error_of(request({4, 8}, {1, 4, 8}, {4, 8})).find("k.npy: shape: ") == 0);
  CHECK(error_of(request({4, 8}, {1, 4, 8}, {4, 8})).find("q, k and v need the same rank") != std::string::npos);
  CHECK(error_of(request({8}, {8}, {8})) == "q.npy: shape: expected [..., L, d], got (8,)");
  CHECK(error_of(request({4, 8}, {8, 4}, {8, 4})) == "k.npy: shape: head dimension d of k (4) differs from q (8)");
  CHECK(error_of(request({4, 8}, {4, 8}, {2, 8})) == "v.npy: shape: v has 2 keys, k has 4");
  CHECK(error_of(request({2, 4, 8}, {3, 4, 8}, {3, 4, 8})).find("k.npy: shape: k and v have 3 heads") == 0);
  CHECK(error_of(request({0, 4, 8}, {0, 4, 8}, {0, 4, 8})).find("q.npy: shape: a leading (batch) axis has length 0") == 0);
  eval::AttentionRequest r = request({4, 8}, {4, 8}, {4, 8});
  r.scale = -1.0;
  CHECK(error_of(r).find("fp64: scale: must be finite and > 0") == 0);
  r.scale = std::nullopt;
  r.mask.valid = RowMatrixXb::Constant(4, 3, true);
  CHECK(error_of(r) == "fp64: mask: valid pairs are [4, 3], the call needs [L_q, L_k] = [4, 4]");
  // A method's own refusal names the batch entries it came from, or reaches the caller as thrown
  std::vector<double> bad = x;
  bad[3 * 8 + 1] = std::numeric_limits<double>::quiet_NaN();
  eval::AttentionRequest nan{tensor("q.npy", {2, 4, 8}, bad), tensor("k.npy", {2, 4, 8}, x), tensor("v.npy", {2, 4, 8}, x),
                             built.method.get(), "fp64"};
  CHECK(error_of(nan).find("q.npy (batch entries 0 to 1) (method fp64") == 0);
  nan.name_entries = false;
  CHECK(error_of(nan).find("q.npy (batch entries") == std::string::npos);
  CHECK_THROWS(eval::attention(nan));
}

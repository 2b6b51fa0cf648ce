// The method-spec parser and the registry: syntax, defaults, presets, overrides, and the error messages.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>

#include "qattn/engine.h"
#include "qattn/error.h"
#include "qattn/method.h"
#include "qattn/reference/registry.h"
#include "support/registry_specs.h"

using namespace qattn;
using Catch::Matchers::Contains;

namespace {

class EchoMethod final : public Method {
 public:
  explicit EchoMethod(ParamMap p) : p_(std::move(p)) {}
  RowMatrixXd softmax_rows_impl(const MatrixView& x) const override {
    return RowMatrixXd::Constant(x.rows(), x.cols(), p_.real("c") * static_cast<double>(p_.integer("b")));
  }
  AttentionResult attention_impl(const MatrixView&, const MatrixView&, const MatrixView&, double,
                            const AttentionMask&) const override {
    return {};
  }
  ParamMap p_;
};

Registry toy_registry() {
  Registry r;
  r.add({"toy",
         "test method",
         {{"b", ParamType::integer, "5", "bits", {}, 1, 8},
          {"c", ParamType::real, "6.6", "clip", {}, 1e-9, 1e9},
          {"p", ParamType::choice, "u8", "P format", {"u8", "s8"}},
          {"mask", ParamType::boolean, "false", "masking"}},
         {{"paper", {{"b", "4"}, {"p", "s8"}}, "as printed"}},
         [](const ParamMap& p) { return std::make_unique<EchoMethod>(p); }});
  return r;
}

}  // namespace

TEST_CASE("spec syntax", "[method]") {
  const MethodSpec s = parse_method_spec("echo@upstream-sim:b=5,c=6.6");
  CHECK(s.name == "echo");
  CHECK(s.preset == "upstream-sim");
  REQUIRE(s.overrides.size() == 2);
  CHECK(s.overrides[0] == std::pair<std::string, std::string>{"b", "5"});
  CHECK(s.overrides[1] == std::pair<std::string, std::string>{"c", "6.6"});
  CHECK(parse_method_spec("fp16").overrides.empty());
  for (const char* bad : {"", ":b=1", "x:", "x:b=", "x:=1", "x:b=1,", "x@", "x y", "x@:b=1", "x:p,", "x:p,q", "x:b=1,p"})
    CHECK_THROWS_AS(parse_method_spec(bad), SpecError);
  // a bare first value is the positional one (file:PATH), the rest key=value
  const MethodSpec f = parse_method_spec("file:/tmp/k.json,p.offset=4");
  CHECK(f.positional == "/tmp/k.json");
  REQUIRE(f.overrides.size() == 1);
  CHECK(f.overrides[0] == std::pair<std::string, std::string>{"p.offset", "4"});
  CHECK(parse_method_spec("x:b").positional == "b");
}

TEST_CASE("defaults, presets and overrides resolve in that order", "[method]") {
  const Registry r = toy_registry();
  const ParamMap d = r.resolve(parse_method_spec("toy"));
  CHECK(d.integer("b") == 5);
  CHECK(d.real("c") == 6.6);
  CHECK(d.choice("p") == "u8");
  CHECK_FALSE(d.boolean("mask"));
  const ParamMap p = r.resolve(parse_method_spec("toy@paper"));
  CHECK(p.integer("b") == 4);
  CHECK(p.choice("p") == "s8");
  // a bare value where the method takes none is refused at resolution
  CHECK_THROWS_WITH(r.resolve(parse_method_spec("toy:7")), Catch::Contains("'7' is not key=value"));
  const ParamMap o = r.resolve(parse_method_spec("toy@paper:b=7,mask=true"));
  CHECK(o.integer("b") == 7);
  CHECK(o.choice("p") == "s8");
  CHECK(o.boolean("mask"));
  CHECK(r.canonical(parse_method_spec("toy@paper:c=2")) == "toy:b=4,c=2,p=s8,mask=false");
  const RowMatrixXd x = RowMatrixXd::Zero(1, 2);
  CHECK(r.create("toy:b=2,c=0.5")->softmax_rows(x)(0, 1) == 1.0);
}

TEST_CASE("errors name what is valid", "[method]") {
  const Registry r = toy_registry();
  CHECK_THROWS_WITH(r.create("nope"), Contains("unknown method 'nope'") && Contains("toy"));
  CHECK_THROWS_WITH(r.create("toy:q=1"), Contains("no key 'q'") && Contains("b (integer)") && Contains("u8|s8"));
  CHECK_THROWS_WITH(r.create("toy@x"), Contains("no preset '@x'") && Contains("@paper"));
  CHECK_THROWS_WITH(r.create("toy:b=9"), Contains("outside [1, 8]"));
  CHECK_THROWS_WITH(r.create("toy:b=2.5"), Contains("not an integer"));
  CHECK_THROWS_WITH(r.create("toy:c=abc"), Contains("not a finite real"));
  CHECK_THROWS_WITH(r.create("toy:c=nan"), Contains("not a finite real"));
  CHECK_THROWS_WITH(r.create("toy:p=u16"), Contains("not one of u8|s8"));
  CHECK_THROWS_WITH(r.create("toy:mask=yes"), Contains("true|false"));
  CHECK_THROWS_WITH(r.create("toy:c=-1"), Contains("-1 is outside [1e-09, 1e+09]"));  // a real's range, stated
  // the next key joined with ':' instead of ','
  CHECK_THROWS_WITH(r.create("toy:b=4:c=5"), Contains("'4:c=5' is not an integer") &&
                                                 Contains("parameters are separated by commas: toy:key=value,key=value"));
  CHECK_THROWS_WITH(r.create("toy:b=40"), !Contains("separated"));
}

TEST_CASE("registry refuses duplicates and presets with unknown keys", "[method]") {
  Registry r = toy_registry();
  CHECK_THROWS_AS(r.add({"toy", "", {}, {}, nullptr}), std::logic_error);
  CHECK_THROWS_AS(r.add({"other", "", {}, {{"p", {{"zz", "1"}}, ""}}, nullptr}), std::logic_error);
  CHECK_THROWS_AS(r.add({"other2", "", {{"b", ParamType::integer, "99", "", {}, 1, 8}}, {}, nullptr}), SpecError);
}

TEST_CASE("the reference registry lists the FP methods", "[method]") {
  const Registry& r = ref::reference_registry();
  for (const char* name : {"fp64", "fp32", "fp16", "bf16"}) CHECK(r.find(name) != nullptr);
  CHECK_THROWS_WITH(r.create("fp16:b=3"), Contains("takes no parameters"));
}

namespace {

// Records where its inputs live, to show that Method's public calls hand a caller's buffer through unchanged.
class AddressMethod final : public Method {
 public:
  mutable std::vector<const double*> seen;

 protected:
  RowMatrixXd softmax_rows_impl(const MatrixView& x) const override {
    seen.push_back(x.data());
    return RowMatrixXd::Zero(x.rows(), x.cols());
  }
  AttentionResult attention_impl(const MatrixView& q, const MatrixView& k, const MatrixView& v, double,
                                 const AttentionMask&) const override {
    seen.insert(seen.end(), {q.data(), k.data(), v.data()});
    return {};
  }
};

}  // namespace

TEST_CASE("methods read a caller's buffer in place: no copy between the caller and the method", "[method]") {
  // Memory the caller owns (as a NumPy array would be), mapped without a copy.
  std::vector<double> buffer(3 * 4 * 8, 0.25);
  const Eigen::Map<const RowMatrixXd> q(buffer.data(), 4, 8), k(buffer.data() + 32, 4, 8), v(buffer.data() + 64, 4, 8);
  const AddressMethod m;
  m.softmax_rows(q);
  m.attention(q, k, v, 0.5, {});
  m.attention_heads({q, k}, {k, v}, {v, q}, 0.5, {});
  const std::vector<const double*> expected = {q.data(), q.data(), k.data(), v.data(),
                                               q.data(), k.data(), v.data(), k.data(), v.data(), q.data()};
  CHECK(m.seen == expected);
  // Whole-row blocks are views too; a block of some columns is not packed, and packed_rows packs it.
  RowMatrixXd storage;
  const RowMatrixXd x = RowMatrixXd::NullaryExpr(5, 6, [](Eigen::Index i, Eigen::Index j) { return 10.0 * i + j; });
  const MatrixView rows = x.middleRows(1, 3);
  CHECK(rows.data() == x.data() + 6);
  CHECK(packed_rows(rows, storage) == rows.data());
  const MatrixView cols = x.middleCols(2, 3);
  REQUIRE(cols.outerStride() == 6);
  const double* packed = packed_rows(cols, storage);
  CHECK(packed == storage.data());
  CHECK(std::vector<double>(packed, packed + 9) == std::vector<double>{2, 3, 4, 12, 13, 14, 22, 23, 24});
}

TEST_CASE("every registered method gives the same bits on a view of some columns as on a packed copy", "[method]") {
  // A view whose rows are not packed (row stride 12, 8 columns) must be read as its rows, not as memory.
  const RowMatrixXd wide = RowMatrixXd::NullaryExpr(
      16, 12, [](Eigen::Index i, Eigen::Index j) { return std::sin(1.7 * static_cast<double>(i * 12 + j)); });
  const RowMatrixXd q = wide.leftCols(8), k = wide.rightCols(8), v = wide.middleCols(2, 8);
  for (const auto& entry : ref::reference_registry().entries())
    for (const std::string& spec : test::bare_specs(entry)) {
      INFO(spec);
      const auto m = ref::reference_registry().create(spec);
      const AttentionResult packed = m->attention(q, k, v, 0.3, {});
      const AttentionResult strided = m->attention(wide.leftCols(8), wide.rightCols(8), wide.middleCols(2, 8), 0.3, {});
      CHECK(packed.o == strided.o);
      CHECK(packed.p == strided.p);
    }
  for (const char* spec : {"intattention", "quant-only:softmax=lanes16"}) {  // and the fused kernels
    INFO(spec);
    const BuiltMethod m = build_method(spec, {.engine = Engine::fast});
    const AttentionResult packed = m.method->attention(q, k, v, 0.3, {});
    const AttentionResult strided = m.method->attention(wide.leftCols(8), wide.rightCols(8), wide.middleCols(2, 8), 0.3, {});
    CHECK(packed.o == strided.o);
    CHECK(packed.p == strided.p);
  }
}

TEST_CASE("the float32 entry gives the float64 entry's bits, for every registered method and the fused kernels",
          "[method]") {
  // float32 values widen to float64 exactly, so both entries see the same numbers. Two heads (TurboAttention looks
  // across them), a causal mask, and float32 views of some columns (row stride 12) as well as packed ones.
  const RowMatrixXf wide = RowMatrixXf::NullaryExpr(16, 12, [](Eigen::Index i, Eigen::Index j) {
    return static_cast<float>(2.5 * std::sin(1.7 * static_cast<double>(i * 12 + j)) + (j == 3 ? 4.0 : 0.0));
  });
  const std::vector<RowMatrixXf> q32 = {wide.leftCols(8), wide.middleCols(1, 8)};
  const std::vector<RowMatrixXf> k32 = {wide.rightCols(8), wide.middleCols(3, 8)};
  const std::vector<RowMatrixXf> v32 = {wide.middleCols(2, 8), wide.leftCols(8)};
  const auto widen = [](const std::vector<RowMatrixXf>& x) {
    std::vector<RowMatrixXd> out;
    for (const RowMatrixXf& m : x) out.emplace_back(m.cast<double>());
    return out;
  };
  const std::vector<RowMatrixXd> q64 = widen(q32), k64 = widen(k32), v64 = widen(v32);
  const std::vector<MatrixViewF> qs = {wide.leftCols(8), wide.middleCols(1, 8)};
  const std::vector<MatrixViewF> ks = {wide.rightCols(8), wide.middleCols(3, 8)};
  const std::vector<MatrixViewF> vs = {wide.middleCols(2, 8), wide.leftCols(8)};
  REQUIRE(qs[0].outerStride() == 12);
  AttentionMask causal;
  causal.causal = true;
  const auto same = [&](const Method& m) {
    const std::vector<AttentionResult> want = m.attention_heads(views(q64), views(k64), views(v64), 0.3, causal);
    for (const auto& got : {m.attention_heads(views(q32), views(k32), views(v32), 0.3, causal),
                            m.attention_heads(qs, ks, vs, 0.3, causal)}) {
      REQUIRE(got.size() == 2);
      for (std::size_t h = 0; h < 2; ++h) {
        CHECK(got[h].o == want[h].o);
        CHECK(got[h].p == want[h].p);
        CHECK(got[h].p_int == want[h].p_int);
      }
    }
  };
  // Softmax: float32 logits with masked (-inf) entries, as the same view types.
  RowMatrixXf logits32 = wide * 3.0f;
  logits32(4, 2) = logits32(9, 7) = -std::numeric_limits<float>::infinity();
  const RowMatrixXd logits64 = logits32.cast<double>();
  const auto same_softmax = [&](const Method& m) {
    RowMatrixXd want;
    try {
      want = m.softmax_rows(logits64);
    } catch (const std::exception& e) {  // a method without a softmax form refuses both entries alike
      CHECK_THROWS_WITH(m.softmax_rows(MatrixViewF(logits32)), e.what());
      return;
    }
    CHECK(m.softmax_rows(MatrixViewF(logits32)) == want);
    CHECK(m.softmax_rows(MatrixViewF(logits32.leftCols(9))) == m.softmax_rows(logits64.leftCols(9)));
  };
  for (const auto& entry : ref::reference_registry().entries()) {
    INFO(entry.name);
    for (const std::string& spec : test::bare_specs(entry)) {
      same(*ref::reference_registry().create(spec));
      same_softmax(*ref::reference_registry().create(spec));
    }
    for (const auto& preset : entry.presets) {
      INFO(preset.name);
      same_softmax(*ref::reference_registry().create(entry.name + "@" + preset.name));
    }
  }
  for (const char* spec : {"intattention", "intattention@paper", "intattention:k-group=4", "quant-only:softmax=lanes16"}) {
    INFO(spec);
    same(*build_method(spec, {.engine = Engine::fast}).method);
  }
  // The policy holds on the float32 entry: K's +inf is named.
  std::vector<RowMatrixXf> bad = k32;
  bad[1](2, 5) = std::numeric_limits<float>::infinity();
  const BuiltMethod fused = build_method("intattention", {.engine = Engine::fast});
  CHECK_THROWS_WITH(fused.method->attention_heads(views(q32), views(bad), views(v32), 0.3, {}),
                    Contains("K") && Contains("[2, 5]") && Contains("+inf"));
}

// The method-spec parser and the registry: syntax, defaults, presets, overrides, and the error messages.
#include <catch2/catch.hpp>

#include "qattn/error.h"
#include "qattn/method.h"
#include "qattn/reference/registry.h"

using namespace qattn;
using Catch::Matchers::Contains;

namespace {

class EchoMethod final : public Method {
 public:
  explicit EchoMethod(ParamMap p) : p_(std::move(p)) {}
  RowMatrixXd softmax_rows_impl(const RowMatrixXd& x) const override {
    return RowMatrixXd::Constant(x.rows(), x.cols(), p_.real("c") * static_cast<double>(p_.integer("b")));
  }
  AttentionResult attention_impl(const RowMatrixXd&, const RowMatrixXd&, const RowMatrixXd&, double,
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
  for (const char* bad : {"", ":b=1", "x:", "x:b", "x:b=", "x:=1", "x:b=1,", "x@", "x y", "x@:b=1"})
    CHECK_THROWS_AS(parse_method_spec(bad), SpecError);
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

// The analysis table's choices (qattn/eval/report.h, ReportOptions): an explicit method order puts each head's rows
// and the summary rows in that order; an order that is not a permutation of the view's methods is refused.
#include <catch2/catch.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "qattn/error.h"
#include "qattn/eval/report.h"

using namespace qattn;

TEST_CASE("render_report: ReportOptions::methods orders each head's and the summary rows", "[report]") {
  eval::ReportView view;
  view.tensors = "t";
  view.methods = {{"a", "a"}, {"b", "b"}};
  view.n_heads = 2;
  std::vector<eval::HeadResult> results(4);
  for (int i = 0; i < 4; ++i) results[i].head = i / 2, results[i].method = i % 2 ? "b" : "a";
  eval::ReportOptions order;
  order.methods = {"b", "a"};
  std::string methods;  // "layer,head,method" of each line, the method's first letter
  std::istringstream csv(eval::render_report(view, results, "csv", order));
  for (std::string line; std::getline(csv, line);) methods += line.substr(0, line.find(',', line.find(',') + 1) + 2) + ";";
  CHECK(methods == "layer,head,m;0,0,b;0,0,a;0,1,b;0,1,a;all,mean,b;all,worst,b;all,mean,a;all,worst,a;");
  for (const auto& bad : std::vector<std::vector<std::string>>{{"b"}, {"b", "a", "b"}, {"b", "c"}}) {
    order.methods = bad;
    CHECK_THROWS_AS(eval::render_report(view, results, "csv", order), SpecError);
  }
}

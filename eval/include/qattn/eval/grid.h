// The grid grammar of a sweep: one axis of method parameters, as `qattn sweep --grid`, the reproductions that sweep
// and Python's qattn.sweep write it. Parsed here once; the fuzzer of the spec grammars (fuzz/spec_grammar_fuzz.cc)
// links it from this library.
#pragma once

#include <string>
#include <vector>

namespace qattn::eval {

// "KEY=A:B" (step 1), "KEY=A:STEP:B" or "KEY=V1,V2,...". Range values are printed with as many decimals as the
// inputs have ("c=3:0.1:10" gives 3.0, 3.1, ..., 10.0), so no 3.3000000000000003 reaches a method spec. No item is
// empty: a leading, trailing or doubled ',' or ':' ("b=3:8:", "b=3,4,,5") is refused, not read as a shorter grid;
// nor is a value twice, or more than 100000 values. Throws qattn::SpecError "'TEXT': reason".
struct GridAxis {
  std::string key;
  std::vector<std::string> values;
};
GridAxis parse_grid_axis(const std::string& text);

}  // namespace qattn::eval

// Grid axes of `qattn sweep` (analysis/sweep.cc), exposed for the reproductions that sweep.
#pragma once

#include <string>
#include <vector>

namespace qattn::cli {

// "KEY=A:B" (step 1), "KEY=A:STEP:B" or "KEY=V1,V2,...". Range values are printed with as many decimals as the
// inputs have ("c=3:0.1:10" gives 3.0, 3.1, ..., 10.0), so no 3.3000000000000003 reaches a method spec. No item is
// empty: a leading, trailing or doubled ',' or ':' ("b=3:8:", "b=3,4,,5") is refused, not read as a shorter grid.
// Throws CLI::ValidationError naming --grid, the text and the reason.
struct GridAxis {
  std::string key;
  std::vector<std::string> values;
};
GridAxis parse_grid_axis(const std::string& text);

}  // namespace qattn::cli

// The grid grammar of a sweep (qattn/eval/grid.h).
#include <algorithm>
#include <cmath>
#include <sstream>
#include <string>

#include "qattn/error.h"
#include "qattn/eval/grid.h"

namespace qattn::eval {
namespace {

// Decimal places of a number as written ("0.10" -> 2, "3" -> 0).
int decimals(const std::string& s) {
  const auto dot = s.find('.');
  return dot == std::string::npos ? 0 : static_cast<int>(s.size() - dot - 1);
}

double number(const std::string& text, const std::string& grid) {
  try {
    std::size_t used = 0;
    const double v = std::stod(text, &used);
    if (used != text.size() || !std::isfinite(v)) throw std::invalid_argument("");
    return v;
  } catch (const std::exception&) {
    throw SpecError("'" + grid + "': '" + text + "' is not a finite number");
  }
}

// The fields of s between separators, empty ones included ("3:8:" -> "3", "8", "").
std::vector<std::string> fields(const std::string& s, char separator) {
  std::vector<std::string> out;
  for (std::size_t start = 0;;) {
    const auto end = s.find(separator, start);
    out.push_back(s.substr(start, end - start));
    if (end == std::string::npos) return out;
    start = end + 1;
  }
}

}  // namespace

GridAxis parse_grid_axis(const std::string& text) {
  const auto eq = text.find('=');
  if (eq == std::string::npos || eq == 0 || eq + 1 == text.size())
    throw SpecError("'" + text + "': expected KEY=A:B, KEY=A:STEP:B or KEY=V1,V2,...");
  GridAxis axis{text.substr(0, eq), {}};
  const std::string range = text.substr(eq + 1);
  const bool is_range = range.find(':') != std::string::npos;
  const char separator = is_range ? ':' : ',';
  const std::vector<std::string> parts = fields(range, separator);
  // "b=3:8:" or "b=3,4,,5" is a typo, not the range 3:8 or the list 3,4,5
  if (std::any_of(parts.begin(), parts.end(), [](const std::string& p) { return p.empty(); }))
    throw SpecError("'" + text + "': an empty item (a leading, trailing or doubled '" + std::string(1, separator) +
                    "')");
  if (!is_range) {  // a list
    axis.values = parts;
  } else {
    if (parts.size() != 2 && parts.size() != 3)
      throw SpecError("'" + text + "': a range is A:B or A:STEP:B");
    const double a = number(parts.front(), text), b = number(parts.back(), text);
    const double step = parts.size() == 3 ? number(parts[1], text) : 1.0;
    if (!(step > 0) || b < a) throw SpecError("'" + text + "': needs A <= B and STEP > 0");
    const int places = std::max({decimals(parts.front()), decimals(parts.back()), parts.size() == 3 ? decimals(parts[1]) : 0});
    const double n = std::floor((b - a) / step + 1e-9);
    if (n > 100000) throw SpecError("'" + text + "': more than 100000 values");
    for (long i = 0; i <= static_cast<long>(n); ++i) {  // a + i step, printed with the inputs' decimal places
      std::ostringstream v;
      v.setf(std::ios::fixed);
      v.precision(places);
      v << a + static_cast<double>(i) * step;
      axis.values.push_back(v.str());
    }
  }
  // A value twice is a point twice: a list that repeats itself, or a step finer than the decimals it is written with
  // ("c=0:1e-1:1" prints 0, 0, 0, ...).
  std::vector<std::string> sorted = axis.values;
  std::sort(sorted.begin(), sorted.end());
  if (const auto dup = std::adjacent_find(sorted.begin(), sorted.end()); dup != sorted.end())
    throw SpecError("'" + text + "': value '" + *dup + "' occurs twice" +
                    (is_range ? " (write A, STEP and B with as many decimals as the values need)" : ""));
  return axis;
}

}  // namespace qattn::eval

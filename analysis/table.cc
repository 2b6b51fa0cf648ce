#include "table.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace qattn::cli {

std::string Table::markdown() const {
  std::vector<std::size_t> width(header.size(), 3);
  for (std::size_t c = 0; c < header.size(); ++c) width[c] = std::max(width[c], header[c].size());
  for (const auto& r : rows)
    for (std::size_t c = 0; c < r.size() && c < width.size(); ++c) width[c] = std::max(width[c], r[c].size());
  auto line = [&](const std::vector<std::string>& cells) {
    std::string s = "|";
    for (std::size_t c = 0; c < width.size(); ++c) {
      const std::string cell = c < cells.size() ? cells[c] : "";
      s += " " + cell + std::string(width[c] - cell.size(), ' ') + " |";
    }
    return s + "\n";
  };
  std::string out = line(header);
  out += "|";
  for (std::size_t w : width) out += std::string(w + 2, '-') + "|";
  out += "\n";
  for (const auto& r : rows) out += line(r);
  return out;
}

std::string Table::csv() const {
  auto quote = [](const std::string& s) {
    if (s.find_first_of(",\"\n") == std::string::npos) return s;
    std::string q = "\"";
    for (char ch : s) q += ch == '"' ? std::string("\"\"") : std::string(1, ch);
    return q + "\"";
  };
  std::string out;
  auto line = [&](const std::vector<std::string>& cells) {
    for (std::size_t c = 0; c < cells.size(); ++c) out += (c ? "," : "") + quote(cells[c]);
    out += "\n";
  };
  line(header);
  for (const auto& r : rows) line(r);
  return out;
}

static std::string printf_double(const char* f, double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

std::string fmt_sim(double v) { return printf_double("%.8f", v); }
std::string fmt_err(double v) { return printf_double("%.3e", v); }

}  // namespace qattn::cli

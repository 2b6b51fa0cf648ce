#include "qattn/eval/table.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

namespace qattn::eval {

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

std::string Table::latex(const std::string& caption, const std::vector<std::size_t>& rule_before,
                         const std::string& comment) const {
  auto escape = [](const std::string& s) {
    std::string out;
    for (char ch : s) {
      switch (ch) {
        case '&': case '%': case '$': case '#': case '_': case '{': case '}': out += '\\'; out += ch; break;
        case '~': out += "\\textasciitilde{}"; break;
        case '^': out += "\\textasciicircum{}"; break;
        case '\\': out += "\\textbackslash{}"; break;
        default: out += ch;
      }
    }
    return out;
  };
  // Non-finite values (spelled nan, inf, -inf in every format) as mathematics.
  auto cell = [&](const std::string& s) {
    if (s == "inf") return std::string("$\\infty$");
    if (s == "-inf") return std::string("$-\\infty$");
    if (s == "nan") return std::string("NaN");
    return escape(s);
  };
  auto line = [&](const std::vector<std::string>& cells) {
    std::string s;
    for (std::size_t c = 0; c < header.size(); ++c) s += (c ? " & " : "") + cell(c < cells.size() ? cells[c] : "");
    return s + " \\\\\n";
  };
  std::string spec;
  for (std::size_t c = 0; c < header.size(); ++c) {
    bool numeric = !rows.empty();
    for (const auto& r : rows)
      if (c < r.size() && !r[c].empty() && r[c].find_first_not_of("0123456789.eE+-naif") != std::string::npos) numeric = false;
    spec += numeric ? 'r' : 'l';
  }
  std::string out = "% requires \\usepackage{booktabs}\n";
  if (!comment.empty()) out += "% " + comment + "\n";
  out += "\\begin{table}[t]\n\\centering\n\\caption{" + escape(caption) +
                    "}\n\\begin{tabular}{" + spec + "}\n\\toprule\n" + line(header) + "\\midrule\n";
  for (std::size_t i = 0; i < rows.size(); ++i) {
    if (std::find(rule_before.begin(), rule_before.end(), i) != rule_before.end()) out += "\\midrule\n";
    out += line(rows[i]);
  }
  return out + "\\bottomrule\n\\end{tabular}\n\\end{table}\n";
}

static std::string printf_double(const char* f, double v) {
  if (std::isnan(v)) return "nan";  // non-finite values read "nan", "inf", "-inf" in every format (docs/metrics.md)
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

std::string fmt_sim(double v) { return printf_double("%.8f", v); }
std::string fmt_err(double v) { return printf_double("%.3e", v); }
std::string fmt_bits(double v) { return printf_double("%.3f", v); }

std::string fixed(double v, int places) {
  std::ostringstream s;
  s.setf(std::ios::fixed);
  s.precision(places);
  s << v;
  return s.str();
}

}  // namespace qattn::eval

// A small text table rendered as Markdown, CSV or LaTeX (booktabs): the analysis report, sweeps, merges and the
// experiments all print through it.
#pragma once

#include <string>
#include <vector>

namespace qattn::eval {

struct Table {
  std::vector<std::string> header;
  std::vector<std::vector<std::string>> rows;

  std::string markdown() const;
  std::string csv() const;
  // A booktabs table (\\toprule, \\midrule, \\bottomrule) ready to paste; LaTeX specials in cells are escaped.
  // `rule_before` lists row indices that get a \\midrule above them (e.g. where the summary rows start).
  // Cells reading inf, -inf and nan become $\infty$, $-\infty$ and NaN; `comment`, when given, is a % line above.
  std::string latex(const std::string& caption, const std::vector<std::size_t>& rule_before = {},
                    const std::string& comment = "") const;
};

// Fixed formats so that tables from different runs line up: %.8f for similarities, %.3e for errors.
std::string fmt_sim(double v);
std::string fmt_err(double v);
std::string fmt_bits(double v);  // bits per element, 3 decimals
std::string fixed(double v, int places);  // v with `places` decimals (std::fixed)

}  // namespace qattn::eval

// A small text table rendered as Markdown or CSV, used by every qattn subcommand that prints results.
#pragma once

#include <string>
#include <vector>

namespace qattn::cli {

struct Table {
  std::vector<std::string> header;
  std::vector<std::vector<std::string>> rows;

  std::string markdown() const;
  std::string csv() const;
};

// Fixed formats so that tables from different runs line up: %.8f for similarities, %.3e for errors.
std::string fmt_sim(double v);
std::string fmt_err(double v);

}  // namespace qattn::cli

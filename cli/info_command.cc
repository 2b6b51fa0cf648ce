// `qattn info`: dtype, shape and statistics of tensor files.
#include "commands.h"

#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "qattn/error.h"
#include "qattn/tensor_io.h"

namespace qattn::cli {
using nlohmann::json;

namespace {

void run_info(const std::vector<std::string>& files, const std::string& format) {
  Table t{{"file", "tensor", "dtype", "shape", "min", "max", "mean", "std", "nan", "inf"}, {}};
  json j = json::array();
  // Read everything first: a bad file must fail the command before anything is printed.
  std::vector<std::pair<std::string, std::vector<NamedTensor>>> all;
  for (const auto& f : files) all.emplace_back(f, read_tensor_file(f));
  for (const auto& [file, tensors] : all) {
    for (const auto& nt : tensors) {
      const Eigen::ArrayXd v = nt.tensor.to_double();
      std::int64_t nan = 0, inf = 0, finite = 0;
      double mn = INFINITY, mx = -INFINITY, sum = 0;
      for (double x : v) {
        if (std::isnan(x)) ++nan;
        else if (std::isinf(x)) ++inf;
        else {
          ++finite;
          mn = std::min(mn, x);
          mx = std::max(mx, x);
          sum += x;
        }
      }
      const double mean = finite ? sum / finite : NAN;
      double var = 0;
      for (double x : v)
        if (std::isfinite(x)) var += (x - mean) * (x - mean);
      const double sd = finite ? std::sqrt(var / finite) : NAN;
      t.rows.push_back({file, nt.name, std::string(dtype_name(nt.tensor.dtype)), nt.tensor.shape_string(),
                        fmt_err(finite ? mn : NAN), fmt_err(finite ? mx : NAN), fmt_err(mean), fmt_err(sd),
                        std::to_string(nan), std::to_string(inf)});
      j.push_back({{"file", file}, {"tensor", nt.name}, {"dtype", dtype_name(nt.tensor.dtype)},
                   {"shape", nt.tensor.shape}, {"min", mn}, {"max", mx}, {"mean", mean}, {"std", sd},
                   {"nan", nan}, {"inf", inf}});
    }
  }
  std::cout << (format == "json" ? j.dump(2) + "\n" : format == "csv" ? t.csv() : t.markdown());
}

}  // namespace

void add_info(CLI::App& app) {
  auto* sub = app.add_subcommand("info", "Print dtype, shape, min/max/mean/std and NaN/Inf counts of tensor files");
  auto files = std::make_shared<std::vector<std::string>>();
  auto format = std::make_shared<std::string>("md");
  sub->add_option("files", *files, "Tensor files (.npy, .npz, .safetensors)")->required();
  sub->add_option("--format", *format, "md|csv|json")->capture_default_str();
  sub->callback([=] {
    check_format_option(*format, {"md", "csv", "json"});
    run_info(*files, *format);
  });
}

}  // namespace qattn::cli

// Uses the installed qattn: the registry, a reference softmax, a metric and the .npy writer/reader.
#include <cstdio>
#include <filesystem>

#include "qattn/metrics.h"
#include "qattn/reference/registry.h"
#include "qattn/tensor_io.h"

int main() {
  qattn::RowMatrixXd x(1, 4);
  x << 1.0, 2.0, 3.0, 4.0;
  const auto p64 = qattn::ref::reference_registry().create("fp64")->softmax_rows(x);
  const auto p16 = qattn::ref::reference_registry().create("fp16")->softmax_rows(x);
  const auto s = qattn::compare(std::span(p16.data(), 4), std::span(p64.data(), 4));
  const auto path = std::filesystem::temp_directory_path() / "qattn-consumer.npy";
  qattn::write_npy(path, qattn::Tensor::from_double(qattn::DType::f64, {4}, std::span(p64.data(), 4)));
  const auto back = qattn::read_npy(path).to_double();
  std::filesystem::remove(path);
  std::printf("consumer: fp16 vs fp64 CosSim %.8f, round trip %s\n", s.cossim, back[3] == p64(0, 3) ? "ok" : "BAD");
  return (s.cossim > 0.999 && back[3] == p64(0, 3)) ? 0 : 1;
}

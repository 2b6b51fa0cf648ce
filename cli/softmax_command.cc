// `qattn softmax`: one method's softmax of a logits tensor, written to a tensor file.
#include "commands.h"

#include <memory>
#include <optional>
#include <span>
#include <string>

#include "qattn/error.h"
#include "qattn/reference/registry.h"
#include "qattn/tensor_io.h"

namespace qattn::cli {

namespace {

const Registry& registry() { return ref::reference_registry(); }

struct SoftmaxOptions {
  std::string in, name, spec, out;
  std::optional<std::int64_t> cint;
  std::optional<double> alpha;
  bool raw = false;
};

void run_softmax(const SoftmaxOptions& o) {
  const auto method = registry().create(o.spec);  // a bad spec fails before any file is touched
  if (o.cint && o.alpha) throw CLI::ValidationError("--cint/--alpha", "give one of them, not both");
  if (o.alpha && !(*o.alpha > 0 && std::isfinite(*o.alpha))) throw CLI::ValidationError("--alpha", "must be finite and > 0");
  if (o.cint && (*o.cint < 1 || *o.cint > INT32_MAX)) throw CLI::ValidationError("--cint", "must be in [1, 2^31 - 1]");
  require_tensor_extension("--out", o.out);
  require_distinct_files({{"--in", o.in}}, {{"--out", o.out}});
  const Tensor logits = pick_tensor(o.in, o.name);
  require_finite_tensor(logits, o.in, o.name.empty() ? "logits" : o.name, /*masked_ok=*/true);
  if (logits.shape.empty() || logits.shape.back() == 0)
    throw InputError(o.in, "shape", "softmax needs at least one axis of non-zero length, got " + logits.shape_string());
  const RowMatrixXd rows = logits.as_rows();
  RowMatrixXd p;
  std::optional<Tensor> raw;
  if (dtype_is_float(logits.dtype)) {
    if (o.cint || o.alpha)
      throw CLI::ValidationError("--cint/--alpha", "apply to integer logits only; " + o.in + " holds " +
                                                      std::string(dtype_name(logits.dtype)));
    p = with_source(o.in, o.spec, [&] { return method->softmax_rows(rows); });
  } else {
    if (!o.cint && !o.alpha)
      throw CLI::ValidationError("--cint/--alpha", o.in + " holds integer logits (" + std::string(dtype_name(logits.dtype)) +
                                                      "): give their clip --cint N or their scale --alpha A");
    RowMatrixXi32 values(rows.rows(), rows.cols());
    for (Eigen::Index i = 0; i < rows.size(); ++i) {
      const double v = rows.data()[i];
      if (v < INT32_MIN || v > INT32_MAX)
        throw InputError(o.in, "values", "integer logit " + std::to_string(v) + " does not fit int32");
      values.data()[i] = static_cast<std::int32_t>(v);
    }
    const IntegerLogits il{values, o.cint, o.alpha};
    IntegerSoftmaxResult r = with_source(o.in, o.spec, [&] { return method->softmax_integer(il); });
    p = std::move(r.probabilities);
    raw = std::move(r.raw);
  }
  if (o.raw) {
    if (!raw) throw CLI::ValidationError("--raw", "method '" + o.spec + "' produces no integer P here; drop --raw");
    raw->shape = logits.shape;
    return write_file_atomic(o.out, encode_output(o.out, {{"p", std::move(*raw)}}));
  }
  write_file_atomic(o.out, encode_output(o.out, {{"p", Tensor::from_double(DType::f64, logits.shape,
                                                                           std::span(p.data(), static_cast<std::size_t>(p.size())))}}));
}

}  // namespace

void add_softmax(CLI::App& app) {
  auto* sub = app.add_subcommand(
      "softmax", "Row-wise softmax over the last axis with one method; writes float64 probabilities or, with --raw, "
                 "the method's integer P");
  auto o = std::make_shared<SoftmaxOptions>();
  sub->add_option("--in", o->in, "Logits file: float logits, or integer logits (INT32 Q K^T) with --cint or --alpha")
      ->required();
  sub->add_option("--name", o->name, "Tensor name inside a multi-tensor file");
  sub->add_option("--method", o->spec, "Method spec name[@preset][:key=value,...] (see `qattn methods`)")->required();
  sub->add_option("--cint", o->cint, "Integer clip threshold of integer logits, used as given");
  sub->add_option("--alpha", o->alpha, "Scale of integer logits (real = alpha * integer); the method derives c_int");
  sub->add_flag("--raw", o->raw, "Write the integer P (uint8/int8) instead of float64 probabilities");
  sub->add_option("--out", o->out, "Output .npy")->required();
  sub->callback([=] { run_softmax(*o); });
}

}  // namespace qattn::cli

// `qattn attention`: softmax(scale Q K^T) V by one method over every batch entry of three tensor files, O (and P)
// written atomically.
#include <algorithm>
#include <cmath>
#include <exception>
#include <future>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "commands.h"
#include "engine_setting.h"
#include "qattn/error.h"
#include "qattn/eval/attention.h"
#include "qattn/eval/evaluate.h"
#include "qattn/tensor_io.h"

namespace qattn::cli {
namespace {

struct AttentionOptions {
  std::string q, k, v, spec, out, probs;
  bool raw = false, causal = false;
  std::optional<double> scale;
  int threads = 0;
  EngineSetting engine;
};

void run_attention(const AttentionOptions& o) {
  require_threads(o.threads);
  const int threads = resolve_threads(o.threads);
  // Without --probs the fused kernels never hold P: memory O(B_r L_k) per thread instead of O(L_q L_k).
  // O is written as float32: the fused path hands it over as float32 (AttentionResult::o_f32), with no float64 copy.
  const auto method = make_method(parse_method_spec(o.spec), o.engine, threads, !o.probs.empty(), /*o_float32=*/true);
  require_tensor_extension("--out", o.out);
  if (!o.probs.empty()) require_tensor_extension("--probs", o.probs);
  require_distinct_files({{"--q", o.q}, {"--k", o.k}, {"--v", o.v}}, {{"--out", o.out}, {"--probs", o.probs}});
  if (o.scale && !(std::isfinite(*o.scale) && *o.scale > 0)) throw CLI::ValidationError("--scale", "must be finite and > 0");
  // Each tensor is read and checked for finiteness (while it is still in cache); with more than one thread K and V on
  // their own threads while this one takes Q, since most of a large read is first touches of fresh memory, which
  // overlap across cores. The first error in the order Q, K, V is the one reported.
  const auto load = [](const std::string& path, const std::string& role) {
    Tensor t = pick_tensor(path, "");
    require_finite_tensor(t, path, role);
    return t;
  };
  const auto policy = threads > 1 ? std::launch::async : std::launch::deferred;  // --threads 1: one thread throughout
  auto k_load = std::async(policy, [&] { return load(o.k, "K"); });
  auto v_load = std::async(policy, [&] { return load(o.v, "V"); });
  std::optional<Tensor> q_load;
  std::exception_ptr q_error;
  try {
    q_load = load(o.q, "Q");
  } catch (...) {
    q_error = std::current_exception();
  }
  k_load.wait(), v_load.wait();
  if (q_error) std::rethrow_exception(q_error);
  const Tensor tq = std::move(*q_load), tk = k_load.get(), tv = v_load.get();
  // Float32 Q, K and V (what dumps hold) are read in place; float16 and bfloat16 are widened.
  std::vector<double> q_wide, k_wide, v_wide;
  eval::AttentionRequest request{eval::tensor_ref(tq, o.q, q_wide), eval::tensor_ref(tk, o.k, k_wide),
                                 eval::tensor_ref(tv, o.v, v_wide), method.get(), o.spec, o.scale};
  request.mask.causal = o.causal;
  eval::AttentionOutput result = eval::attention(request);
  if (!o.probs.empty() && !result.has_probs(o.raw))
    throw o.raw ? CLI::ValidationError("--raw", "method '" + o.spec + "' has no integer P; drop --raw")
                : CLI::ValidationError("--probs", "method '" + o.spec + "' does not materialise P; drop --probs");
  // O is float32 by definition of every method: each entry's O as float32 (the fused path's already is; a float64 O
  // is rounded to nearest, as Tensor::from_double would), written after the header one entry after another.
  std::vector<std::span<const std::byte>> o_pieces;
  std::vector<double> p_all;
  DType p_dtype = DType::f64;
  for (AttentionResult& r : result.entries) {
    if (r.o_f32.size() == 0 && r.o.size() != 0) r.o_f32 = r.o.cast<float>();
    o_pieces.push_back(std::as_bytes(std::span(r.o_f32.data(), static_cast<std::size_t>(r.o_f32.size()))));
    if (o.probs.empty()) continue;
    if (o.raw) {
      p_dtype = r.p_dtype;
      p_all.insert(p_all.end(), r.p_int.data(), r.p_int.data() + r.p_int.size());
    } else {
      p_all.insert(p_all.end(), r.p.data(), r.p.data() + r.p.size());
    }
  }
  // Both files are prepared before either is put in place, so a failure leaves both destinations as they were.
  std::vector<std::unique_ptr<PendingFile>> files;
  files.push_back(prepare_output(o.out, "o", DType::f32, result.o_shape, o_pieces));
  if (!o.probs.empty())
    files.push_back(std::make_unique<PendingFile>(
        o.probs, encode_output(o.probs, {{"p", Tensor::from_double(p_dtype, result.p_shape, p_all)}})));
  for (auto& f : files) f->commit();
}
}  // namespace

void add_attention(CLI::App& app) {
  auto* sub = app.add_subcommand("attention",
                                 "softmax(scale Q K^T) V with one method for every batch entry; writes O (float32) and "
                                 "optionally P (float64, or the integer P with --raw)");
  auto o = std::make_shared<AttentionOptions>();
  sub->add_option("--q", o->q, "Queries [..., L_q, d]; with 3 or more axes the axis before L is the heads of one call "
                  "(as in Python's qattn.attention): give [B, 1, L, d] for a batch of one head")->required();
  sub->add_option("--k", o->k, "Keys [..., L_k, d]; [..., H_kv, L_k, d] with H_kv dividing Q's heads H_q: grouped-query "
                  "attention, query head h reads K/V head h / (H_q / H_kv)")->required();
  sub->add_option("--v", o->v, "Values [..., L_k, d_v], with K's heads")->required();
  sub->add_option("--method", o->spec, "Method spec (see `qattn methods`)")->required();
  sub->add_option("--out", o->out, "Output O .npy [..., L_q, d_v], float32")->required();
  sub->add_option("--probs", o->probs,
                  "Also write P [..., L_q, L_k]. Costs O(L_q L_k) memory: about 13 bytes per (query, key) pair held "
                  "(3.5 GB at L = 16384), plus the file; without it the fused path holds O(64 L_k) per thread");
  sub->add_flag("--raw", o->raw, "Write P in the method's integer dtype (uint8/int8) instead of float64");
  sub->add_flag("--causal", o->causal, "Causal mask, bottom-right aligned (query i sees keys j <= i + L_k - L_q)");
  sub->add_option("--scale", o->scale, "Logit scale (default 1/sqrt(d))");
  add_threads_option(sub, o->threads, "threads of each fused call", ". Every count gives the same bits");
  add_engine_options(sub, o->engine);
  sub->callback([=] { run_attention(*o); });
}

}  // namespace qattn::cli

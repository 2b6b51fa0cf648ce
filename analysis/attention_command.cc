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

std::vector<std::int64_t> leading(const Tensor& t) { return {t.shape.begin(), t.shape.end() - 2}; }

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
  // Float32 Q, K and V (what dumps hold) are read in place through the methods' float32 entry, which gives the same
  // bits as the float64 one (qattn/method.h): no float64 copy of the inputs is made. Other float dtypes are widened.
  const bool in_place = tq.dtype == DType::f32 && tk.dtype == DType::f32 && tv.dtype == DType::f32;
  std::vector<RowMatrixXd> qs, ks, vs;
  if (in_place) {
    batch_entries(tq, o.q), batch_entries(tk, o.k), batch_entries(tv, o.v);
  } else {
    qs = split_batch(tq, o.q), ks = split_batch(tk, o.k), vs = split_batch(tv, o.v);
  }
  const std::int64_t entries = batch_entries(tq, o.q);
  // Grouped-query attention: K and V may hold fewer heads than Q (the axis before L); each Q matrix reads its
  // group's K/V matrix in place, none is repeated.
  const KvGrouping kv = group_kv_heads(tq.shape, tk.shape, tv.shape, o.q, o.k, o.v);
  if (tq.shape.back() != tk.shape.back())
    throw InputError(o.k, "shape", "head dimension d of k (" + std::to_string(tk.shape.back()) + ") differs from q (" +
                                       std::to_string(tq.shape.back()) + ")");
  if (tk.shape[tk.shape.size() - 2] != tv.shape[tv.shape.size() - 2])
    throw InputError(o.v, "shape", "v has " + std::to_string(tv.shape[tv.shape.size() - 2]) + " keys, k has " +
                                       std::to_string(tk.shape[tk.shape.size() - 2]));
  const double scale = o.scale ? *o.scale : 1.0 / std::sqrt(static_cast<double>(tq.shape.back()));
  AttentionMask mask;
  mask.causal = o.causal;
  std::vector<double> p_all;
  DType p_dtype = DType::f64;
  // [..., H, L, d] with 4 or more axes: the axis before L is the heads of one layer, handed over together (turbo's
  // head-wise KV precision ranks them; under grouped-query attention a group's query heads get the same K/V views);
  // with 3 axes every matrix is its own call.
  const std::size_t heads = tq.shape.size() >= 4 ? static_cast<std::size_t>(tq.shape[tq.shape.size() - 3]) : 1;
  std::vector<AttentionResult> results;
  // Q's entries [b0, b0 + heads), or the K/V entries they read (`kv_of`)
  const auto entry_views = [&](const std::vector<RowMatrixXd>& m, std::size_t b0, bool kv_of) {
    std::vector<MatrixView> views;
    for (std::size_t e = b0; e < b0 + heads; ++e)
      views.emplace_back(m[kv_of ? static_cast<std::size_t>(kv.kv_entry(static_cast<std::int64_t>(e))) : e]);
    return views;
  };
  const auto kv_views_f32 = [&](const Tensor& t, const std::string& path, std::int64_t first, std::int64_t n) {
    std::vector<MatrixViewF> views;
    for (std::int64_t e = first; e < first + n; ++e) views.push_back(batch_views_f32(t, path, kv.kv_entry(e), 1).front());
    return views;
  };
  for (std::size_t b0 = 0; b0 < static_cast<std::size_t>(entries); b0 += heads) {
    const std::string where =
        o.q + (heads == 1 ? " (batch entry " + std::to_string(b0) : " (batch entries " + std::to_string(b0) + " to " +
                                                                       std::to_string(b0 + heads - 1)) + ")";
    const auto n = static_cast<std::int64_t>(heads), first = static_cast<std::int64_t>(b0);
    for (AttentionResult& r : with_source(where, o.spec, [&] {
           return in_place ? method->attention_heads(batch_views_f32(tq, o.q, first, n), kv_views_f32(tk, o.k, first, n),
                                                     kv_views_f32(tv, o.v, first, n), scale, mask)
                           : method->attention_heads(entry_views(qs, b0, false), entry_views(ks, b0, true),
                                                     entry_views(vs, b0, true), scale, mask);
         }))
      results.push_back(std::move(r));
  }
  std::vector<std::int64_t> o_shape = leading(tq), p_shape = leading(tq);
  o_shape.push_back(tq.shape[tq.shape.size() - 2]);
  o_shape.push_back(tv.shape.back());
  p_shape.push_back(tq.shape[tq.shape.size() - 2]);
  p_shape.push_back(tk.shape[tk.shape.size() - 2]);
  // O is float32 by definition of every method: each entry's O as float32 (the fused path's already is; a float64 O
  // is rounded to nearest, as Tensor::from_double would), written after the header one entry after another.
  std::vector<std::span<const std::byte>> o_pieces;
  for (AttentionResult& r : results) {
    if (r.o_f32.size() == 0 && r.o.size() != 0) r.o_f32 = r.o.cast<float>();
    o_pieces.push_back(std::as_bytes(std::span(r.o_f32.data(), static_cast<std::size_t>(r.o_f32.size()))));
    if (o.probs.empty()) continue;
    if (o.raw) {
      if (r.p_int.size() == 0) throw CLI::ValidationError("--raw", "method '" + o.spec + "' has no integer P; drop --raw");
      p_dtype = r.p_dtype;
      p_all.insert(p_all.end(), r.p_int.data(), r.p_int.data() + r.p_int.size());
    } else {
      p_all.insert(p_all.end(), r.p.data(), r.p.data() + r.p.size());
    }
  }
  // Both files are prepared before either is put in place, so a failure leaves both destinations as they were.
  std::vector<std::unique_ptr<PendingFile>> files;
  files.push_back(prepare_output(o.out, "o", DType::f32, o_shape, o_pieces));
  if (!o.probs.empty())
    files.push_back(std::make_unique<PendingFile>(
        o.probs, encode_output(o.probs, {{"p", Tensor::from_double(p_dtype, p_shape, p_all)}})));
  for (auto& f : files) f->commit();
}
}  // namespace

void add_attention(CLI::App& app) {
  auto* sub = app.add_subcommand("attention",
                                 "softmax(scale Q K^T) V with one method for every batch entry; writes O (float32) and "
                                 "optionally P (float64, or the integer P with --raw)");
  auto o = std::make_shared<AttentionOptions>();
  sub->add_option("--q", o->q, "Queries [..., L_q, d]")->required();
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

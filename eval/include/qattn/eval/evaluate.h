// The evaluation layer (docs/streaming.md): the one place where heads, methods, the fp64 reference and the metrics
// meet. A dump is loaded once (Q, K, V per layer and head, or logits), then any methods, the registry's or a user's
// own qattn::Method, run over it and are compared with the reference head by head, streamed over blocks of query
// rows on worker threads. `qattn analyze`, `sweep`, `merge` and `reproduce` call it; it is part of the installed
// package (target qattn::eval), so a program of the user's can evaluate its own methods beside the built-in ones
// (examples/own-method-analysis).
#pragma once

#include "qattn/parallel.h"  // parallel_for, used by every threaded command

#include <array>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "qattn/error.h"
#include "qattn/method.h"
#include "qattn/metrics.h"
#include "qattn/reference/kv_quant.h"
#include "qattn/reference/weight_quant.h"
#include "qattn/tensor.h"

namespace qattn::eval {

// [..., L, d] -> batch of [L, d] matrices (leading axes flattened); InputError naming `path` otherwise, also for a
// batch of size 0 (a leading axis of length 0: nothing to evaluate).
std::vector<RowMatrixXd> split_batch(const Tensor& t, const std::filesystem::path& path);
// The checks of split_batch without the copy: the number of [L, d] matrices in t.
std::int64_t batch_entries(const Tensor& t, const std::filesystem::path& path);
// The shape checks alone ([..., L, d], L and d and every leading axis non-empty), for values named `name`.
std::int64_t batch_entries(const std::vector<std::int64_t>& shape, const std::string& name);
// Entries [first, first + count) of a float32 tensor as views of its own bytes (no copy; t must outlive them).
std::vector<MatrixViewF> batch_views_f32(const Tensor& t, const std::filesystem::path& path, std::int64_t first,
                                         std::int64_t count);

// The registry's non-finite policy applied to a tensor read from `where`: NaN and +inf are refused, and -inf too
// unless `masked_ok` (logits, where -inf means masked). The InputError names the file, the tensor `role` ("Q",
// "logits") with the first bad index in the file's own shape, and the value.
void require_finite_tensor(const Tensor& t, const std::string& where, const std::string& role, bool masked_ok = false);

// Runs fn(); an InputError or std::invalid_argument / std::domain_error that a method raises from inside is
// rethrown as an InputError whose source names `where` (the file, layer and head it came from) and `method`.
template <class Fn>
auto with_source(const std::string& where, const std::string& method, Fn&& fn) -> decltype(fn());

// What a dump is evaluated on: full attention from Q, K and V, or the softmax alone on the dumped logits.
enum class DumpTarget { attention, softmax };
// The softmax-only reference: the double-precision softmax (method fp64) or the 50-digit exact softmax rounded
// once to double (docs/softmax-reference.md). Attention always uses fp64.
enum class SoftmaxReference { fp64, exact };
// "fp64" | "exact" and back; parse throws SpecError listing the valid names.
SoftmaxReference parse_softmax_reference(const std::string& name);
std::string softmax_reference_name(SoftmaxReference reference);

// Grouped-query attention on tensors [..., H, L, d] (the axis before L is the heads; with 3 axes, the first): K and
// V may hold H_kv heads where Q holds H_q, H_kv dividing H_q and the other leading axes equal. Q's [L, d] matrix e
// (leading axes flattened, C order) reads K's and V's matrix kv_entry(e): query head h reads K/V head
// h / (H_q / H_kv) (contiguous groups, as Hugging Face's repeat_kv), with no copy. Shapes with equal leading axes
// give kv_entry(e) = e.
struct KvGrouping {
  std::int64_t q_heads = 1, kv_heads = 1;  // H_q, H_kv (1 and 1: leading axes equal, or no heads axis)
  std::int64_t group() const { return q_heads / kv_heads; }
  std::int64_t kv_entry(std::int64_t q_entry) const {
    return q_entry / q_heads * kv_heads + q_entry % q_heads / group();
  }
};

// One layer of a dump: its heads in order, each a batch of matrices (leading axes flattened).
//
// Grouped-query attention (GQA, docs/dumping.md): a layer of H_q query heads may hold H_kv K/V heads, H_kv dividing
// H_q; query head h reads K/V head h / kv_group (contiguous groups, as Hugging Face's repeat_kv). k and v then hold
// each K/V head once, and kv_of maps a query head's position to its K/V's: no K/V matrix is copied per query head.
struct DumpLayer {
  int layer = 0;
  double scale = 0;      // logit scale of softmax(scale Q K^T); 0 = 1/sqrt(d). manifest.json may set it per layer.
  bool causal = false;   // causal mask, bottom-right aligned (manifest.json)
  std::vector<int> heads;
  std::vector<std::filesystem::path> q_paths;              // [head], for error messages (the logits file if softmax)
  std::vector<std::vector<RowMatrixXd>> q;                 // [head][batch], attention dumps
  std::vector<std::vector<RowMatrixXd>> k, v;              // [K/V head][batch]: kv_index(head) of each head
  int kv_group = 1;                 // query heads per K/V head: H_q / H_kv (1: one K/V head per query head)
  std::vector<std::size_t> kv_of;   // [head] -> index into k and v; empty: the head's own index
  std::size_t kv_index(std::size_t head) const { return kv_of.empty() ? head : kv_of[head]; }
  KvGrouping kv_entries;  // q's batch entry -> k's and v's (explicit files whose K/V hold fewer heads than Q's)
  const RowMatrixXd& k_at(std::size_t head, std::size_t b) const { return k[kv_index(head)][kv_entry(b)]; }
  const RowMatrixXd& v_at(std::size_t head, std::size_t b) const { return v[kv_index(head)][kv_entry(b)]; }
  std::size_t kv_entry(std::size_t b) const {
    return static_cast<std::size_t>(kv_entries.kv_entry(static_cast<std::int64_t>(b)));
  }
  std::vector<std::vector<AttentionResult>> reference;     // [head][batch], fp64 attention (empty: computed when needed)
  std::vector<std::vector<RowMatrixXd>> logits;            // [head][batch] [L_q, L_k], softmax dumps (mask applied)
  std::vector<std::vector<RowMatrixXd>> p_reference;       // [head][batch], reference probabilities of `logits`
  double logit_scale() const;
  bool softmax_only() const { return !logits.empty(); }
};

// What a dump holds, without reading its tensors (a directory is listed; a single file is read for its names):
// every (layer, head) pair the target needs, in (layer, head) order (a GQA layer's query heads), and every regular
// file of the source with its size in bytes (names relative to the directory; the file's own name for a single file).
struct DumpListing {
  std::vector<std::pair<int, int>> units;
  std::map<std::string, std::uintmax_t> files;
  bool directory = false;
  std::map<int, int> heads_per_layer() const;
};
DumpListing list_dump(const std::filesystem::path& source, DumpTarget target);

// Reads a dump and computes its reference: a directory of layer{L}_head{H}_{q,k,v}.npy (softmax target:
// layer{L}_head{H}_logits.npy), or one .npz or .safetensors file holding tensors of those names. A directory's
// optional manifest.json may set each layer's "scale" and "causal" (docs/dumping.md). Throws InputError naming the
// file (or file:tensor), field and reason for a missing tensor, a non-float dtype, a bad shape, batch sizes that
// differ or a manifest that contradicts the files.
//
// A layer whose k and v heads are exactly 0 .. H_kv - 1 and its q heads 0 .. H_q - 1, H_kv < H_q, is grouped-query
// attention (DumpLayer::kv_group = H_q / H_kv): refused (--tensors) where the k and v counts differ or H_kv does not
// divide H_q; a manifest's "num_kv_heads" must equal the files' K/V head count (H_q where every head has its own).
//
// With a filter (a shard of the dump, docs/scale-out.md), only the (layer, head) pairs it keeps are read (from a
// directory; a single file is read whole and the rest dropped) and given a reference; the manifest's num_heads and
// layers are checked against the whole dump's listing, and the files read are listed in files_read.
struct DumpFilter {
  std::function<bool(int layer, int head)> keep;
  const DumpListing* listing = nullptr;          // the whole dump (list_dump)
  std::vector<std::string>* files_read = nullptr;  // appended: every file whose bytes were read
};
//
// with_reference false: an attention dump's layers get no reference (DumpLayer::reference stays empty), and
// evaluate_methods computes it block by block, so no [L_q, L_k] matrix is held.
std::vector<DumpLayer> load_dump(const std::filesystem::path& source, DumpTarget target = DumpTarget::attention,
                                 SoftmaxReference reference = SoftmaxReference::fp64, const DumpFilter* filter = nullptr,
                                 bool with_reference = true);

// One head from three tensor files (.npy, or .npz/.safetensors holding exactly one tensor), [..., L, d] each.
// K and V may hold fewer heads than Q (group_kv_heads); each batch entry of Q reads its group's K/V entry.
std::vector<DumpLayer> load_explicit(const std::string& q, const std::string& k, const std::string& v,
                                     bool with_reference = true);
// The KvGrouping of Q, K and V from their shapes ([..., L, d] each; L and d are not looked at, nor is a rank below
// 2). InputError (field "shape") naming the tensors by q, k, v (files, or argument names): K's and V's head counts
// differ (on v), H_kv does not divide H_q (on k; both counts named), or other leading axes differ (on k).
KvGrouping group_kv_heads(const std::vector<std::int64_t>& q_shape, const std::vector<std::int64_t>& k_shape,
                          const std::vector<std::int64_t>& v_shape, const std::string& q, const std::string& k,
                          const std::string& v);

// One head's logits [..., L_q, L_k] from one tensor file, for softmax-only analysis.
std::vector<DumpLayer> load_explicit_logits(const std::string& logits, SoftmaxReference reference);

// ---- projection weights (weight quantization) ------------------------------------------------------------------

// One layer's attention input and Q/K/V projections from a dump directory: layer{L}_attn_input.npy
// [windows, tokens, d_model], layer{L}_w{q,k,v}.npy [d_model, d_out] and layer{L}_b{q,k,v}.npy [d_out]
// (y = x W + b; head h is columns h*d .. (h+1)*d - 1).
struct LayerProjections {
  RowMatrixXd x;  // [windows * tokens, d_model]
  std::int64_t windows = 0, tokens = 0;
  std::array<RowMatrixXd, 3> w;
  std::array<Eigen::RowVectorXd, 3> b;
};
// Empty when the directory has no layer{L}_attn_input.npy; InputError naming the file for a missing weight or a
// shape that does not fit.
std::optional<LayerProjections> load_projections(const std::filesystem::path& dir, int layer);

// q, k and v of every head and window of `x` [windows * tokens, d_model] projected with `w`, `b`, split into the
// heads of `like` (whose layer number, scale and mask are kept); no reference.
DumpLayer project_layer(const DumpLayer& like, const RowMatrixXd& x, std::int64_t tokens,
                        const std::array<RowMatrixXd, 3>& w, const std::array<Eigen::RowVectorXd, 3>& b);
// Fills l.reference with the fp64 attention of its q, k, v.
void compute_reference(DumpLayer& l);

// Replaces every layer's q, k, v by projections with weights quantized by `wq` (calibrated on all of the layer's
// attention input), and its reference by fp64 attention of the unquantized projections. Layers without an attention
// input in `dir` are left out (with a note on stderr); InputError if none has one, or for a missing weight file.
void quantize_projections(std::vector<DumpLayer>& dump, const std::filesystem::path& dir, const ref::WeightQuantizer& wq);

// The metrics of one method on one head, against the fp64 reference; P metrics are NaN for methods without P.
struct HeadResult {
  int layer = 0, head = 0;
  std::string method;
  ErrorStats o, p;
  KlStats kl;
  double k_bits = NAN, v_bits = NAN;  // with a KV quantizer: bits per element of its cache (mean over the layer)
  double scale = NAN;   // the logit scale the layer's attention used (1/sqrt(d) or the manifest's); NaN: softmax only
  bool causal = false;  // whether a causal mask applied
};

// ---- the streamed evaluation (docs/streaming.md) ----------------------------------------------------------------

struct EvalMethod {
  const Method* method;
  std::string label;     // the name its results carry (the spec as given)
  MethodTraits traits;   // query_block_rows > 0 lets it stream; MethodTraits{} runs it on whole heads
};

struct EvalOptions {
  int threads = 1;              // workers over the (head, block) items; <= 0: one per hardware thread
  Eigen::Index block_rows = 0;  // query rows per block, a positive multiple of 64; 0: default_block_rows(L_k)
  const ref::KvQuantizer* kv = nullptr;  // K and V through it first (whole heads, as attention_with_kv)
  // Streamed methods per block item (0: all): each item computes the block's reference rows once for its methods,
  // and a head holds the prepared calls (Method::prepare) of one item's methods at a time.
  std::size_t methods_per_item = 0;
  bool whole_calls = false;  // every method on whole calls, none streamed (a check: the results are the same)
  // Called after each finished item (from the worker that finished it) with the count done and the total.
  std::function<void(std::size_t done, std::size_t total)> progress;
};

// 2^20 / L_k rows rounded down to a multiple of 64, within [64, 1024]: one [rows, L_k] float64 matrix is at most
// 8 MiB where L_k >= 1024.
Eigen::Index default_block_rows(Eigen::Index lk);

// Every method over every head, compared with the fp64 reference. Per head and batch entry, the query rows go in
// blocks of block_rows: a block's reference O and P rows are computed once (or read from the dump's reference
// where load_dump computed one) and shared by every method that streams (traits.query_block_rows dividing
// block_rows, heads independent, no KV quantizer); the other methods run on whole layers as attention_heads, and
// their rows are compared block by block. Metrics are accumulated per panel of 64 rows and folded in a fixed order
// (qattn/eval/panel_metrics.h), so the results do not depend on threads or block_rows. Memory: O(threads x
// block_rows x L_k) for the streamed methods, plus O(L_q x L_k) per whole call in flight.
// Results: method by method in the order given, each in the dump's (layer, head) order. An InputError names the
// file, layer, head and method; a block's error is the whole call's (its row indices are the head's).
// Grouped-query attention: every item of a query head reads its group's K/V (DumpLayer::k_at), and a whole-layer
// call gets the same K/V view for each query head of a group, as if the K/V were repeated (repeat_kv), no copy made;
// the memory bound above holds, the K/V counted once per K/V head.
std::vector<HeadResult> evaluate_methods(const std::vector<DumpLayer>& dump, const std::vector<EvalMethod>& methods,
                                         const EvalOptions& options);

// One method on whole heads (evaluate_methods with MethodTraits{} and one thread): all heads of a layer in one
// attention_heads call; softmax_rows on each logits matrix for a softmax dump, whose O metrics are then NaN.
// Deterministic; safe to call from several threads on the same dump with different Method objects.
// With `kv`, K and V of every layer go through the KV quantizer first (Q rotated, O rotated back where it asks).
std::vector<HeadResult> evaluate(const std::vector<DumpLayer>& dump, const Method& method, const std::string& label,
                                 const ref::KvQuantizer* kv = nullptr);

// The nine summary metrics. kMetrics lists them with their names and which direction is worse; PerMetric<T> holds
// one value per metric in named fields. 1 - CosSim (ErrorStats::one_minus_cossim) keeps the digits a CosSim printed
// as 1.00000000 hides.
enum class Metric { o_cossim, o_rel_l1, o_rmse, p_cossim, p_rel_l1, p_rmse, p_kl, o_one_minus_cossim, p_one_minus_cossim };
struct MetricInfo {
  Metric metric;
  const char* name;     // JSON key, `qattn sweep --metric` (with its O_/P_ prefix)
  bool lower_is_worse;  // the two CosSims
};
inline constexpr MetricInfo kMetrics[] = {
    {Metric::o_cossim, "O_cossim", true},  {Metric::o_rel_l1, "O_rel_l1", false}, {Metric::o_rmse, "O_rmse", false},
    {Metric::p_cossim, "P_cossim", true},  {Metric::p_rel_l1, "P_rel_l1", false}, {Metric::p_rmse, "P_rmse", false},
    {Metric::p_kl, "P_kl", false},
    {Metric::o_one_minus_cossim, "O_one_minus_cossim", false}, {Metric::p_one_minus_cossim, "P_one_minus_cossim", false}};

template <class T>
struct PerMetric {
  T o_cossim{}, o_rel_l1{}, o_rmse{}, p_cossim{}, p_rel_l1{}, p_rmse{}, p_kl{}, o_one_minus_cossim{},
      p_one_minus_cossim{};
  T& operator[](Metric m) {
    switch (m) {
      case Metric::o_cossim: return o_cossim;
      case Metric::o_rel_l1: return o_rel_l1;
      case Metric::o_rmse: return o_rmse;
      case Metric::p_cossim: return p_cossim;
      case Metric::p_rel_l1: return p_rel_l1;
      case Metric::p_rmse: return p_rmse;
      case Metric::p_kl: return p_kl;
      case Metric::o_one_minus_cossim: return o_one_minus_cossim;
      case Metric::p_one_minus_cossim: return p_one_minus_cossim;
    }
    throw std::logic_error("PerMetric: not a metric");
  }
  const T& operator[](Metric m) const { return const_cast<PerMetric&>(*this)[m]; }
};
using Metrics = PerMetric<double>;

// One head's nine metrics (P ones NaN for methods without P, O ones NaN for a softmax-only dump).
Metrics metric_values(const HeadResult& r);

// Mean over heads and the worst head of each metric. A NaN metric (a head whose output is not finite) is the worst
// there is: the mean is NaN too, and worst_at names the first such head.
struct Summary {
  Metrics mean, worst;
  PerMetric<int> worst_at{-1, -1, -1, -1, -1, -1, -1, -1, -1};  // index into the results summarised
};
Summary summarise(const std::vector<HeadResult>& results);


template <class Fn>
auto with_source(const std::string& where, const std::string& method, Fn&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const InputError& e) {
    throw InputError(where + " (method " + method + ", " + e.source() + ")", e.field(), e.reason());
  } catch (const std::invalid_argument& e) {
    if (dynamic_cast<const SpecError*>(&e)) throw;
    throw InputError(where, "method " + method, e.what());
  } catch (const std::domain_error& e) {
    throw InputError(where, "method " + method, e.what());
  }
}

}  // namespace qattn::eval

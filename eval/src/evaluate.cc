#include "qattn/eval/evaluate.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <exception>
#include <mutex>
#include <optional>
#include <string>

#include "qattn/error.h"
#include "qattn/eval/panel_metrics.h"
#include "qattn/reference/float_attention.h"
#include "qattn/reference/registry.h"
#include "qattn/reference/softmax.h"
#include "qattn/tensor_io.h"

namespace qattn::eval {
namespace fs = std::filesystem;

namespace {

// Where one (method, head) collects its panels: [batch entry][panel], filled by the items in any order and
// folded in this order at the end.
struct HeadSink {
  std::vector<PanelStats> o, p;
  eval::MetricFold o_median{false}, p_median{false};  // the bucketed medians of |o - r| (docs/streaming.md)
  bool has_p = true;
  std::vector<double> k_bits, v_bits;  // [batch entry], with a KV quantizer
};

// One head's prepared call of one streamed method (Method::prepare), shared by the head's blocks.
struct PreparedSlot {
  std::once_flag once;
  AttentionMask mask;  // the call's mask: the prepared call holds it by reference
  std::unique_ptr<PreparedCall> call;
  std::atomic<int> blocks_left{0};
};

Eigen::Index panels_of(Eigen::Index rows) { return (rows + eval::kPanelRows - 1) / eval::kPanelRows; }

// The panels of rows [r0, r0 + n) of a head's O and P (result rows 0 .. n - 1 vs reference rows 0 .. n - 1),
// written to the sink's slots of batch entry b.
void collect_rows(HeadSink& sink, std::mutex& median_lock, std::size_t b, Eigen::Index lq, Eigen::Index r0,
                  const AttentionResult& r, const RowMatrixXd& ref_o, const RowMatrixXd& ref_p, Eigen::Index ref_row0) {
  const Eigen::Index n_panels = panels_of(lq), dv = ref_o.cols(), lk = ref_p.cols();
  const Eigen::Index n = r.o.rows();
  eval::MetricFold o_errors(false), p_errors(false);
  const bool with_p = r.p.size() != 0;
  for (Eigen::Index i0 = 0; i0 < n; i0 += eval::kPanelRows) {
    const Eigen::Index rows = std::min<Eigen::Index>(eval::kPanelRows, n - i0);
    const std::size_t slot = b * static_cast<std::size_t>(n_panels) + static_cast<std::size_t>((r0 + i0) / eval::kPanelRows);
    const double* o = r.o.data() + i0 * dv;
    const double* ro = ref_o.data() + (ref_row0 + i0) * dv;
    sink.o[slot] = eval::panel_stats(o, ro, static_cast<std::size_t>(rows * dv));
    o_errors.add_errors(o, ro, static_cast<std::size_t>(rows * dv));
    if (!with_p) continue;
    const double* p = r.p.data() + i0 * lk;
    const double* rp = ref_p.data() + (ref_row0 + i0) * lk;
    PanelStats ps = eval::panel_stats(p, rp, static_cast<std::size_t>(rows * lk));
    eval::add_panel_kl(ps, p, rp, rows, lk);
    sink.p[slot] = std::move(ps);
    p_errors.add_errors(p, rp, static_cast<std::size_t>(rows * lk));
  }
  const std::lock_guard<std::mutex> hold(median_lock);
  if (!with_p) sink.has_p = false;
  sink.o_median.merge_errors(o_errors);
  sink.p_median.merge_errors(p_errors);
}

// The fp64 reference rows [r0, r0 + n) of one head: the dump's own reference where it holds one (weight
// quantization compares with other projections), else computed on the block (fp64 streams in blocks of 64 rows,
// so the block's rows are the whole call's). *row0 is where the block's rows start in the returned matrices. Where
// computed, the block's masked logits are kept too (fp64's own), for the softmax models (rows_from_logits).
struct ReferenceRows {
  const RowMatrixXd* o;
  const RowMatrixXd* p;
  Eigen::Index row0;
  AttentionResult computed;
  RowMatrixXd logits;  // empty where the dump holds the reference
};
void reference_rows(ReferenceRows& out, const DumpLayer& l, std::size_t h, std::size_t b, Eigen::Index r0,
                    Eigen::Index n) {
  if (!l.reference.empty()) {
    out.o = &l.reference[h][b].o, out.p = &l.reference[h][b].p, out.row0 = r0;
    return;
  }
  const Eigen::Index lq = l.q[h][b].rows();
  const AttentionMask mask{RowMatrixXb(), l.causal, l.causal ? r0 + n - lq : 0};
  out.computed = ref::float_attention(l.q[h][b].middleRows(r0, n), l.k_at(h, b), l.v_at(h, b), l.logit_scale(),
                                      ref::FloatPrecision::fp64, mask, &out.logits);
  // fp64 propagates overflow as NaN; a reference that is not finite cannot measure anything
  if (!out.computed.o.allFinite())
    throw InputError(l.q_paths[h].string(), "values", "scale * Q K^T overflows float64 in the fp64 reference (batch entry " +
                                                          std::to_string(b) + "); rescale the inputs");
  out.o = &out.computed.o, out.p = &out.computed.p, out.row0 = 0;
}

// One head's group of streamed methods (methods_per_item of them), shared by the group's prepare and block items.
struct StreamedGroup {
  std::size_t li, b, h;               // the dump's layer, the batch entry and the head
  std::vector<std::size_t> streamed;  // the group's methods, indices into evaluate_methods' list
  std::string where;                  // the head's source, for errors
  std::vector<PreparedSlot> calls;    // [the group's method]
};

// One evaluate_methods call: the sinks every work item writes its own slots of, and the items, added layer by layer
// and run once.
class Evaluation {
 public:
  Evaluation(const std::vector<DumpLayer>& dump, const std::vector<EvalMethod>& methods, const EvalOptions& options)
      : dump_(dump), methods_(methods), options_(options), sinks_(methods.size()), in_order_(methods.size()) {
    std::size_t n_units = 0;
    for (const DumpLayer& l : dump) unit_of_layer_.push_back(n_units), n_units += l.heads.size();
    for (auto& per_method : sinks_) per_method = std::vector<HeadSink>(n_units);
  }

  void add_layer(std::size_t li) {
    if (dump_[li].softmax_only()) add_softmax_layer(li);
    else add_attention_layer(li);
  }

  // The items, each writing only its own slots: whole calls first (the largest), then the streamed blocks. The calls
  // of a method whose results depend on its earlier calls (traits.calls_in_order) are one item, in dump order.
  void run() {
    for (auto& calls : in_order_)
      if (!calls.empty())
        items_.insert(items_.begin(), [calls = std::move(calls)] {
          for (const auto& call : calls) call();
        });
    items_.insert(items_.end(), std::make_move_iterator(streamed_items_.begin()),
                  std::make_move_iterator(streamed_items_.end()));
    std::atomic<std::size_t> done{0};
    parallel_for(items_.size(), options_.threads, [&](std::size_t i) {
      items_[i]();
      const std::size_t now = ++done;
      if (options_.progress) options_.progress(now, items_.size());
    });
  }

  // The results, [method][layer][head] in the dump's order.
  std::vector<HeadResult> results() {
    std::vector<HeadResult> out;
    for (std::size_t m = 0; m < methods_.size(); ++m)
      for (std::size_t li = 0; li < dump_.size(); ++li)
        for (std::size_t h = 0; h < dump_[li].heads.size(); ++h) out.push_back(head_result(m, li, h));
    return out;
  }

 private:
  HeadSink& sink(std::size_t m, std::size_t li, std::size_t h) { return sinks_[m][unit_of_layer_[li] + h]; }

  void add_item(std::size_t m, std::function<void()> item) {
    if (methods_[m].traits.calls_in_order) in_order_[m].push_back(std::move(item));
    else items_.push_back(std::move(item));
  }

  // A softmax-only layer: one item per (method, head), over the head's batch entries.
  void add_softmax_layer(std::size_t li) {
    const DumpLayer& l = dump_[li];
    const std::size_t batch = l.logits.front().size();
    for (std::size_t m = 0; m < methods_.size(); ++m)
      for (std::size_t h = 0; h < l.heads.size(); ++h) {
        HeadSink& s = sink(m, li, h);
        const Eigen::Index lq = l.logits[h].front().rows();
        s.o.assign(batch * panels_of(lq), PanelStats{});
        s.p.assign(batch * panels_of(lq), PanelStats{});
        add_item(m, [this, li, m, h, batch, lq] { run_softmax_head(m, li, h, batch, lq); });
      }
  }

  void run_softmax_head(std::size_t m, std::size_t li, std::size_t h, std::size_t batch, Eigen::Index lq) {
    const DumpLayer& l = dump_[li];
    HeadSink& s = sink(m, li, h);
    for (std::size_t b = 0; b < batch; ++b) {
      const RowMatrixXd p =
          with_source(l.q_paths[h].string() + " (batch entry " + std::to_string(b) + ")", methods_[m].label,
                      [&] { return methods_[m].method->softmax_rows(l.logits[h][b]); });
      const RowMatrixXd& ref = l.p_reference[h][b];
      eval::MetricFold p_errors(false);
      for (Eigen::Index i0 = 0; i0 < lq; i0 += eval::kPanelRows) {
        const Eigen::Index rows = std::min<Eigen::Index>(eval::kPanelRows, lq - i0);
        const std::size_t n = static_cast<std::size_t>(rows * ref.cols());
        PanelStats ps = eval::panel_stats(p.data() + i0 * ref.cols(), ref.data() + i0 * ref.cols(), n);
        eval::add_panel_kl(ps, p.data() + i0 * ref.cols(), ref.data() + i0 * ref.cols(), rows, ref.cols());
        s.p[b * panels_of(lq) + i0 / eval::kPanelRows] = std::move(ps);
        p_errors.add_errors(p.data() + i0 * ref.cols(), ref.data() + i0 * ref.cols(), n);
      }
      const std::lock_guard<std::mutex> hold(median_lock_);
      s.p_median.merge_errors(p_errors);
    }
  }

  // An attention layer: its methods split into streamed ones and ones run on whole calls, and its sinks sized.
  void add_attention_layer(std::size_t li) {
    const DumpLayer& l = dump_[li];
    const std::size_t nh = l.heads.size(), batch = l.q.front().size();
    const Eigen::Index lq = l.q.front().front().rows(), lk = l.k.front().front().rows();
    // The reference streams (fp64's products give a block the whole call's rows: fp64_product.h).
    const Eigen::Index block_rows = options_.block_rows > 0 ? options_.block_rows : default_block_rows(lk);
    std::vector<std::size_t> streamed, whole;
    for (std::size_t m = 0; m < methods_.size(); ++m) {
      (streams(m, nh, block_rows) ? streamed : whole).push_back(m);
      for (std::size_t h = 0; h < nh; ++h) {
        HeadSink& s = sink(m, li, h);
        s.o.assign(batch * panels_of(lq), PanelStats{});
        s.p.assign(batch * panels_of(lq), PanelStats{});
        s.k_bits.assign(batch, 0.0);
        s.v_bits.assign(batch, 0.0);
      }
    }
    for (const std::size_t m : whole)
      for (std::size_t b = 0; b < batch; ++b)
        add_item(m, [this, li, m, b, block_rows] { run_whole_call(m, li, b, block_rows); });
    if (!streamed.empty()) add_streamed_items(li, streamed, block_rows);
  }

  // Whether method m runs on blocks of query rows of a layer of nh heads (docs/streaming.md).
  bool streams(std::size_t m, std::size_t nh, Eigen::Index block_rows) const {
    const MethodTraits& t = methods_[m].traits;
    const int n = t.query_block_rows;
    return !options_.whole_calls && !options_.kv && n > 0 && block_rows % n == 0 && !t.calls_in_order &&
           (t.heads_independent || nh == 1);
  }

  // Method m on batch entry b of a layer, all heads in one call (through the KV quantizer where there is one), its
  // results compared with the reference block by block.
  void run_whole_call(std::size_t m, std::size_t li, std::size_t b, Eigen::Index block_rows) {
    const DumpLayer& l = dump_[li];
    const std::size_t nh = l.heads.size();
    const AttentionMask mask{RowMatrixXb(), l.causal};
    std::vector<MatrixView> q, k, v;
    // a group's query heads get the same K/V view each (turbo's head-wise KV precision ranks them as given)
    for (std::size_t h = 0; h < nh; ++h) q.push_back(l.q[h][b]), k.push_back(l.k_at(h, b)), v.push_back(l.v_at(h, b));
    ref::KvQuantized used;
    const std::string where = "layer " + std::to_string(l.layer) + " (" + l.q_paths.front().string() + " and its " +
                              std::to_string(nh) + " heads, batch entry " + std::to_string(b) + ")";
    const Method& method = *methods_[m].method;
    const std::vector<AttentionResult> r = with_source(where, methods_[m].label, [&] {
      return options_.kv ? ref::attention_with_kv(method, *options_.kv, q, k, v, l.logit_scale(), mask, &used)
                         : method.attention_heads(q, k, v, l.logit_scale(), mask);
    });
    for (std::size_t h = 0; h < nh; ++h) {
      HeadSink& s = sink(m, li, h);
      const Eigen::Index lq = l.q[h][b].rows();
      if (options_.kv) s.k_bits[b] = used.k_bits, s.v_bits[b] = used.v_bits;
      for (Eigen::Index r0 = 0; r0 < lq; r0 += block_rows) {
        const Eigen::Index n = std::min(block_rows, lq - r0);
        ReferenceRows ref;
        reference_rows(ref, l, h, b, r0, n);
        AttentionResult rows;
        rows.o = r[h].o.middleRows(r0, n);
        if (r[h].p.size()) rows.p = r[h].p.middleRows(r0, n);
        collect_rows(s, median_lock_, b, lq, r0, rows, *ref.o, *ref.p, ref.row0);
      }
    }
  }

  // The streamed methods of a layer in groups of methods_per_item: a block item runs one group on the block's
  // reference rows, so a head holds the prepared calls of one group at a time (a sweep of many grid points).
  void add_streamed_items(std::size_t li, const std::vector<std::size_t>& all_streamed, Eigen::Index block_rows) {
    const DumpLayer& l = dump_[li];
    const Eigen::Index lq = l.q.front().front().rows(), n_blocks = (lq + block_rows - 1) / block_rows;
    const std::size_t group = options_.methods_per_item > 0 ? options_.methods_per_item : all_streamed.size();
    for (std::size_t b = 0; b < l.q.front().size(); ++b)
      for (std::size_t h = 0; h < l.heads.size(); ++h)
        for (std::size_t g0 = 0; g0 < all_streamed.size(); g0 += group) {
          auto g = std::make_shared<StreamedGroup>();
          g->li = li, g->b = b, g->h = h;
          const std::size_t g1 = std::min(g0 + group, all_streamed.size());
          g->streamed.assign(all_streamed.begin() + static_cast<std::ptrdiff_t>(g0),
                             all_streamed.begin() + static_cast<std::ptrdiff_t>(g1));
          g->where =
              l.q_paths[h].string() + " (layer " + std::to_string(l.layer) + ", batch entry " + std::to_string(b) + ")";
          // The head's prepared calls (Method::prepare: a method's first pass over the whole head), one per streamed
          // method, made by their own items ahead of the head's blocks and released after its last block.
          g->calls = std::vector<PreparedSlot>(g->streamed.size());
          for (PreparedSlot& slot : g->calls) {
            slot.mask = AttentionMask{RowMatrixXb(), l.causal};
            slot.blocks_left = static_cast<int>(n_blocks);
          }
          for (std::size_t s = 0; s < g->streamed.size(); ++s)
            streamed_items_.push_back([this, g, s] { prepare(*g, s); });
          for (Eigen::Index r0 = 0; r0 < lq; r0 += block_rows)
            streamed_items_.push_back([this, g, r0, block_rows] { run_block(*g, r0, block_rows); });
        }
  }

  // Makes the group's prepared call of its method s, once. The prepare item reads nothing of the call, because by the
  // time it runs every block may have finished and released it.
  void prepare(StreamedGroup& g, std::size_t s) const {
    PreparedSlot& slot = g.calls[s];
    std::call_once(slot.once, [&] {
      const DumpLayer& l = dump_[g.li];
      const EvalMethod& method = methods_[g.streamed[s]];
      slot.call = with_source(g.where, method.label, [&] {
        return method.method->prepare(l.q[g.h][g.b], l.k_at(g.h, g.b), l.v_at(g.h, g.b), l.logit_scale(), slot.mask);
      });
    });
  }

  // A block's call: alive until the block counts itself done (run_block).
  const PreparedCall& prepared(StreamedGroup& g, std::size_t s) const {
    prepare(g, s);
    return *g.calls[s].call;
  }

  // Rows [r0, r0 + n) of the group's methods, compared with the reference's. Two rounds: the softmax models first,
  // on the reference's logits (rows_from_logits, the same bits as rows()), which are then released; the other
  // methods after, each from its own prepared call.
  void run_block(StreamedGroup& g, Eigen::Index r0, Eigen::Index block_rows) {
    const DumpLayer& l = dump_[g.li];
    const Eigen::Index lq = l.q[g.h][g.b].rows(), n = std::min(block_rows, lq - r0);
    ReferenceRows ref;
    reference_rows(ref, l, g.h, g.b, r0, n);
    std::vector<char> done(g.streamed.size(), 0);
    for (int round = 0; round < 2; ++round) {
      if (round == 1) ref.logits = RowMatrixXd();
      for (std::size_t s = 0; s < g.streamed.size(); ++s) {
        if (done[s]) continue;
        AttentionResult r;
        try {
          std::optional<AttentionResult> rows = block_result(g, s, round, r0, n, ref.logits);
          if (!rows) continue;
          r = std::move(*rows);
        } catch (const std::exception&) {
          rethrow_block_error(g, s);
        }
        done[s] = 1;
        collect_rows(sink(g.streamed[s], g.li, g.h), median_lock_, g.b, lq, r0, r, *ref.o, *ref.p, ref.row0);
        if (--g.calls[s].blocks_left == 0) g.calls[s].call.reset();  // the head's last block of this method
      }
    }
  }

  // Method s's rows of a block in the given round; none where round 0 cannot give them (no reference logits, or
  // not a softmax model).
  std::optional<AttentionResult> block_result(StreamedGroup& g, std::size_t s, int round, Eigen::Index r0,
                                              Eigen::Index n, const RowMatrixXd& logits) const {
    if (round == 1) return prepared(g, s).rows(r0, n);
    if (logits.size() == 0) return std::nullopt;
    return prepared(g, s).rows_from_logits(r0, n, logits);
  }

  // Called in a block's catch: the whole call's error, whose row indices are the head's own, not the block's; where
  // the whole call passes, the block's error, with the head's source.
  // Always throws (the second with_source rethrows the block's exception).
  void rethrow_block_error(const StreamedGroup& g, std::size_t s) const {
    const DumpLayer& l = dump_[g.li];
    const EvalMethod& method = methods_[g.streamed[s]];
    with_source(g.where, method.label, [&] {
      return method.method->attention(l.q[g.h][g.b], l.k_at(g.h, g.b), l.v_at(g.h, g.b), l.logit_scale(),
                                      AttentionMask{RowMatrixXb(), l.causal});
    });
    with_source(g.where, method.label, []() -> int { throw; });
  }

  // One (method, head)'s panels folded in their order into its metrics.
  HeadResult head_result(std::size_t m, std::size_t li, std::size_t h) {
    const DumpLayer& l = dump_[li];
    HeadSink& s = sink(m, li, h);
    HeadResult hr;
    hr.layer = l.layer;
    hr.head = l.heads[h];
    hr.method = methods_[m].label;
    if (!l.softmax_only()) hr.scale = l.logit_scale(), hr.causal = l.causal;
    if (l.softmax_only()) {
      // O is not computed: its metrics are NaN (compare() of empty spans would report zeros)
      hr.o.cossim = hr.o.rel_l1 = hr.o.rmse = hr.o.max_abs = hr.o.bias = hr.o.median_abs = NAN;
    } else {
      for (const PanelStats& ps : s.o) s.o_median.add(ps);
      hr.o = s.o_median.stats();
    }
    if (s.has_p) {
      for (const PanelStats& ps : s.p) s.p_median.add(ps);
      hr.p = s.p_median.stats();
      hr.kl = s.p_median.kl();
    } else {
      hr.p.cossim = hr.p.rel_l1 = hr.p.rmse = hr.p.max_abs = hr.p.bias = hr.kl.mean = hr.kl.max = NAN;
    }
    if (options_.kv) {  // the mean over batch entries, in their order
      hr.k_bits = hr.v_bits = 0;
      for (std::size_t b = 0; b < s.k_bits.size(); ++b) {
        hr.k_bits += s.k_bits[b] / static_cast<double>(s.k_bits.size());
        hr.v_bits += s.v_bits[b] / static_cast<double>(s.v_bits.size());
      }
    }
    return hr;
  }

  const std::vector<DumpLayer>& dump_;
  const std::vector<EvalMethod>& methods_;
  const EvalOptions& options_;
  std::vector<std::size_t> unit_of_layer_;     // the first unit of each layer; units are the heads in dump order
  std::vector<std::vector<HeadSink>> sinks_;   // [method][unit]
  std::mutex median_lock_;
  std::vector<std::function<void()>> items_, streamed_items_;
  std::vector<std::vector<std::function<void()>>> in_order_;  // [method]: the items of calls_in_order methods
};

}  // namespace

Eigen::Index default_block_rows(Eigen::Index lk) {
  // About 1 Mi entries of [rows, L_k] per matrix a worker holds (8 MiB of float64), in whole panels.
  const Eigen::Index rows = (Eigen::Index{1} << 20) / std::max<Eigen::Index>(lk, 1) / eval::kPanelRows * eval::kPanelRows;
  return std::clamp<Eigen::Index>(rows, eval::kPanelRows, 1024);
}

std::vector<HeadResult> evaluate_methods(const std::vector<DumpLayer>& dump, const std::vector<EvalMethod>& methods,
                                         const EvalOptions& options) {
  if (options.block_rows < 0 || options.block_rows % eval::kPanelRows != 0)
    throw std::invalid_argument("block rows must be a positive multiple of " + std::to_string(eval::kPanelRows) +
                                " (or 0: chosen from L_k), got " + std::to_string(options.block_rows));
  Evaluation evaluation(dump, methods, options);
  for (std::size_t li = 0; li < dump.size(); ++li) evaluation.add_layer(li);
  evaluation.run();
  return evaluation.results();
}

std::vector<HeadResult> evaluate(const std::vector<DumpLayer>& dump, const Method& method, const std::string& label,
                                 const ref::KvQuantizer* kv) {
  EvalOptions options;
  options.kv = kv;
  return evaluate_methods(dump, {{&method, label, MethodTraits{}}}, options);
}

Metrics metric_values(const HeadResult& r) {
  return {r.o.cossim, r.o.rel_l1,      r.o.rmse, r.p.cossim, r.p.rel_l1, r.p.rmse, r.kl.mean, r.o.one_minus_cossim,
          r.p.one_minus_cossim};
}

Summary summarise(const std::vector<HeadResult>& results) {
  Summary s;
  for (const MetricInfo& m : kMetrics) s.worst[m.metric] = m.lower_is_worse ? INFINITY : -INFINITY;
  for (std::size_t r = 0; r < results.size(); ++r) {
    const Metrics v = metric_values(results[r]);
    for (const MetricInfo& m : kMetrics) {
      const double x = v[m.metric];
      double& worst = s.worst[m.metric];
      s.mean[m.metric] += x;
      if (std::isnan(worst)) continue;  // the first NaN head stays the worst
      if (std::isnan(x) || (m.lower_is_worse ? x < worst : x > worst)) {
        worst = x;
        s.worst_at[m.metric] = static_cast<int>(r);
      }
    }
  }
  for (const MetricInfo& m : kMetrics) s.mean[m.metric] /= static_cast<double>(results.size());
  return s;
}

}  // namespace qattn::eval

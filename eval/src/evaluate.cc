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

// Which methods run on blocks of query rows and how the rows are split (docs/streaming.md).
struct StreamPlan {
  Eigen::Index block_rows;
  std::vector<bool> streamed;  // per method
};

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
  const std::size_t n_methods = methods.size();
  // sinks[method][unit]; units are the dump's heads in (layer, head) order
  std::vector<std::size_t> unit_of_layer;
  std::size_t n_units = 0;
  for (const DumpLayer& l : dump) unit_of_layer.push_back(n_units), n_units += l.heads.size();
  std::vector<std::vector<HeadSink>> sinks(n_methods);
  for (auto& per_method : sinks) per_method = std::vector<HeadSink>(n_units);
  std::mutex median_lock;

  // The work items, each writing only its own slots: whole calls first (the largest), then the streamed blocks. The
  // calls of a method whose results depend on its earlier calls (traits.calls_in_order) are one item, in dump order.
  std::vector<std::function<void()>> items;
  std::vector<std::function<void()>> streamed_items;
  std::vector<std::vector<std::function<void()>>> in_order(n_methods);
  const auto add_item = [&](std::size_t m, std::function<void()> item) {
    if (methods[m].traits.calls_in_order) in_order[m].push_back(std::move(item));
    else items.push_back(std::move(item));
  };
  for (std::size_t li = 0; li < dump.size(); ++li) {
    const DumpLayer& l = dump[li];
    const std::size_t nh = l.heads.size();
    if (l.softmax_only()) {
      const std::size_t batch = l.logits.front().size();
      for (std::size_t m = 0; m < n_methods; ++m)
        for (std::size_t h = 0; h < nh; ++h) {
          HeadSink& sink = sinks[m][unit_of_layer[li] + h];
          const Eigen::Index lq = l.logits[h].front().rows();
          sink.o.assign(batch * panels_of(lq), PanelStats{});
          sink.p.assign(batch * panels_of(lq), PanelStats{});
          add_item(m, [&, li, m, h, batch, lq] {
            const DumpLayer& l = dump[li];
            HeadSink& sink = sinks[m][unit_of_layer[li] + h];
            for (std::size_t b = 0; b < batch; ++b) {
              const RowMatrixXd p = with_source(l.q_paths[h].string() + " (batch entry " + std::to_string(b) + ")",
                                                methods[m].label, [&] { return methods[m].method->softmax_rows(l.logits[h][b]); });
              const RowMatrixXd& ref = l.p_reference[h][b];
              eval::MetricFold p_errors(false);
              for (Eigen::Index i0 = 0; i0 < lq; i0 += eval::kPanelRows) {
                const Eigen::Index rows = std::min<Eigen::Index>(eval::kPanelRows, lq - i0);
                const std::size_t n = static_cast<std::size_t>(rows * ref.cols());
                PanelStats ps = eval::panel_stats(p.data() + i0 * ref.cols(), ref.data() + i0 * ref.cols(), n);
                eval::add_panel_kl(ps, p.data() + i0 * ref.cols(), ref.data() + i0 * ref.cols(), rows, ref.cols());
                sink.p[b * panels_of(lq) + i0 / eval::kPanelRows] = std::move(ps);
                p_errors.add_errors(p.data() + i0 * ref.cols(), ref.data() + i0 * ref.cols(), n);
              }
              const std::lock_guard<std::mutex> hold(median_lock);
              sink.p_median.merge_errors(p_errors);
            }
          });
        }
      continue;
    }
    const std::size_t batch = l.q.front().size();
    const Eigen::Index lq = l.q.front().front().rows(), lk = l.k.front().front().rows();
    // The reference streams (fp64's products give a block the whole call's rows: fp64_product.h).
    const Eigen::Index block_rows = options.block_rows > 0 ? options.block_rows : default_block_rows(lk);
    std::vector<std::size_t> all_streamed, whole;
    for (std::size_t m = 0; m < n_methods; ++m) {
      const int n = methods[m].traits.query_block_rows;
      const bool streams = !options.whole_calls && !options.kv && n > 0 && block_rows % n == 0 && !methods[m].traits.calls_in_order &&
                           (methods[m].traits.heads_independent || nh == 1);
      (streams ? all_streamed : whole).push_back(m);
      for (std::size_t h = 0; h < nh; ++h) {
        HeadSink& sink = sinks[m][unit_of_layer[li] + h];
        sink.o.assign(batch * panels_of(lq), PanelStats{});
        sink.p.assign(batch * panels_of(lq), PanelStats{});
        sink.k_bits.assign(batch, 0.0);
        sink.v_bits.assign(batch, 0.0);
      }
    }
    const std::string layer_where = "layer " + std::to_string(l.layer) + " (" + l.q_paths.front().string() + " and its " +
                                    std::to_string(nh) + " heads, batch entry ";
    for (const std::size_t m : whole)
      for (std::size_t b = 0; b < batch; ++b)
        add_item(m, [&, li, m, b, block_rows, layer_where] {
          const DumpLayer& l = dump[li];
          const std::size_t nh = l.heads.size();
          const AttentionMask mask{RowMatrixXb(), l.causal};
          std::vector<MatrixView> q, k, v;
          // a group's query heads get the same K/V view each (turbo's head-wise KV precision ranks them as given)
          for (std::size_t h = 0; h < nh; ++h) q.push_back(l.q[h][b]), k.push_back(l.k_at(h, b)), v.push_back(l.v_at(h, b));
          ref::KvQuantized used;
          const std::vector<AttentionResult> r = with_source(layer_where + std::to_string(b) + ")", methods[m].label, [&] {
            return options.kv ? ref::attention_with_kv(*methods[m].method, *options.kv, q, k, v, l.logit_scale(), mask, &used)
                              : methods[m].method->attention_heads(q, k, v, l.logit_scale(), mask);
          });
          for (std::size_t h = 0; h < nh; ++h) {
            HeadSink& sink = sinks[m][unit_of_layer[li] + h];
            const Eigen::Index lq = l.q[h][b].rows();
            if (options.kv) sink.k_bits[b] = used.k_bits, sink.v_bits[b] = used.v_bits;
            for (Eigen::Index r0 = 0; r0 < lq; r0 += block_rows) {
              const Eigen::Index n = std::min(block_rows, lq - r0);
              ReferenceRows ref;
              reference_rows(ref, l, h, b, r0, n);
              AttentionResult rows;
              rows.o = r[h].o.middleRows(r0, n);
              if (r[h].p.size()) rows.p = r[h].p.middleRows(r0, n);
              collect_rows(sink, median_lock, b, lq, r0, rows, *ref.o, *ref.p, ref.row0);
            }
          }
        });
    if (all_streamed.empty()) continue;
    const Eigen::Index n_blocks = (lq + block_rows - 1) / block_rows;
    // The streamed methods in groups of methods_per_item: a block item runs one group on the block's reference
    // rows, so a head holds the prepared calls of one group at a time (a sweep of many grid points).
    const std::size_t group = options.methods_per_item > 0 ? options.methods_per_item : all_streamed.size();
    for (std::size_t b = 0; b < batch; ++b)
      for (std::size_t h = 0; h < nh; ++h)
        for (std::size_t g0 = 0; g0 < all_streamed.size(); g0 += group) {
        const std::vector<std::size_t> streamed(all_streamed.begin() + static_cast<std::ptrdiff_t>(g0),
                                                all_streamed.begin() + static_cast<std::ptrdiff_t>(std::min(g0 + group, all_streamed.size())));
        // The head's prepared calls (Method::prepare: a method's first pass over the whole head), one per streamed
        // method, made by their own items ahead of the head's blocks and released after its last block.
        auto calls = std::make_shared<std::vector<PreparedSlot>>(streamed.size());
        for (PreparedSlot& slot : *calls) {
          slot.mask = AttentionMask{RowMatrixXb(), l.causal};
          slot.blocks_left = static_cast<int>(n_blocks);
        }
        const std::string where = l.q_paths[h].string() + " (layer " + std::to_string(l.layer) + ", batch entry " +
                                  std::to_string(b) + ")";
        const auto prepare = [&, li, b, h, calls, streamed, where](std::size_t s) {
          PreparedSlot& slot = (*calls)[s];
          std::call_once(slot.once, [&] {
            const DumpLayer& l = dump[li];
            slot.call = with_source(where, methods[streamed[s]].label, [&] {
              return methods[streamed[s]].method->prepare(l.q[h][b], l.k_at(h, b), l.v_at(h, b), l.logit_scale(), slot.mask);
            });
          });
        };
        // A block's call: alive until the block counts itself done below. The prepare item reads nothing of it,
        // because by the time it runs every block may have finished and released the call.
        const auto prepared = [prepare, calls](std::size_t s) -> const PreparedCall& {
          prepare(s);
          return *(*calls)[s].call;
        };
        for (std::size_t s = 0; s < streamed.size(); ++s) streamed_items.push_back([prepare, s] { prepare(s); });
        for (Eigen::Index r0 = 0; r0 < lq; r0 += block_rows)
          streamed_items.push_back([&, li, b, h, r0, block_rows, streamed, calls, prepared, where] {
            const DumpLayer& l = dump[li];
            const Eigen::Index lq = l.q[h][b].rows(), n = std::min(block_rows, lq - r0);
            ReferenceRows ref;
            reference_rows(ref, l, h, b, r0, n);
            // Two rounds: the softmax models first, on the reference's logits (rows_from_logits, the same bits as
            // rows()), which are then released; the other methods after, each from its own prepared call.
            std::vector<char> done(streamed.size(), 0);
            for (int round = 0; round < 2; ++round) {
              if (round == 1) ref.logits = RowMatrixXd();
              for (std::size_t s = 0; s < streamed.size(); ++s) {
                if (done[s]) continue;
                const std::size_t m = streamed[s];
                AttentionResult r;
                try {
                  if (round == 0) {
                    if (ref.logits.size() == 0) continue;
                    std::optional<AttentionResult> shared = prepared(s).rows_from_logits(r0, n, ref.logits);
                    if (!shared) continue;
                    r = std::move(*shared);
                  } else {
                    r = prepared(s).rows(r0, n);
                  }
                } catch (const std::exception&) {
                  // The whole call's error, whose row indices are the head's own, not the block's.
                  with_source(where, methods[m].label, [&] {
                    return methods[m].method->attention(l.q[h][b], l.k_at(h, b), l.v_at(h, b), l.logit_scale(),
                                                        AttentionMask{RowMatrixXb(), l.causal});
                  });
                  with_source(where, methods[m].label, []() -> int { throw; });  // the whole call passed: the block's
                }
                done[s] = 1;
                collect_rows(sinks[m][unit_of_layer[li] + h], median_lock, b, lq, r0, r, *ref.o, *ref.p, ref.row0);
                if (--(*calls)[s].blocks_left == 0) (*calls)[s].call.reset();  // the head's last block of this method
              }
            }
          });
      }
  }
  for (auto& calls : in_order)
    if (!calls.empty())
      items.insert(items.begin(), [calls = std::move(calls)] {
        for (const auto& call : calls) call();
      });
  items.insert(items.end(), std::make_move_iterator(streamed_items.begin()), std::make_move_iterator(streamed_items.end()));
  std::atomic<std::size_t> done{0};
  parallel_for(items.size(), options.threads, [&](std::size_t i) {
    items[i]();
    const std::size_t now = ++done;
    if (options.progress) options.progress(now, items.size());
  });

  std::vector<HeadResult> results;
  for (std::size_t m = 0; m < n_methods; ++m)
    for (std::size_t li = 0; li < dump.size(); ++li)
      for (std::size_t h = 0; h < dump[li].heads.size(); ++h) {
        HeadSink& sink = sinks[m][unit_of_layer[li] + h];
        HeadResult hr;
        hr.layer = dump[li].layer;
        hr.head = dump[li].heads[h];
        hr.method = methods[m].label;
        if (!dump[li].softmax_only()) hr.scale = dump[li].logit_scale(), hr.causal = dump[li].causal;
        if (dump[li].softmax_only()) {
          // O is not computed: its metrics are NaN (compare() of empty spans would report zeros)
          hr.o.cossim = hr.o.rel_l1 = hr.o.rmse = hr.o.max_abs = hr.o.bias = hr.o.median_abs = NAN;
        } else {
          for (const PanelStats& ps : sink.o) sink.o_median.add(ps);
          hr.o = sink.o_median.stats();
        }
        if (sink.has_p) {
          for (const PanelStats& ps : sink.p) sink.p_median.add(ps);
          hr.p = sink.p_median.stats();
          hr.kl = sink.p_median.kl();
        } else {
          hr.p.cossim = hr.p.rel_l1 = hr.p.rmse = hr.p.max_abs = hr.p.bias = hr.kl.mean = hr.kl.max = NAN;
        }
        if (options.kv) {  // the mean over batch entries, in their order
          hr.k_bits = hr.v_bits = 0;
          for (std::size_t b = 0; b < sink.k_bits.size(); ++b) {
            hr.k_bits += sink.k_bits[b] / static_cast<double>(sink.k_bits.size());
            hr.v_bits += sink.v_bits[b] / static_cast<double>(sink.v_bits.size());
          }
        }
        results.push_back(std::move(hr));
      }
  return results;
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

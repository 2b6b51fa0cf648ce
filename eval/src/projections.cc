// A dump's projection weights (qattn/eval/evaluate.h): Q, K and V recomputed from a layer's input through weights a
// weight quantizer changed (--weights).
#include "qattn/eval/evaluate.h"

#include <algorithm>
#include <cmath>
#include <iostream>
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

std::optional<LayerProjections> load_projections(const fs::path& dir, int layer) {
  const std::string pre = "layer" + std::to_string(layer) + "_";
  const fs::path xf = dir / (pre + "attn_input.npy");
  std::error_code ec;
  if (!fs::is_directory(dir, ec) || !fs::exists(xf, ec)) return std::nullopt;
  const Tensor xt = read_npy(xf);
  if (xt.shape.size() != 3 || !dtype_is_float(xt.dtype))
    throw InputError(xf.string(), "shape", "expected float [windows, tokens, d_model], got " +
                                               std::string(dtype_name(xt.dtype)) + " " + xt.shape_string());
  LayerProjections p;
  p.windows = xt.shape[0];
  p.tokens = xt.shape[1];
  p.x = xt.as_rows();
  for (int k = 0; k < 3; ++k) {
    const fs::path wf = dir / (pre + "w" + "qkv"[k] + ".npy"), bf = dir / (pre + "b" + "qkv"[k] + ".npy");
    if (!fs::exists(wf, ec)) throw InputError(wf.string(), "file", "missing (the weights of " + xf.filename().string() + ")");
    if (!fs::exists(bf, ec)) throw InputError(bf.string(), "file", "missing (the biases of " + xf.filename().string() + ")");
    const Tensor wt = read_npy(wf), bt = read_npy(bf);
    if (wt.shape.size() != 2 || wt.shape[0] != xt.shape[2])
      throw InputError(wf.string(), "shape", "expected [" + std::to_string(xt.shape[2]) + ", d_out], got " + wt.shape_string());
    if (bt.shape.size() != 1 || bt.shape[0] != wt.shape[1])
      throw InputError(bf.string(), "shape", "expected [" + std::to_string(wt.shape[1]) + "], got " + bt.shape_string());
    // K's and V's may be narrower than Q's (grouped-query attention): checked against the dump's heads by the caller
    if (k == 2 && wt.shape[1] != p.w[1].cols())
      throw InputError(wf.string(), "shape", "d_out differs from " + pre + "wk.npy");
    p.w[k] = wt.as_rows();
    const Eigen::ArrayXd bv = bt.to_double();
    p.b[k] = bv.matrix().transpose();
  }
  return p;
}

DumpLayer project_layer(const DumpLayer& like, const RowMatrixXd& x, std::int64_t tokens,
                        const std::array<RowMatrixXd, 3>& w, const std::array<Eigen::RowVectorXd, 3>& b) {
  DumpLayer l;
  l.layer = like.layer;
  l.scale = like.logit_scale();
  l.causal = like.causal;
  l.heads = like.heads;
  l.kv_group = like.kv_group;
  l.kv_of = like.kv_of;
  const Eigen::Index heads = static_cast<Eigen::Index>(like.heads.size()), d = w[0].cols() / heads;
  const Eigen::Index kv_heads = static_cast<Eigen::Index>(like.k.size());  // H_kv of a grouped-query layer
  if (d * heads != w[0].cols())
    throw InputError("layer" + std::to_string(like.layer) + "_wq.npy", "shape",
                     std::to_string(w[0].cols()) + " outputs do not split into " + std::to_string(heads) + " heads");
  for (int k = 1; k < 3; ++k)
    if (w[k].cols() != kv_heads * d)
      throw InputError("layer" + std::to_string(like.layer) + "_w" + "qkv"[k] + ".npy", "shape",
                       std::to_string(w[k].cols()) + " outputs do not split into " + std::to_string(kv_heads) +
                           " K/V heads of d = " + std::to_string(d));
  std::array<RowMatrixXd, 3> y;
  for (int k = 0; k < 3; ++k) y[k] = (x * w[k]).rowwise() + b[k];
  const std::int64_t windows = x.rows() / tokens;
  // Q per query head; K and V per K/V head (the same as per query head where every head has its own)
  for (int k = 0; k < 3; ++k)
    for (Eigen::Index h = 0; h < (k == 0 ? heads : kv_heads); ++h) {
      if (k == 0)
        l.q_paths.push_back("layer" + std::to_string(like.layer) + " projections, head " + std::to_string(like.heads[h]));
      std::vector<RowMatrixXd> per;
      for (std::int64_t t = 0; t < windows; ++t) per.push_back(y[k].block(t * tokens, h * d, tokens, d));
      (k == 0 ? l.q : k == 1 ? l.k : l.v).push_back(std::move(per));
    }
  return l;
}

void compute_reference(DumpLayer& l) {
  const auto fp64 = ref::reference_registry().create("fp64");
  const AttentionMask mask{RowMatrixXb(), l.causal};
  l.reference.clear();
  for (std::size_t h = 0; h < l.q.size(); ++h) {
    std::vector<AttentionResult> refs;
    for (std::size_t b = 0; b < l.q[h].size(); ++b)
      refs.push_back(fp64->attention(l.q[h][b], l.k_at(h, b), l.v_at(h, b), l.logit_scale(), mask));
    l.reference.push_back(std::move(refs));
  }
}

void quantize_projections(std::vector<DumpLayer>& dump, const fs::path& dir, const ref::WeightQuantizer& wq) {
  std::vector<DumpLayer> kept;
  for (DumpLayer& l : dump) {
    const std::optional<LayerProjections> p = load_projections(dir, l.layer);
    if (!p) {
      std::cerr << "qattn: layer " << l.layer << " has no layer" << l.layer
                << "_attn_input.npy: left out of the weight-quantization analysis\n";
      continue;
    }
    const Eigen::Index d = l.q.front().front().cols(), heads = static_cast<Eigen::Index>(l.heads.size());
    const Eigen::Index kv_heads = static_cast<Eigen::Index>(l.k.size());
    if (p->w[0].cols() != heads * d)
      throw InputError((dir / ("layer" + std::to_string(l.layer) + "_wq.npy")).string(), "shape",
                       std::to_string(p->w[0].cols()) + " outputs, but the dump's layer " + std::to_string(l.layer) +
                           " has " + std::to_string(heads) + " heads of d = " + std::to_string(d));
    // grouped-query attention: K and V project onto the K/V heads, each read by its group's query heads
    if (p->w[1].cols() != kv_heads * d)
      throw InputError((dir / ("layer" + std::to_string(l.layer) + "_wk.npy")).string(), "shape",
                       std::to_string(p->w[1].cols()) + " outputs, but the dump's layer " + std::to_string(l.layer) +
                           " has " + std::to_string(kv_heads) + " K/V heads of d = " + std::to_string(d));
    DumpLayer exact = project_layer(l, p->x, p->tokens, p->w, p->b);
    compute_reference(exact);
    std::array<RowMatrixXd, 3> w;
    for (int k = 0; k < 3; ++k) w[k] = wq.apply(p->w[k], p->x);
    DumpLayer quantized = project_layer(l, p->x, p->tokens, w, p->b);
    quantized.reference = std::move(exact.reference);
    kept.push_back(std::move(quantized));
  }
  if (kept.empty())
    throw InputError(dir.string(), "--weights",
                     "no layer has layer{L}_attn_input.npy with layer{L}_w{q,k,v}.npy and b{q,k,v}.npy (weight "
                     "quantization projects Q, K and V from them)");
  dump = std::move(kept);
}

}  // namespace qattn::eval

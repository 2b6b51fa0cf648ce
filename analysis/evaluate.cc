#include "evaluate.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <string>

#include "qattn/error.h"
#include "qattn/reference/registry.h"
#include "qattn/tensor_io.h"

namespace qattn::cli {
namespace fs = std::filesystem;

namespace {

// One head's q, k and v, read, with the names errors should show ("dir/layer0_head1_q.npy" or "dump.npz:layer0_head1_q").
struct HeadTensors {
  int layer, head;
  std::string where[3];
  Tensor t[3];
};

// Parses "layer{L}_head{H}_{q|k|v}" followed by `suffix` (L, H decimal); false for any other name.
bool parse_head_name(const std::string& name, const std::string& suffix, int* layer, int* head, int* kind) {
  auto number = [&](std::size_t& i, int* out) {
    const std::size_t start = i;
    long v = 0;
    while (i < name.size() && name[i] >= '0' && name[i] <= '9' && i - start < 9) v = v * 10 + (name[i++] - '0');
    *out = static_cast<int>(v);
    return i > start;
  };
  auto literal = [&](std::size_t& i, const char* text) {
    const std::size_t n = std::char_traits<char>::length(text);
    if (name.compare(i, n, text) != 0) return false;
    i += n;
    return true;
  };
  std::size_t i = 0;
  if (!literal(i, "layer") || !number(i, layer) || !literal(i, "_head") || !number(i, head) || !literal(i, "_")) return false;
  if (i + 1 + suffix.size() != name.size() || name.compare(i + 1, suffix.size(), suffix) != 0) return false;
  const std::string kinds = "qkv";
  if (kinds.find(name[i]) == std::string::npos) return false;
  *kind = static_cast<int>(kinds.find(name[i]));
  return true;
}

// A directory of layer{L}_head{H}_{q,k,v}.npy, or one .npz / .safetensors file holding tensors of those names
// (".npy" suffixes inside an .npz are accepted).
std::vector<HeadTensors> read_heads(const fs::path& source) {
  std::error_code ec;
  std::map<std::pair<int, int>, HeadTensors> found;
  int layer = 0, head = 0, kind = 0;
  auto slot = [&](int l, int h) -> HeadTensors& {
    auto [it, fresh] = found.try_emplace({l, h});
    if (fresh) it->second.layer = l, it->second.head = h;
    return it->second;
  };
  const bool directory = fs::is_directory(source, ec);
  const std::string what = directory ? "no layer{L}_head{H}_{q,k,v}.npy files found"
                                     : "is not a dump directory and holds no tensors named layer{L}_head{H}_{q,k,v}";
  if (directory) {
    std::vector<fs::path> files;
    for (const auto& entry : fs::directory_iterator(source)) files.push_back(entry.path());
    std::sort(files.begin(), files.end());
    for (const auto& f : files)
      if (parse_head_name(f.filename().string(), ".npy", &layer, &head, &kind)) {
        HeadTensors& h = slot(layer, head);
        h.where[kind] = f.string();
        h.t[kind] = read_npy(f);
      }
  } else if (fs::is_regular_file(source, ec)) {
    for (NamedTensor& nt : read_tensor_file(source))
      if (parse_head_name(nt.name, "", &layer, &head, &kind) || parse_head_name(nt.name, ".npy", &layer, &head, &kind)) {
        HeadTensors& h = slot(layer, head);
        h.where[kind] = source.string() + ":" + nt.name;
        h.t[kind] = std::move(nt.tensor);
      }
  } else {
    throw InputError(source.string(), "--tensors", "is neither a directory nor a file");
  }
  if (found.empty()) throw InputError(source.string(), "--tensors", what);
  std::vector<HeadTensors> heads;
  for (auto& [lh, h] : found) {
    for (int k = 0; k < 3; ++k)
      if (h.where[k].empty())
        throw InputError(source.string(), "--tensors", "layer" + std::to_string(lh.first) + "_head" +
                                                           std::to_string(lh.second) + "_" + "qkv"[k] +
                                                           (directory ? ".npy" : "") + " is missing (q, k and v are all needed)");
    heads.push_back(std::move(h));
  }
  return heads;
}

}  // namespace

// [..., L, d] -> batch of [L, d] matrices (leading axes flattened).
std::vector<RowMatrixXd> split_batch(const Tensor& t, const fs::path& path) {
  if (t.shape.size() < 2) throw InputError(path.string(), "shape", "expected [..., L, d], got " + t.shape_string());
  if (!dtype_is_float(t.dtype))
    throw InputError(path.string(), "dtype", std::string(dtype_name(t.dtype)) + " given, analyze expects float Q/K/V");
  const std::int64_t L = t.shape[t.shape.size() - 2], d = t.shape.back();
  if (L == 0 || d == 0) throw InputError(path.string(), "shape", "empty L or d in " + t.shape_string());
  const RowMatrixXd rows = t.as_rows();
  std::vector<RowMatrixXd> out;
  for (std::int64_t b = 0; b * L < rows.rows(); ++b) out.push_back(rows.middleRows(b * L, L));
  return out;
}


namespace {

// Groups heads (in (layer, head) order) into layers, checks shapes, computes the fp64 reference.
std::vector<DumpLayer> build_layers(std::vector<HeadTensors> heads) {
  const auto reference = ref::reference_registry().create("fp64");
  std::vector<DumpLayer> layers;
  for (std::size_t h0 = 0; h0 < heads.size();) {
    std::size_t h1 = h0;
    while (h1 < heads.size() && heads[h1].layer == heads[h0].layer) ++h1;
    DumpLayer l;
    l.layer = heads[h0].layer;
    for (std::size_t h = h0; h < h1; ++h) {
      HeadTensors& ht = heads[h];
      l.heads.push_back(ht.head);
      l.q_paths.push_back(ht.where[0]);
      l.q.push_back(split_batch(ht.t[0], ht.where[0]));
      l.k.push_back(split_batch(ht.t[1], ht.where[1]));
      l.v.push_back(split_batch(ht.t[2], ht.where[2]));
      if (l.q.back().size() != l.k.back().size() || l.k.back().size() != l.v.back().size())
        throw InputError(ht.where[1], "shape", "batch size differs between q, k and v");
      if (l.q.back().size() != l.q.front().size())
        throw InputError(ht.where[0], "shape", "batch size differs from the other heads of layer " + std::to_string(ht.layer));
      if (l.q.back().front().cols() != l.q.front().front().cols())
        throw InputError(ht.where[0], "shape", "head dimension differs between heads of one layer");
      for (std::size_t b = 0; b < l.q.back().size(); ++b) {
        const RowMatrixXd &q = l.q.back()[b], &k = l.k.back()[b], &v = l.v.back()[b];
        if (q.cols() != k.cols()) throw InputError(ht.where[1], "shape", "head dimension d differs from q");
        if (k.rows() != v.rows()) throw InputError(ht.where[2], "shape", "v has a different number of keys than k");
      }
      std::vector<AttentionResult> refs;
      const double scale = 1.0 / std::sqrt(static_cast<double>(l.q.back().front().cols()));
      for (std::size_t b = 0; b < l.q.back().size(); ++b)
        refs.push_back(reference->attention(l.q.back()[b], l.k.back()[b], l.v.back()[b], scale, {}));
      l.reference.push_back(std::move(refs));
      ht = HeadTensors{};  // the matrices are kept; the tensors are not needed any more
    }
    layers.push_back(std::move(l));
    h0 = h1;
  }
  return layers;
}

Tensor single_tensor(const std::string& path) {
  std::vector<NamedTensor> ts = read_tensor_file(path);
  if (ts.size() != 1) throw InputError(path, "tensor", "holds " + std::to_string(ts.size()) + " tensors; expected one");
  return std::move(ts.front().tensor);
}

}  // namespace

std::vector<DumpLayer> load_dump(const fs::path& source) { return build_layers(read_heads(source)); }

std::vector<DumpLayer> load_explicit(const std::string& q, const std::string& k, const std::string& v) {
  HeadTensors h{0, 0, {q, k, v}, {single_tensor(q), single_tensor(k), single_tensor(v)}};
  std::vector<HeadTensors> heads;
  heads.push_back(std::move(h));
  return build_layers(std::move(heads));
}

std::vector<HeadResult> evaluate(const std::vector<DumpLayer>& dump, const Method& method, const std::string& label) {
  std::vector<HeadResult> results;
  for (const DumpLayer& l : dump) {
    const std::size_t nh = l.heads.size(), batch = l.q.front().size();
    std::vector<std::vector<AttentionResult>> res(nh);  // [head][batch]
    for (std::size_t b = 0; b < batch; ++b) {
      std::vector<RowMatrixXd> q, k, v;
      for (std::size_t h = 0; h < nh; ++h) q.push_back(l.q[h][b]), k.push_back(l.k[h][b]), v.push_back(l.v[h][b]);
      const double scale = 1.0 / std::sqrt(static_cast<double>(q.front().cols()));
      std::vector<AttentionResult> r = method.attention_heads(q, k, v, scale, {});
      for (std::size_t h = 0; h < nh; ++h) res[h].push_back(std::move(r[h]));
    }
    for (std::size_t h = 0; h < nh; ++h) {
      std::vector<double> o_all, o_ref_all, p_all, p_ref_all;
      for (std::size_t b = 0; b < batch; ++b) {
        const AttentionResult& r = res[h][b];
        const AttentionResult& ref = l.reference[h][b];
        o_all.insert(o_all.end(), r.o.data(), r.o.data() + r.o.size());
        o_ref_all.insert(o_ref_all.end(), ref.o.data(), ref.o.data() + ref.o.size());
        p_all.insert(p_all.end(), r.p.data(), r.p.data() + r.p.size());
        p_ref_all.insert(p_ref_all.end(), ref.p.data(), ref.p.data() + ref.p.size());
      }
      HeadResult hr{l.layer, l.heads[h], label, compare(o_all, o_ref_all), {}, {}};
      if (!p_all.empty()) {
        hr.p = compare(p_all, p_ref_all);
        const auto cols = l.reference[h].front().p.cols();
        const auto nrows = static_cast<Eigen::Index>(p_all.size()) / cols;
        hr.kl = kl_rows(Eigen::Map<const RowMatrixXd>(p_ref_all.data(), nrows, cols),
                        Eigen::Map<const RowMatrixXd>(p_all.data(), nrows, cols));
      } else {
        hr.p.cossim = hr.p.rel_l1 = hr.p.rmse = hr.p.max_abs = hr.p.bias = hr.kl.mean = hr.kl.max = NAN;
      }
      results.push_back(hr);
    }
  }
  return results;
}

std::array<double, 7> metric_values(const HeadResult& r) {
  return {r.o.cossim, r.o.rel_l1, r.o.rmse, r.p.cossim, r.p.rel_l1, r.p.rmse, r.kl.mean};
}

Summary summarise(const std::vector<HeadResult>& results) {
  Summary s;
  for (int i = 0; i < 7; ++i) s.worst[i] = lower_is_worse(i) ? INFINITY : -INFINITY;
  for (const HeadResult& r : results) {
    const auto v = metric_values(r);
    for (int i = 0; i < 7; ++i) {
      s.mean[i] += v[i];
      s.worst[i] = lower_is_worse(i) ? std::fmin(s.worst[i], v[i]) : std::fmax(s.worst[i], v[i]);
    }
  }
  for (double& x : s.mean) x /= static_cast<double>(results.size());
  return s;
}

}  // namespace qattn::cli

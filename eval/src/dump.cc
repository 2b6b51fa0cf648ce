// Reading a dump (qattn/eval/evaluate.h): a directory's, .npz's or .safetensors' heads by name with their manifest,
// batches and masks, and the fp64 references; the explicit tensors of --q/--k/--v and --logits.
#include "qattn/eval/evaluate.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <string>
#include <tuple>

#include "dump_manifest.h"
#include "qattn/error.h"
#include "qattn/eval/panel_metrics.h"
#include "qattn/reference/float_attention.h"
#include "qattn/reference/registry.h"
#include "qattn/reference/softmax.h"
#include "qattn/tensor_io.h"

namespace qattn::eval {
namespace fs = std::filesystem;

namespace {

// One head's tensors, read, with the names errors should show ("dir/layer0_head1_q.npy" or
// "dump.npz:layer0_head1_q"): q, k, v and logits, in that order.
constexpr int kKinds = 4;
constexpr const char* kKindNames[kKinds] = {"q", "k", "v", "logits"};
constexpr const char* kKindRoles[kKinds] = {"Q", "K", "V", "logits"};

struct HeadTensors {
  int layer, head;
  std::string where[kKinds];
  Tensor t[kKinds];
};

// Parses "layer{L}_head{H}_{q|k|v|logits}" followed by `suffix` (L, H decimal, leading zeros allowed, each at most
// kMaxDumpNumber); false for any other name.
constexpr long long kMaxDumpNumber = INT32_MAX;
bool parse_head_name(const std::string& name, const std::string& suffix, int* layer, int* head, int* kind) {
  auto number = [&](std::size_t& i, int* out) {
    const std::size_t start = i;
    long long v = 0;
    for (; i < name.size() && name[i] >= '0' && name[i] <= '9'; ++i)
      if ((v = v * 10 + (name[i] - '0')) > kMaxDumpNumber) return false;
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
  for (int k = 0; k < kKinds; ++k)
    if (name == name.substr(0, i) + kKindNames[k] + suffix) {
      *kind = k;
      return true;
    }
  return false;
}

// Why a name of the form "layer{L}_head{H}_{q|k|v|logits}" + `suffix` that parse_head_name refuses is not a dump
// file name: L or H is not a decimal number ("head+1", "head-1", "head0x1") or exceeds kMaxDumpNumber (10 digits and
// more). Empty for a name of any other form, which is a stray rather than a head file.
std::string bad_head_number(const std::string& name, const std::string& suffix) {
  static const std::regex kHeadLike(R"(layer([^_]*)_head([^_]*)_(q|k|v|logits))");
  static const std::regex kHeadLikeNpy(R"(layer([^_]*)_head([^_]*)_(q|k|v|logits)\.npy)");
  std::smatch m;
  if (!std::regex_match(name, m, suffix.empty() ? kHeadLike : kHeadLikeNpy)) return "";
  for (int part : {1, 2}) {
    const std::string what = part == 1 ? "layer" : "head", digits = m[part].str();
    if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos)
      return what + " number '" + digits + "' is not a decimal number (files are named layer{L}_head{H}_{q,k,v,logits}" +
             suffix + ")";
    long long v = 0;
    for (const char c : digits)
      if ((v = v * 10 + (c - '0')) > kMaxDumpNumber)
        return what + " number " + digits + " is out of range [0, " + std::to_string(kMaxDumpNumber) + "]";
  }
  return "";
}

// The grouped-query layers of an attention dump, decided from the names alone (so that every shard decides alike):
// layer -> H_q / H_kv (query heads per K/V head) for each layer whose q heads are exactly 0 .. H_q - 1, its k heads
// 0 .. H_k - 1 and its v heads 0 .. H_v - 1, with min(H_k, H_v) < H_q and max(H_k, H_v) <= H_q. Refused (InputError,
// --tensors) where H_k and H_v differ (naming the first missing file) or H_kv = H_k does not divide H_q, naming the
// counts. Every other layer has one K/V head per query head, and its missing files are found per head.
std::map<int, int> grouped_layers(const std::map<std::tuple<int, int, int>, std::string>& named, const fs::path& source,
                                  bool directory) {
  std::map<int, std::array<std::vector<int>, 3>> heads;  // layer -> [kind] -> head numbers, ascending
  for (const auto& [lhk, name] : named)
    if (std::get<2>(lhk) < 3) heads[std::get<0>(lhk)][static_cast<std::size_t>(std::get<2>(lhk))].push_back(std::get<1>(lhk));
  const auto from_zero = [](const std::vector<int>& h) {
    for (std::size_t i = 0; i < h.size(); ++i)
      if (h[i] != static_cast<int>(i)) return false;
    return !h.empty();
  };
  std::map<int, int> out;
  for (const auto& [layer, kinds] : heads) {
    const std::size_t nq = kinds[0].size(), nk = kinds[1].size(), nv = kinds[2].size();
    if (!from_zero(kinds[0]) || !from_zero(kinds[1]) || !from_zero(kinds[2]) || std::min(nk, nv) >= nq ||
        std::max(nk, nv) > nq)
      continue;
    const std::string l = std::to_string(layer), counts = "layer " + l + " has " + std::to_string(nq) + " q heads, ";
    if (nk != nv)
      throw InputError(source.string(), "--tensors",
                       counts + std::to_string(nk) + " k heads and " + std::to_string(nv) +
                           " v heads: grouped-query attention needs as many k heads as v heads (layer" + l + "_head" +
                           std::to_string(std::min(nk, nv)) + "_" + (nk < nv ? "k" : "v") + (directory ? ".npy" : "") +
                           " is missing)");
    if (nq % nk != 0)
      throw InputError(source.string(), "--tensors",
                       counts + std::to_string(nk) + " k and v heads: grouped-query attention needs the K/V head count "
                       "to divide the query head count");
    out[layer] = static_cast<int>(nq / nk);
  }
  return out;
}

// One read_heads call: the source's names, classified, and the tensors the target and the filter keep.
struct HeadScan {
  // A name classified as a head file: (layer, head, kind), kind indexing kKindNames.
  struct HeadFile {
    int layer, head, kind;
  };

  const fs::path& source;
  const DumpFilter* filter;
  bool softmax, directory;
  std::map<std::pair<int, int>, HeadTensors> found;
  bool other_kind = false;  // files of the other target were seen (for the hint in the error)
  std::string strays;       // files named like none of the dump's files (a misspelt head name), for the messages
  std::map<std::tuple<int, int, int>, std::string> named;  // (layer, head, kind) -> the name that gave it
  std::map<int, int> groups;  // layer -> H_q / H_kv of the grouped-query layers, once every name is classified

  bool wanted(int kind) const { return softmax ? kind == 3 : kind < 3; }

  // Every name is classified before any tensor is kept: a head file, one named like a head file whose number does not
  // parse (refused, naming it), a layer's projection file, or a stray. Two names of one (layer, head, kind), such as
  // layer0_head0_k.npy and layer0_head00_k.npy, are refused: either could be the one read.
  std::optional<HeadFile> classify(const std::string& name, const std::string& where) {
    static const std::regex kLayerFile(R"(layer\d+_(attn_input|[wb][qkv])(\.npy)?)");
    int layer = 0, head = 0, kind = 0;
    if (parse_head_name(name, ".npy", &layer, &head, &kind) || (!directory && parse_head_name(name, "", &layer, &head, &kind))) {
      if (auto [it, fresh] = named.try_emplace({layer, head, kind}, name); !fresh)
        throw InputError(source.string(), "--tensors",
                         it->second + " and " + name + " both name layer " + std::to_string(layer) + " head " +
                             std::to_string(head) + "'s " + kKindNames[kind] + ": keep one");
      return HeadFile{layer, head, kind};
    }
    const bool npy = name.size() >= 4 && name.compare(name.size() - 4, 4, ".npy") == 0;
    if (const std::string why = bad_head_number(name, npy ? ".npy" : ""); !why.empty()) throw InputError(where, "name", why);
    if (!std::regex_match(name, kLayerFile)) strays += (strays.empty() ? "" : ", ") + name;
    return std::nullopt;
  }

  // Whether the filter keeps a file of (layer, head, kind): a grouped layer's K/V head where it keeps any query head
  // of the group (each one asked, so that a listing sees them all).
  bool kept(const HeadFile& hf) const {
    if (!filter) return true;
    const auto g = groups.find(hf.layer);
    if (hf.kind == 0 || hf.kind == 3 || g == groups.end()) return filter->keep(hf.layer, hf.head);
    const int group = g->second;
    bool any = false;
    for (int h = hf.head * group; h < (hf.head + 1) * group; ++h) any = filter->keep(hf.layer, h) || any;
    return any;
  }

  // Keeps one classified tensor file or member where the target and the filter want it; `read` gives its tensor.
  template <class Read>
  void keep(const HeadFile& hf, const std::string& where, Read&& read) {
    if (!wanted(hf.kind)) {
      other_kind = true;
      return;
    }
    if (!kept(hf)) return;
    auto [it, fresh] = found.try_emplace({hf.layer, hf.head});
    HeadTensors& h = it->second;
    if (fresh) h.layer = hf.layer, h.head = hf.head;
    h.where[hf.kind] = where;
    h.t[hf.kind] = read();
    if (directory && filter && filter->files_read) filter->files_read->push_back(where);
  }

  // A directory's .npy files, in name order.
  void scan_directory() {
    std::vector<fs::path> files;
    for (const auto& entry : fs::directory_iterator(source)) files.push_back(entry.path());
    std::sort(files.begin(), files.end());
    std::vector<std::pair<fs::path, HeadFile>> head_files;
    for (const auto& f : files)
      if (f.extension() == ".npy")
        if (const auto hf = classify(f.filename().string(), f.string())) head_files.push_back({f, *hf});
    if (!softmax) groups = grouped_layers(named, source, true);
    for (const auto& file : head_files) keep(file.second, file.first.string(), [&] { return read_npy(file.first); });
  }

  // An .npz's or .safetensors' members, in the file's order.
  void scan_file() {
    if (filter && filter->files_read) filter->files_read->push_back(source.string());
    std::vector<NamedTensor> tensors = read_tensor_file(source);
    std::vector<std::optional<HeadFile>> kinds;
    for (const NamedTensor& nt : tensors) kinds.push_back(classify(nt.name, source.string() + ":" + nt.name));
    if (!softmax) groups = grouped_layers(named, source, false);
    for (std::size_t i = 0; i < tensors.size(); ++i)
      if (kinds[i]) keep(*kinds[i], source.string() + ":" + tensors[i].name, [&] { return std::move(tensors[i].tensor); });
  }

  // The heads found, in (layer, head) order; refuses an unfiltered source with none, and a head missing a kind the
  // target needs (outside the grouped layers, whose K/V heads are fewer).
  std::vector<HeadTensors> checked_heads() {
    const std::string stray_note = strays.empty() ? ""
                                                  : std::string(directory ? "; files" : "; tensors") +
                                                        " not read, named like none of the dump's: " + strays;
    if (found.empty() && !filter) {
      const std::string names = softmax ? "layer{L}_head{H}_logits" : "layer{L}_head{H}_{q,k,v}";
      std::string what = directory ? "no " + names + ".npy files found" + stray_note
                                   : "is not a dump directory and holds no tensors named " + names + stray_note;
      if (other_kind)
        what += softmax ? " (it holds q/k/v: drop --softmax-only)" : " (it holds only logits: add --softmax-only)";
      throw InputError(source.string(), "--tensors", what);
    }
    std::vector<HeadTensors> heads;
    for (auto& [lh, h] : found) {
      for (int k = 0; k < kKinds; ++k)
        if (wanted(k) && h.where[k].empty() && !groups.count(lh.first))
          throw InputError(source.string(), "--tensors",
                           "layer" + std::to_string(lh.first) + "_head" + std::to_string(lh.second) + "_" +
                               kKindNames[k] + (directory ? ".npy" : "") + " is missing (q, k and v are all needed)" +
                               stray_note);
      heads.push_back(std::move(h));
    }
    return heads;
  }
};

// A directory of layer{L}_head{H}_{q,k,v,logits}.npy, or one .npz / .safetensors file holding tensors of those
// names (".npy" suffixes inside an .npz are accepted). Keeps the kinds `target` needs. Refuses (InputError) a name
// of that form whose L or H is not a number in [0, kMaxDumpNumber], and two names of one (layer, head, kind), whatever
// the target and the filter keep. An attention dump's grouped-query layers (grouped_layers) go to *grouped, layer ->
// query heads per K/V head; a K/V head of one is read where the filter keeps any query head of its group.
std::vector<HeadTensors> read_heads(const fs::path& source, DumpTarget target, const DumpFilter* filter = nullptr,
                                    std::map<int, int>* grouped = nullptr) {
  std::error_code ec;
  HeadScan scan{source, filter, target == DumpTarget::softmax, fs::is_directory(source, ec)};
  if (scan.directory) scan.scan_directory();
  else if (fs::is_regular_file(source, ec)) scan.scan_file();
  else if (!fs::exists(source, ec)) throw InputError(source.string(), "--tensors", "does not exist");
  else throw InputError(source.string(), "--tensors", "is neither a directory nor a regular file");
  std::vector<HeadTensors> heads = scan.checked_heads();
  if (grouped) *grouped = std::move(scan.groups);
  return heads;
}

}  // namespace

// [..., L, d] -> batch of [L, d] matrices (leading axes flattened).
std::int64_t batch_entries(const Tensor& t, const fs::path& path) {
  if (t.shape.size() < 2) throw InputError(path.string(), "shape", "expected [..., L, d], got " + t.shape_string());
  if (!dtype_is_float(t.dtype))
    throw InputError(path.string(), "dtype", std::string(dtype_name(t.dtype)) + " given, analyze expects float Q/K/V");
  return batch_entries(t.shape, path.string());
}

std::int64_t batch_entries(const std::vector<std::int64_t>& shape, const std::string& name) {
  Tensor t;
  t.shape = shape;
  if (t.shape.size() < 2) throw InputError(name, "shape", "expected [..., L, d], got " + t.shape_string());
  const std::int64_t L = t.shape[t.shape.size() - 2], d = t.shape.back();
  if (L == 0 || d == 0) throw InputError(name, "shape", "empty L or d in " + t.shape_string());
  if (t.element_count() == 0)
    throw InputError(name, "shape", "a leading (batch) axis has length 0 in " + t.shape_string() +
                                        ": there is nothing to evaluate");
  return t.element_count() / (L * d);
}

std::vector<MatrixViewF> batch_views_f32(const Tensor& t, const fs::path& path, std::int64_t first, std::int64_t count) {
  batch_entries(t, path);
  if (t.dtype != DType::f32) throw std::logic_error("batch_views_f32 on a " + std::string(dtype_name(t.dtype)) + " tensor");
  const Eigen::Index L = t.shape[t.shape.size() - 2], d = t.shape.back();
  const float* base = reinterpret_cast<const float*>(t.bytes.data());
  std::vector<MatrixViewF> out;
  for (std::int64_t b = first; b < first + count; ++b)
    out.emplace_back(Eigen::Map<const RowMatrixXf>(base + b * L * d, L, d));
  return out;
}

std::vector<RowMatrixXd> split_batch(const Tensor& t, const fs::path& path) {
  batch_entries(t, path);
  const std::int64_t L = t.shape[t.shape.size() - 2];
  RowMatrixXd rows = t.as_rows();
  std::vector<RowMatrixXd> out;
  if (rows.rows() == L) {  // one matrix: handed over, not copied
    out.push_back(std::move(rows));
    return out;
  }
  for (std::int64_t b = 0; b * L < rows.rows(); ++b) out.push_back(rows.middleRows(b * L, L));
  return out;
}

void require_finite_tensor(const Tensor& t, const std::string& where, const std::string& role, bool masked_ok) {
  if (!dtype_is_float(t.dtype)) return;  // integers are always finite
  const auto count = static_cast<Eigen::Index>(t.element_count());
  const auto all_finite = [&](const auto* data) {
    return finite_prefix(std::span(data, static_cast<std::size_t>(count))) == static_cast<std::size_t>(count);
  };
  if (t.dtype == DType::f32 && all_finite(reinterpret_cast<const float*>(t.bytes.data()))) return;
  if (t.dtype == DType::f64 && all_finite(reinterpret_cast<const double*>(t.bytes.data()))) return;
  // Something is not finite (or the dtype is a 16-bit format): find the first refused entry.
  // float32 and float64 are read in place; the 16-bit formats through to_double (exact).
  Eigen::ArrayXd widened;
  if (t.dtype != DType::f32 && t.dtype != DType::f64) widened = t.to_double();
  const auto value = [&](Eigen::Index i) -> double {
    if (t.dtype == DType::f32) return reinterpret_cast<const float*>(t.bytes.data())[i];
    if (t.dtype == DType::f64) return reinterpret_cast<const double*>(t.bytes.data())[i];
    return widened[i];
  };
  for (Eigen::Index i = 0; i < count; ++i) {
    const double x = value(i);
    if (std::isfinite(x) || (masked_ok && x == -INFINITY)) continue;
    std::string index;  // i as an index into t.shape, C order
    std::int64_t rest = i;
    for (std::size_t a = t.shape.size(); a-- > 0;) {
      index = std::to_string(rest % t.shape[a]) + (index.empty() ? "" : ", ") + index;
      rest /= t.shape[a];
    }
    const std::string what = std::isnan(x) ? "NaN" : x > 0 ? "+inf" : "-inf";
    throw InputError(where, role + "[" + index + "]",
                     "is " + what + "; non-finite input is refused" +
                         (masked_ok ? " (-inf, meaning masked, is the one exception)" : "") + " (docs/non-finite.md)");
  }
}

namespace {

constexpr std::pair<const char*, SoftmaxReference> kSoftmaxReferences[] = {{"fp64", SoftmaxReference::fp64},
                                                                           {"exact", SoftmaxReference::exact}};

}  // namespace

SoftmaxReference parse_softmax_reference(const std::string& name) {
  std::string valid;
  for (const auto& [n, r] : kSoftmaxReferences) {
    if (name == n) return r;
    valid += (valid.empty() ? "" : "|") + std::string(n);
  }
  throw SpecError("'" + name + "' is not one of " + valid);
}

std::string softmax_reference_name(SoftmaxReference reference) {
  for (const auto& [n, r] : kSoftmaxReferences)
    if (r == reference) return n;
  return "";
}

namespace {

// The reference probabilities of logits [rows, L]: fp64 softmax, or the exact softmax rounded once to double.
RowMatrixXd softmax_reference(const RowMatrixXd& logits, SoftmaxReference kind) {
  if (kind == SoftmaxReference::fp64) return ref::softmax_ref_rows(logits);
  RowMatrixXd p(logits.rows(), logits.cols());
  for (Eigen::Index r = 0; r < logits.rows(); ++r) {
    const std::vector<ref::Exact50> e =
        ref::softmax_exact(std::span<const double>(logits.row(r).data(), static_cast<std::size_t>(logits.cols())));
    for (Eigen::Index c = 0; c < logits.cols(); ++c) p(r, c) = static_cast<double>(e[static_cast<std::size_t>(c)]);
  }
  return p;
}

// One head of a softmax dump into l: its logits (mask applied) and their reference probabilities.
void add_softmax_head(DumpLayer& l, const HeadTensors& ht, const AttentionMask& mask, SoftmaxReference ref_kind) {
  l.q_paths.push_back(ht.where[3]);
  require_finite_tensor(ht.t[3], ht.where[3], "logits", /*masked_ok=*/true);
  std::vector<RowMatrixXd> rows = split_batch(ht.t[3], ht.where[3]);
  if (!l.logits.empty() && rows.size() != l.logits.front().size())
    throw InputError(ht.where[3], "shape", "batch size differs from the other heads of layer " + std::to_string(ht.layer));
  std::vector<RowMatrixXd> refs;
  for (RowMatrixXd& x : rows) {
    mask.apply_to_logits(x);
    refs.push_back(softmax_reference(x, ref_kind));
  }
  l.logits.push_back(std::move(rows));
  l.p_reference.push_back(std::move(refs));
}

// One head of an attention dump into l: q from qt, k and v from kvt (the same head, or under grouped-query attention
// the K/V head of qt's group), which are l.k[kv] and l.v[kv] once read (kv == l.k.size(): read here, from kvt);
// checked against each other, the layer's other heads and the manifest's head_dim (field names its layer), and the
// fp64 reference attention.
void add_attention_head(DumpLayer& l, const HeadTensors& qt, const HeadTensors& kvt, std::size_t kv,
                        const LayerManifest* m, const std::string& manifest_path, const std::string& field,
                        const AttentionMask& mask, const Method* reference) {
  const bool new_kv = kv == l.k.size();
  const HeadTensors& ht = qt;
  l.q_paths.push_back(ht.where[0]);
  for (int kind = 0; kind < 3; ++kind)
    if (kind == 0 || new_kv) require_finite_tensor((kind ? kvt : qt).t[kind], (kind ? kvt : qt).where[kind], kKindRoles[kind]);
  l.q.push_back(split_batch(ht.t[0], ht.where[0]));
  if (new_kv) {
    l.k.push_back(split_batch(kvt.t[1], kvt.where[1]));
    l.v.push_back(split_batch(kvt.t[2], kvt.where[2]));
  }
  const auto q_entries = static_cast<std::int64_t>(l.q.back().size());
  if (q_entries % l.kv_entries.q_heads != 0 ||
      static_cast<std::size_t>(q_entries / l.kv_entries.q_heads * l.kv_entries.kv_heads) != l.k[kv].size() ||
      l.k[kv].size() != l.v[kv].size())
    throw InputError(kvt.where[1], "shape",
                     "batch size differs between q, k and v: " + std::to_string(l.q.back().size()) + ", " +
                         std::to_string(l.k[kv].size()) + " and " + std::to_string(l.v[kv].size()) +
                         " [L, d] matrices (leading axes flattened)");
  if (l.q.back().size() != l.q.front().size())
    throw InputError(ht.where[0], "shape", "batch size differs from the other heads of layer " + std::to_string(ht.layer));
  if (l.q.back().front().cols() != l.q.front().front().cols())
    throw InputError(ht.where[0], "shape", "head dimension differs between heads of one layer");
  if (m && m->head_dim && *m->head_dim != l.q.back().front().cols())
    throw InputError(manifest_path, field + ".head_dim",
                     "says " + std::to_string(*m->head_dim) + ", " + ht.where[0] + " has d = " +
                         std::to_string(l.q.back().front().cols()));
  for (std::size_t b = 0; b < l.q.back().size(); ++b) {
    const RowMatrixXd &q = l.q.back()[b], &k = l.k[kv][l.kv_entry(b)], &v = l.v[kv][l.kv_entry(b)];
    if (q.cols() != k.cols())
      throw InputError(kvt.where[1], "shape", "head dimension d = " + std::to_string(k.cols()) + " differs from q's d = " +
                                                  std::to_string(q.cols()) + " (" + ht.where[0] + ")");
    if (k.rows() != v.rows())
      throw InputError(kvt.where[2], "shape", "v has " + std::to_string(v.rows()) + " keys, k has " +
                                                  std::to_string(k.rows()) + " (" + kvt.where[1] + ")");
  }
  if (!reference) return;  // computed block by block when evaluated
  std::vector<AttentionResult> refs;
  const double scale = l.logit_scale();
  for (std::size_t b = 0; b < l.q.back().size(); ++b) {
    refs.push_back(reference->attention(l.q.back()[b], l.k[kv][l.kv_entry(b)], l.v[kv][l.kv_entry(b)], scale, mask));
    // fp64 propagates overflow as NaN; a reference that is not finite cannot measure anything
    if (!refs.back().o.allFinite())
      throw InputError(ht.where[0], "values", "scale * Q K^T overflows float64 in the fp64 reference (batch entry " +
                                                  std::to_string(b) + "); rescale the inputs");
  }
  l.reference.push_back(std::move(refs));
}

// Groups heads (in (layer, head) order) into layers, checks shapes against each other and the manifest, computes
// the reference. `grouped`: the grouped-query layers (read_heads), whose query heads share their group's K/V.
// With `listing` (a shard), the manifest is checked against the whole dump's layers and heads, not the ones read.
std::vector<DumpLayer> build_layers(std::vector<HeadTensors> heads, DumpTarget target, SoftmaxReference ref_kind,
                                    const std::map<int, LayerManifest>& manifest, const std::string& manifest_path,
                                    const DumpListing* listing = nullptr, bool with_reference = true,
                                    const std::map<int, int>& grouped = {}, const KvGrouping& kv_entries = {}) {
  const std::map<int, int> listed = listing ? listing->heads_per_layer() : std::map<int, int>{};
  const auto reference = ref::reference_registry().create("fp64");
  std::vector<DumpLayer> layers;
  for (std::size_t h0 = 0; h0 < heads.size();) {
    std::size_t h1 = h0;
    while (h1 < heads.size() && heads[h1].layer == heads[h0].layer) ++h1;
    DumpLayer l;
    l.layer = heads[h0].layer;
    const LayerManifest* m = nullptr;
    if (auto it = manifest.find(l.layer); it != manifest.end()) m = &it->second;
    else if (auto all = manifest.find(-1); all != manifest.end()) m = &all->second;
    if (m && m->scale) l.scale = *m->scale;
    if (m && m->causal) l.causal = *m->causal;
    const std::string field = "layers[" + std::to_string(l.layer) + "]";
    const int n_heads = listing ? listed.at(l.layer) : static_cast<int>(h1 - h0);
    if (m && m->num_heads && *m->num_heads != n_heads)
      throw InputError(manifest_path, field + ".num_heads",
                       "says " + std::to_string(*m->num_heads) + " heads, the dump has " + std::to_string(n_heads));
    const auto group = grouped.find(l.layer);
    l.kv_group = group == grouped.end() ? 1 : group->second;
    l.kv_entries = kv_entries;
    if (m && m->num_kv_heads && target == DumpTarget::attention && *m->num_kv_heads != n_heads / l.kv_group)
      throw InputError(manifest_path, field + ".num_kv_heads",
                       "says " + std::to_string(*m->num_kv_heads) + " K/V heads, the dump has " +
                           std::to_string(n_heads / l.kv_group) + " (k and v files of layer " +
                           std::to_string(l.layer) + ", for " + std::to_string(n_heads) + " query heads)");
    const AttentionMask mask{RowMatrixXb(), l.causal};
    if (target == DumpTarget::attention && l.kv_group > 1) {
      // Each query head reads its group's K/V head, read once: l.k and l.v hold the K/V heads in order.
      std::map<int, std::size_t> kv_at;  // K/V head number -> index into l.k
      for (std::size_t h = h0; h < h1; ++h) {
        if (heads[h].where[0].empty()) continue;  // a K/V head whose own query head this shard does not read
        const int g = heads[h].head / l.kv_group;
        std::size_t s = h0;
        while (heads[s].head != g) ++s;  // heads are in order; g <= the query head
        const auto [at, fresh] = kv_at.try_emplace(g, l.k.size());
        l.heads.push_back(heads[h].head);
        add_attention_head(l, heads[h], heads[s], at->second, m, manifest_path, field, mask,
                           with_reference ? reference.get() : nullptr);
        l.kv_of.push_back(at->second);
        heads[h].t[0] = Tensor{};  // the matrices are kept; the tensors are not needed any more
        if (fresh) heads[s].t[1] = Tensor{}, heads[s].t[2] = Tensor{};
      }
    } else {
      for (std::size_t h = h0; h < h1; ++h) {
        l.heads.push_back(heads[h].head);
        if (target == DumpTarget::softmax) add_softmax_head(l, heads[h], mask, ref_kind);
        else add_attention_head(l, heads[h], heads[h], l.k.size(), m, manifest_path, field, mask,
                                with_reference ? reference.get() : nullptr);
        heads[h] = HeadTensors{};  // the matrices are kept; the tensors are not needed any more
      }
    }
    layers.push_back(std::move(l));
    h0 = h1;
  }
  std::vector<int> present_layers;
  for (const DumpLayer& l : layers) present_layers.push_back(l.layer);
  if (listing) {
    present_layers.clear();
    for (const auto& [layer, n] : listed) present_layers.push_back(layer);
  }
  for (const auto& [layer, m] : manifest) {
    if (layer < 0) continue;
    if (std::find(present_layers.begin(), present_layers.end(), layer) == present_layers.end()) {
      std::string present;
      for (int l : present_layers) present += (present.empty() ? "" : ", ") + std::to_string(l);
      throw InputError(manifest_path, "layers[" + std::to_string(layer) + "]",
                       "describes a layer that has no files in the dump (layers present: " + present + ")");
    }
  }
  return layers;
}

Tensor single_tensor(const std::string& path) {
  std::vector<NamedTensor> ts = read_tensor_file(path);
  if (ts.size() != 1) throw InputError(path, "tensor", "holds " + std::to_string(ts.size()) + " tensors; expected one");
  return std::move(ts.front().tensor);
}

}  // namespace

double DumpLayer::logit_scale() const {
  if (scale > 0) return scale;
  const Eigen::Index d = q.empty() ? 1 : q.front().front().cols();
  return 1.0 / std::sqrt(static_cast<double>(d));
}

std::vector<DumpLayer> load_dump(const fs::path& source, DumpTarget target, SoftmaxReference reference,
                                 const DumpFilter* filter, bool with_reference) {
  const auto manifest = read_manifest(source);  // before the tensors: a bad manifest fails fast
  if (filter && filter->files_read && !manifest.empty()) filter->files_read->push_back((source / "manifest.json").string());
  std::map<int, int> grouped;
  std::vector<HeadTensors> heads = read_heads(source, target, filter, &grouped);
  return build_layers(std::move(heads), target, reference, manifest, (source / "manifest.json").string(),
                      filter ? filter->listing : nullptr, with_reference, grouped);
}

std::map<int, int> DumpListing::heads_per_layer() const {
  std::map<int, int> n;
  for (const auto& [layer, head] : units) ++n[layer];
  return n;
}

DumpListing list_dump(const fs::path& source, DumpTarget target) {
  DumpListing out;
  std::error_code ec;
  std::set<std::pair<int, int>> units;
  out.directory = fs::is_directory(source, ec);
  if (out.directory) {
    for (const auto& entry : fs::directory_iterator(source))
      if (entry.is_regular_file(ec)) out.files[entry.path().filename().string()] = entry.file_size(ec);
  } else if (fs::is_regular_file(source, ec)) {
    out.files[source.filename().string()] = fs::file_size(source, ec);
  }
  // The names as the reader classifies them, so that every shard refuses what the unsharded run refuses (two
  // spellings of one file, a head number that does not parse), a shard that owns no head included. Nothing is kept:
  // a directory's files are not read, an archive's members are read once, here.
  DumpFilter names_only;
  names_only.keep = [&units](int layer, int head) {
    units.insert({layer, head});
    return false;
  };
  read_heads(source, target, &names_only);
  if (units.empty()) read_heads(source, target);  // throws the unsharded run's error, with its hints
  out.units.assign(units.begin(), units.end());
  return out;
}

KvGrouping group_kv_heads(const std::vector<std::int64_t>& q_shape, const std::vector<std::int64_t>& k_shape,
                          const std::vector<std::int64_t>& v_shape, const std::string& q, const std::string& k,
                          const std::string& v) {
  const auto leading = [](const std::vector<std::int64_t>& s) {
    return std::vector<std::int64_t>(s.begin(), s.end() - static_cast<std::ptrdiff_t>(std::min<std::size_t>(2, s.size())));
  };
  const auto shown = [](const std::vector<std::int64_t>& s) {
    Tensor t;
    t.shape = s;
    return t.shape_string();
  };
  const std::vector<std::int64_t> lq = leading(q_shape), lk = leading(k_shape), lv = leading(v_shape);
  if (lq == lk && lk == lv) return {};
  // Only the heads axis (the last leading one) may differ.
  const auto others_equal = [](const std::vector<std::int64_t>& a, const std::vector<std::int64_t>& b) {
    return a.size() == b.size() && std::equal(a.begin(), a.end() - 1, b.begin());
  };
  if (lq.empty() || !others_equal(lq, lk) || !others_equal(lk, lv))
    throw InputError(k, "shape", "leading (batch) dimensions of q " + shown(q_shape) + ", k " + shown(k_shape) +
                                     " and v " + shown(v_shape) + " differ");
  const std::int64_t hq = lq.back(), hk = lk.back(), hv = lv.back();
  if (hk != hv)
    throw InputError(v, "shape", "v has " + std::to_string(hv) + " heads (axis -3 of " + shown(v_shape) + "), k has " +
                                     std::to_string(hk) + " (" + k + ", " + shown(k_shape) +
                                     "): grouped-query attention needs as many K heads as V heads");
  if (hk < 1 || hq % hk != 0)
    throw InputError(k, "shape", "k and v have " + std::to_string(hk) + " heads (axis -3 of " + shown(k_shape) +
                                     "), q has " + std::to_string(hq) + " (" + q + ", " + shown(q_shape) +
                                     "): grouped-query attention needs the K/V head count to divide the query head count");
  return {hq, hk};
}

std::vector<DumpLayer> load_explicit(const std::string& q, const std::string& k, const std::string& v,
                                     bool with_reference) {
  HeadTensors h{0, 0, {q, k, v, ""}, {single_tensor(q), single_tensor(k), single_tensor(v), Tensor{}}};
  // K and V with fewer heads than Q (only the heads axis differing: other mismatches keep the batch-size message)
  KvGrouping kv_entries;
  const std::vector<std::int64_t>&qs = h.t[0].shape, &ks = h.t[1].shape, &vs = h.t[2].shape;
  if (qs.size() >= 3 && qs.size() == ks.size() && ks.size() == vs.size() &&
      std::equal(qs.begin(), qs.end() - 3, ks.begin()) && std::equal(ks.begin(), ks.end() - 3, vs.begin()) &&
      (qs[qs.size() - 3] != ks[ks.size() - 3] || ks[ks.size() - 3] != vs[vs.size() - 3]))
    kv_entries = group_kv_heads(qs, ks, vs, q, k, v);
  std::vector<HeadTensors> heads;
  heads.push_back(std::move(h));
  return build_layers(std::move(heads), DumpTarget::attention, SoftmaxReference::fp64, {}, "", nullptr, with_reference,
                      {}, kv_entries);
}

std::vector<DumpLayer> load_explicit_logits(const std::string& logits, SoftmaxReference reference) {
  HeadTensors h{0, 0, {"", "", "", logits}, {Tensor{}, Tensor{}, Tensor{}, single_tensor(logits)}};
  std::vector<HeadTensors> heads;
  heads.push_back(std::move(h));
  return build_layers(std::move(heads), DumpTarget::softmax, reference, {}, "");
}

}  // namespace qattn::eval

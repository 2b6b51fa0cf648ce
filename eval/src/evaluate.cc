#include "qattn/eval/evaluate.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>
#include <thread>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <string>
#include <tuple>

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

// A directory of layer{L}_head{H}_{q,k,v,logits}.npy, or one .npz / .safetensors file holding tensors of those
// names (".npy" suffixes inside an .npz are accepted). Keeps the kinds `target` needs. Refuses (InputError) a name
// of that form whose L or H is not a number in [0, kMaxDumpNumber], and two names of one (layer, head, kind), whatever
// the target and the filter keep. An attention dump's grouped-query layers (grouped_layers) go to *grouped, layer ->
// query heads per K/V head; a K/V head of one is read where the filter keeps any query head of its group.
std::vector<HeadTensors> read_heads(const fs::path& source, DumpTarget target, const DumpFilter* filter = nullptr,
                                    std::map<int, int>* grouped = nullptr) {
  std::error_code ec;
  std::map<std::pair<int, int>, HeadTensors> found;
  bool other_kind = false;  // files of the other target were seen (for the hint in the error)
  int layer = 0, head = 0, kind = 0;
  const bool softmax = target == DumpTarget::softmax;
  auto wanted = [&](int k) { return softmax ? k == 3 : k < 3; };
  auto slot = [&](int l, int h) -> HeadTensors& {
    auto [it, fresh] = found.try_emplace({l, h});
    if (fresh) it->second.layer = l, it->second.head = h;
    return it->second;
  };
  const bool directory = fs::is_directory(source, ec);
  const std::string names = softmax ? "layer{L}_head{H}_logits" : "layer{L}_head{H}_{q,k,v}";
  std::string strays;  // files named like none of the dump's files (a misspelt head name), for the messages
  // Every name is classified before any tensor is kept: a head file, one named like a head file whose number does not
  // parse (refused, naming it), a layer's projection file, or a stray. Two names of one (layer, head, kind), such as
  // layer0_head0_k.npy and layer0_head00_k.npy, are refused: either could be the one read.
  struct HeadFile {
    int layer, head, kind;
  };
  std::map<std::tuple<int, int, int>, std::string> named;  // (layer, head, kind) -> the name that gave it
  static const std::regex kLayerFile(R"(layer\d+_(attn_input|[wb][qkv])(\.npy)?)");
  auto classify = [&](const std::string& name, const std::string& where) -> std::optional<HeadFile> {
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
  };
  std::map<int, int> groups;  // layer -> H_q / H_kv of the grouped-query layers, once every name is classified
  // Whether the filter keeps a file of (layer, head, kind): a grouped layer's K/V head where it keeps any query head
  // of the group (each one asked, so that a listing sees them all).
  auto kept = [&](const HeadFile& hf) {
    if (!filter) return true;
    const auto g = groups.find(hf.layer);
    if (hf.kind == 0 || hf.kind == 3 || g == groups.end()) return filter->keep(hf.layer, hf.head);
    const int group = g->second;
    bool any = false;
    for (int h = hf.head * group; h < (hf.head + 1) * group; ++h) any = filter->keep(hf.layer, h) || any;
    return any;
  };
  // Keeps one classified tensor file or member where the target and the filter want it; `read` gives its tensor.
  auto keep = [&](const HeadFile& hf, const std::string& where, auto&& read) {
    if (!wanted(hf.kind)) {
      other_kind = true;
      return;
    }
    if (!kept(hf)) return;
    HeadTensors& h = slot(hf.layer, hf.head);
    h.where[hf.kind] = where;
    h.t[hf.kind] = read();
    if (directory && filter && filter->files_read) filter->files_read->push_back(where);
  };
  if (directory) {
    std::vector<fs::path> files;
    for (const auto& entry : fs::directory_iterator(source)) files.push_back(entry.path());
    std::sort(files.begin(), files.end());
    std::vector<std::pair<fs::path, HeadFile>> head_files;
    for (const auto& f : files)
      if (f.extension() == ".npy")
        if (const auto hf = classify(f.filename().string(), f.string())) head_files.push_back({f, *hf});
    if (!softmax) groups = grouped_layers(named, source, true);
    for (const auto& file : head_files) keep(file.second, file.first.string(), [&] { return read_npy(file.first); });
  } else if (fs::is_regular_file(source, ec)) {
    if (filter && filter->files_read) filter->files_read->push_back(source.string());
    std::vector<NamedTensor> tensors = read_tensor_file(source);
    std::vector<std::optional<HeadFile>> kinds;
    for (const NamedTensor& nt : tensors) kinds.push_back(classify(nt.name, source.string() + ":" + nt.name));
    if (!softmax) groups = grouped_layers(named, source, false);
    for (std::size_t i = 0; i < tensors.size(); ++i)
      if (kinds[i]) keep(*kinds[i], source.string() + ":" + tensors[i].name, [&] { return std::move(tensors[i].tensor); });
  } else if (!fs::exists(source, ec)) {
    throw InputError(source.string(), "--tensors", "does not exist");
  } else {
    throw InputError(source.string(), "--tensors", "is neither a directory nor a regular file");
  }
  const std::string stray_note =
      strays.empty() ? "" : std::string(directory ? "; files" : "; tensors") + " not read, named like none of the dump's: " + strays;
  if (found.empty() && !filter) {
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
                         "layer" + std::to_string(lh.first) + "_head" + std::to_string(lh.second) + "_" + kKindNames[k] +
                             (directory ? ".npy" : "") + " is missing (q, k and v are all needed)" + stray_note);
    heads.push_back(std::move(h));
  }
  if (grouped) *grouped = std::move(groups);
  return heads;
}

// What manifest.json says about one layer.
struct LayerManifest {
  std::optional<double> scale;
  std::optional<bool> causal;
  std::optional<int> num_heads, head_dim;
  std::optional<int> num_kv_heads;  // grouped-query attention: the layer's K/V heads
};

// The keys a manifest may hold, per level: first those qattn reads, then those other writers put there, accepted and
// not read (analysis/dump_torch.py: format, files, source, layout, function, rope; the USE-Lite dump tools that wrote
// the full sample, ../shared/data/use-lite: the others). Any other key is refused, so that a misspelt "scale" cannot
// leave the default in place without a word.
constexpr const char* kManifestKeys[] = {"causal",         "layers",          "format",      "source",     "files",
                                         "model",          "weights_source",  "weights_license", "text_source",
                                         "text_license_note", "text_sha256",  "n_seq",       "seq_len",    "layout",
                                         "token_ids",      "tokens",          "layout_projections", "final_embedding",
                                         "sanity"};
constexpr const char* kLayerKeys[] = {"layer",  "scale",   "causal",  "num_heads", "n_heads",    "head_dim",
                                      "num_kv_heads", "source", "layout", "heads", "d_model",   "d_out",
                                      "attn_input", "projections", "projection_source", "function", "rope"};

// Refuses a key of `object` that is not in `known`, naming it and the known ones.
template <std::size_t N>
void require_known_keys(const nlohmann::json& object, const char* const (&known)[N], const std::string& where,
                        const std::string& field) {
  for (const auto& item : object.items()) {
    const std::string& key = item.key();
    if (std::find_if(std::begin(known), std::end(known), [&](const char* k) { return key == k; }) != std::end(known))
      continue;
    std::string list;
    for (const char* k : known) list += (list.empty() ? "" : ", ") + std::string(k);
    throw InputError(where, field.empty() ? key : field + "." + key, "is not a key of a manifest here (known: " + list + ")");
  }
}

// The value of an integer field in [lo, INT32_MAX]; nullopt for a non-integer or a value outside (nlohmann holds
// 4294967296 as an integer, which a plain cast to int would read as 0).
std::optional<int> int_field(const nlohmann::json& v, long long lo) {
  if (v.is_number_unsigned()) {
    const std::uint64_t u = v.get<std::uint64_t>();
    if (u > static_cast<std::uint64_t>(INT32_MAX) || static_cast<long long>(u) < lo) return std::nullopt;
    return static_cast<int>(u);
  }
  if (!v.is_number_integer()) return std::nullopt;
  const std::int64_t i = v.get<std::int64_t>();
  if (i < lo || i > INT32_MAX) return std::nullopt;
  return static_cast<int>(i);
}

// Parses a manifest's bytes, refusing a key given twice in one object (nlohmann keeps the last; another reader may
// keep the first), named by its path: layers[1].scale, layers.0.scale.
nlohmann::json parse_manifest(const std::vector<std::byte>& bytes, const std::string& where) {
  using Event = nlohmann::json::parse_event_t;
  struct Level {
    bool array;
    std::string path;
    std::size_t elements = 0;  // of an array, so far
    std::set<std::string> keys;  // of an object, so far
    std::string key;             // of an object: the member being read
  };
  std::vector<Level> levels;
  auto child_path = [&]() -> std::string {
    if (levels.empty()) return "";
    Level& up = levels.back();
    if (up.array) return up.path + "[" + std::to_string(up.elements++) + "]";
    return up.path.empty() ? up.key : up.path + "." + up.key;
  };
  auto track = [&](int /*depth*/, Event event, nlohmann::json& parsed) {
    switch (event) {
      case Event::object_start:
      case Event::array_start: {
        std::string path = child_path();
        levels.push_back({event == Event::array_start, std::move(path)});
        break;
      }
      case Event::object_end:
      case Event::array_end:
        levels.pop_back();
        break;
      case Event::key: {
        Level& object = levels.back();
        object.key = parsed.get<std::string>();
        if (!object.keys.insert(object.key).second)
          throw InputError(where, object.path.empty() ? object.key : object.path + "." + object.key,
                           "the key is given twice in one object");
        break;
      }
      case Event::value:
        if (!levels.empty() && levels.back().array) ++levels.back().elements;
        break;
    }
    return true;
  };
  const char* text = reinterpret_cast<const char*>(bytes.data());
  try {
    return nlohmann::json::parse(text, text + bytes.size(), track);
  } catch (const nlohmann::json::exception& e) {
    throw InputError(where, "json", std::string("does not parse: ") + e.what());
  }
}

// Reads the optional manifest.json of a dump directory: "layers" is an array of objects with "layer", or an object
// keyed by the layer number (an inner "layer" must equal its key); each may carry "scale" (> 0), "causal" (bool),
// "num_heads" (or "n_heads", equal where both are given), "num_kv_heads" and "head_dim". A top-level "causal"
// applies to every layer.
// Keys outside kManifestKeys and kLayerKeys, and keys given twice in one object, are refused.
std::map<int, LayerManifest> read_manifest(const fs::path& dir) {
  std::map<int, LayerManifest> out;
  const fs::path path = dir / "manifest.json";
  std::error_code ec;
  if (!fs::is_directory(dir, ec) || !fs::exists(path, ec)) return out;
  const std::string where = path.string();
  const nlohmann::json j = parse_manifest(read_file_bytes(path), where);  // refuses a directory, FIFO or device
  if (!j.is_object()) throw InputError(where, "json", "expected an object at the top level");
  require_known_keys(j, kManifestKeys, where, "");
  std::optional<bool> causal_all;
  if (j.contains("causal")) {
    if (!j["causal"].is_boolean()) throw InputError(where, "causal", "expected true or false");
    causal_all = j["causal"].get<bool>();
  }
  auto read_layer = [&](int layer, const nlohmann::json& e) {
    const std::string field = "layers[" + std::to_string(layer) + "]";
    if (!e.is_object()) throw InputError(where, field, "expected an object");
    require_known_keys(e, kLayerKeys, where, field);
    LayerManifest m;
    m.causal = causal_all;
    if (layer < 0) throw InputError(where, field, "layer numbers are >= 0");
    if (e.contains("scale")) {
      if (!e["scale"].is_number() || !(e["scale"].get<double>() > 0) || !std::isfinite(e["scale"].get<double>()))
        throw InputError(where, field + ".scale", "expected a finite number > 0");
      m.scale = e["scale"].get<double>();
    }
    if (e.contains("causal")) {
      if (!e["causal"].is_boolean()) throw InputError(where, field + ".causal", "expected true or false");
      m.causal = e["causal"].get<bool>();
    }
    for (const char* key : {"num_heads", "n_heads", "head_dim", "num_kv_heads"}) {
      if (!e.contains(key)) continue;
      const std::optional<int> n = int_field(e[key], 1);
      if (!n) throw InputError(where, field + "." + key, "expected an integer in [1, " + std::to_string(INT32_MAX) + "]");
      const std::string k = key;
      std::optional<int>& slot = k == "head_dim" ? m.head_dim : k == "num_kv_heads" ? m.num_kv_heads : m.num_heads;
      if (slot && *slot != *n)
        throw InputError(where, field + ".n_heads",
                         "says " + std::to_string(*n) + " heads, num_heads " + std::to_string(*slot) + ": give one");
      slot = n;
    }
    if (out.count(layer)) throw InputError(where, field, "layer " + std::to_string(layer) + " is described twice");
    out[layer] = m;
  };
  if (!j.contains("layers")) {
    if (causal_all) out[-1].causal = causal_all;  // applies to every layer
    return out;
  }
  const nlohmann::json& layers = j["layers"];
  if (layers.is_array()) {
    for (std::size_t i = 0; i < layers.size(); ++i) {
      const nlohmann::json& e = layers[i];
      if (!e.is_object() || !e.contains("layer") || !e["layer"].is_number_integer())
        throw InputError(where, "layers[" + std::to_string(i) + "]", "expected an object with an integer \"layer\"");
      const std::optional<int> layer = int_field(e["layer"], 0);
      if (!layer)
        throw InputError(where, "layers[" + std::to_string(i) + "].layer",
                         "expected a layer number in [0, " + std::to_string(INT32_MAX) + "]");
      read_layer(*layer, e);
    }
  } else if (layers.is_object()) {
    for (const auto& [key, e] : layers.items()) {
      char* end = nullptr;
      errno = 0;
      const long n = std::strtol(key.c_str(), &end, 10);
      if (key.empty() || *end != '\0' || n < 0 || n > INT32_MAX || errno != 0 || key[0] < '0' || key[0] > '9')
        throw InputError(where, "layers", "key '" + key + "' is not a layer number");
      if (e.is_object() && e.contains("layer") && int_field(e["layer"], 0) != std::optional<int>(static_cast<int>(n)))
        throw InputError(where, "layers[" + std::to_string(n) + "].layer",
                         "is " + e["layer"].dump() + " in the entry keyed \"" + key + "\" (drop it, or make it equal)");
      read_layer(static_cast<int>(n), e);
    }
  } else {
    throw InputError(where, "layers", "expected an array or an object");
  }
  if (causal_all) out[-1].causal = causal_all;
  return out;
}

}  // namespace

// [..., L, d] -> batch of [L, d] matrices (leading axes flattened).
std::int64_t batch_entries(const Tensor& t, const fs::path& path) {
  if (t.shape.size() < 2) throw InputError(path.string(), "shape", "expected [..., L, d], got " + t.shape_string());
  if (!dtype_is_float(t.dtype))
    throw InputError(path.string(), "dtype", std::string(dtype_name(t.dtype)) + " given, analyze expects float Q/K/V");
  const std::int64_t L = t.shape[t.shape.size() - 2], d = t.shape.back();
  if (L == 0 || d == 0) throw InputError(path.string(), "shape", "empty L or d in " + t.shape_string());
  if (t.element_count() == 0)
    throw InputError(path.string(), "shape", "a leading (batch) axis has length 0 in " + t.shape_string() +
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

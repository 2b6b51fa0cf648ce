// manifest.json of a dump directory (dump_manifest.h).
#include "dump_manifest.h"

#include <climits>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "qattn/error.h"
#include "qattn/tensor_io.h"

namespace qattn::eval {
namespace fs = std::filesystem;
namespace {

// The keys a manifest may hold, per level: first those qattn reads, then those other writers put there, accepted and
// not read (cli/dump_torch.py: format, files, source, layout, function, rope; the USE-Lite dump tools that wrote
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

}  // namespace

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

}  // namespace qattn::eval

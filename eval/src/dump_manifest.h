// manifest.json of a dump directory (docs/dumping.md): what it says per layer, read and checked once, for the dump
// loader (dump.cc). Not installed.
#pragma once

#include <filesystem>
#include <map>
#include <optional>

namespace qattn::eval {

// What manifest.json says about one layer.
struct LayerManifest {
  std::optional<double> scale;
  std::optional<bool> causal;
  std::optional<int> num_heads, head_dim;
  std::optional<int> num_kv_heads;  // grouped-query attention: the layer's K/V heads
};

// The manifest in `dir` by layer (-1: what holds for every layer); empty when the directory has none. InputError
// naming the file and field for malformed JSON, a value out of range or an unknown key.
std::map<int, LayerManifest> read_manifest(const std::filesystem::path& dir);

}  // namespace qattn::eval

// Sharded runs (docs/scale-out.md): `qattn analyze --shard K/N` and `qattn sweep --shard K/N` each compute one
// block of the work and write a partial result with its provenance; `qattn merge` checks that a set of parts
// belongs together and writes the table the unsharded run writes, byte for byte.
#pragma once

#include <CLI/CLI.hpp>
#include <cstddef>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "evaluate.h"

namespace qattn::cli {

inline constexpr std::size_t kMaxShards = 1000000;
inline constexpr int kPartialFormat = 1;  // "qattn_partial" of the files below; a merge refuses any other

// Shard `index` of `count`, 0-based (Slurm's $SLURM_ARRAY_TASK_ID and `seq 0 N-1` give K directly).
struct Shard {
  std::size_t index = 0, count = 1;
};
// "K/N" with 0 <= K < N <= kMaxShards; CLI::ValidationError naming --shard otherwise.
Shard parse_shard(const std::string& text);
// The contiguous block of the n units (heads, grid points) that shard s owns: [floor(K n / N), floor((K+1) n / N)).
// Blocks of consecutive shards tile [0, n); sizes differ by at most one.
std::pair<std::size_t, std::size_t> shard_block(std::size_t n, Shard s);

// SHA-256 of a file's bytes as 64 lower-case hex digits; InputError naming the file if it cannot be read.
std::string sha256_file(const std::filesystem::path& path);

// What every part carries. Parts belong together when command, version, options, the dump's listing and the unit
// count are equal, and every input file two parts both read has the same hash in both.
struct Provenance {
  std::string command;      // "analyze" | "sweep"
  nlohmann::json options;   // every option that decides the result (not --out, --threads, --engine, --shard)
  nlohmann::json dump;      // {"source": path as given, "files": {name: bytes}} of the whole dump
  std::size_t units = 0;    // what is split: (layer, head) pairs, or grid points
  Shard shard;
  std::vector<std::string> inputs;  // the files this shard read; hashed when the part is written
};

// The part file's JSON: provenance (with the qattn version and the inputs' SHA-256) and the command's `result`.
nlohmann::json partial_document(const Provenance& p, nlohmann::json result);

// A double as JSON that reads back to the same bits: a number when finite, "nan", "inf" or "-inf" otherwise.
nlohmann::json exact_number(double v);
double exact_number(const nlohmann::json& j);

// One head's metrics as JSON and back, every double bit for bit.
nlohmann::json head_result_json(const HeadResult& r);
HeadResult head_result_from_json(const nlohmann::json& j);

// `qattn merge PARTS... [--out F] [--format F]`.
void add_merge(CLI::App& app);

}  // namespace qattn::cli

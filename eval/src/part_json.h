// The part file of a sharded run (qattn/eval/shard.h), for the commands that write and read them. Not installed.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "qattn/eval/shard.h"

namespace qattn::eval {

// "qattn_partial" of the part files; a merge refuses any other. 2: the provenance lists the run's heads (and a sweep's
// points) and holds the SHA-256 of the result.
inline constexpr int kPartialFormat = 2;

// What every part carries. Parts belong together when command, version, options, the dump's listing, the run's
// heads, points and unit count are equal, and every input file two parts both read has the same hash in both.
struct Provenance {
  std::string command;      // "analyze" | "sweep"
  nlohmann::json options;   // every option that decides the result (not --out, --threads, --engine, --shard)
  nlohmann::json dump;      // {"source": path as given, "files": {name: bytes}} of the whole dump
  std::size_t units = 0;    // what is split: (layer, head) pairs, or (grid point, head) pairs
  std::vector<std::pair<int, int>> heads;  // the run's (layer, head) pairs in order: units = heads (analyze)
  std::size_t points = 0;                  // sweep: its grid points, units = points x heads; 0: analyze
  Shard shard;
  std::vector<std::string> inputs;  // the files this shard read; hashed when the part is written
};

// The part file's JSON: provenance (with the qattn version, the inputs' SHA-256 and the SHA-256 of the result's
// compact serialisation, `result.dump()`, as result_sha256) and the command's `result`.
nlohmann::json partial_document(const Provenance& p, nlohmann::json result);

}  // namespace qattn::eval

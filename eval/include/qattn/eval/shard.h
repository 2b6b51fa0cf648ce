// Sharded analyses (docs/scale-out.md): each shard evaluates a contiguous block of a dump's (layer, head) pairs and
// writes a part file with its provenance (the options, the dump's listing and the SHA-256 of every file it read);
// `qattn merge` checks that a set of parts belongs together and writes the table the unsharded run writes, byte for
// byte. `qattn analyze --shard K/N` is one caller; a user's program that evaluates its own methods
// (examples/own-method-analysis) is another, and its parts merge the same way. Target qattn::shard (it hashes with
// OpenSSL's libcrypto).
#pragma once

#include <cstddef>
#include <filesystem>
#include <string>
#include <utility>

#include "qattn/eval/analysis.h"
#include "qattn/eval/evaluate.h"

namespace qattn::eval {

inline constexpr std::size_t kMaxShards = 1000000;

// Shard `index` of `count`, 0-based (Slurm's $SLURM_ARRAY_TASK_ID and `seq 0 N-1` give K directly).
struct Shard {
  std::size_t index = 0, count = 1;
};
// "K/N" with 0 <= K < N <= kMaxShards; SpecError with the reason otherwise (also when this build cannot hash).
Shard parse_shard(const std::string& text);
// The contiguous block of the n units (heads, grid points) that shard s owns: [floor(K n / N), floor((K+1) n / N)).
// Blocks of consecutive shards tile [0, n); sizes differ by at most one.
std::pair<std::size_t, std::size_t> shard_block(std::size_t n, Shard s);

// SHA-256 of a file's bytes as 64 lower-case hex digits; InputError naming the file if it cannot be read.
std::string sha256_file(const std::filesystem::path& path);

// Shard `shard` of the plan's analysis of the dump directory or file `source`: the part file's text (JSON), which
// `qattn merge` joins with the other shards' into the report render_report writes for the whole dump, in `format`
// unless merge is given another. Only the heads the shard owns are read, unless the plan looks across the heads of
// a layer (AnalysisPlan::heads_independent false): then whole layers are read and evaluated and only the shard's own
// heads' rows kept. The part records every option the plan holds; the methods by label and canonical spec, so a
// user's own method must keep its label from shard to shard. InputError / SpecError as load_dump and the plan's
// methods raise them.
std::string analyze_shard(const std::filesystem::path& source, const AnalysisPlan& plan, Shard shard,
                          const EvalOptions& options, const std::string& format = "md");

}  // namespace qattn::eval

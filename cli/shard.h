// Sharded runs (docs/scale-out.md) as the commands see them: `qattn analyze --shard K/N` and `qattn sweep --shard K/N`
// each compute one block of the work and write a part file (qattn/eval/shard.h); `qattn merge` checks that a set of
// parts belongs together and writes the table the unsharded run writes, byte for byte.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "evaluate.h"
#include "qattn/eval/shard.h"

namespace qattn::cli {

// --shard "K/N" (eval::parse_shard); CLI::ValidationError naming --shard otherwise.
Shard shard_option(const std::string& text);

// `qattn merge PARTS... [--out F] [--format F]`.
void add_merge(CLI::App& app);

}  // namespace qattn::cli

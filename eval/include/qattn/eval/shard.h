// Sharded analyses (docs/scale-out.md): each shard evaluates a contiguous block of a dump's (layer, head) pairs and
// writes a part file with its provenance (the options, the dump's listing and the SHA-256 of every file it read);
// `qattn merge` checks that a set of parts belongs together and writes the table the unsharded run writes, byte for
// byte. `qattn analyze --shard K/N` is one caller; a user's program that evaluates its own methods
// (examples/own-method-analysis) is another, and its parts merge the same way. Target qattn::shard (it hashes with
// OpenSSL's libcrypto).
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "qattn/eval/analysis.h"
#include "qattn/eval/analyze.h"
#include "qattn/eval/evaluate.h"
#include "qattn/eval/report.h"
#include "qattn/eval/sweep.h"

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
// SHA-256 of `bytes` as 64 lower-case hex digits (a part's result_sha256 hashes its result this way);
// std::runtime_error in a build without OpenSSL's libcrypto.
std::string sha256_hex(std::string_view bytes);

// Shard `shard` of the plan's analysis of the dump directory or file `source`: the part file's text (JSON), which
// `qattn merge` joins with the other shards' into the report render_report writes for the whole dump, in `format`
// unless merge is given another. Only the heads the shard owns are read, unless the plan looks across the heads of
// a layer (AnalysisPlan::heads_independent false): then whole layers are read and evaluated and only the shard's own
// heads' rows kept. The part records every option the plan holds; the methods by label and canonical spec, so a
// user's own method must keep its label from shard to shard. InputError / SpecError as load_dump and the plan's
// methods raise them.
std::string analyze_shard(const std::filesystem::path& source, const AnalysisPlan& plan, Shard shard,
                          const EvalOptions& options, const std::string& format = "md");

// Shard `shard` of the sweep `request` (qattn/eval/sweep.h): the part file's text (JSON), as analyze_shard's. The
// units are the (grid point, head) pairs, numbered point-major (point i, head j is unit i H + j for the H heads of
// the dump in (layer, head) order: when N divides the number of points every shard owns whole points) or head-major
// (request.order; unit j P + i for P points: when N divides the number of heads every shard owns whole heads and runs
// every point on them, reading each head once). A shard reads only the heads its block touches (whole layers where a
// point's method looks across heads). Its rows are the per-head metrics of each (point, head) it owns; merge_parts
// summarises each point over all its heads, whichever order numbered them.
std::string sweep_shard(const SweepRequest& request, Shard shard);

// Shard `shard` of the analysis `request` (qattn/eval/analyze.h) of its dump (request.tensors; SpecError for
// explicit q/k/v or logits files, which have no heads to split): plan_request, then analyze_shard in the request's
// format (md unless given).
std::string analysis_shard(AnalysisRequest& request, Shard shard);

// The largest part file `merge_part_files` reads. The merge holds every part as parsed JSON, about 10 bytes of memory
// per byte of part; a run whose parts are larger needs more shards (a row of analyze, one head and method, is about
// 1.9 KB, a sweep row about 2.0 KB: a part holds up to about 130,000 rows).
inline constexpr std::uintmax_t kMaxPartBytes = std::uintmax_t{256} << 20;

// One part as `merge_parts` reads it: the name its errors give (the file) and its text.
struct PartText {
  std::string file, text;
};

// What `merge_parts` wrote: the table, the command of the run, and how many distinct input files the parts hashed.
struct MergedParts {
  std::string text, command;
  std::size_t inputs_hashed = 0;
};

// Joins the parts of one sharded run (in any order) into the table its unsharded run writes, byte for byte, in
// `format` (md|csv|latex|json for analyze parts, csv|md for sweep parts; empty: the format the shards were given,
// SpecError for another). Every part is checked before anything is joined (docs/scale-out.md, "Merging"): its
// layout and format version, its shard (an integer count in [1, kMaxShards], an integer index below it), the SHA-256
// of its result against the one its provenance records, and its rows against its block of the run's units, which
// the provenance lists: exactly one row per (layer, head) it owns and method of the run (analyze), or per (grid
// point, head) it owns (sweep). A set is refused when its parts differ in anything but the shard index, the inputs
// they read and the result's rows, when an input file has two hashes, when a shard is given twice or missing, and
// when two sweep parts give a point different values. Each part is parsed with a check of its keys as they come, so
// a file that is not a part, a part of another version or one with more rows than its block is refused at the first
// wrong key or row. InputError(part, JSON field, reason) for all of these; no exception of another type but the
// SpecError of a format, and of `report`: what an analyze table shows (render_report, check_report_options; any
// choice on sweep parts is refused).
MergedParts merge_parts(const std::vector<PartText>& parts, const std::string& format = "",
                        const ReportOptions& report = {});

// merge_parts of part files: InputError(file, "file", reason) for a path that is not a regular file, cannot be read
// or holds more than kMaxPartBytes, before it is read.
MergedParts merge_part_files(const std::vector<std::filesystem::path>& files, const std::string& format = "",
                             const ReportOptions& report = {});

}  // namespace qattn::eval

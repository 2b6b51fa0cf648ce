#include "shard.h"

#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <vector>

#include "commands.h"
#include "qattn/error.h"

namespace qattn::cli {
namespace fs = std::filesystem;

Shard shard_option(const std::string& text) {
  try {
    return parse_shard(text);
  } catch (const SpecError& e) {
    throw CLI::ValidationError("--shard", e.what());
  }
}

namespace {

struct MergeOptions {
  std::vector<std::string> parts;
  std::string out, format;
  bool summary = false;                // analyze parts: only the mean and worst rows
  std::optional<std::string> columns;  // analyze parts: the metric columns shown (eval::split_columns)
};

void run_merge(const MergeOptions& o) {
  std::vector<std::pair<std::string, std::string>> outputs{{"--out", o.out}}, inputs;
  for (const std::string& f : o.parts) inputs.emplace_back("part", f);
  require_distinct_files(inputs, outputs);
  const std::vector<fs::path> files(o.parts.begin(), o.parts.end());
  ReportOptions report;
  report.summary = o.summary;
  if (o.columns) report.columns = split_columns(*o.columns);
  MergedParts merged;
  try {
    merged = merge_part_files(files, o.format, report);
  } catch (const SpecError& e) {
    // --format names a table the parts' command does not write, or --summary / --columns a choice its table cannot
    // show (check_report_options' messages begin with the choice)
    const std::string why = e.what();
    throw CLI::ValidationError(why.rfind("summary", 0) == 0  ? "--summary"
                               : why.rfind("column", 0) == 0 ? "--columns"
                                                             : "--format",
                               why);
  }
  emit(merged.text, o.out);
  std::cerr << "qattn merge: " << o.parts.size() << " part" << (o.parts.size() == 1 ? "" : "s") << " of one "
            << merged.command << " run, " << merged.inputs_hashed << " input file"
            << (merged.inputs_hashed == 1 ? "" : "s") << " hashed\n";
}

}  // namespace

void add_merge(CLI::App& app) {
  auto* sub = app.add_subcommand(
      "merge", "Join the partial results of `analyze|sweep --shard K/N` into the table the unsharded run writes, byte "
               "for byte; refuses a set with a shard missing, given twice, or from another run");
  auto o = std::make_shared<MergeOptions>();
  sub->add_option("parts", o->parts, "Partial results (JSON), in any order")->required();
  sub->add_option("--out", o->out, "Write here (atomically) instead of stdout");
  sub->add_option("--format", o->format,
                  "Table format (default: the one the shards were given): md|csv|latex|json for analyze, csv|md for sweep");
  sub->add_flag("--summary", o->summary,
                "analyze parts: only each method's mean and worst rows, as `qattn analyze --summary` (md, csv, latex)");
  sub->add_option("--columns", o->columns,
                  "analyze parts: the metric columns shown, in this order, as `qattn analyze --columns` (md, csv, latex)");
  sub->callback([o] { run_merge(*o); });
}

}  // namespace qattn::cli

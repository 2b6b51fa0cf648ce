#include "shard.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <optional>

#include "commands.h"
#include "qattn/error.h"
#include "sweep.h"

namespace qattn::cli {
namespace fs = std::filesystem;
using nlohmann::json;

Shard shard_option(const std::string& text) {
  try {
    return parse_shard(text);
  } catch (const SpecError& e) {
    throw CLI::ValidationError("--shard", e.what());
  }
}

namespace {

// ---- merge -----------------------------------------------------------------------------------------------------

struct Part {
  std::string file;
  json doc;
  Shard shard;
};

Part read_part(const std::string& file) {
  std::error_code ec;
  if (!fs::is_regular_file(file, ec)) throw InputError(file, "file", fs::exists(file, ec) ? "is not a regular file" : "does not exist");
  std::ifstream in(file, std::ios::binary);
  if (!in) throw InputError(file, "file", "cannot be opened");
  Part p{file, json(), {}};
  try {
    p.doc = json::parse(in);
  } catch (const json::parse_error& e) {
    throw InputError(file, "json", std::string("is not JSON: ") + e.what());
  }
  if (!p.doc.is_object() || !p.doc.contains("qattn_partial"))
    throw InputError(file, "qattn_partial", "is not a partial result (written by qattn analyze|sweep --shard K/N)");
  if (p.doc["qattn_partial"] != kPartialFormat)
    throw InputError(file, "qattn_partial", "format " + p.doc["qattn_partial"].dump() + ", this qattn reads format " +
                                                std::to_string(kPartialFormat));
  try {
    const json& s = p.doc.at("provenance").at("shard");
    p.shard = {s.at("index").get<std::size_t>(), s.at("count").get<std::size_t>()};
    p.doc.at("provenance").at("command").get<std::string>();
    p.doc.at("result").at("rows");
  } catch (const json::exception& e) {
    throw InputError(file, "provenance", std::string("incomplete: ") + e.what());
  }
  // The result as the merge reads it, checked here so that a part of another layout is named before anything runs.
  try {
    const json& result = p.doc.at("result");
    const bool analyze = p.doc.at("provenance").at("command") == "analyze";
    if (analyze) report_view_from_json(result.at("view"));
    else sweep_header_from_json(result);
    for (const json& row : result.at("rows")) {
      if (analyze) {
        head_result_from_json(row);
      } else {
        row.at("point").get<std::size_t>();
        row.at("values").get<std::vector<std::string>>();
        row.at("method").get<std::string>();
        head_result_from_json(row.at("head"));
      }
    }
  } catch (const std::exception& e) {  // json::exception, or exact_number's std::invalid_argument
    throw InputError(file, "result",
                     std::string("is not a result this qattn reads (written by another version?): ") + e.what());
  }
  return p;
}

// The first place where a and b differ: its path as shown ("options.method[1]") and as a JSON pointer.
struct Difference {
  std::string shown;
  json::json_pointer at;
};
std::optional<Difference> first_difference(const json& a, const json& b, const Difference& here) {
  if (a.type() != b.type()) return here;
  if (a.is_object()) {
    for (const auto& [k, v] : a.items()) {
      const Difference next{here.shown + "." + k, here.at / k};
      if (!b.contains(k)) return next;
      if (auto d = first_difference(v, b.at(k), next)) return d;
    }
    for (const auto& [k, v] : b.items())
      if (!a.contains(k)) return Difference{here.shown + "." + k, here.at / k};
    return std::nullopt;
  }
  if (a.is_array()) {
    for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i)
      if (auto d = first_difference(a[i], b[i], {here.shown + "[" + std::to_string(i) + "]", here.at / i})) return d;
    return a.size() == b.size() ? std::nullopt : std::optional<Difference>(here);
  }
  return a == b ? std::nullopt : std::optional<Difference>(here);
}

std::string value_at(const json& j, const json::json_pointer& at) { return j.contains(at) ? j.at(at).dump() : "nothing"; }

// What must be equal in every part of a set: all of the provenance but the shard index and the inputs, and the
// result's header (everything in it but the rows).
json identity(const Part& p) {
  json id = p.doc.at("provenance");
  id["shard"].erase("index");
  id.erase("inputs");
  json header = p.doc.at("result");
  header.erase("rows");
  id["result"] = header;
  return id;
}

std::string shard_name(std::size_t k, std::size_t n) { return std::to_string(k) + "/" + std::to_string(n); }

struct MergeOptions {
  std::vector<std::string> parts;
  std::string out, format;
};

void run_merge(const MergeOptions& o) {
  std::vector<std::pair<std::string, std::string>> outputs{{"--out", o.out}}, inputs;
  for (const std::string& f : o.parts) inputs.emplace_back("part", f);
  require_distinct_files(inputs, outputs);
  std::vector<Part> parts;
  for (const std::string& f : o.parts) parts.push_back(read_part(f));
  const Part& first = parts.front();
  const json first_id = identity(first);
  std::map<std::string, std::pair<std::string, const Part*>> hashes;  // input file -> (sha256, part that read it)
  std::map<std::size_t, const Part*> by_index;
  for (const Part& p : parts) {
    const json id = identity(p);
    if (const auto d = first_difference(id, first_id, {"provenance", json::json_pointer()}))
      throw InputError(p.file, d->shown,
                       "foreign part: " + value_at(id, d->at) + " here, " + value_at(first_id, d->at) + " in " +
                           first.file + " (parts of one run have the same command, version, options, dump and shard "
                           "count)");
    for (const auto& [file, hash] : p.doc.at("provenance").at("inputs").items()) {
      auto [it, fresh] = hashes.try_emplace(file, hash.get<std::string>(), &p);
      if (!fresh && it->second.first != hash.get<std::string>())
        throw InputError(p.file, "provenance.inputs." + file,
                         "foreign part: it read " + file + " with SHA-256 " + hash.get<std::string>() + ", " +
                             it->second.second->file + " read it with " + it->second.first +
                             " (the input changed between shards)");
    }
    if (auto [it, fresh] = by_index.try_emplace(p.shard.index, &p); !fresh)
      throw InputError(p.file, "provenance.shard",
                       "shard " + shard_name(p.shard.index, p.shard.count) + " is given twice (also " + it->second->file +
                           ")");
  }
  const std::size_t n = first.shard.count;
  std::string missing;
  std::size_t n_missing = 0;
  for (std::size_t k = 0; k < n; ++k)
    if (!by_index.count(k)) {
      if (++n_missing <= 20) missing += (missing.empty() ? "" : ", ") + shard_name(k, n);
    }
  if (n_missing)
    throw InputError(first.file, "provenance.shard",
                     "the set is incomplete: " + std::to_string(n_missing) + " of " + std::to_string(n) +
                         " shards missing (" + missing + (n_missing > 20 ? ", ..." : "") + ")");

  const json& prov = first.doc.at("provenance");
  const std::string command = prov.at("command").get<std::string>();
  const std::string format = o.format.empty() ? first.doc.value("format", std::string("md")) : o.format;
  std::string text;
  if (command == "analyze") {
    std::vector<HeadResult> results;
    for (const auto& [k, p] : by_index)
      for (const json& h : p->doc.at("result").at("rows")) results.push_back(head_result_from_json(h));
    check_format_option(format, {"md", "csv", "latex", "json"});
    text = render_report(report_view_from_json(first.doc.at("result").at("view")), results, format);
  } else if (command == "sweep") {
    // every point's heads from all parts, in (layer, head) order, summarised as the unsharded run does
    check_format_option(format, {"csv", "md"});
    const json& header = first.doc.at("result");
    SweepTable table = sweep_header_from_json(header);
    Metric metric;
    try {
      metric = sweep_metric(table.target, table.metric);
    } catch (const SpecError& e) {
      throw InputError(first.file, "result.metric", e.what());
    }
    std::map<std::size_t, std::pair<SweepRow, std::vector<HeadResult>>> points;
    for (const auto& [k, p] : by_index)
      for (const json& r : p->doc.at("result").at("rows")) {
        auto [it, fresh] = points.try_emplace(r.at("point").get<std::size_t>());
        if (fresh) it->second.first = {r.at("values").get<std::vector<std::string>>(), r.at("method").get<std::string>()};
        it->second.second.push_back(head_result_from_json(r.at("head")));
      }
    for (auto& [point, entry] : points) {
      auto& [row, heads] = entry;
      if (heads.size() != table.heads)
        throw InputError(first.file, "result.rows", "grid point " + std::to_string(point) + " has " +
                                                        std::to_string(heads.size()) + " heads in the parts, the dump " +
                                                        std::to_string(table.heads));
      std::stable_sort(heads.begin(), heads.end(), [](const HeadResult& a, const HeadResult& b) {
        return std::make_pair(a.layer, a.head) < std::make_pair(b.layer, b.head);
      });
      const Summary sum = summarise(heads);
      row.mean = sum.mean[metric];
      row.worst = sum.worst[metric];
      table.rows.push_back(row);
    }
    text = render_sweep(table, format);
  } else {
    throw InputError(first.file, "provenance.command", "'" + command + "' is not a command that shards");
  }
  emit(text, o.out);
  std::cerr << "qattn merge: " << parts.size() << " part" << (parts.size() == 1 ? "" : "s") << " of one " << command
            << " run, " << hashes.size() << " input file" << (hashes.size() == 1 ? "" : "s") << " hashed\n";
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
  sub->callback([o] { run_merge(*o); });
}

}  // namespace qattn::cli

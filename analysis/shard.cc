#include "shard.h"

#if QATTN_HAVE_OPENSSL
#include <openssl/evp.h>
#endif

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

Shard parse_shard(const std::string& text) {
  const std::size_t slash = text.find('/');
  auto number = [&](const std::string& s, std::size_t* out) {
    if (s.empty() || s.size() > 7 || s.find_first_not_of("0123456789") != std::string::npos) return false;
    *out = std::stoul(s);
    return true;
  };
  Shard s;
  if (slash == std::string::npos || !number(text.substr(0, slash), &s.index) || !number(text.substr(slash + 1), &s.count))
    throw CLI::ValidationError("--shard", "'" + text + "' is not K/N (shard K of N, 0 <= K < N)");
  if (s.count < 1 || s.count > kMaxShards)
    throw CLI::ValidationError("--shard", "'" + text + "': N must be in [1, " + std::to_string(kMaxShards) + "]");
#if !QATTN_HAVE_OPENSSL
  throw CLI::ValidationError("--shard", "this qattn was built without OpenSSL's libcrypto (libssl-dev), which hashes "
                                        "the inputs every part records; rebuild with it to run shards");
#endif
  if (s.index >= s.count)
    throw CLI::ValidationError("--shard", "'" + text + "': K counts from 0 and must be below N (0.." +
                                              std::to_string(s.count - 1) + ")");
  return s;
}

std::pair<std::size_t, std::size_t> shard_block(std::size_t n, Shard s) {
  // n * K fits: n is a count of heads or grid points (<= 10^7), K < 10^6
  return {n * s.index / s.count, n * (s.index + 1) / s.count};
}

std::string sha256_file(const fs::path& path) {
#if QATTN_HAVE_OPENSSL
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path.string(), "file", "cannot be read to hash it");
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  if (!ctx || EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) != 1)
    throw std::runtime_error("SHA-256 is not available from OpenSSL");
  std::vector<char> buf(1 << 20);
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    if (in.gcount() > 0) EVP_DigestUpdate(ctx.get(), buf.data(), static_cast<std::size_t>(in.gcount()));
  }
  if (in.bad()) throw InputError(path.string(), "file", "read failed while hashing it");
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_DigestFinal_ex(ctx.get(), md, &len);
  std::string hex;
  char two[3];
  for (unsigned int i = 0; i < len; ++i) std::snprintf(two, sizeof two, "%02x", md[i]), hex += two;
  return hex;
#else
  throw InputError(path.string(), "file", "cannot be hashed: built without OpenSSL's libcrypto");
#endif
}

json partial_document(const Provenance& p, json result) {
  json inputs = json::object();
  for (const std::string& f : p.inputs) inputs[f] = sha256_file(f);
  return {{"qattn_partial", kPartialFormat},
          {"provenance",
           {{"command", p.command},
            {"version", QATTN_VERSION},
            {"options", p.options},
            {"dump", p.dump},
            {"units", p.units},
            {"shard", {{"index", p.shard.index}, {"count", p.shard.count}}},
            {"inputs", inputs}}},
          {"result", std::move(result)}};
}

json exact_number(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return v;  // printed with the shortest digits that read back to the same double
}

double exact_number(const json& j) {
  if (j.is_number()) return j.get<double>();
  if (j == "nan") return NAN;
  if (j == "inf") return INFINITY;
  if (j == "-inf") return -INFINITY;
  throw std::invalid_argument("not a number: " + j.dump());
}

namespace {

json stats_json(const ErrorStats& s) {
  json hist = json::object();
  for (const auto& [k, n] : s.log2_histogram) hist[std::to_string(k)] = n;
  return {{"count", s.count}, {"nonfinite", s.nonfinite}, {"cossim", exact_number(s.cossim)},
          {"rel_l1", exact_number(s.rel_l1)}, {"rmse", exact_number(s.rmse)}, {"max_abs", exact_number(s.max_abs)},
          {"bias", exact_number(s.bias)}, {"median_abs", exact_number(s.median_abs)}, {"zero_errors", s.zero_errors},
          {"log2_histogram", hist}};
}

ErrorStats stats_from_json(const json& j) {
  ErrorStats s;
  s.count = j.at("count").get<std::int64_t>();
  s.nonfinite = j.at("nonfinite").get<std::int64_t>();
  s.cossim = exact_number(j.at("cossim"));
  s.rel_l1 = exact_number(j.at("rel_l1"));
  s.rmse = exact_number(j.at("rmse"));
  s.max_abs = exact_number(j.at("max_abs"));
  s.bias = exact_number(j.at("bias"));
  s.median_abs = exact_number(j.at("median_abs"));
  s.zero_errors = j.at("zero_errors").get<std::int64_t>();
  for (const auto& [k, n] : j.at("log2_histogram").items()) s.log2_histogram[std::stoi(k)] = n.get<std::int64_t>();
  return s;
}

}  // namespace

json head_result_json(const HeadResult& r) {
  return {{"layer", r.layer},  {"head", r.head},
          {"method", r.method}, {"O", stats_json(r.o)},
          {"P", stats_json(r.p)}, {"kl", {exact_number(r.kl.mean), exact_number(r.kl.max)}},
          {"bits", {exact_number(r.k_bits), exact_number(r.v_bits)}}, {"scale", exact_number(r.scale)},
          {"causal", r.causal}};
}

HeadResult head_result_from_json(const json& j) {
  HeadResult r;
  r.layer = j.at("layer").get<int>();
  r.head = j.at("head").get<int>();
  r.method = j.at("method").get<std::string>();
  r.o = stats_from_json(j.at("O"));
  r.p = stats_from_json(j.at("P"));
  r.kl.mean = exact_number(j.at("kl").at(0));
  r.kl.max = exact_number(j.at("kl").at(1));
  r.k_bits = exact_number(j.at("bits").at(0));
  r.v_bits = exact_number(j.at("bits").at(1));
  r.scale = exact_number(j.at("scale"));
  r.causal = j.at("causal").get<bool>();
  return r;
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
    text = render_analyze(analyze_view_from_json(first.doc.at("result").at("view")), results, format);
  } else if (command == "sweep") {
    // every point's heads from all parts, in (layer, head) order, summarised as the unsharded run does
    const json& header = first.doc.at("result");
    const std::string name = (header.at("target") == "P" ? "P_" : "O_") + header.at("metric").get<std::string>();
    const auto info = std::find_if(std::begin(kMetrics), std::end(kMetrics), [&](const MetricInfo& m) { return name == m.name; });
    if (info == std::end(kMetrics)) throw InputError(first.file, "result.metric", "'" + name + "' is not a metric");
    std::map<std::size_t, std::pair<json, std::vector<HeadResult>>> points;
    for (const auto& [k, p] : by_index)
      for (const json& r : p->doc.at("result").at("rows")) {
        auto& [row, heads] = points[r.at("point").get<std::size_t>()];
        if (row.is_null()) row = {{"values", r.at("values")}, {"method", r.at("method")}};
        heads.push_back(head_result_from_json(r.at("head")));
      }
    std::vector<json> rows;
    for (auto& [point, entry] : points) {
      auto& [row, heads] = entry;
      if (heads.size() != header.at("heads").get<std::size_t>())
        throw InputError(first.file, "result.rows", "grid point " + std::to_string(point) + " has " +
                                                        std::to_string(heads.size()) + " heads in the parts, the dump " +
                                                        header.at("heads").dump());
      std::stable_sort(heads.begin(), heads.end(), [](const HeadResult& a, const HeadResult& b) {
        return std::make_pair(a.layer, a.head) < std::make_pair(b.layer, b.head);
      });
      const Summary sum = summarise(heads);
      row["mean"] = exact_number(sum.mean[info->metric]);
      row["worst"] = exact_number(sum.worst[info->metric]);
      rows.push_back(row);
    }
    text = render_sweep(header, rows, format);
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

// Sharded runs, the reading side (qattn/eval/shard.h): parts checked against their provenance and against each
// other, then joined into the table the unsharded run writes (docs/scale-out.md, "Merging").
#include "qattn/eval/shard.h"

#include <algorithm>
#include <climits>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <stdexcept>

#include "part_json.h"
#include "qattn/error.h"
#include "qattn/eval/report.h"
#include "report_json.h"

namespace qattn::eval {

namespace fs = std::filesystem;
using nlohmann::json;

// ---- merge (docs/scale-out.md, "Merging") -------------------------------------------------------------------------

namespace {

constexpr int kMaxPartDepth = 8;                        // a part nests 7 deep: result.rows[i].head.O.log2_histogram.k
constexpr std::uint64_t kMaxUnits = 10000000000000ull;  // 10^13 units: K n / N of shard_block stays below 2^64
constexpr int kTopKeys = 4;
constexpr const char* kTopKey[kTopKeys] = {"format", "provenance", "qattn_partial", "result"};

std::string shown(const json& v) { return printable(v.dump(-1, ' ', false, json::error_handler_t::replace), 80); }
std::string index_field(const std::string& base, std::size_t i) { return base + "[" + std::to_string(i) + "]"; }
std::string head_name(const std::pair<int, int>& h) {
  return "layer " + std::to_string(h.first) + " head " + std::to_string(h.second);
}
std::string shard_name(std::size_t k, std::size_t n) { return std::to_string(k) + "/" + std::to_string(n); }

// v as an integer in [lo, hi]; InputError naming `field` for a float (1.5, and 1.0 too), a string, a negative or a
// too large value.
std::uint64_t integer_value(const std::string& file, const json& v, const std::string& field, std::uint64_t lo,
                            std::uint64_t hi) {
  const bool integer = v.is_number_integer() && (v.is_number_unsigned() || v.get<std::int64_t>() >= 0);
  const std::uint64_t u = integer ? v.get<std::uint64_t>() : 0;
  if (!integer || u < lo || u > hi)
    throw InputError(file, field, shown(v) + " is not an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return u;
}
// parent[key] as integer_value; InputError naming `field` if there is none.
std::uint64_t integer_at(const std::string& file, const json& parent, const char* key, const std::string& field,
                         std::uint64_t lo, std::uint64_t hi) {
  if (!parent.is_object() || !parent.contains(key)) throw InputError(file, field, "is missing");
  return integer_value(file, parent.at(key), field, lo, hi);
}

const json& member(const std::string& file, const json& parent, const char* key, const std::string& field,
                   json::value_t type, const char* what) {
  if (!parent.contains(key)) throw InputError(file, field, "is missing");
  const json& v = parent.at(key);
  const bool ok = type == json::value_t::number_integer ? v.is_number_integer() : v.type() == type;
  if (!ok) throw InputError(file, field, shown(v) + " is not " + what);
  return v;
}

bool is_sha256(const json& v) {
  return v.is_string() && v.get_ref<const std::string&>().size() == 64 &&
         v.get_ref<const std::string&>().find_first_not_of("0123456789abcdef") == std::string::npos;
}

// A part's place in its run, from its provenance: the run's heads and (sweep) points, its shard and the block of
// units it owns, and so the rows its result must hold.
struct PartPlace {
  std::string command;                      // analyze | sweep
  Shard shard;
  std::vector<std::pair<int, int>> heads;   // the run's (layer, head) pairs, strictly increasing
  std::size_t points = 1;                   // sweep: the grid points; analyze: 1
  bool head_major = false;                  // sweep --order head-major: unit j P + i is point i of head j
  std::vector<std::string> methods;         // analyze: the run's methods by label
  std::pair<std::size_t, std::size_t> block;
  std::size_t rows = 0;                     // analyze: block size x methods; sweep: block size
};

PartPlace check_provenance(const std::string& file, const json& prov) {
  PartPlace place;
  const json& command = member(file, prov, "command", "provenance.command", json::value_t::string, "a string");
  place.command = command.get<std::string>();
  if (place.command != "analyze" && place.command != "sweep")
    throw InputError(file, "provenance.command", "'" + place.command + "' is not a command that shards (analyze|sweep)");
  member(file, prov, "version", "provenance.version", json::value_t::string, "a string");
  const json& options = member(file, prov, "options", "provenance.options", json::value_t::object, "an object");
  member(file, prov, "dump", "provenance.dump", json::value_t::object, "an object");
  for (const auto& [name, hash] : member(file, prov, "inputs", "provenance.inputs", json::value_t::object, "an object").items())
    if (!is_sha256(hash)) throw InputError(file, "provenance.inputs." + name, shown(hash) + " is not a SHA-256 (64 hex digits)");
  if (!is_sha256(member(file, prov, "result_sha256", "provenance.result_sha256", json::value_t::string, "a string")))
    throw InputError(file, "provenance.result_sha256", "is not a SHA-256 (64 hex digits)");

  const json& shard = member(file, prov, "shard", "provenance.shard", json::value_t::object, "an object");
  place.shard.count = integer_at(file, shard, "count", "provenance.shard.count", 1, kMaxShards);
  place.shard.index = integer_at(file, shard, "index", "provenance.shard.index", 0, kMaxShards);
  if (place.shard.index >= place.shard.count)
    throw InputError(file, "provenance.shard.index", std::to_string(place.shard.index) + " of " +
                                                         std::to_string(place.shard.count) +
                                                         ": shard indices count from 0 and stay below the count");

  const json& heads = member(file, prov, "heads", "provenance.heads", json::value_t::array, "an array");
  if (heads.empty()) throw InputError(file, "provenance.heads", "is empty: a run has at least one head");
  place.heads.reserve(heads.size());
  for (std::size_t i = 0; i < heads.size(); ++i) {
    const json& h = heads[i];
    if (!h.is_array() || h.size() != 2)
      throw InputError(file, index_field("provenance.heads", i), shown(h) + " is not [layer, head]");
    const auto number = [&](std::size_t e) {  // the field's name is built only for an error
      const json& v = h[e];
      if (v.is_number_unsigned() && v.get<std::uint64_t>() <= INT_MAX) return static_cast<int>(v.get<std::uint64_t>());
      return static_cast<int>(
          integer_value(file, v, index_field("provenance.heads", i) + "[" + std::to_string(e) + "]", 0, INT_MAX));
    };
    place.heads.emplace_back(number(0), number(1));
    if (i > 0 && !(place.heads[i - 1] < place.heads[i]))
      throw InputError(file, index_field("provenance.heads", i),
                       head_name(place.heads[i]) + " after " + head_name(place.heads[i - 1]) +
                           ": the run's heads are listed once each, in (layer, head) order");
  }
  const std::uint64_t units = integer_at(file, prov, "units", "provenance.units", 1, kMaxUnits);
  if (place.command == "sweep") {
    place.points = integer_at(file, prov, "points", "provenance.points", 1, kMaxUnits);
    std::uint64_t product = 0;
    if (__builtin_mul_overflow(static_cast<std::uint64_t>(place.points), place.heads.size(), &product) || product != units)
      throw InputError(file, "provenance.units", std::to_string(units) + " is not the " + std::to_string(place.points) +
                                                     " points x " + std::to_string(place.heads.size()) + " heads of the run");
    const json& order = member(file, options, "order", "provenance.options.order", json::value_t::string, "a string");
    if (order != "point-major" && order != "head-major")
      throw InputError(file, "provenance.options.order", shown(order) + " is not point-major or head-major");
    place.head_major = order == "head-major";
  } else {
    if (units != place.heads.size())
      throw InputError(file, "provenance.units", std::to_string(units) + " is not the run's " +
                                                     std::to_string(place.heads.size()) + " heads (provenance.heads)");
    const json& methods = member(file, options, "method", "provenance.options.method", json::value_t::array, "an array");
    if (methods.empty()) throw InputError(file, "provenance.options.method", "is empty: a run has at least one method");
    for (std::size_t i = 0; i < methods.size(); ++i) {
      const std::string field = index_field("provenance.options.method", i);
      if (!methods[i].is_string()) throw InputError(file, field, shown(methods[i]) + " is not a method's label");
      place.methods.push_back(methods[i].get<std::string>());
      if (std::find(place.methods.begin(), place.methods.end() - 1, place.methods.back()) != place.methods.end() - 1)
        throw InputError(file, field, "'" + place.methods.back() + "' is given twice: a run's methods have distinct labels");
    }
  }
  place.block = shard_block(units, place.shard);
  if (__builtin_mul_overflow(place.block.second - place.block.first, std::max<std::size_t>(place.methods.size(), 1),
                             &place.rows))
    throw InputError(file, "provenance.units", "the block of shard " + shard_name(place.shard.index, place.shard.count) +
                                                   " holds more rows than a part can");
  return place;
}

// nlohmann's parse callback for a part: it checks the top-level keys as they come (each one of format, provenance,
// qattn_partial, result, once, the format version and the provenance before the result) and counts the rows against
// the block the provenance gives, so that a file that is not a part, a part of another version or one with more rows
// than its block is refused at the first wrong key or row, not once the whole file is held.
class PartParser {
 public:
  explicit PartParser(const std::string& file) : file_(file), key_at_(kMaxPartDepth + 2) {}

  bool operator()(int depth, json::parse_event_t event, json& parsed) {
    using Event = json::parse_event_t;
    const bool opens = event == Event::object_start || event == Event::array_start;
    if (depth > kMaxPartDepth || (opens && depth == kMaxPartDepth))
      throw InputError(file_, key_at_[1].empty() ? "json" : key_at_[1],
                       "nests deeper than a part does (" + std::to_string(kMaxPartDepth) + " levels)");
    if (depth == 0) {
      if (event != Event::object_start && event != Event::object_end)
        throw InputError(file_, "qattn_partial", "is not a partial result (written by qattn analyze|sweep --shard K/N): "
                                                 "not a JSON object");
      return true;
    }
    if (event == Event::key) {
      key_at_[static_cast<std::size_t>(depth)] = parsed.get<std::string>();
      if (depth == 1) top_key(key_at_[1]);
      return true;
    }
    const std::string& top = key_at_[1];
    if (depth == 1) {
      if (top == "format" && event != Event::value) throw InputError(file_, "format", "is not a string");
      if (top == "format" && !parsed.is_string()) throw InputError(file_, "format", shown(parsed) + " is not a string");
      if ((top == "provenance" || top == "result") && event != Event::object_start && event != Event::object_end)
        throw InputError(file_, top, "is not an object");
      if (top == "qattn_partial") check_version(event, parsed);
      if (top == "provenance" && event == Event::object_end) provenance_ = parsed;
      return true;
    }
    // An element of result.rows has ended: one row more than the block holds is refused here.
    if (depth == 3 && top == "result" && key_at_[2] == "rows" &&
        (event == Event::object_end || event == Event::array_end || event == Event::value) && ++rows_ > place_.rows)
      throw InputError(file_, "result.rows",
                       "holds more than the " + std::to_string(place_.rows) + " rows of shard " +
                           shard_name(place_.shard.index, place_.shard.count) + "'s block");
    return true;
  }

  // After the parse: every key there, the place the provenance gives.
  const PartPlace& place() const {
    if (!seen_[2]) throw InputError(file_, "qattn_partial", "is not a partial result (written by qattn analyze|sweep "
                                                            "--shard K/N): no qattn_partial");
    if (!seen_[3]) throw InputError(file_, "result", "is missing");
    return place_;
  }

 private:
  void top_key(const std::string& key) {
    int k = 0;
    while (k < kTopKeys && key != kTopKey[k]) ++k;
    if (k == kTopKeys)
      throw InputError(file_, "qattn_partial", "is not a partial result (written by qattn analyze|sweep --shard K/N): "
                                               "it has a key '" + key + "'");
    if (seen_[k]) throw InputError(file_, key, "is given twice");
    seen_[k] = true;
    if (key != "result") return;
    if (!seen_[2]) throw InputError(file_, "qattn_partial", "is not a partial result (written by qattn analyze|sweep "
                                                            "--shard K/N): no qattn_partial before its result");
    if (!seen_[1]) throw InputError(file_, "provenance", "is missing before the result (a part's keys come in the "
                                                         "order format, provenance, qattn_partial, result)");
    place_ = check_provenance(file_, provenance_);
  }

  void check_version(json::parse_event_t event, const json& v) const {
    if (event != json::parse_event_t::value || !v.is_number_integer())
      throw InputError(file_, "qattn_partial", "is not a format number");
    if (v != kPartialFormat)
      throw InputError(file_, "qattn_partial", "format " + shown(v) + ", this qattn reads format " +
                                                   std::to_string(kPartialFormat) +
                                                   " (format 1 parts carry no list of the run's heads and no SHA-256 "
                                                   "of their result: run the shards again with this qattn)");
  }

  std::string file_;
  std::vector<std::string> key_at_;  // the last key seen at each depth
  bool seen_[kTopKeys] = {};
  json provenance_;
  PartPlace place_;
  std::size_t rows_ = 0;
};

// One part, checked alone: its rows decoded, each with its slot in the run's order (analyze: head j, method m at
// j M + m; sweep: point i, head j at i H + j).
struct Part {
  std::string file;
  json doc;  // without result.rows, once decoded
  PartPlace place;
  std::vector<HeadResult> rows;
  std::vector<std::size_t> slots;
  std::vector<std::size_t> row_points;  // sweep: each row's point, values and method
  std::vector<std::vector<std::string>> row_values;
  std::vector<std::string> row_methods;
};

// The (layer, head) of a row, as integers of the run: InputError naming the field for 1.5, -1, 2^40 or none.
std::size_t head_of_row(const Part& p, const json& row, const std::string& field) {
  const int layer = static_cast<int>(integer_at(p.file, row, "layer", field + ".layer", 0, INT_MAX));
  const int head = static_cast<int>(integer_at(p.file, row, "head", field + ".head", 0, INT_MAX));
  const auto& heads = p.place.heads;
  const auto it = std::lower_bound(heads.begin(), heads.end(), std::make_pair(layer, head));
  if (it == heads.end() || *it != std::make_pair(layer, head))
    throw InputError(p.file, field, head_name({layer, head}) + " is not a head of the run (provenance.heads)");
  return static_cast<std::size_t>(it - heads.begin());
}

HeadResult decode_head(const Part& p, const json& row, const std::string& field) {
  try {
    return head_result_from_json(row);
  } catch (const std::exception& e) {  // json::exception, or exact_number's std::invalid_argument
    throw InputError(p.file, field, std::string("is not a row this qattn reads: ") + e.what());
  }
}

void decode_rows(Part& p) {
  const PartPlace& place = p.place;
  if (!p.doc.at("result").contains("rows")) throw InputError(p.file, "result.rows", "is missing");
  const json& rows = p.doc.at("result").at("rows");
  if (!rows.is_array()) throw InputError(p.file, "result.rows", "is not an array");
  const auto [begin, end] = place.block;
  const std::string owner = "shard " + shard_name(place.shard.index, place.shard.count);
  if (rows.size() != place.rows)
    throw InputError(p.file, "result.rows",
                     std::to_string(rows.size()) + " rows, where " + owner + "'s block (units " + std::to_string(begin) +
                         " to " + std::to_string(end) + " of " + std::to_string(place.heads.size() * place.points) +
                         ") holds " + std::to_string(place.rows));
  const std::size_t n_heads = place.heads.size(), n_methods = place.methods.size();
  std::vector<char> seen(rows.size());
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const std::string field = index_field("result.rows", i);
    const json& row = rows[i];
    if (!row.is_object()) throw InputError(p.file, field, "is not an object");
    std::size_t unit = 0, slot = 0, within = 0;
    std::string what;
    if (place.command == "analyze") {
      const std::size_t j = head_of_row(p, row, field);
      HeadResult r = decode_head(p, row, field);
      const auto m = std::find(place.methods.begin(), place.methods.end(), r.method);
      if (m == place.methods.end())
        throw InputError(p.file, field + ".method", "'" + r.method + "' is not a method of the run (provenance.options.method)");
      unit = j;
      slot = j * n_methods + static_cast<std::size_t>(m - place.methods.begin());
      within = (j - begin) * n_methods + static_cast<std::size_t>(m - place.methods.begin());
      what = head_name(place.heads[j]) + " (" + r.method + ")";
      p.rows.push_back(std::move(r));
    } else {
      const std::size_t point = integer_at(p.file, row, "point", field + ".point", 0, place.points - 1);
      const json& values = member(p.file, row, "values", field + ".values", json::value_t::array, "an array");
      std::vector<std::string> v;
      for (const json& x : values) {
        if (!x.is_string()) throw InputError(p.file, field + ".values", shown(x) + " is not a string");
        v.push_back(x.get<std::string>());
      }
      const json& method = member(p.file, row, "method", field + ".method", json::value_t::string, "a string");
      const json& head = member(p.file, row, "head", field + ".head", json::value_t::object, "an object");
      const std::size_t j = head_of_row(p, head, field + ".head");
      unit = place.head_major ? j * place.points + point : point * n_heads + j;
      slot = point * n_heads + j;
      within = unit - begin;
      what = "point " + std::to_string(point) + ", " + head_name(place.heads[j]);
      p.rows.push_back(decode_head(p, head, field + ".head"));
      p.row_points.push_back(point);
      p.row_values.push_back(std::move(v));
      p.row_methods.push_back(method.get<std::string>());
    }
    if (unit < begin || unit >= end)
      throw InputError(p.file, field, what + " is unit " + std::to_string(unit) + " of the run, outside " + owner +
                                          "'s block (units " + std::to_string(begin) + " to " + std::to_string(end) +
                                          "): another shard's row");
    if (seen[within]) throw InputError(p.file, field, what + " is given twice");
    seen[within] = 1;
    p.slots.push_back(slot);
  }
  // Every row is distinct, in the block, and there are as many as the block holds: each of its units is there.
}

// The result's header, read as the merge reads it, against the provenance.
void check_header(const Part& p) {
  const json& result = p.doc.at("result");
  try {
    if (p.place.command == "analyze") {
      const ReportView view = report_view_from_json(result.at("view"));
      if (view.n_heads != p.place.heads.size())
        throw InputError(p.file, "result.view.n_heads", std::to_string(view.n_heads) + " is not the run's " +
                                                            std::to_string(p.place.heads.size()) + " heads");
      std::vector<std::string> labels;
      for (const ReportMethod& m : view.methods) labels.push_back(m.label);
      if (labels != p.place.methods)
        throw InputError(p.file, "result.view.methods", "are not the methods of provenance.options.method");
    } else {
      const SweepTable table = sweep_header_from_json(result);
      if (table.heads != p.place.heads.size())
        throw InputError(p.file, "result.heads", std::to_string(table.heads) + " is not the run's " +
                                                     std::to_string(p.place.heads.size()) + " heads");
      try {
        sweep_metric(table.target, table.metric);
      } catch (const SpecError& e) {
        throw InputError(p.file, "result.metric", e.what());
      }
    }
  } catch (const InputError&) {
    throw;
  } catch (const std::exception& e) {
    throw InputError(p.file, "result", std::string("is not a result this qattn reads (written by another version?): ") +
                                           e.what());
  }
}

Part read_part(const std::string& file, std::string_view text) {
  Part p{file, json(), {}, {}, {}, {}, {}, {}};
  PartParser parser(file);
  try {
    p.doc = json::parse(text.begin(), text.end(),
                        [&parser](int depth, json::parse_event_t event, json& parsed) { return parser(depth, event, parsed); });
  } catch (const json::exception& e) {  // a parse error, or a number out of range
    throw InputError(file, "json", std::string("is not JSON: ") + e.what());
  }
  p.place = parser.place();
  const json& prov = p.doc.at("provenance");
#if QATTN_HAVE_OPENSSL
  const std::string digest = sha256_hex(p.doc.at("result").dump());
  if (digest != prov.at("result_sha256"))
    throw InputError(file, "provenance.result_sha256",
                     "the result's SHA-256 is " + digest + ", the part records " +
                         prov.at("result_sha256").get<std::string>() + ": the part was edited or damaged after it was written");
#else
  throw InputError(file, "provenance.result_sha256",
                   "cannot be checked: this qattn was built without OpenSSL's libcrypto");
#endif
  check_header(p);
  decode_rows(p);
  p.doc.at("result").erase("rows");
  p.doc.at("provenance").erase("heads");  // held once as p.place.heads: a set of many parts keeps no list per part
  return p;
}

// The first place where a and b differ: its path as shown ("options.method[1]") and as a JSON pointer.
struct Difference {
  std::string shown;
  json::json_pointer at;
};
std::optional<Difference> first_difference(const json& a, const json& b, const Difference& here) {
  if (a == b) return std::nullopt;
  if (a.type() != b.type()) return here;
  if (a.is_object()) {
    for (const auto& [k, v] : a.items()) {
      if (b.contains(k) && v == b.at(k)) continue;
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
      if (a[i] != b[i])
        if (auto d = first_difference(a[i], b[i], {here.shown + "[" + std::to_string(i) + "]", here.at / i})) return d;
    return a.size() == b.size() ? std::nullopt : std::optional<Difference>(here);
  }
  return a == b ? std::nullopt : std::optional<Difference>(here);
}

std::string value_at(const json& j, const json::json_pointer& at) { return j.contains(at) ? shown(j.at(at)) : "nothing"; }

// What must be equal in every part of a set: all of the provenance but the shard index, the inputs and the result's
// SHA-256, and the result's header (everything in it but the rows). The run's heads are compared apart (PartPlace),
// not copied into it for every part.
json identity(const Part& p) {
  json id = json::object();
  for (const auto& [key, value] : p.doc.at("provenance").items())
    if (key != "heads" && key != "inputs" && key != "result_sha256") id[key] = value;
  id["shard"].erase("index");
  id["result"] = p.doc.at("result");
  return id;
}

void check_format(const std::string& format, std::initializer_list<const char*> valid) {
  std::string list;
  for (const char* v : valid) {
    if (format == v) return;
    list += std::string(list.empty() ? "" : "|") + v;
  }
  throw SpecError("'" + format + "' is not one of " + list);
}

// The parts are one run's (the same identity, heads and inputs) and each of its shards exactly once; returns how
// many input files their provenance hashed. InputError naming the part and field otherwise.
std::size_t check_one_run(const std::vector<Part>& parts) {
  const Part& first = parts.front();
  const json first_id = identity(first);
  std::map<std::string, std::pair<std::string, const Part*>> hashes;  // input file -> (sha256, part that read it)
  std::map<std::size_t, const Part*> by_index;
  for (const Part& p : parts) {
    const json id = identity(p);
    if (const auto d = first_difference(id, first_id, {"provenance", json::json_pointer()}))
      throw InputError(p.file, d->shown,
                       "foreign part: " + value_at(id, d->at) + " here, " + value_at(first_id, d->at) + " in " +
                           first.file + " (parts of one run have the same command, version, options, dump, heads and "
                           "shard count)");
    if (p.place.heads != first.place.heads) {
      const auto [here, there] = std::mismatch(p.place.heads.begin(), p.place.heads.end(), first.place.heads.begin(),
                                               first.place.heads.end());
      const std::size_t i = static_cast<std::size_t>(here - p.place.heads.begin());
      throw InputError(p.file, index_field("provenance.heads", i),
                       "foreign part: " + (here == p.place.heads.end() ? "nothing" : head_name(*here)) + " here, " +
                           (there == first.place.heads.end() ? "nothing" : head_name(*there)) + " in " + first.file +
                           " (parts of one run list the same heads)");
    }
    for (const auto& [file, hash] : p.doc.at("provenance").at("inputs").items()) {
      auto [it, fresh] = hashes.try_emplace(file, hash.get<std::string>(), &p);
      if (!fresh && it->second.first != hash.get<std::string>())
        throw InputError(p.file, "provenance.inputs." + file,
                         "foreign part: it read " + file + " with SHA-256 " + hash.get<std::string>() + ", " +
                             it->second.second->file + " read it with " + it->second.first +
                             " (the input changed between shards)");
    }
    if (auto [it, fresh] = by_index.try_emplace(p.place.shard.index, &p); !fresh)
      throw InputError(p.file, "provenance.shard",
                       "shard " + shard_name(p.place.shard.index, p.place.shard.count) + " is given twice (also " +
                           it->second->file + ")");
  }
  const PartPlace& place = first.place;
  const std::size_t n = place.shard.count;  // at most kMaxShards
  std::string missing;
  std::size_t n_missing = 0;
  for (std::size_t k = 0; k < n; ++k)
    if (!by_index.count(k) && ++n_missing <= 20) missing += (missing.empty() ? "" : ", ") + shard_name(k, n);
  if (n_missing)
    throw InputError(first.file, "provenance.shard",
                     "the set is incomplete: " + std::to_string(n_missing) + " of " + std::to_string(n) +
                         " shards missing (" + missing + (n_missing > 20 ? ", ..." : "") + ")");
  return hashes.size();
}

// The format of the merged text: the option, or the first part's, either checked against the command's formats.
std::string merge_format(const Part& first, const std::string& format_option) {
  const std::string& command = first.place.command;
  std::string format = format_option;
  if (format.empty()) {
    format = first.doc.value("format", std::string("md"));
    try {
      check_format(format, command == "analyze" ? std::initializer_list<const char*>{"md", "csv", "latex", "json"}
                                                      : std::initializer_list<const char*>{"csv", "md"});
    } catch (const SpecError& e) {
      throw InputError(first.file, "format", e.what());
    }
  } else if (command == "analyze") {
    check_format(format, {"md", "csv", "latex", "json"});
  } else {
    check_format(format, {"csv", "md"});
  }
  return format;
}

// A sweep's table from its parts: each point's heads from all parts, in (layer, head) order, summarised as the
// unsharded run does; a point's values and method are the same in every part that holds it.
std::string merge_sweep(std::vector<Part>& parts, std::vector<HeadResult>& slots, const std::string& format) {
  const Part& first = parts.front();
  const PartPlace& place = first.place;
  SweepTable table = sweep_header_from_json(first.doc.at("result"));
  const Metric metric = sweep_metric(table.target, table.metric);
  std::vector<std::optional<std::pair<SweepRow, const Part*>>> rows(place.points);
  for (Part& p : parts)
    for (std::size_t i = 0; i < p.rows.size(); ++i) {
      const std::size_t point = p.row_points[i];
      const std::string field = index_field("result.rows", i);
      if (p.row_values[i].size() != table.keys.size())
        throw InputError(p.file, field + ".values", std::to_string(p.row_values[i].size()) + " values for the grid's " +
                                                        std::to_string(table.keys.size()) + " keys");
      auto& row = rows[point];
      if (!row) {
        row.emplace(SweepRow{p.row_values[i], p.row_methods[i]}, &p);
      } else if (row->first.values != p.row_values[i] || row->first.method != p.row_methods[i]) {
        throw InputError(p.file, field, "point " + std::to_string(point) + " has other values or another method here than in " +
                                            row->second->file + " (" + shown(json(p.row_values[i])) + " " +
                                            shown(json(p.row_methods[i])) + " against " + shown(json(row->first.values)) +
                                            " " + shown(json(row->first.method)) + ")");
      }
      slots[p.slots[i]] = std::move(p.rows[i]);
    }
  const std::size_t n_heads = place.heads.size();
  for (std::size_t point = 0; point < place.points; ++point) {
    const std::vector<HeadResult> heads(std::make_move_iterator(slots.begin() + static_cast<std::ptrdiff_t>(point * n_heads)),
                                        std::make_move_iterator(slots.begin() + static_cast<std::ptrdiff_t>((point + 1) * n_heads)));
    const Summary sum = summarise(heads);
    SweepRow row = rows[point]->first;
    row.mean = sum.mean[metric];
    row.worst = sum.worst[metric];
    table.rows.push_back(std::move(row));
  }
  return render_sweep(table, format);
}

MergedParts merge(std::vector<Part> parts, const std::string& format_option, const ReportOptions& report) {
  if (parts.empty()) throw SpecError("merge needs at least one part");
  const Part& first = parts.front();
  const PartPlace& place = first.place;
  // The set is complete and every part holds exactly its block: every slot of the run is filled once.
  MergedParts merged;
  merged.inputs_hashed = check_one_run(parts);
  merged.command = place.command;
  const std::string format = merge_format(first, format_option);
  std::vector<HeadResult> slots(place.heads.size() * place.points * std::max<std::size_t>(place.methods.size(), 1));
  if (place.command == "analyze") {
    for (Part& p : parts)
      for (std::size_t i = 0; i < p.rows.size(); ++i) slots[p.slots[i]] = std::move(p.rows[i]);
    merged.text =
        render_report(report_view_from_json(first.doc.at("result").at("view")), std::move(slots), format, report);
    return merged;
  }
  if (report != ReportOptions{})
    throw SpecError(std::string(report.summary            ? "summary chooses"
                                : !report.columns.empty() ? "columns choose"
                                                          : "a method order chooses") +
                    " what an analyze table shows; these are sweep parts");
  merged.text = merge_sweep(parts, slots, format);
  return merged;
}

}  // namespace

MergedParts merge_parts(const std::vector<PartText>& parts, const std::string& format, const ReportOptions& report) {
  std::vector<Part> read;
  for (const PartText& p : parts) read.push_back(read_part(p.file, p.text));
  return merge(std::move(read), format, report);
}

MergedParts merge_part_files(const std::vector<fs::path>& files, const std::string& format,
                             const ReportOptions& report) {
  std::vector<Part> read;
  for (const fs::path& path : files) {
    const std::string file = path.string();
    std::error_code ec;
    if (!fs::is_regular_file(path, ec))
      throw InputError(file, "file", fs::exists(path, ec) ? "is not a regular file" : "does not exist");
    const std::uintmax_t size = fs::file_size(path, ec);
    if (ec) throw InputError(file, "file", "cannot be read: " + ec.message());
    if (size > kMaxPartBytes)
      throw InputError(file, "file", std::to_string(size) + " bytes, more than the " + std::to_string(kMaxPartBytes) +
                                         " (256 MiB) a part may hold (a run of parts this large needs more shards)");
    std::ifstream in(path, std::ios::binary);
    if (!in) throw InputError(file, "file", "cannot be opened");
    std::string text(static_cast<std::size_t>(size), '\0');
    in.read(text.data(), static_cast<std::streamsize>(size));
    if (static_cast<std::uintmax_t>(in.gcount()) != size) throw InputError(file, "file", "read failed (it changed while read?)");
    read.push_back(read_part(file, text));
  }
  return merge(std::move(read), format, report);
}

}  // namespace qattn::eval

// qattn merge's checks of its parts (eval::merge_parts, qattn/eval/shard.h; docs/scale-out.md, "Merging"): real parts
// of the embedded sample, then each one changed the way a damaged or edited part would be, its result_sha256
// recomputed where the change is not about the digest; every such set is refused with an InputError naming the part
// and the field, and a sound set merges to the unsharded report byte for byte.
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "qattn/engine.h"
#include "qattn/error.h"
#include "qattn/eval/report.h"
#include "qattn/eval/shard.h"

using namespace qattn;
using nlohmann::json;

namespace {

const std::filesystem::path kSample = QATTN_SAMPLE_DUMP;

// The four parts of `analyze --method fp16 --method index@paper --shard K/4` of the embedded sample (8 heads: each
// part holds 2 heads x 2 methods), and the single part of the whole run (shard 0/1).
struct AnalyzeParts {
  std::vector<json> four;
  json whole;
};
const AnalyzeParts& analyze_parts() {
  static const AnalyzeParts parts = [] {
    const eval::AnalysisPlan plan =
        eval::plan_analysis({"fp16", "index@paper"}, "", "", false, eval::SoftmaxReference::fp64, false,
                            [](const MethodSpec& spec) { return build_method(spec).method; });
    AnalyzeParts p;
    for (std::size_t k = 0; k < 4; ++k) p.four.push_back(json::parse(eval::analyze_shard(kSample, plan, {k, 4}, {})));
    p.whole = json::parse(eval::analyze_shard(kSample, plan, {0, 1}, {}));
    return p;
  }();
  return parts;
}

void reseal(json& part) { part["provenance"]["result_sha256"] = eval::sha256_hex(part["result"].dump()); }

std::vector<eval::PartText> texts(const std::vector<json>& parts) {
  std::vector<eval::PartText> t;
  for (std::size_t k = 0; k < parts.size(); ++k) t.push_back({"part-" + std::to_string(k) + ".json", parts[k].dump(1)});
  return t;
}

// merge_parts(parts) throws an InputError naming `file` and `field`, whose reason holds `reason`.
void refused_texts(const std::vector<eval::PartText>& parts, const std::string& file, const std::string& field,
                   const std::string& reason) {
  try {
    eval::merge_parts(parts);
    FAIL("merged: expected " << file << ": " << field << ": ..." << reason << "...");
  } catch (const InputError& e) {
    INFO(e.what());
    CHECK(e.source() == file);
    CHECK(e.field() == field);
    CHECK(e.reason().find(reason) != std::string::npos);
  }
}
void refused(const std::vector<json>& parts, const std::string& file, const std::string& field, const std::string& reason) {
  refused_texts(texts(parts), file, field, reason);
}

// The four analyze parts with part `k` changed by `change`, its digest recomputed.
std::vector<json> with(std::size_t k, const std::function<void(json&)>& change, bool keep_digest = false) {
  std::vector<json> parts = analyze_parts().four;
  change(parts[k]);
  if (!keep_digest) reseal(parts[k]);
  return parts;
}

}  // namespace

TEST_CASE("merge_parts: a sound set of analyze parts, in any order, gives the unsharded report", "[shard]") {
  const AnalyzeParts& p = analyze_parts();
  const std::string whole = eval::merge_parts(texts({p.whole})).text;
  CHECK(eval::merge_parts(texts(p.four)).text == whole);
  CHECK(eval::merge_parts(texts({p.four[2], p.four[0], p.four[3], p.four[1]})).text == whole);
  const eval::MergedParts csv = eval::merge_parts(texts(p.four), "csv");
  CHECK(csv.command == "analyze");
  CHECK(csv.text == eval::merge_parts(texts({p.whole}), "csv").text);
  CHECK_THROWS_AS(eval::merge_parts(texts(p.four), "html"), SpecError);
}

TEST_CASE("merge_parts: the shard count and index are integers in range", "[shard]") {
  for (const json& count : {json(-3), json(1000000000000LL), json(0), json(18446744073709551619.0), json(2.5), json("4")})
    refused(with(3, [&](json& d) { d["provenance"]["shard"]["count"] = count; }), "part-3.json",
            "provenance.shard.count", "is not an integer in [1, 1000000]");
  for (const json& index : {json(-1), json(1.5), json(1.0), json("1"), json(nullptr)})
    refused(with(3, [&](json& d) { d["provenance"]["shard"]["index"] = index; }), "part-3.json",
            "provenance.shard.index", "is not an integer in [0, 1000000]");
  refused(with(3, [](json& d) { d["provenance"]["shard"]["index"] = 7; }), "part-3.json", "provenance.shard.index",
          "7 of 4: shard indices count from 0");
  // One part of 2 heads relabelled as the whole run: its block is all 8 heads x 2 methods
  std::vector<json> alone = {analyze_parts().four[1]};
  alone[0]["provenance"]["shard"] = {{"index", 0}, {"count", 1}};
  reseal(alone[0]);
  refused(alone, "part-0.json", "result.rows", "4 rows, where shard 0/1's block (units 0 to 8 of 8) holds 16");
}

TEST_CASE("merge_parts: a part's rows are exactly its own (layer, head) x methods", "[shard]") {
  const json foreign = analyze_parts().four[2]["result"]["rows"][0];
  refused(with(1, [&](json& d) { d["result"]["rows"][0] = foreign; }), "part-1.json", "result.rows[0]",
          "is unit 4 of the run, outside shard 1/4's block (units 2 to 4)");
  refused(with(1, [](json& d) { d["result"]["rows"][1] = d["result"]["rows"][0]; }), "part-1.json", "result.rows[1]",
          "is given twice");
  refused(with(1, [](json& d) { d["result"]["rows"].erase(3); }), "part-1.json", "result.rows",
          "3 rows, where shard 1/4's block (units 2 to 4 of 8) holds 4");
  refused(with(1, [](json& d) { d["result"]["rows"][0]["method"] = "fp32"; }), "part-1.json", "result.rows[0].method",
          "'fp32' is not a method of the run");
  refused(with(1, [](json& d) { d["result"]["rows"][0]["head"] = 2.5; }), "part-1.json", "result.rows[0].head",
          "is not an integer");
  refused(with(1, [](json& d) { d["result"]["rows"][0]["layer"] = 7; }), "part-1.json", "result.rows[0]",
          "layer 7 head 2 is not a head of the run");
  // A count or histogram entry that is not an integer (2e67 to int64 was an undefined conversion, 1.5 read as 1)
  refused(with(1, [](json& d) { d["result"]["rows"][0]["O"]["count"] = 2.05444e67; }), "part-1.json", "result.rows[0]",
          "is not a row this qattn reads");
  refused(with(1, [](json& d) { d["result"]["rows"][0]["P"]["log2_histogram"]["-5"] = 1.5; }), "part-1.json",
          "result.rows[0]", "is not a row this qattn reads");
  // A histogram bin spelt otherwise than std::to_string writes it ("-05" would share the bin of "-5")
  refused(with(1, [](json& d) { d["result"]["rows"][0]["P"]["log2_histogram"]["-05"] = 1; }), "part-1.json",
          "result.rows[0]", "is not a row this qattn reads");
  refused(with(1, [](json& d) { d["result"]["rows"][0]["P"]["log2_histogram"]["1x"] = 1; }), "part-1.json",
          "result.rows[0]", "is not a row this qattn reads");
  // The run's heads: listed once each, in order, as every part lists them
  refused(with(1, [](json& d) { d["provenance"]["heads"][1] = d["provenance"]["heads"][0]; }), "part-1.json",
          "provenance.heads[1]", "in (layer, head) order");
  refused(with(2, [](json& d) { d["provenance"]["heads"][7] = {1, 9}; }), "part-2.json", "provenance.heads[7]",
          "foreign part: layer 1 head 9 here, layer 1 head 3 in part-0.json");
  refused(with(1, [](json& d) { d["provenance"]["units"] = 9; }), "part-1.json", "provenance.units",
          "is not the run's 8 heads");
  refused(with(1, [](json& d) { d["provenance"]["heads"].push_back({9, 0}), d["provenance"]["units"] = 9; }),
          "part-1.json", "result.view.n_heads", "8 is not the run's 9 heads");
}

TEST_CASE("merge_parts: a part carries its result's SHA-256 and its format version", "[shard]") {
  refused(with(1, [](json& d) { d["result"]["rows"][0]["O"]["cossim"] = 0.5; }, /*keep_digest=*/true), "part-1.json",
          "provenance.result_sha256", "the part was edited or damaged");
  refused(with(1, [](json& d) { d["provenance"]["result_sha256"] = "x"; }, true), "part-1.json",
          "provenance.result_sha256", "is not a SHA-256");
  refused(with(1, [](json& d) { d["qattn_partial"] = 1; }, true), "part-1.json", "qattn_partial",
          "format 1, this qattn reads format 2");
  // The digest and the input hashes differ from part to part: they are not part of what a set shares
  CHECK_NOTHROW(eval::merge_parts(texts(analyze_parts().four)));
}

TEST_CASE("merge_parts: a part is refused at its first wrong key or row, before the rest is parsed", "[shard]") {
  // Each text is cut short after the fault: a reader that parsed it whole would call it "not JSON" instead
  refused_texts({{"big.json", "{\"aaa\": [0, 0, 0, "}}, "big.json", "qattn_partial", "it has a key 'aaa'");
  refused_texts({{"big.json", "[0, 0, 0, "}}, "big.json", "qattn_partial", "not a JSON object");
  refused_texts({{"big.json", "{\"result\": {\"rows\": [0, "}}, "big.json", "qattn_partial", "no qattn_partial before its result");
  std::string dup = analyze_parts().four[1].dump();
  dup.insert(dup.rfind("\"qattn_partial\""), "\"provenance\": 0, ");
  refused_texts({{"dup.json", dup}}, "dup.json", "provenance", "is given twice");
  // Rows beyond the block: refused at the first row too many
  json many = analyze_parts().four[1];
  for (int i = 0; i < 4; ++i) many["result"]["rows"].push_back(many["result"]["rows"][0]);
  std::string text = many.dump();
  text.resize(text.find("\"view\"") - 4);  // inside the last row, after the fifth
  refused_texts({{"many.json", text}}, "many.json", "result.rows", "holds more than the 4 rows of shard 1/4's block");
  // Nesting deeper than any part
  refused(with(1, [](json& d) {
            json deep = 0;
            for (int i = 0; i < 10; ++i) deep = json::array({deep});
            d["provenance"]["options"]["x"] = deep;
          }),
          "part-1.json", "provenance", "nests deeper than a part does");
}

TEST_CASE("merge_part_files: a file over kMaxPartBytes is refused before it is read", "[shard]") {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "qattn-merge-part-test";
  std::filesystem::create_directories(dir);
  const std::filesystem::path big = dir / "big.json";
  { std::ofstream(big) << "{"; }
  std::filesystem::resize_file(big, eval::kMaxPartBytes + 1);  // sparse: nothing is written
  try {
    eval::merge_part_files({big});
    FAIL("merged a part over the cap");
  } catch (const InputError& e) {
    CHECK(e.field() == "file");
    CHECK(e.reason().find("more than the 268435456") != std::string::npos);
  }
  CHECK_THROWS_AS(eval::merge_part_files({dir}), InputError);  // a directory
  std::filesystem::remove_all(dir);
}

namespace {

// A sweep part of `points` grid points (axis "b" = point + 2) over the sample's 8 heads, shard k of n, with the fp16
// rows of the analyze run as every point's head rows. The test of the sweep's own merge is scale_out_test.sh; here
// the units: point-major (point i, head j is unit 8 i + j) or head-major (unit j points + i).
json sweep_part(std::size_t points, std::size_t k, std::size_t n, bool head_major) {
  const json& whole = analyze_parts().whole;
  std::vector<json> head_rows;
  const json& rows_of_run = whole["result"]["rows"];
  for (const json& r : rows_of_run)  // one method's rows: the first row's
    if (r["method"] == rows_of_run[0]["method"]) head_rows.push_back(r);
  const std::size_t heads = head_rows.size(), units = points * heads;
  const auto [begin, end] = eval::shard_block(units, {k, n});
  json rows = json::array();
  for (std::size_t u = begin; u < end; ++u) {
    const std::size_t point = head_major ? u % points : u / heads, head = head_major ? u / points : u % heads;
    rows.push_back({{"point", point}, {"values", json::array({std::to_string(point + 2)})}, {"method", "fp16"}, {"head", head_rows[head]}});
  }
  json part = {{"format", "csv"},
               {"qattn_partial", 2},
               {"provenance",
                {{"command", "sweep"},
                 {"version", whole["provenance"]["version"]},
                 {"options", {{"order", head_major ? "head-major" : "point-major"}}},
                 {"dump", whole["provenance"]["dump"]},
                 {"units", units},
                 {"points", points},
                 {"heads", whole["provenance"]["heads"]},
                 {"shard", {{"index", k}, {"count", n}}},
                 {"inputs", json::object()}}},
               {"result", {{"keys", json::array({"b"})}, {"target", "O"}, {"metric", "cossim"}, {"heads", heads}, {"rows", rows}}}};
  reseal(part);
  return part;
}

std::vector<json> sweep_set(std::size_t n, bool head_major) {
  std::vector<json> parts;
  for (std::size_t k = 0; k < n; ++k) parts.push_back(sweep_part(2, k, n, head_major));
  return parts;
}

}  // namespace

TEST_CASE("merge_parts: sweep parts hold exactly their own (point, head) pairs, a point's values the same in all",
          "[shard]") {
  const std::string whole = eval::merge_parts(texts(sweep_set(1, false))).text;
  CHECK(whole.find("b,target,metric,mean,worst,heads,method\n2,O,cossim,") == 0);
  CHECK(eval::merge_parts(texts(sweep_set(3, false))).text == whole);
  CHECK(eval::merge_parts(texts(sweep_set(5, true))).text == whole);
  // part 0 of 3 holds point 0, heads 0-4; part 1 point 0, heads 5-7 and point 1, heads 0-1
  std::vector<json> twice = sweep_set(3, false);
  twice[0]["result"]["rows"][1]["head"] = twice[0]["result"]["rows"][0]["head"];
  reseal(twice[0]);
  refused(twice, "part-0.json", "result.rows[1]", "point 0, layer 0 head 0 is given twice");
  std::vector<json> foreign = sweep_set(3, false);
  foreign[0]["result"]["rows"][0] = foreign[2]["result"]["rows"][0];
  reseal(foreign[0]);
  refused(foreign, "part-0.json", "result.rows[0]", "is unit 10 of the run, outside shard 0/3's block");
  std::vector<json> values = sweep_set(3, false);
  values[1]["result"]["rows"][0]["values"] = json::array({"3"});
  reseal(values[1]);
  refused(values, "part-1.json", "result.rows[0]", "point 0 has other values or another method here than in part-0.json");
  std::vector<json> order = sweep_set(3, false);  // point-major rows under a head-major order
  order[1]["provenance"]["options"]["order"] = "head-major";
  refused(order, "part-1.json", "result.rows[0]", "outside shard 1/3's block");
  std::vector<json> points = sweep_set(3, false);
  points[2]["provenance"]["points"] = 3;
  refused(points, "part-2.json", "provenance.units", "is not the 3 points x 8 heads of the run");
}

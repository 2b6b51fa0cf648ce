// Sharded runs, the writing side (qattn/eval/shard.h): a shard's block of the units, its part file and its
// provenance; merge.cc reads the parts back.
#include "qattn/eval/shard.h"

#if QATTN_HAVE_OPENSSL
#include <openssl/evp.h>
#endif

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
#include "qattn/eval/sweep.h"
#include "qattn/reference/registry.h"
#include "report_json.h"

namespace qattn::eval {

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
    throw SpecError("'" + text + "' is not K/N (shard K of N, 0 <= K < N)");
  if (s.count < 1 || s.count > kMaxShards)
    throw SpecError("'" + text + "': N must be in [1, " + std::to_string(kMaxShards) + "]");
#if !QATTN_HAVE_OPENSSL
  throw SpecError("this qattn was built without OpenSSL's libcrypto (libssl-dev), which hashes the inputs every part "
                  "records; rebuild with it to run shards");
#endif
  if (s.index >= s.count)
    throw SpecError("'" + text + "': K counts from 0 and must be below N (0.." + std::to_string(s.count - 1) + ")");
  return s;
}

std::pair<std::size_t, std::size_t> shard_block(std::size_t n, Shard s) {
  // n * K fits: n is a count of heads or grid points (<= 10^7), K < 10^6
  return {n * s.index / s.count, n * (s.index + 1) / s.count};
}

#if QATTN_HAVE_OPENSSL
namespace {

using DigestContext = std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)>;

DigestContext sha256_context() {
  DigestContext ctx(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  if (!ctx || EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) != 1)
    throw std::runtime_error("SHA-256 is not available from OpenSSL");
  return ctx;
}

std::string sha256_final(EVP_MD_CTX* ctx) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_DigestFinal_ex(ctx, md, &len);
  std::string hex;
  char two[3];
  for (unsigned int i = 0; i < len; ++i) std::snprintf(two, sizeof two, "%02x", md[i]), hex += two;
  return hex;
}

}  // namespace
#endif

std::string sha256_file(const fs::path& path) {
#if QATTN_HAVE_OPENSSL
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path.string(), "file", "cannot be read to hash it");
  DigestContext ctx = sha256_context();
  std::vector<char> buf(1 << 20);
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    if (in.gcount() > 0) EVP_DigestUpdate(ctx.get(), buf.data(), static_cast<std::size_t>(in.gcount()));
  }
  if (in.bad()) throw InputError(path.string(), "file", "read failed while hashing it");
  return sha256_final(ctx.get());
#else
  throw InputError(path.string(), "file", "cannot be hashed: built without OpenSSL's libcrypto");
#endif
}

std::string sha256_hex(std::string_view bytes) {
#if QATTN_HAVE_OPENSSL
  DigestContext ctx = sha256_context();
  EVP_DigestUpdate(ctx.get(), bytes.data(), bytes.size());
  return sha256_final(ctx.get());
#else
  (void)bytes;
  throw std::runtime_error("SHA-256 is not available: built without OpenSSL's libcrypto");
#endif
}

json partial_document(const Provenance& p, json result) {
  json inputs = json::object();
  for (const std::string& f : p.inputs) inputs[f] = sha256_file(f);
  const std::string result_sha256 = sha256_hex(result.dump());
  json doc = {{"qattn_partial", kPartialFormat},
          {"provenance",
           {{"command", p.command},
            {"version", QATTN_VERSION},
            {"options", p.options},
            {"dump", p.dump},
            {"units", p.units},
            {"heads", p.heads},
            {"shard", {{"index", p.shard.index}, {"count", p.shard.count}}},
            {"inputs", inputs},
            {"result_sha256", result_sha256}}},
          {"result", std::move(result)}};
  if (p.points > 0) doc["provenance"]["points"] = p.points;
  return doc;
}

std::string analyze_shard(const fs::path& source, const AnalysisPlan& plan, Shard shard, const EvalOptions& options,
                          const std::string& format) {
  if (shard.count < 1 || shard.index >= shard.count)
    throw SpecError("shard " + std::to_string(shard.index) + "/" + std::to_string(shard.count) +
                    " is not K/N with 0 <= K < N");
  if (format != "md" && format != "csv" && format != "latex" && format != "json")
    throw SpecError("format '" + format + "' is not one of md|csv|latex|json");
  const DumpTarget target = plan.softmax ? DumpTarget::softmax : DumpTarget::attention;
  const DumpListing listing = list_dump(source, target);
  std::vector<std::pair<int, int>> units = listing.units;
  auto input_file = [&](int layer, const std::string& suffix) { return "layer" + std::to_string(layer) + "_" + suffix; };
  if (plan.wq) {  // layers without an attention input are left out of a weight analysis, as in the unsharded run
    std::erase_if(units, [&](const auto& u) { return !listing.files.count(input_file(u.first, "attn_input.npy")); });
    std::vector<DumpLayer> none;
    if (units.empty()) quantize_projections(none, source, *plan.wq);  // throws the unsharded run's error
  }
  const auto [begin, end] = shard_block(units.size(), shard);
  const std::set<std::pair<int, int>> owned(units.begin() + static_cast<std::ptrdiff_t>(begin),
                                            units.begin() + static_cast<std::ptrdiff_t>(end));
  std::set<int> owned_layers;
  for (const auto& [layer, head] : owned) owned_layers.insert(layer);
  const bool whole_layers = !plan.heads_independent();
  Provenance prov;
  DumpFilter filter;
  filter.keep = [&](int layer, int head) { return whole_layers ? owned_layers.count(layer) > 0 : owned.count({layer, head}) > 0; };
  filter.listing = &listing;
  filter.files_read = &prov.inputs;
  std::vector<HeadResult> results;
  if (!owned.empty()) {
    std::vector<DumpLayer> dump = load_dump(source, target, plan.reference, &filter, /*with_reference=*/false);
    if (plan.wq) {
      quantize_projections(dump, source, *plan.wq);
      for (int layer : owned_layers)
        for (const char* f : {"attn_input", "wq", "wk", "wv", "bq", "bk", "bv"})
          prov.inputs.push_back((source / input_file(layer, std::string(f) + ".npy")).string());
    }
    results = evaluate_plan(dump, plan, options);
    std::erase_if(results, [&](const HeadResult& r) { return !owned.count({r.layer, r.head}); });
  }
  const ReportView view = report_view(plan, source.string(), units.size());
  json methods = json::array();  // by label; the canonical specs are in the view
  for (const ReportMethod& m : view.methods) methods.push_back(m.label);
  prov.command = "analyze";
  prov.options = {{"tensors", view.tensors}, {"method", methods},        {"reference", view.reference},
                  {"kv", view.kv},           {"weights", view.weights}, {"softmax_only", view.softmax}};
  prov.dump = {{"source", source.string()}, {"files", listing.files}};
  prov.units = units.size();
  prov.heads = units;
  prov.shard = shard;
  json rows = json::array();
  for (const HeadResult& r : results) rows.push_back(head_result_json(r));
  json doc = partial_document(prov, {{"view", report_view_json(view)}, {"rows", rows}});
  doc["format"] = format;
  return doc.dump(1) + "\n";
}

std::string sweep_shard(const SweepRequest& request, Shard shard) {
  if (shard.count < 1 || shard.index >= shard.count)
    throw SpecError("shard " + std::to_string(shard.index) + "/" + std::to_string(shard.count) +
                    " is not K/N with 0 <= K < N");
  if (request.order != "point-major" && request.order != "head-major")
    throw SpecError("order '" + request.order + "' is not point-major or head-major");
  sweep_metric(request.target, request.metric);
  const SweepGrid grid = sweep_grid(request);
  const std::vector<MethodSpec>& specs = grid.specs;
  const DumpListing listing = list_dump(request.tensors, DumpTarget::attention);
  const std::size_t n_heads = listing.units.size();
  const auto [begin, end] = shard_block(specs.size() * n_heads, shard);
  std::map<std::size_t, std::set<std::pair<int, int>>> owned;  // point -> its heads this shard owns
  std::set<std::pair<int, int>> heads_read;
  std::set<int> layers_read;
  bool whole_layers = false;
  const bool head_major = request.order == "head-major";
  for (std::size_t u = begin; u < end; ++u) {
    const std::size_t point = head_major ? u % specs.size() : u / n_heads, head = head_major ? u / specs.size() : u % n_heads;
    owned[point].insert(listing.units[head]);
    heads_read.insert(listing.units[head]);
    layers_read.insert(listing.units[head].first);
  }
  for (const auto& [point, heads] : owned)
    whole_layers = whole_layers || !ref::reference_registry().traits(specs[point]).heads_independent;
  Provenance prov;
  DumpFilter filter;
  filter.keep = [&](int layer, int head) {
    return whole_layers ? layers_read.count(layer) > 0 : heads_read.count({layer, head}) > 0;
  };
  filter.listing = &listing;
  filter.files_read = &prov.inputs;
  std::vector<DumpLayer> dump;
  if (begin < end) dump = load_dump(request.tensors, DumpTarget::attention, SoftmaxReference::fp64, &filter, false);
  std::vector<std::size_t> my_points;
  std::vector<MethodSpec> my_specs;
  std::vector<std::string> my_canonical;
  for (const auto& [point, heads] : owned)
    my_points.push_back(point), my_specs.push_back(specs[point]), my_canonical.push_back(grid.canonical[point]);
  std::vector<std::vector<HeadResult>> results(my_specs.size());
  evaluate_sweep_points(dump, request, my_specs, my_canonical,
                        [&](std::size_t i, std::vector<HeadResult> r) { results[i] = std::move(r); });
  json rows = json::array();
  for (std::size_t i = 0; i < my_points.size(); ++i)
    for (const HeadResult& r : results[i])
      if (owned[my_points[i]].count({r.layer, r.head}))
        rows.push_back({{"point", my_points[i]},
                        {"values", grid.points[my_points[i]]},
                        {"method", grid.canonical[my_points[i]]},
                        {"head", head_result_json(r)}});
  json header = sweep_header_json(sweep_header(request, grid.axes));
  header["heads"] = n_heads;
  header["rows"] = rows;
  prov.command = "sweep";
  prov.options = {{"method", request.spec}, {"grid", request.grids},   {"tensors", request.tensors},
                  {"metric", request.metric}, {"target", request.target}, {"order", request.order}};
  prov.dump = {{"source", request.tensors}, {"files", listing.files}};
  prov.units = specs.size() * n_heads;
  prov.heads = listing.units;
  prov.points = specs.size();
  prov.shard = shard;
  json doc = partial_document(prov, header);
  doc["format"] = request.format;
  return doc.dump(1) + "\n";
}

std::string analysis_shard(AnalysisRequest& request, Shard shard) {
  if (!request.q.empty() || !request.logits.empty())
    throw SpecError("a shard splits a dump's (layer, head) pairs: give a dump, not explicit q/k/v or logits files");
  const PlannedAnalysis p = plan_request(request);
  return analyze_shard(request.tensors, p.plan, shard, eval_options(request),
                       request.format.empty() ? "md" : request.format);
}

}  // namespace qattn::eval

// Fuzz target: `qattn merge`'s reading and joining of part files (eval::merge_parts, qattn/eval/shard.h). The input
// is split at each line "--part--" into up to 8 parts, named part-0.json, part-1.json, ... and merged in that order
// with the format the parts name; a seed that is a whole set of parts (fuzz/seeds-merge) reaches the table. A part
// that parses as JSON gets its provenance.result_sha256 recomputed first, so that a mutated row reaches the checks of
// rows and the merge instead of stopping at the digest; an input that starts with '!' keeps its digests (the digest
// check itself). The acceptable failures are qattn::InputError (a part refused) and qattn::SpecError (a format the
// parts' command does not write); anything else (a crash, a hang, a sanitizer report, another exception escaping) is
// a finding.
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "qattn/error.h"
#include "qattn/eval/shard.h"

namespace {

// `text` with provenance.result_sha256 set to its result's digest, where it parses as a part-like object.
std::string resealed(const std::string& text) {
  nlohmann::json doc = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!doc.is_object() || !doc.contains("provenance") || !doc["provenance"].is_object() || !doc.contains("result"))
    return text;
  doc["provenance"]["result_sha256"] = qattn::eval::sha256_hex(doc["result"].dump());
  return doc.dump(1);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  constexpr std::string_view kSeparator = "\n--part--\n";
  constexpr std::size_t kMaxParts = 8;
  std::string_view input(reinterpret_cast<const char*>(data), size);
  const bool keep_digests = !input.empty() && input.front() == '!';
  if (keep_digests) input.remove_prefix(1);
  std::vector<qattn::eval::PartText> parts;
  std::size_t start = 0;
  while (parts.size() + 1 < kMaxParts) {
    const std::size_t end = input.find(kSeparator, start);
    if (end == std::string_view::npos) break;
    parts.push_back({"part-" + std::to_string(parts.size()) + ".json", std::string(input.substr(start, end - start))});
    start = end + kSeparator.size();
  }
  parts.push_back({"part-" + std::to_string(parts.size()) + ".json", std::string(input.substr(start))});
  if (!keep_digests)
    for (qattn::eval::PartText& p : parts) p.text = resealed(p.text);
  try {
    (void)qattn::eval::merge_parts(parts);
  } catch (const qattn::InputError&) {
  } catch (const qattn::SpecError&) {
  }
  return 0;
}

// .safetensors: an 8-byte little-endian header length N, N bytes of JSON, then the tensor bytes.
// Validation follows the format's reference implementation: offsets must tile the data buffer exactly, in order,
// with no overlap and no gap, and each tensor's byte range must equal prod(shape) * itemsize.
#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "qattn/error.h"
#include "qattn/tensor_io.h"

namespace qattn {
namespace {

using nlohmann::json;

struct StCode {
  const char* code;
  DType dtype;
};
constexpr StCode kCodes[] = {{"F64", DType::f64}, {"F32", DType::f32}, {"F16", DType::f16}, {"BF16", DType::bf16},
                             {"I8", DType::i8},   {"U8", DType::u8},   {"I16", DType::i16}, {"I32", DType::i32},
                             {"I64", DType::i64}, {"U16", DType::u16}, {"U32", DType::u32}};

const char* code_of(DType t) {
  for (const auto& c : kCodes)
    if (c.dtype == t) return c.code;
  return "?";
}

struct Entry {
  std::string name;
  DType dtype;
  std::vector<std::int64_t> shape;
  std::uint64_t begin, end;
};

std::uint64_t non_negative(const json& v, const std::string& source, const std::string& field) {
  if (!v.is_number_integer() || (v.is_number_integer() && !v.is_number_unsigned() && v.get<std::int64_t>() < 0))
    throw InputError(source, field, "expected a non-negative integer, got " + v.dump());
  return v.get<std::uint64_t>();
}

// Deepest nesting of [ and { outside strings. A safetensors header needs 3 levels ({name: {shape: [...]}});
// nlohmann-json builds every level as a node, so a 20 MB header of nested brackets would cost gigabytes.
std::size_t nesting_depth(std::string_view text) {
  std::size_t depth = 0, deepest = 0;
  bool in_string = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') ++i;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
      if (deepest > kMaxSafetensorsNesting) break;
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return deepest;
}

// The header's JSON, checked: the 8-byte length within the limit and the file, the nesting within
// kMaxSafetensorsNesting, and the text a JSON object. *n is the header's length in bytes.
json parse_header(std::span<const std::byte> data, const std::string& source, std::uint64_t* n) {
  if (data.size() < 8)
    throw InputError(source, "header_len", "file is " + std::to_string(data.size()) + " bytes, shorter than 8");
  std::memcpy(n, data.data(), 8);  // little-endian host
  if (*n > kMaxSafetensorsHeaderBytes)
    throw InputError(source, "header_len",
                     std::to_string(*n) + " exceeds the limit of " + std::to_string(kMaxSafetensorsHeaderBytes));
  if (*n > data.size() - 8)
    throw InputError(source, "header", "truncated: header needs " + std::to_string(*n) + " bytes, " +
                                           std::to_string(data.size() - 8) + " present");
  const char* text = reinterpret_cast<const char*>(data.data() + 8);
  if (nesting_depth({text, *n}) > kMaxSafetensorsNesting)
    throw InputError(source, "header", "JSON nests deeper than " + std::to_string(kMaxSafetensorsNesting) +
                                           " levels (a safetensors header needs 3)");
  json header = json::parse(text, text + *n, nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded()) throw InputError(source, "header", "not valid JSON");
  if (!header.is_object()) throw InputError(source, "header", "JSON header is not an object");
  return header;
}

// The shape of entry `f` (its quoted name), at most kMaxRank non-negative dimensions; *count is its element count.
std::vector<std::int64_t> parse_shape(const json& shape, const std::string& source, const std::string& f,
                                      std::uint64_t* count) {
  if (!shape.is_array()) throw InputError(source, f + ".shape", "must be an array");
  if (shape.size() > static_cast<std::size_t>(kMaxRank))
    throw InputError(source, f + ".shape", "more than " + std::to_string(kMaxRank) + " dimensions");
  std::vector<std::int64_t> out;
  *count = 1;
  for (const json& d : shape) {
    const std::uint64_t dim = non_negative(d, source, f + ".shape");
    if (dim > static_cast<std::uint64_t>(INT64_MAX) || __builtin_mul_overflow(*count, dim, count))
      throw InputError(source, f + ".shape", "element count overflows");
    out.push_back(static_cast<std::int64_t>(dim));
  }
  return out;
}

// One tensor entry of the header: a known dtype, a shape, and data offsets within the `buffer` bytes of data whose
// range holds exactly the shape's elements.
Entry parse_entry(const std::string& name, const json& info, const std::string& source, std::uint64_t buffer) {
  const std::string f = "'" + name + "'";
  if (!info.is_object()) throw InputError(source, f, "entry is not an object");
  for (const char* key : {"dtype", "shape", "data_offsets"})
    if (!info.contains(key)) throw InputError(source, f + "." + key, "missing");
  Entry e;
  e.name = name;
  const json& code = info["dtype"];
  if (!code.is_string()) throw InputError(source, f + ".dtype", "must be a string");
  const auto* c = std::find_if(std::begin(kCodes), std::end(kCodes),
                               [&](const StCode& x) { return code.get<std::string>() == x.code; });
  if (c == std::end(kCodes))
    throw InputError(source, f + ".dtype",
                     "unsupported dtype " + code.dump() + " (supported: F64 F32 F16 BF16 I8 U8 I16 I32 I64)");
  e.dtype = c->dtype;
  std::uint64_t count = 1;
  e.shape = parse_shape(info["shape"], source, f, &count);
  const json& off = info["data_offsets"];
  if (!off.is_array() || off.size() != 2) throw InputError(source, f + ".data_offsets", "must be [begin, end]");
  e.begin = non_negative(off[0], source, f + ".data_offsets");
  e.end = non_negative(off[1], source, f + ".data_offsets");
  if (e.begin > e.end) throw InputError(source, f + ".data_offsets", "begin is after end");
  if (e.end > buffer)
    throw InputError(source, f + ".data_offsets",
                     "end " + std::to_string(e.end) + " is beyond the data buffer of " + std::to_string(buffer) +
                         " bytes");
  std::uint64_t nbytes = 0;
  if (__builtin_mul_overflow(count, dtype_size(e.dtype), &nbytes) || nbytes != e.end - e.begin)
    throw InputError(source, f + ".data_offsets",
                     "range holds " + std::to_string(e.end - e.begin) + " bytes but shape and dtype need " +
                         std::to_string(count) + " x " + std::to_string(dtype_size(e.dtype)));
  return e;
}

// Sorts the entries by offset and checks that they tile the `buffer` data bytes: no overlap, no gap, nothing left.
void check_tiling(std::vector<Entry>& entries, const std::string& source, std::uint64_t buffer) {
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  std::uint64_t cursor = 0;
  for (const Entry& e : entries) {
    if (e.begin < cursor)
      throw InputError(source, "'" + e.name + "'.data_offsets", "overlaps the previous tensor (begins at " +
                                                                   std::to_string(e.begin) + ", previous ends at " +
                                                                   std::to_string(cursor) + ")");
    if (e.begin > cursor)
      throw InputError(source, "'" + e.name + "'.data_offsets",
                       "leaves a gap: begins at " + std::to_string(e.begin) + ", previous ends at " + std::to_string(cursor));
    cursor = e.end;
  }
  if (cursor != buffer)
    throw InputError(source, "data", "tensors cover " + std::to_string(cursor) + " of " + std::to_string(buffer) +
                                         " data bytes");
}

}  // namespace

std::vector<NamedTensor> parse_safetensors(std::span<const std::byte> data, const std::string& source) {
  std::uint64_t n = 0;
  const json header = parse_header(data, source, &n);
  const std::uint64_t buffer = data.size() - 8 - n;
  std::vector<Entry> entries;
  for (const auto& [name, info] : header.items()) {
    if (name == "__metadata__") {
      if (!info.is_object()) throw InputError(source, "__metadata__", "must be an object");
      for (const auto& [k, v] : info.items())
        if (!v.is_string()) throw InputError(source, "__metadata__." + k, "values must be strings");
      continue;
    }
    entries.push_back(parse_entry(name, info, source, buffer));
  }
  check_tiling(entries, source, buffer);

  const std::byte* base = data.data() + 8 + n;
  std::vector<NamedTensor> out;
  out.reserve(entries.size());
  for (Entry& e : entries) {
    Tensor t;
    t.dtype = e.dtype;
    t.shape = std::move(e.shape);
    t.bytes.assign(base + e.begin, base + e.end);
    out.push_back({std::move(e.name), std::move(t)});
  }
  return out;
}

std::vector<NamedTensor> read_safetensors(const std::filesystem::path& path) {
  return parse_safetensors(read_file_bytes(path), path.string());
}

void write_safetensors(const std::filesystem::path& path, const std::vector<NamedTensor>& tensors) {
  write_file_atomic(path, encode_safetensors(tensors, path.string()));
}

std::vector<std::byte> encode_safetensors(const std::vector<NamedTensor>& tensors, const std::string& source) {
  json header = json::object();
  std::uint64_t offset = 0;
  for (const auto& t : tensors) {
    if (t.name == "__metadata__" || header.contains(t.name))
      throw InputError(source, "'" + t.name + "'", "duplicate or reserved tensor name");
    header[t.name] = {{"dtype", code_of(t.tensor.dtype)},
                      {"shape", t.tensor.shape},
                      {"data_offsets", {offset, offset + t.tensor.bytes.size()}}};
    offset += t.tensor.bytes.size();
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // keep the data 8-byte aligned, as the reference writer does
  std::vector<std::byte> out(8 + text.size());
  const std::uint64_t n = text.size();
  std::memcpy(out.data(), &n, 8);
  std::memcpy(out.data() + 8, text.data(), text.size());
  // json objects iterate in key order; write the data in the order the offsets were assigned above.
  for (const auto& t : tensors) {
    const auto* b = t.tensor.bytes.data();
    out.insert(out.end(), b, b + t.tensor.bytes.size());
  }
  return out;
}

}  // namespace qattn

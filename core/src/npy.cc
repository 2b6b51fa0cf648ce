// .npy reader and writer. Hand-written: Debian ships no C++ library for the format. The header is a Python
// dict literal; this file parses exactly the subset numpy writes (see docs/tensor-io.md) and rejects the rest.
#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <string_view>

#include "qattn/choice.h"
#include "qattn/error.h"
#include "qattn/tensor_io.h"

namespace qattn {
namespace {

static_assert(std::endian::native == std::endian::little, "qattn supports little-endian hosts only");

constexpr std::string_view kMagic = "\x93NUMPY";

// Minimal scanner for the header dict: {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
class HeaderScanner {
 public:
  HeaderScanner(std::string_view text, const std::string& source) : s_(text), source_(source) {}

  void skip_space() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r')) ++i_;
  }
  bool peek(char c) {
    skip_space();
    return i_ < s_.size() && s_[i_] == c;
  }
  void expect(char c, const char* what) {
    if (!peek(c)) fail("header", std::string("expected '") + c + "' " + what + " at offset " + std::to_string(i_));
    ++i_;
  }
  std::string string_literal(const char* field) {
    skip_space();
    if (i_ >= s_.size() || (s_[i_] != '\'' && s_[i_] != '"')) fail(field, "expected a quoted string");
    const char q = s_[i_++];
    const std::size_t start = i_;
    while (i_ < s_.size() && s_[i_] != q) {
      if (s_[i_] == '\\') fail(field, "escape sequences are not supported");
      ++i_;
    }
    if (i_ >= s_.size()) fail(field, "unterminated string");
    return std::string(s_.substr(start, i_++ - start));
  }
  bool boolean(const char* field) {
    skip_space();
    if (s_.substr(i_, 4) == "True") { i_ += 4; return true; }
    if (s_.substr(i_, 5) == "False") { i_ += 5; return false; }
    fail(field, "expected True or False");
  }
  std::vector<std::int64_t> int_tuple(const char* field) {
    std::vector<std::int64_t> dims;
    bool trailing_comma = false;
    expect('(', "to open the shape tuple");
    while (!peek(')')) {
      skip_space();
      if (i_ >= s_.size() || s_[i_] < '0' || s_[i_] > '9') fail(field, "expected a non-negative integer");
      std::int64_t v = 0;
      while (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9') {
        if (__builtin_mul_overflow(v, 10, &v) || __builtin_add_overflow(v, s_[i_] - '0', &v))
          fail(field, "dimension overflows int64");
        ++i_;
      }
      if (i_ < s_.size() && s_[i_] == 'L') ++i_;  // Python 2 long suffix, as old numpy wrote it
      dims.push_back(v);
      if (dims.size() > static_cast<std::size_t>(kMaxRank))
        fail(field, "more than " + std::to_string(kMaxRank) + " dimensions");
      trailing_comma = peek(',');
      if (!trailing_comma) break;
      ++i_;
    }
    expect(')', "to close the shape tuple");
    // Python reads (2) as the integer 2, not a tuple: numpy refuses it, and so do we.
    if (dims.size() == 1 && !trailing_comma)
      fail(field, "(" + std::to_string(dims.front()) + ") is not a tuple; a one-dimensional shape is written (" +
                      std::to_string(dims.front()) + ",)");
    return dims;
  }
  bool at_end() {
    skip_space();
    return i_ == s_.size();
  }
  [[noreturn]] void fail(const std::string& field, const std::string& reason) const {
    throw InputError(source_, field, reason);
  }

 private:
  std::string_view s_;
  const std::string& source_;
  std::size_t i_ = 0;
};

struct Descr {
  DType dtype;
  bool big_endian;
};

// numpy's type codes (a descr less its byte-order character) of the dtypes read and written here.
constexpr Choice<DType> kTypeCodes[] = {
    {"f8", DType::f64}, {"f4", DType::f32}, {"f2", DType::f16}, {"V2", DType::bf16}, {"i1", DType::i8},
    {"u1", DType::u8},  {"i2", DType::i16}, {"i4", DType::i32}, {"i8", DType::i64}, {"u2", DType::u16},
    {"u4", DType::u32}};

Descr parse_descr(const std::string& d, const std::string& source) {
  auto bad = [&](const std::string& why) -> Descr { throw InputError(source, "descr", "'" + d + "': " + why); };
  if (d.size() < 2) return bad("too short");
  std::size_t k = 0;
  bool big = false;
  if (d[0] == '<' || d[0] == '>' || d[0] == '|' || d[0] == '=') {
    big = d[0] == '>';
    k = 1;
  }
  const std::string code = d.substr(k);
  if (const std::optional<DType> t = value_named(kTypeCodes, code)) return {*t, big && dtype_size(*t) > 1};
  if (code == "b1") return bad("bool arrays are not supported; convert to uint8 first");
  if (code[0] == 'V') return bad("only V2 (read as bfloat16) is supported among void types");
  return bad("unsupported dtype (supported: f8 f4 f2 V2(bfloat16) i1 u1 i2 u2 i4 u4 i8, any byte order)");
}

// Every dtype has its code (the table is the one place the codes live, so nothing else would notice a missing one).
constexpr bool every_dtype_has_a_code() {
  for (DType t : kAllDTypes)
    if (!value_named(kTypeCodes, name_of(kTypeCodes, t, ""))) return false;
  return true;
}
static_assert(every_dtype_has_a_code(), "kTypeCodes lacks a DType of kAllDTypes");

// Written little-endian, as this host stores them; a single byte has no order ('|').
std::string descr_of(DType t) { return (dtype_size(t) == 1 ? "|" : "<") + std::string(name_of(kTypeCodes, t)); }

std::uint32_t read_le(const std::byte* p, int n) {
  std::uint32_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = (v << 8) | static_cast<std::uint32_t>(p[i]);
  return v;
}

// Reorders column-major (Fortran) elements into row-major order.
std::vector<std::byte> fortran_to_c(std::span<const std::byte> src, const std::vector<std::int64_t>& shape,
                                    std::size_t width) {
  std::vector<std::byte> dst(src.size());
  const std::size_t rank = shape.size();
  const std::int64_t n = static_cast<std::int64_t>(src.size() / width);
  std::vector<std::int64_t> idx(rank, 0);  // C-order multi-index of element c
  for (std::int64_t c = 0; c < n; ++c) {
    std::int64_t f = 0;
    for (std::size_t a = rank; a-- > 0;) f = f * shape[a] + idx[a];
    std::memcpy(dst.data() + c * width, src.data() + f * width, width);
    for (std::size_t a = rank; a-- > 0;) {
      if (++idx[a] < shape[a]) break;
      idx[a] = 0;
    }
  }
  return dst;
}

// The header fields of a .npy file and where its data lies.
struct NpyHeader {
  Descr descr;
  bool fortran = false;
  std::vector<std::int64_t> shape;
  std::size_t data_start = 0;
  std::uint64_t nbytes = 0;
};

// Parses the preamble and header dict of `data`; nullopt when `data` ends before the header does (only when
// `partial`, otherwise that is an error).
std::optional<NpyHeader> parse_npy_header(std::span<const std::byte> data, const std::string& source, bool partial) {
  if (data.size() < 10) {
    if (partial) return std::nullopt;
    throw InputError(source, "magic", "file is " + std::to_string(data.size()) +
                                          " bytes, shorter than the 10-byte .npy preamble");
  }
  if (std::memcmp(data.data(), kMagic.data(), kMagic.size()) != 0)
    throw InputError(source, "magic", "not a .npy file (expected \\x93NUMPY)");
  const int major = static_cast<int>(data[6]);
  const int minor = static_cast<int>(data[7]);
  if (major < 1 || major > 3 || minor != 0)
    throw InputError(source, "version", "unsupported format version " + std::to_string(major) + "." +
                                            std::to_string(minor) + " (supported: 1.0, 2.0, 3.0)");
  const std::size_t len_bytes = major == 1 ? 2 : 4;
  if (data.size() < 8 + len_bytes) {
    if (partial) return std::nullopt;
    throw InputError(source, "header_len", "truncated before the header length");
  }
  const std::size_t header_len = read_le(data.data() + 8, static_cast<int>(len_bytes));
  const std::size_t header_start = 8 + len_bytes;
  if (header_len > kMaxNpyHeaderBytes)
    throw InputError(source, "header_len", std::to_string(header_len) + " bytes exceeds the limit of " +
                                               std::to_string(kMaxNpyHeaderBytes));
  if (data.size() - header_start < header_len) {
    if (partial) return std::nullopt;
    throw InputError(source, "header", "truncated: header needs " + std::to_string(header_len) + " bytes, " +
                                           std::to_string(data.size() - header_start) + " present");
  }
  const std::string_view header(reinterpret_cast<const char*>(data.data() + header_start), header_len);

  HeaderScanner sc(header, source);
  std::string descr;
  bool have_descr = false, have_order = false, have_shape = false;
  NpyHeader h;
  sc.expect('{', "to open the header dict");
  while (!sc.peek('}')) {
    const std::string key = sc.string_literal("header");
    sc.expect(':', "after a key");
    if (key == "descr") {
      if (sc.peek('[')) sc.fail("descr", "structured dtypes are not supported");
      if (have_descr) sc.fail("descr", "given twice");
      descr = sc.string_literal("descr");
      have_descr = true;
    } else if (key == "fortran_order") {
      if (have_order) sc.fail("fortran_order", "given twice");
      h.fortran = sc.boolean("fortran_order");
      have_order = true;
    } else if (key == "shape") {
      if (have_shape) sc.fail("shape", "given twice");
      h.shape = sc.int_tuple("shape");
      have_shape = true;
    } else {
      sc.fail("header", "unexpected key '" + key + "'");
    }
    if (!sc.peek(',')) break;
    sc.expect(',', "between entries");
  }
  sc.expect('}', "to close the header dict");
  if (!sc.at_end()) sc.fail("header", "trailing characters after the dict");
  if (!have_descr) sc.fail("descr", "missing");
  if (!have_order) sc.fail("fortran_order", "missing");
  if (!have_shape) sc.fail("shape", "missing");

  h.descr = parse_descr(descr, source);
  const std::size_t width = dtype_size(h.descr.dtype);
  std::int64_t count = 1;
  for (std::int64_t dim : h.shape)
    if (__builtin_mul_overflow(count, dim, &count)) sc.fail("shape", "element count overflows int64");
  std::int64_t nbytes = 0;
  if (__builtin_mul_overflow(count, static_cast<std::int64_t>(width), &nbytes))
    sc.fail("shape", "byte size overflows int64");
  h.data_start = header_start + header_len;
  h.nbytes = static_cast<std::uint64_t>(nbytes);
  return h;
}

}  // namespace

std::optional<std::uint64_t> npy_declared_size(std::span<const std::byte> prefix, const std::string& source) {
  const std::optional<NpyHeader> h = parse_npy_header(prefix, source, /*partial=*/true);
  if (!h) return std::nullopt;
  return h->data_start + h->nbytes;
}

namespace {

// The checks and the tensor of parse_npy. With `buffer` (the file's bytes, `data` viewing them) the payload is slid
// to the front of that buffer and the buffer becomes the tensor's storage: no second copy of a large file in fresh
// memory, which costs more than the copy itself (every new page is a fault).
Tensor npy_tensor(std::span<const std::byte> data, const std::string& source, std::vector<std::byte>* buffer) {
  NpyHeader h = *parse_npy_header(data, source, /*partial=*/false);
  const std::size_t width = dtype_size(h.descr.dtype);
  const std::size_t present = data.size() - h.data_start;
  if (h.nbytes != present)
    throw InputError(source, "data", "shape " + Tensor{h.descr.dtype, h.shape, {}}.shape_string() + " of " +
                                         std::string(dtype_name(h.descr.dtype)) + " needs " + std::to_string(h.nbytes) +
                                         " bytes, file has " + std::to_string(present));

  Tensor t;
  t.dtype = h.descr.dtype;
  t.shape = std::move(h.shape);
  if (buffer) {
    buffer->erase(buffer->begin(), buffer->begin() + static_cast<std::ptrdiff_t>(h.data_start));
    t.bytes = std::move(*buffer);
  } else {
    const auto payload = data.subspan(h.data_start);
    t.bytes.assign(payload.begin(), payload.end());
  }
  if (h.descr.big_endian)
    for (std::size_t i = 0; i < t.bytes.size(); i += width) std::reverse(t.bytes.begin() + i, t.bytes.begin() + i + width);
  if (h.fortran && t.shape.size() > 1) t.bytes = fortran_to_c(t.bytes, t.shape, width);
  return t;
}

}  // namespace

Tensor parse_npy(std::span<const std::byte> data, const std::string& source) { return npy_tensor(data, source, nullptr); }

std::vector<std::byte> encode_npy_header(const Tensor& t) {
  const std::string header =
      "{'descr': '" + descr_of(t.dtype) + "', 'fortran_order': False, 'shape': " + t.shape_string() + ", }";
  // Pad with spaces so that the data starts at a multiple of 64 bytes, then a newline (as numpy does).
  auto padded = [&](std::size_t preamble) {
    std::string h = header;
    const std::size_t total = preamble + h.size() + 1;
    h.append((64 - total % 64) % 64, ' ');
    h += '\n';
    return h;
  };
  std::string h = padded(10);
  int major = 1;
  if (h.size() > 0xffff) {
    h = padded(12);
    major = 2;
  }
  std::vector<std::byte> out;
  out.reserve(12 + h.size());
  auto put = [&](const void* p, std::size_t n) {
    const auto* b = static_cast<const std::byte*>(p);
    out.insert(out.end(), b, b + n);
  };
  put(kMagic.data(), kMagic.size());
  const unsigned char ver[2] = {static_cast<unsigned char>(major), 0};
  put(ver, 2);
  const std::uint32_t len = static_cast<std::uint32_t>(h.size());
  put(&len, major == 1 ? 2 : 4);  // little-endian host
  put(h.data(), h.size());
  return out;
}

std::vector<std::byte> encode_npy(const Tensor& t) {
  std::vector<std::byte> out = encode_npy_header(t);
  out.insert(out.end(), t.bytes.begin(), t.bytes.end());
  return out;
}

Tensor read_npy(const std::filesystem::path& path) {
  std::vector<std::byte> bytes = read_file_bytes(path);
  const std::span<const std::byte> data(bytes);
  return npy_tensor(data, path.string(), &bytes);
}

void write_npy(const std::filesystem::path& path, const Tensor& t) { write_file_atomic(path, encode_npy(t)); }

}  // namespace qattn

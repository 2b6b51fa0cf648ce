// Tensor I/O: files numpy itself wrote (tests/fixtures, see make_fixtures.py), round trips through our writers,
// and the catalogue of malformed inputs of docs/tensor-io.md, each of which must be a typed InputError.
#include <catch2/catch.hpp>
#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>

#include "qattn/error.h"
#include "qattn/tensor_io.h"

using namespace qattn;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

const fs::path kFixtures = QATTN_FIXTURES;

json expected_json() {
  std::ifstream in(kFixtures / "expected.json");
  return json::parse(in);
}

void check_tensor(const Tensor& t, const json& e, const std::string& what) {
  INFO(what);
  CHECK(std::string(dtype_name(t.dtype)) == e["dtype"].get<std::string>());
  CHECK(t.shape == e["shape"].get<std::vector<std::int64_t>>());
  const auto& values = e["values"];
  REQUIRE(t.element_count() == static_cast<std::int64_t>(values.size()));
  if (t.dtype == DType::i64) {
    for (std::size_t i = 0; i < values.size(); ++i) {
      std::int64_t v;
      std::memcpy(&v, t.bytes.data() + 8 * i, 8);
      CHECK(std::to_string(v) == values[i].get<std::string>());
    }
    return;
  }
  const Eigen::ArrayXd got = t.to_double();
  for (std::size_t i = 0; i < values.size(); ++i) {
    INFO("element " << i);
    if (values[i].is_string()) {
      const std::string s = values[i];
      if (s == "nan") CHECK(std::isnan(got[i]));
      else CHECK(got[i] == (s == "inf" ? INFINITY : -INFINITY));
    } else {
      CHECK(got[i] == values[i].get<double>());
    }
  }
}

std::vector<std::byte> bytes_of(const std::string& s) {
  const auto* p = reinterpret_cast<const std::byte*>(s.data());
  return {p, p + s.size()};
}

// A .npy file with the given header dict text and payload (version 1.0, no padding).
std::vector<std::byte> npy_with_header(const std::string& dict, const std::string& payload, int major = 1) {
  std::string h = dict + "\n";
  std::string out = std::string("\x93NUMPY", 6) + static_cast<char>(major) + '\0';
  if (major == 1) out += std::string{static_cast<char>(h.size() & 0xff), static_cast<char>(h.size() >> 8)};
  else out += std::string{static_cast<char>(h.size() & 0xff), static_cast<char>(h.size() >> 8), '\0', '\0'};
  return bytes_of(out + h + payload);
}

// Expects parse to throw InputError whose field contains `field`.
template <class F>
void expect_input_error(F&& parse, const std::string& field, const std::string& case_name) {
  INFO(case_name);
  try {
    parse();
    FAIL("no error for " << case_name);
  } catch (const InputError& e) {
    INFO(e.what());
    CHECK(e.field().find(field) != std::string::npos);
    CHECK(e.source() == "case");
  }
}

Tensor random_tensor(DType t, std::vector<std::int64_t> shape, std::mt19937_64& gen) {
  Tensor x{t, std::move(shape), {}};
  x.bytes.resize(x.element_count() * dtype_size(t));
  for (auto& b : x.bytes) b = static_cast<std::byte>(gen());
  return x;
}

fs::path scratch_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("qattn-test-" + name + "-" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

}  // namespace

TEST_CASE("npy files written by numpy load with dtype, shape and values intact", "[io]") {
  const json e = expected_json();
  int files = 0;
  for (const auto& [name, spec] : e.items()) {
    if (name.size() < 4 || name.substr(name.size() - 4) != ".npy") continue;
    check_tensor(read_npy(kFixtures / name), spec, name);
    ++files;
  }
  CHECK(files >= 17);  // every dtype, both byte orders, Fortran order, versions 1-3, scalar, empty, bfloat16
}

TEST_CASE("npz stored and deflated archives written by numpy", "[io]") {
  if (!have_npz()) {
    WARN("skipped: built without libzip");
    return;
  }
  const json e = expected_json();
  for (const char* name : {"stored.npz", "deflated.npz"}) {
    const auto ts = read_npz(kFixtures / name);
    REQUIRE(ts.size() == 2);
    for (const auto& nt : ts) check_tensor(nt.tensor, e[name]["members"][nt.name], std::string(name) + ":" + nt.name);
  }
}

TEST_CASE("safetensors written from the specification", "[io]") {
  const json e = expected_json();
  const auto ts = read_safetensors(kFixtures / "mixed.safetensors");
  REQUIRE(ts.size() == 5);
  CHECK(ts[0].name == "logits");  // data-offset order
  for (const auto& nt : ts) check_tensor(nt.tensor, e["mixed.safetensors"]["members"][nt.name], nt.name);
}

TEST_CASE("every dtype round-trips bit-exactly through npy, npz and safetensors", "[io]") {
  std::mt19937_64 gen(3);
  const fs::path dir = scratch_dir("roundtrip");
  std::vector<NamedTensor> all;
  for (DType t : kAllDTypes) {
    for (const auto& shape : std::vector<std::vector<std::int64_t>>{{}, {0}, {7}, {3, 5}, {2, 3, 4}}) {
      const Tensor x = random_tensor(t, shape, gen);
      const Tensor y = parse_npy(encode_npy(x), "mem");
      CHECK(y.dtype == x.dtype);
      CHECK(y.shape == x.shape);
      CHECK(y.bytes == x.bytes);
      CHECK(encode_npy(x).size() % 64 == x.bytes.size() % 64);  // data starts on a 64-byte boundary
    }
    all.push_back({std::string(dtype_name(t)), random_tensor(t, {4, 3}, gen)});
  }
  write_safetensors(dir / "all.safetensors", all);
  auto back = read_safetensors(dir / "all.safetensors");
  REQUIRE(back.size() == all.size());
  for (std::size_t i = 0; i < all.size(); ++i) {
    CHECK(back[i].name == all[i].name);
    CHECK(back[i].tensor.bytes == all[i].tensor.bytes);
  }
  if (have_npz()) {
    for (bool compress : {false, true}) {
      write_npz(dir / "all.npz", all, compress);
      back = read_npz(dir / "all.npz");
      REQUIRE(back.size() == all.size());
      for (std::size_t i = 0; i < all.size(); ++i) {
        CHECK(back[i].name == all[i].name);
        CHECK(back[i].tensor.bytes == all[i].tensor.bytes);
      }
    }
  }
  fs::remove_all(dir);
}

TEST_CASE("read_npy takes the file payload as the tensor storage and a header with pieces writes the same file", "[io]") {
  std::mt19937_64 gen(17);
  const fs::path dir = scratch_dir("pieces");
  // Payloads around the reader's 4 KiB probe and of a few MB, so the file ends exactly at, just past and well past
  // a probe's boundary; the Fortran-order and big-endian fixtures go through the same in-place path.
  for (const std::int64_t n : {std::int64_t{0}, std::int64_t{1}, std::int64_t{992}, std::int64_t{1024},
                               std::int64_t{1025}, std::int64_t{3} << 20}) {
    INFO("n " << n);
    const Tensor x = random_tensor(DType::f32, {n}, gen);
    const std::vector<std::byte> whole = encode_npy(x), header = encode_npy_header(x);
    REQUIRE(whole.size() == header.size() + x.bytes.size());
    CHECK(std::equal(header.begin(), header.end(), whole.begin()));
    // The file as a header and the payload in three pieces, through PendingFile, is byte for byte encode_npy's.
    const std::size_t third = x.bytes.size() / 3;
    const std::span<const std::byte> payload(x.bytes);
    const std::span<const std::byte> parts[] = {header, payload.first(third), payload.subspan(third, third),
                                                payload.subspan(2 * third)};
    PendingFile(dir / "x.npy", std::span<const std::span<const std::byte>>(parts)).commit();
    CHECK(read_file_bytes(dir / "x.npy") == whole);
    const Tensor y = read_npy(dir / "x.npy");
    CHECK(y.shape == x.shape);
    CHECK(y.bytes == x.bytes);
    const std::vector<NamedTensor> named = read_tensor_file(dir / "x.npy");
    REQUIRE(named.size() == 1);
    CHECK(named.front().tensor.bytes == x.bytes);
  }
  for (const char* fixture : {"f64_fortran.npy", "i16_fortran_big_endian.npy", "f32_big_endian.npy"}) {
    INFO(fixture);
    const std::vector<std::byte> bytes = read_file_bytes(kFixtures / fixture);
    const Tensor from_file = read_npy(kFixtures / fixture), from_bytes = parse_npy(bytes, fixture);
    CHECK(from_file.shape == from_bytes.shape);
    CHECK(from_file.bytes == from_bytes.bytes);
  }
  fs::remove_all(dir);
}

TEST_CASE("the huge-page advice of a fresh buffer changes no byte of it or of its neighbours", "[io]") {
  // advise_huge_pages rounds the span out to 2 MiB pages, which it shares with the memory next to it, and has the
  // partly touched ones rebuilt as huge pages (their contents copied): every byte of a mapping around the span keeps
  // its value, whether the span's pages were touched or not. A mapping of 16 MiB, 2 MiB aligned, its outer 2 MiB
  // pages and one interior page written, the span starting and ending inside pages.
  constexpr std::size_t kHuge = std::size_t{2} << 20, kSize = 8 * kHuge;
  void* raw = ::mmap(nullptr, kSize + kHuge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  REQUIRE(raw != MAP_FAILED);
  auto* base = reinterpret_cast<std::uint8_t*>((reinterpret_cast<std::uintptr_t>(raw) + kHuge - 1) & ~(kHuge - 1));
  const auto value = [](std::size_t i) { return static_cast<std::uint8_t>((i * 2654435761u) >> 13); };
  const auto written = [&](std::size_t i) {
    return i < 2 * kHuge || i >= kSize - 2 * kHuge || (i >= 4 * kHuge && i < 4 * kHuge + 4096);
  };
  for (std::size_t i = 0; i < kSize; ++i)
    if (written(i)) base[i] = value(i);
  advise_huge_pages(base + kHuge + 12345, 5 * kHuge + 777);  // pages 1-6, the end ones written and partly inside
  advise_huge_pages(base + 3 * kHuge, kHuge);                // under 4 MiB: left alone
  std::size_t changed = 0;
  for (std::size_t i = 0; i < kSize; ++i) changed += base[i] != (written(i) ? value(i) : 0);
  CHECK(changed == 0);
  ::munmap(raw, kSize + kHuge);
}

TEST_CASE("rank 32 (numpy's maximum) round-trips, rank 33 is refused", "[io]") {
  Tensor x{DType::u8, std::vector<std::int64_t>(32, 1), {std::byte{9}}};
  const auto bytes = encode_npy(x);
  CHECK(static_cast<int>(bytes[6]) == 1);  // every header qattn writes fits format 1.0
  CHECK(parse_npy(bytes, "mem").shape.size() == 32);
  std::string dims;
  for (int i = 0; i < 33; ++i) dims += "1,";
  const std::string h = "{'descr': '|u1', 'fortran_order': False, 'shape': (" + dims + "), }\n";
  std::string raw = std::string("\x93NUMPY\x01\x00", 8) + static_cast<char>(h.size()) + '\0' + h + "x";
  try {
    parse_npy(bytes_of(raw), "case");
    FAIL("rank 33 accepted");
  } catch (const InputError& e) {
    CHECK(e.field() == "shape");
  }
}

TEST_CASE("malformed npy input is a typed error naming the field", "[io][malformed]") {
  const std::string ok = "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }";
  const std::string payload(8, '\0');
  auto parse = [](std::vector<std::byte> b) { return [b] { parse_npy(b, "case"); }; };
  expect_input_error(parse({}), "magic", "empty file");
  expect_input_error(parse(bytes_of("\x93NUMPX\x01\x00\x00\x00")), "magic", "bad magic");
  expect_input_error(parse(bytes_of(std::string("\x93NUMPY\x04\x00\x00\x00", 10))), "version", "version 4");
  expect_input_error(parse(bytes_of(std::string("\x93NUMPY\x02\x00\x00\x00\x00", 11))), "header_len", "v2 cut in length");
  expect_input_error(parse(bytes_of(std::string("\x93NUMPY\x02\x00\xff\xff\xff\xff", 12))), "header_len", "huge header");
  expect_input_error(parse(bytes_of(std::string("\x93NUMPY\x01\x00\x40\x00{'descr'", 17))), "header", "truncated header");
  expect_input_error(parse(npy_with_header(ok, payload.substr(0, 7))), "data", "truncated data");
  expect_input_error(parse(npy_with_header(ok, payload + "x")), "data", "extra data");
  expect_input_error(parse(npy_with_header("{'descr': '<c8', 'fortran_order': False, 'shape': (1,), }", payload)),
                     "descr", "complex dtype");
  expect_input_error(parse(npy_with_header("{'descr': '|b1', 'fortran_order': False, 'shape': (1,), }", "x")),
                     "descr", "bool dtype");
  expect_input_error(parse(npy_with_header("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (1,), }", payload)),
                     "descr", "structured dtype");
  expect_input_error(parse(npy_with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (4611686018427387904, 4), }", "")),
                     "shape", "element count overflow");
  expect_input_error(parse(npy_with_header("{'descr': '<f8', 'fortran_order': False, 'shape': (2305843009213693952,), }", "")),
                     "shape", "byte size overflow");
  expect_input_error(parse(npy_with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,), }", "")),
                     "shape", "dimension overflow");
  expect_input_error(parse(npy_with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (-2,), }", payload)),
                     "shape", "negative dimension");
  expect_input_error(parse(npy_with_header("{'descr': '<f4', 'fortran_order': Maybe, 'shape': (2,), }", payload)),
                     "fortran_order", "bad bool");
  expect_input_error(parse(npy_with_header("{'descr': '<f4', 'shape': (2,), }", payload)), "fortran_order", "missing key");
  expect_input_error(parse(npy_with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'x': 1}", payload)),
                     "header", "unknown key");
  expect_input_error(parse(npy_with_header("['descr']", payload)), "header", "not a dict");
  expect_input_error(parse(npy_with_header(ok + " junk", payload)), "header", "trailing junk");
  expect_input_error(parse(npy_with_header("{'descr': '<f4, 'fortran_order': False, 'shape': (2,), }", payload)),
                     "header", "broken quoting");
  expect_input_error(parse(npy_with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (2), }", payload)),
                     "shape", "(2) is an integer, not a tuple");
  expect_input_error(parse(npy_with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'shape': (2,)}", payload)),
                     "shape", "a key given twice");
  CHECK(parse_npy(npy_with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", payload), "case").shape ==
        std::vector<std::int64_t>{2});
  CHECK(parse_npy(npy_with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (1, 2,), }", payload), "case").shape ==
        std::vector<std::int64_t>{1, 2});
}

TEST_CASE("npy_declared_size reads the size from a header prefix", "[io]") {
  const auto file = npy_with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (3, 5), }", std::string(60, '\0'));
  CHECK(npy_declared_size(file, "case") == file.size());
  CHECK_FALSE(npy_declared_size(std::span(file).first(9), "case").has_value());
  CHECK_FALSE(npy_declared_size(std::span(file).first(40), "case").has_value());
  CHECK_THROWS_AS(npy_declared_size(bytes_of(std::string("\x93NUMPX\x01\x00\x00\x00", 10)), "case"), InputError);
}

TEST_CASE("error text is printable and bounded", "[io][malformed]") {
  CHECK(printable(std::string("a\x1b[31mb\0c", 9), 100) == "a\\x1b[31mb\\x00c");
  CHECK(printable("caf\xc3\xa9", 100) == "caf\xc3\xa9");      // valid UTF-8 stays
  CHECK(printable("\xc2\x9b", 100) == "\\xc2\\x9b");          // C1 control (CSI) is escaped
  CHECK(printable("\xff", 100) == "\\xff");                    // not UTF-8
  CHECK(printable(std::string(1000, 'A'), 10) == "AAAAAAAAAA...[990 more bytes]");
  const InputError e(std::string(5000, 's'), "field\n", "why");
  CHECK(std::string(e.what()).size() < 1200);
  CHECK(std::string(e.what()).find('\n') == std::string::npos);
  CHECK(e.field() == "field\n");  // the parts as given
}

TEST_CASE("malformed safetensors input is a typed error naming the field", "[io][malformed]") {
  auto st = [](const std::string& header, std::size_t data_bytes) {
    std::string out(8, '\0');
    const std::uint64_t n = header.size();
    std::memcpy(out.data(), &n, 8);
    return bytes_of(out + header + std::string(data_bytes, '\x01'));
  };
  auto parse = [](std::vector<std::byte> b) { return [b] { parse_safetensors(b, "case"); }; };
  const std::string one = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  CHECK_NOTHROW(parse_safetensors(st(one, 8), "case"));
  expect_input_error(parse(bytes_of("abc")), "header_len", "shorter than 8");
  {
    auto b = st(one, 8);
    const std::uint64_t huge = std::uint64_t{1} << 40;
    std::memcpy(b.data(), &huge, 8);
    expect_input_error(parse(b), "header_len", "huge header length");
    const std::uint64_t past = b.size();
    std::memcpy(b.data(), &past, 8);
    expect_input_error(parse(b), "header", "header past end of file");
  }
  expect_input_error(parse(st("{not json", 0)), "header", "bad json");
  expect_input_error(parse(st("[1,2]", 0)), "header", "json array");
  expect_input_error(parse(st(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 4)), "data_offsets", "out of range");
  expect_input_error(parse(st(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12)),
                     "data_offsets", "overlap");
  expect_input_error(parse(st(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8)), "data_offsets", "gap");
  expect_input_error(parse(st(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8)), "data_offsets", "size mismatch");
  expect_input_error(parse(st(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 8)), "data_offsets", "begin > end");
  expect_input_error(parse(st(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[-1,7]}})", 8)), "data_offsets", "negative");
  expect_input_error(parse(st(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 9)), "data", "trailing bytes");
  expect_input_error(parse(st(R"({"a":{"dtype":"C64","shape":[1],"data_offsets":[0,8]}})", 8)), "dtype", "unsupported dtype");
  expect_input_error(parse(st(R"({"a":{"dtype":"F32","shape":[4611686018427387904,8],"data_offsets":[0,8]}})", 8)),
                     "shape", "shape overflow");
  expect_input_error(parse(st(R"({"a":{"dtype":"F32","shape":"2","data_offsets":[0,8]}})", 8)), "shape", "shape not array");
  expect_input_error(parse(st(R"({"a":{"shape":[2],"data_offsets":[0,8]}})", 8)), "dtype", "missing dtype");
  expect_input_error(parse(st(R"({"__metadata__":{"k":1}})", 0)), "__metadata__", "non-string metadata");
  expect_input_error(parse(st(std::string(17, '[') + std::string(17, ']'), 0)), "header", "nested 17 deep");
  expect_input_error(parse(st(R"({"a":[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]})", 0)), "header", "nested inside an object");
  CHECK_NOTHROW(parse_safetensors(st(R"({"__metadata__":{"k":"[[[[[[[[[[[[[[[[[[[[["}})", 0), "case"));  // in a string
}

TEST_CASE("malformed npz input is a typed error", "[io][malformed]") {
  if (!have_npz()) {
    WARN("skipped: built without libzip");
    return;
  }
  auto parse = [](std::vector<std::byte> b) { return [b] { parse_npz(b, "case"); }; };
  expect_input_error(parse(bytes_of("PK\x03\x04 not really a zip")), "archive", "bad archive");
  std::vector<std::byte> good = read_file_bytes(kFixtures / "deflated.npz");
  expect_input_error(parse(std::vector<std::byte>(good.begin(), good.begin() + good.size() / 2)), "archive", "truncated");
  // Corrupt the compressed data of the first member (the local header is 30 bytes + name "a.npy").
  std::vector<std::byte> corrupt = good;
  for (std::size_t i = 40; i < 60; ++i) corrupt[i] = std::byte{0xff};
  try {
    parse_npz(corrupt, "case");
    FAIL("corrupt deflate stream accepted");
  } catch (const InputError& e) {
    CHECK(e.source().find("case") != std::string::npos);
  }
  expect_input_error(parse({}), "archive", "0 bytes");
  // A member whose .npy header declares 8 bytes of data but which holds 4 MiB: a stored archive of a 4 MiB tensor
  // with the member's header replaced by one declaring shape (2,). Refused one 64 KiB chunk past the declared size,
  // before libzip's CRC check at the end of the member could run.
  const Tensor two = Tensor::from_double(DType::f32, {2}, std::vector<double>{1.0, 2.0});
  const Tensor big = Tensor::from_double(DType::f32, {1 << 20}, std::vector<double>(1 << 20, 0.0));
  const std::vector<std::byte> big_npy = encode_npy(big), two_npy = encode_npy(two);
  std::vector<std::byte> archive = encode_npz({{"x", big}}, "case", /*compress=*/false);
  const std::ptrdiff_t header = static_cast<std::ptrdiff_t>(two_npy.size()) - 8;  // preamble + padded dict
  REQUIRE(big_npy.size() - (std::size_t{1} << 22) == two_npy.size() - 8);       // the same header length
  const auto at = std::search(archive.begin(), archive.end(), big_npy.begin(), big_npy.begin() + header);
  REQUIRE(at != archive.end());
  std::copy(two_npy.begin(), two_npy.begin() + header, at);
  try {
    parse_npz(archive, "case");
    FAIL("a member longer than its header declares was accepted");
  } catch (const InputError& e) {
    INFO(e.what());
    CHECK(e.field() == "member data");
    CHECK(e.reason().find("inflates past the " + std::to_string(two_npy.size()) + " bytes its .npy header declares") != std::string::npos);
  }
}

TEST_CASE("writers are atomic and leave nothing behind on failure", "[io]") {
  const fs::path dir = scratch_dir("atomic");
  const Tensor x = Tensor::from_double(DType::f32, {2}, std::vector<double>{1.0, 2.0});
  CHECK_THROWS_AS(write_npy(dir / "missing-dir" / "x.npy", x), InputError);
  CHECK_THROWS_AS(write_safetensors(dir / "missing-dir" / "x.safetensors", {{"x", x}}), InputError);
  CHECK_THROWS_AS(write_safetensors(dir / "dup.safetensors", {{"x", x}, {"x", x}}), InputError);
  if (have_npz()) CHECK_THROWS_AS(write_npz(dir / "missing-dir" / "x.npz", {{"x", x}}), InputError);
  CHECK(fs::is_empty(dir));
  write_npy(dir / "x.npy", x);
  CHECK(std::distance(fs::directory_iterator(dir), fs::directory_iterator()) == 1);
  CHECK_THROWS_AS(read_npy(dir / "nope.npy"), InputError);
  CHECK_THROWS_AS(read_npy(dir), InputError);
  CHECK_THROWS_AS(read_tensor_file(dir / "x.txt"), InputError);
  fs::remove_all(dir);
}

TEST_CASE("outputs: symbolic links written through, FIFOs written in place, temporaries within NAME_MAX", "[io]") {
  const fs::path dir = scratch_dir("outputs");
  const Tensor x = Tensor::from_double(DType::f32, {2}, std::vector<double>{1.0, 2.0});
  fs::create_symlink("target.npy", dir / "link.npy");
  write_npy(dir / "link.npy", x);
  CHECK(fs::is_symlink(dir / "link.npy"));
  CHECK(read_npy(dir / "target.npy").bytes == x.bytes);
  CHECK(resolve_output_path(dir / "link.npy") == dir / "target.npy");
  const std::string long_name(251, 'a');  // + ".npy" = 255 = NAME_MAX
  write_npy(dir / (long_name + ".npy"), x);
  CHECK(fs::exists(dir / (long_name + ".npy")));
  {
    PendingFile pending(dir / "pending.npy", encode_npy(x));
    CHECK_FALSE(fs::exists(dir / "pending.npy"));  // not in place before commit
  }
  CHECK_FALSE(fs::exists(dir / "pending.npy"));  // and the temporary is gone
  for (const auto& e : fs::directory_iterator(dir)) CHECK(e.path().filename().string().rfind(".qattn-", 0) != 0);
  CHECK_THROWS_AS(write_npy(dir, x), InputError);  // a directory
  CHECK_THROWS_AS(read_npy("/dev/zero"), InputError);  // not a regular file: refused, never read forever
  write_npy("/dev/null", x);
  CHECK(fs::is_character_file("/dev/null"));
  fs::remove_all(dir);
}

TEST_CASE("from_double rounds floats once and refuses unrepresentable integers", "[io]") {
  const std::vector<double> v = {1.0 + std::ldexp(1.0, -11), 127.0, -128.0};
  const Tensor h = Tensor::from_double(DType::f16, {3}, v);
  CHECK(h.to_double()[0] == 1.0);  // tie rounds to even
  CHECK_NOTHROW(Tensor::from_double(DType::i8, {3}, std::vector<double>{0, 127, -128}));
  CHECK_THROWS_AS(Tensor::from_double(DType::i8, {1}, std::vector<double>{128.0}), std::domain_error);
  CHECK_THROWS_AS(Tensor::from_double(DType::u8, {1}, std::vector<double>{0.5}), std::domain_error);
  CHECK_THROWS_AS(Tensor::from_double(DType::i64, {1}, std::vector<double>{std::ldexp(1.0, 63)}), std::domain_error);
  CHECK_NOTHROW(Tensor::from_double(DType::i64, {1}, std::vector<double>{-std::ldexp(1.0, 63)}));
  CHECK_THROWS_AS(Tensor::from_double(DType::f32, {2}, std::vector<double>{1.0}), std::invalid_argument);
}

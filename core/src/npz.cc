// .npz archives through libzip: each member is a .npy file, stored or deflated (np.savez / np.savez_compressed).
#include <string>

#include "qattn/error.h"
#include "qattn/tensor_io.h"

#if QATTN_HAVE_LIBZIP
#include <zip.h>
#endif

namespace qattn {

#if QATTN_HAVE_LIBZIP
namespace {

std::string zip_error_text(zip_error_t* e) {
  std::string s = zip_error_strerror(e);
  return s;
}

struct ZipArchive {
  zip_t* z = nullptr;
  ~ZipArchive() {
    if (z) zip_discard(z);
  }
};

struct ZipFile {
  zip_file_t* f = nullptr;
  ~ZipFile() {
    if (f) zip_fclose(f);
  }
};

// Inflates one member in 64 KiB chunks. Once the .npy header is in, the member may hold exactly the size that
// header declares: inflating stops one chunk past it, so a small member that claims 8 bytes of data but inflates to
// gigabytes costs one chunk of memory, not gigabytes. The member's sizes in the zip directory are not trusted.
std::vector<std::byte> read_member(zip_t* z, zip_uint64_t index, const std::string& where) {
  ZipFile f;
  f.f = zip_fopen_index(z, index, 0);
  if (!f.f) throw InputError(where, "member", std::string("cannot open: ") + zip_strerror(z));
  std::vector<std::byte> out;
  std::optional<std::uint64_t> declared;
  std::byte buf[1 << 16];
  for (;;) {
    const zip_int64_t n = zip_fread(f.f, buf, sizeof buf);
    if (n < 0) throw InputError(where, "member data", zip_file_strerror(f.f));
    if (n == 0) break;
    out.insert(out.end(), buf, buf + n);
    if (!declared) declared = npy_declared_size(out, where);
    if (declared && out.size() > *declared)
      throw InputError(where, "member data", "inflates past the " + std::to_string(*declared) +
                                                 " bytes its .npy header declares");
  }
  return out;
}

}  // namespace

bool have_npz() { return true; }

std::vector<NamedTensor> parse_npz(std::span<const std::byte> data, const std::string& source) {
  // libzip reads 0 bytes as an empty archive; no tool writes that as an .npz, so it is refused.
  if (data.empty()) throw InputError(source, "archive", "file is empty (0 bytes), not a zip archive");
  zip_error_t err;
  zip_error_init(&err);
  zip_source_t* src = zip_source_buffer_create(data.data(), data.size(), 0, &err);
  if (!src) {
    const std::string why = zip_error_text(&err);
    zip_error_fini(&err);
    throw InputError(source, "archive", why);
  }
  ZipArchive a;
  a.z = zip_open_from_source(src, ZIP_RDONLY | ZIP_CHECKCONS, &err);
  if (!a.z) {
    zip_source_free(src);
    const std::string why = zip_error_text(&err);
    zip_error_fini(&err);
    throw InputError(source, "archive", "not a readable zip archive: " + why);
  }
  zip_error_fini(&err);
  std::vector<NamedTensor> out;
  const zip_int64_t n = zip_get_num_entries(a.z, 0);
  for (zip_int64_t i = 0; i < n; ++i) {
    const char* raw_name = zip_get_name(a.z, static_cast<zip_uint64_t>(i), ZIP_FL_ENC_RAW);
    if (!raw_name) throw InputError(source, "member " + std::to_string(i), "has no name");
    std::string name = raw_name;
    const std::string where = name + " in " + source;
    if (name.size() < 5 || name.compare(name.size() - 4, 4, ".npy") != 0)
      throw InputError(where, "member name", "not a .npy member (an .npz holds only .npy files)");
    std::vector<std::byte> bytes = read_member(a.z, static_cast<zip_uint64_t>(i), where);
    name.resize(name.size() - 4);
    out.push_back({name, parse_npy(bytes, where)});
  }
  return out;
}

std::vector<NamedTensor> read_npz(const std::filesystem::path& path) {
  return parse_npz(read_file_bytes(path), path.string());
}

void write_npz(const std::filesystem::path& path, const std::vector<NamedTensor>& tensors, bool compress) {
  write_file_atomic(path, encode_npz(tensors, path.string(), compress));
}

std::vector<std::byte> encode_npz(const std::vector<NamedTensor>& tensors, const std::string& source, bool compress) {
  // Encode every member first (they must outlive zip_close), build the archive in memory, then write it with the
  // same safe writer as every other format.
  std::vector<std::vector<std::byte>> encoded;
  encoded.reserve(tensors.size());
  for (const auto& t : tensors) encoded.push_back(encode_npy(t.tensor));
  zip_error_t err;
  zip_error_init(&err);
  zip_source_t* mem = zip_source_buffer_create(nullptr, 0, 0, &err);
  if (!mem) {
    const std::string why = zip_error_text(&err);
    zip_error_fini(&err);
    throw InputError(source, "archive", why);
  }
  zip_source_keep(mem);  // survives zip_close, which writes the archive into it
  struct SourceRef {
    zip_source_t* s;
    ~SourceRef() { zip_source_free(s); }
  } mem_ref{mem};
  ZipArchive a;
  a.z = zip_open_from_source(mem, ZIP_TRUNCATE, &err);
  if (!a.z) {
    zip_source_free(mem);  // the failed open did not take its reference
    const std::string why = zip_error_text(&err);
    zip_error_fini(&err);
    throw InputError(source, "archive", "cannot create archive: " + why);
  }
  zip_error_fini(&err);
  auto fail = [&](const std::string& why) { throw InputError(source, "archive", why); };
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    zip_source_t* s = zip_source_buffer(a.z, encoded[i].data(), encoded[i].size(), 0);
    if (!s) fail(zip_strerror(a.z));
    const zip_int64_t idx = zip_file_add(a.z, (tensors[i].name + ".npy").c_str(), s, ZIP_FL_ENC_UTF_8);
    if (idx < 0) {
      zip_source_free(s);
      fail("member " + tensors[i].name + ": " + zip_strerror(a.z));
    }
    if (zip_set_file_compression(a.z, static_cast<zip_uint64_t>(idx), compress ? ZIP_CM_DEFLATE : ZIP_CM_STORE, 0) != 0)
      fail(zip_strerror(a.z));
  }
  if (zip_close(a.z) != 0) fail(zip_strerror(a.z));
  a.z = nullptr;
  std::vector<std::byte> bytes;
  if (zip_source_open(mem) != 0) fail(std::string("cannot read back the archive: ") + zip_error_strerror(zip_source_error(mem)));
  std::byte buf[1 << 16];
  for (zip_int64_t n; (n = zip_source_read(mem, buf, sizeof buf)) > 0;) bytes.insert(bytes.end(), buf, buf + n);
  zip_source_close(mem);
  return bytes;
}

#else  // built without libzip: .npz is reported as unavailable, never silently mis-read

bool have_npz() { return false; }

std::vector<NamedTensor> parse_npz(std::span<const std::byte>, const std::string& source) {
  throw InputError(source, "format", ".npz support was not built (configure with libzip-dev installed)");
}
std::vector<NamedTensor> read_npz(const std::filesystem::path& path) { return parse_npz({}, path.string()); }
void write_npz(const std::filesystem::path& path, const std::vector<NamedTensor>&, bool) {
  throw InputError(path.string(), "format", ".npz support was not built (configure with libzip-dev installed)");
}
std::vector<std::byte> encode_npz(const std::vector<NamedTensor>&, const std::string& source, bool) {
  throw InputError(source, "format", ".npz support was not built (configure with libzip-dev installed)");
}

#endif

}  // namespace qattn

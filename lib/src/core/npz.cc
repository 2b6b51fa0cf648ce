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

// Refuses members that decompress beyond this, so that a small hostile archive cannot exhaust memory.
constexpr std::uint64_t kMaxMemberBytes = std::uint64_t{1} << 34;

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

std::vector<std::byte> read_member(zip_t* z, zip_uint64_t index, const std::string& where) {
  zip_file_t* f = zip_fopen_index(z, index, 0);
  if (!f) throw InputError(where, "member", std::string("cannot open: ") + zip_strerror(z));
  std::vector<std::byte> out;
  std::byte buf[1 << 16];
  for (;;) {
    const zip_int64_t n = zip_fread(f, buf, sizeof buf);
    if (n < 0) {
      const std::string why = zip_file_strerror(f);
      zip_fclose(f);
      throw InputError(where, "member data", why);
    }
    if (n == 0) break;
    if (out.size() + static_cast<std::uint64_t>(n) > kMaxMemberBytes) {
      zip_fclose(f);
      throw InputError(where, "member data", "decompresses beyond the limit of 16 GiB");
    }
    out.insert(out.end(), buf, buf + n);
  }
  zip_fclose(f);
  return out;
}

}  // namespace

bool have_npz() { return true; }

std::vector<NamedTensor> parse_npz(std::span<const std::byte> data, const std::string& source) {
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
  // Encode every member first (they must outlive zip_close), then build the archive in a temporary sibling.
  std::vector<std::vector<std::byte>> encoded;
  encoded.reserve(tensors.size());
  for (const auto& t : tensors) encoded.push_back(encode_npy(t.tensor));
  const std::filesystem::path tmp = path.parent_path() / ("." + path.filename().string() + ".tmpzip");
  int errorp = 0;
  zip_t* z = zip_open(tmp.c_str(), ZIP_CREATE | ZIP_TRUNCATE, &errorp);
  if (!z) throw InputError(path.string(), "file", "cannot create archive (libzip error " + std::to_string(errorp) + ")");
  auto fail = [&](const std::string& why) {
    zip_discard(z);
    std::filesystem::remove(tmp);
    throw InputError(path.string(), "archive", why);
  };
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    zip_source_t* s = zip_source_buffer(z, encoded[i].data(), encoded[i].size(), 0);
    if (!s) fail(zip_strerror(z));
    const zip_int64_t idx = zip_file_add(z, (tensors[i].name + ".npy").c_str(), s, ZIP_FL_ENC_UTF_8);
    if (idx < 0) {
      zip_source_free(s);
      fail("member " + tensors[i].name + ": " + zip_strerror(z));
    }
    if (zip_set_file_compression(z, static_cast<zip_uint64_t>(idx), compress ? ZIP_CM_DEFLATE : ZIP_CM_STORE, 0) != 0)
      fail(zip_strerror(z));
  }
  if (zip_close(z) != 0) fail(zip_strerror(z));
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::filesystem::remove(tmp);
    throw InputError(path.string(), "file", "cannot move into place: " + ec.message());
  }
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

#endif

}  // namespace qattn

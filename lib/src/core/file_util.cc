#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <string>

#include "qattn/error.h"
#include "qattn/tensor_io.h"

namespace qattn {

std::vector<std::byte> read_file_bytes(const std::filesystem::path& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw InputError(path.string(), "file", "is a directory, expected a tensor file");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path.string(), "file", std::string("cannot open: ") + std::strerror(errno));
  std::vector<std::byte> bytes;
  char buf[1 << 16];
  while (in.read(buf, sizeof buf) || in.gcount() > 0) {
    const auto* b = reinterpret_cast<const std::byte*>(buf);
    bytes.insert(bytes.end(), b, b + in.gcount());
  }
  if (in.bad()) throw InputError(path.string(), "file", "read error");
  return bytes;
}

void write_file_atomic(const std::filesystem::path& path, std::span<const std::byte> bytes) {
  std::random_device rd;
  const std::filesystem::path tmp =
      path.parent_path() / ("." + path.filename().string() + ".tmp" + std::to_string(rd() & 0xffffff));
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out)
      throw InputError(path.string(), "file", std::string("cannot create for writing: ") + std::strerror(errno));
    out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    out.flush();
    if (!out) {
      out.close();
      std::filesystem::remove(tmp);
      throw InputError(path.string(), "file", "write failed (disk full?)");
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::filesystem::remove(tmp);
    throw InputError(path.string(), "file", "cannot move into place: " + ec.message());
  }
}

}  // namespace qattn

// Reading input files and writing output files safely. The contract is in tensor_io.h; the policy table (what
// happens with symlinks, devices, FIFOs, existing files, full disks) is in docs/tensor-io.md "Output files".
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>

#include "qattn/error.h"
#include "qattn/tensor_io.h"

namespace qattn {
namespace fs = std::filesystem;

namespace {

std::string os_reason(int err) { return std::strerror(err); }

// MADV_COLLAPSE of <linux/mman.h> (asm-generic, so x86-64 and aarch64 alike): glibc 2.36's <sys/mman.h> lacks it.
constexpr int kMadvCollapse = 25;

// Closes a descriptor on scope exit unless released.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

// Writes every byte, retrying short writes and EINTR. Returns 0 or the errno of the failure.
int write_all(int fd, std::span<const std::byte> bytes) {
  const std::byte* p = bytes.data();
  std::size_t left = bytes.size();
  while (left > 0) {
    const ssize_t n = ::write(fd, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    p += n;
    left -= static_cast<std::size_t>(n);
  }
  return 0;
}

mode_t current_umask() {
  const mode_t m = ::umask(0);
  ::umask(m);
  return m;
}

}  // namespace

// Asks for transparent huge pages over the 2 MiB pages a fresh buffer of n bytes spans, before its first touch: one
// fault per 2 MiB instead of one per 4 KiB, which on some VMs is most of what reading a large tensor costs
// (docs/kernels.md). A fault gives a huge page only where none of its 2 MiB has been touched, and the two end pages
// are shared with live neighbouring heap memory (in a thread's fresh arena, the arena's own start and the top the
// heap has grown to), so the buffer's ends still took 4 KiB faults: 1-4 MiB of a buffer. MADV_COLLAPSE (Linux 6.1)
// rebuilds such partly touched 2 MiB pages as huge pages now, copying what the neighbours hold; it leaves untouched
// ones to their first fault, and says EINVAL for them (ignored). Advice only: where THP is off, the call is unknown
// or the kernel refuses, the pages are ordinary ones. Buffers under 4 MiB are left alone.
void advise_huge_pages(const void* p, std::size_t n) {
  constexpr std::uintptr_t kHugePage = std::uintptr_t{2} << 20;
  if (n < 2 * kHugePage) return;
  const auto at = reinterpret_cast<std::uintptr_t>(p);
  const std::uintptr_t begin = at & ~(kHugePage - 1);
  const std::uintptr_t end = (at + n + kHugePage - 1) & ~(kHugePage - 1);
  ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
  ::madvise(reinterpret_cast<void*>(begin), end - begin, kMadvCollapse);
}

std::vector<std::byte> read_file_bytes(const fs::path& path) {
  Fd f;
  // O_NONBLOCK: opening a FIFO must not wait for a writer; it is refused below as not a regular file.
  f.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  if (f.fd < 0) throw InputError(path.string(), "file", "cannot open: " + os_reason(errno));
  struct stat st {};
  if (::fstat(f.fd, &st) != 0) throw InputError(path.string(), "file", "cannot stat: " + os_reason(errno));
  if (S_ISDIR(st.st_mode)) throw InputError(path.string(), "file", "is a directory, expected a tensor file");
  if (!S_ISREG(st.st_mode))
    throw InputError(path.string(), "file",
                     "is not a regular file (a FIFO, device or socket); inputs are read from regular files only");
  const int flags = ::fcntl(f.fd, F_GETFL);
  if (flags >= 0) ::fcntl(f.fd, F_SETFL, flags & ~O_NONBLOCK);
  // Straight into the result, sized by the file's real size (not a header's claim); a file that grows meanwhile is
  // read to its end, one that shrinks is cut where it ends.
  // Allocated, advised, then filled: the first touch comes after the advice.
  std::vector<std::byte> bytes;
  bytes.reserve(static_cast<std::size_t>(st.st_size));
  advise_huge_pages(bytes.data(), bytes.capacity());
  bytes.resize(static_cast<std::size_t>(st.st_size));
  std::size_t filled = 0;
  std::byte probe[1 << 12];  // past the expected end: reads 0 at the end of the file, so the vector never regrows
  for (;;) {
    const bool full = filled == bytes.size();
    const ssize_t n = full ? ::read(f.fd, probe, sizeof probe) : ::read(f.fd, bytes.data() + filled, bytes.size() - filled);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw InputError(path.string(), "file", "read error: " + os_reason(errno));
    }
    if (n == 0) break;
    if (full) bytes.insert(bytes.end(), probe, probe + n);
    filled += static_cast<std::size_t>(n);
  }
  bytes.resize(filled);
  return bytes;
}

fs::path resolve_output_path(const fs::path& path) {
  fs::path p = path;
  for (int hops = 0; hops < 40; ++hops) {
    struct stat st {};
    if (::lstat(p.c_str(), &st) != 0 || !S_ISLNK(st.st_mode)) return p;
    std::error_code ec;
    const fs::path target = fs::read_symlink(p, ec);
    if (ec) throw InputError(path.string(), "file", "cannot read symbolic link: " + ec.message());
    p = target.is_absolute() ? target : p.parent_path() / target;
  }
  throw InputError(path.string(), "file", "too many levels of symbolic links");
}

PendingFile::PendingFile(const fs::path& path, std::span<const std::byte> bytes)
    : PendingFile(path, std::span<const std::span<const std::byte>>(&bytes, 1)) {}

PendingFile::PendingFile(const fs::path& path, std::span<const std::span<const std::byte>> parts) : path_(path) {
  if (path.empty()) throw InputError("(empty path)", "file", "no output file name given");
  target_ = resolve_output_path(path);
  struct stat st {};
  const bool exists = ::stat(target_.c_str(), &st) == 0;
  if (exists && S_ISDIR(st.st_mode)) throw InputError(path.string(), "file", "is a directory");
  if (exists && !S_ISREG(st.st_mode)) {
    if (S_ISSOCK(st.st_mode)) throw InputError(path.string(), "file", "is a socket; cannot write to it");
    // A character or block device or a FIFO: written to in place at commit (like a shell redirection), never replaced.
    for (const auto& bytes : parts) in_place_.insert(in_place_.end(), bytes.begin(), bytes.end());
    device_ = true;
    return;
  }
  // A regular file or a new name: a temporary sibling with an unguessable name made with O_EXCL by mkstemp (so a
  // pre-created symbolic link cannot redirect it), written now, renamed over the destination at commit. The
  // temporary's name has a fixed length, so any destination name that fits NAME_MAX works.
  const fs::path dir = target_.parent_path().empty() ? fs::path(".") : target_.parent_path();
  std::string tmpl = (dir / ".qattn-XXXXXX").string();
  Fd f;
  f.fd = ::mkostemp(tmpl.data(), O_CLOEXEC);
  if (f.fd < 0)
    throw InputError(path.string(), "file", "cannot create a file in " + dir.string() + ": " + os_reason(errno));
  temp_ = tmpl;
  auto fail = [&](const std::string& why) {
    ::unlink(temp_.c_str());
    temp_.clear();
    throw InputError(path.string(), "file", why);
  };
  // mkstemp creates mode 0600; give the file the mode a plain create would (0666 less the umask), or keep the mode of
  // the file it replaces.
  const mode_t mode = exists ? (st.st_mode & 07777) : (0666 & ~current_umask());
  if (::fchmod(f.fd, mode) != 0) fail("cannot set the file mode: " + os_reason(errno));
  for (const auto& bytes : parts)
    if (const int err = write_all(f.fd, bytes)) fail("write failed: " + os_reason(err) + " (nothing was written)");
  const int fd = f.fd;
  f.fd = -1;
  if (::close(fd) != 0) fail("write failed: " + os_reason(errno) + " (nothing was written)");
}

PendingFile::~PendingFile() {
  if (!temp_.empty()) ::unlink(temp_.c_str());
}

void PendingFile::commit() {
  if (device_) {
    Fd f;
    f.fd = ::open(target_.c_str(), O_WRONLY | O_CLOEXEC | O_NOCTTY);
    if (f.fd < 0) throw InputError(path_.string(), "file", "cannot open for writing: " + os_reason(errno));
    if (const int err = write_all(f.fd, in_place_)) throw InputError(path_.string(), "file", "write failed: " + os_reason(err));
    const int fd = f.fd;
    f.fd = -1;
    if (::close(fd) != 0) throw InputError(path_.string(), "file", "write failed: " + os_reason(errno));
    device_ = false;
    return;
  }
  if (temp_.empty()) throw std::logic_error("PendingFile::commit: nothing to commit");
  if (::rename(temp_.c_str(), target_.c_str()) != 0) {
    const int err = errno;
    ::unlink(temp_.c_str());
    temp_.clear();
    throw InputError(path_.string(), "file", "cannot move into place: " + os_reason(err));
  }
  temp_.clear();
}

void write_file_atomic(const fs::path& path, std::span<const std::byte> bytes) { PendingFile(path, bytes).commit(); }

}  // namespace qattn

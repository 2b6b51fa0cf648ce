// Reading and writing tensors: .npy (versions 1.0, 2.0, 3.0), .npz (stored or deflated members) and
// .safetensors. The formats, the dtype conventions and every error are catalogued in docs/tensor-io.md.
//
// Contract for every reader: malformed input raises qattn::InputError naming the file, the field and the
// reason; it never reads out of bounds, never allocates more than the data actually present justifies, and
// never aborts. Inputs are read from regular files only (a FIFO or device is refused, so nothing blocks).
// Writers are atomic: a regular destination (or a new name) is written to a temporary sibling made with O_EXCL
// and renamed over it, so a failed write leaves nothing behind and never a half-written file; a symbolic link is
// written through to its target; a character or block device or a FIFO is written to in place, never replaced.
//
// Byte order: qattn runs on little-endian hosts only (x86-64, aarch64); big-endian .npy data is swapped on read.
#pragma once

#include <cstddef>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "qattn/tensor.h"

namespace qattn {

struct NamedTensor {
  std::string name;
  Tensor tensor;
};

// Limits that protect readers against hostile headers. Exceeding one is an InputError.
inline constexpr std::size_t kMaxNpyHeaderBytes = std::size_t{1} << 20;            // numpy itself warns at 10000
inline constexpr std::size_t kMaxSafetensorsHeaderBytes = std::size_t{100} << 20;  // the format's own limit
inline constexpr std::size_t kMaxSafetensorsNesting = 16;                           // JSON depth; the format needs 3
inline constexpr int kMaxRank = 32;                                                // numpy's NPY_MAXDIMS

// --- .npy ---------------------------------------------------------------------------------------------------
// `source` is the name used in error messages (a path, or "member.npy in archive.npz").
Tensor parse_npy(std::span<const std::byte> data, const std::string& source);
// Little-endian, C order; format version 1.0 unless the header needs more than 65535 bytes (then 2.0).
// bfloat16 is written with descr '<V2' (see docs/tensor-io.md).
std::vector<std::byte> encode_npy(const Tensor& t);
// The bytes encode_npy(t) puts before t.bytes (magic, version, header): a writer can send them and t.bytes as two
// parts (PendingFile) instead of building one copy of a large tensor.
std::vector<std::byte> encode_npy_header(const Tensor& t);
Tensor read_npy(const std::filesystem::path& path);
// The total byte size (preamble, header and data) that the .npy header at the start of `prefix` declares, or
// nullopt while `prefix` ends before the header does. Throws InputError for a malformed header. Lets a reader of a
// compressed member stop inflating once the declared size is passed.
std::optional<std::uint64_t> npy_declared_size(std::span<const std::byte> prefix, const std::string& source);
void write_npy(const std::filesystem::path& path, const Tensor& t);

// --- .npz ---------------------------------------------------------------------------------------------------
// Member "x.npy" is returned with name "x". Available when qattn was built with libzip (have_npz()).
bool have_npz();
std::vector<NamedTensor> parse_npz(std::span<const std::byte> data, const std::string& source);
std::vector<NamedTensor> read_npz(const std::filesystem::path& path);
void write_npz(const std::filesystem::path& path, const std::vector<NamedTensor>& tensors, bool compress = true);
std::vector<std::byte> encode_npz(const std::vector<NamedTensor>& tensors, const std::string& source, bool compress = true);

// --- .safetensors -------------------------------------------------------------------------------------------
// Tensors come back in data-offset order. "__metadata__" is validated (string -> string) and skipped.
std::vector<NamedTensor> parse_safetensors(std::span<const std::byte> data, const std::string& source);
std::vector<NamedTensor> read_safetensors(const std::filesystem::path& path);
void write_safetensors(const std::filesystem::path& path, const std::vector<NamedTensor>& tensors);
std::vector<std::byte> encode_safetensors(const std::vector<NamedTensor>& tensors, const std::string& source);

// --- by extension -------------------------------------------------------------------------------------------
// .npy gives one tensor named after the file stem; .npz and .safetensors give their members.
std::vector<NamedTensor> read_tensor_file(const std::filesystem::path& path);
// Chooses the format from the extension; .npy takes exactly one tensor.
void write_tensor_file(const std::filesystem::path& path, const std::vector<NamedTensor>& tensors);
// The bytes write_tensor_file would write.
std::vector<std::byte> encode_tensor_file(const std::filesystem::path& path, const std::vector<NamedTensor>& tensors);

// --- shared helpers -----------------------------------------------------------------------------------------
// The whole file, into a buffer that asks for transparent huge pages before it is filled (advise_huge_pages).
std::vector<std::byte> read_file_bytes(const std::filesystem::path& path);
// Advice for a fresh buffer [p, p + n) of 4 MiB or more (smaller ones are left alone): transparent huge pages over
// the 2 MiB pages it spans (rounded outward: the end pages are shared with whatever memory is next to it), and those
// of them already partly touched rebuilt as huge pages now, their contents copied (MADV_COLLAPSE). No byte changes;
// where the kernel refuses, the pages stay as they are (docs/kernels.md, "Huge pages for fresh buffers").
void advise_huge_pages(const void* p, std::size_t n);
// Writes `bytes` to `path` under the policy above. Throws InputError naming `path` on failure, after removing the
// temporary.
void write_file_atomic(const std::filesystem::path& path, std::span<const std::byte> bytes);
// An output prepared under the same policy but not yet in place: the bytes sit in the temporary (or, for a device
// or FIFO, in memory) until commit(). A command that writes several files prepares them all, then commits them, so
// a failure while preparing leaves every destination as it was. Destroying an uncommitted PendingFile removes its
// temporary.
class PendingFile {
 public:
  PendingFile(const std::filesystem::path& path, std::span<const std::byte> bytes);
  // The file's bytes are `parts` one after another (a header and a tensor's own bytes, with no joined copy).
  PendingFile(const std::filesystem::path& path, std::span<const std::span<const std::byte>> parts);
  ~PendingFile();
  PendingFile(const PendingFile&) = delete;
  PendingFile& operator=(const PendingFile&) = delete;
  void commit();

 private:
  std::filesystem::path path_, target_, temp_;
  std::vector<std::byte> in_place_;
  bool device_ = false;
};
// The file a write to `path` lands on: `path` with symbolic links followed (up to 40), or `path` itself.
std::filesystem::path resolve_output_path(const std::filesystem::path& path);

}  // namespace qattn

#include "qattn/error.h"
#include "qattn/tensor_io.h"

namespace qattn {

std::vector<NamedTensor> read_tensor_file(const std::filesystem::path& path) {
  const std::string ext = path.extension().string();
  if (ext == ".npy") {  // not {{name, read_npy(path)}}: an initializer list would copy the tensor
    std::vector<NamedTensor> one;
    one.push_back({path.stem().string(), read_npy(path)});
    return one;
  }
  if (ext == ".npz") return read_npz(path);
  if (ext == ".safetensors") return read_safetensors(path);
  throw InputError(path.string(), "extension", "unknown tensor format '" + ext + "' (expected .npy, .npz or .safetensors)");
}

void write_tensor_file(const std::filesystem::path& path, const std::vector<NamedTensor>& tensors) {
  write_file_atomic(path, encode_tensor_file(path, tensors));
}

std::vector<std::byte> encode_tensor_file(const std::filesystem::path& path, const std::vector<NamedTensor>& tensors) {
  const std::string ext = path.extension().string();
  if (ext == ".npy") {
    if (tensors.size() != 1)
      throw InputError(path.string(), "extension", ".npy holds exactly one tensor, " + std::to_string(tensors.size()) + " given");
    return encode_npy(tensors.front().tensor);
  }
  if (ext == ".npz") return encode_npz(tensors, path.string());
  if (ext == ".safetensors") return encode_safetensors(tensors, path.string());
  throw InputError(path.string(), "extension", "unknown tensor format '" + ext + "' (expected .npy, .npz or .safetensors)");
}

}  // namespace qattn

// Fuzz target: the vector files of `qattn mma-check` and the operand checks of `qattn mma`. Arbitrary bytes are read
// as an .npz (when they start like a zip archive) or a .safetensors file; the members go through ref::mma_vector_sets
// and each set through ref::mma_agreement on a preset whose input width and accumulator fit it, on its first two
// tests; the first two members go through ref::mma_shape as A and Bt, a third through ref::mma_accumulator as C, and
// a small enough product of uint8 codes through ref::mma_batched. The only acceptable failure is qattn::InputError;
// anything else (a crash, a sanitizer report, another exception escaping) is a finding.
//
// Built by fuzz/CMakeLists.txt as fuzz_mma_sets, linking qattn_reference and qattn_core; seeds: fuzz/seeds-mma.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "qattn/error.h"
#include "qattn/reference/mma.h"
#include "qattn/reference/mma_vectors.h"
#include "qattn/tensor_io.h"

namespace {

namespace ref = qattn::ref;

// Products (tests x M x N x K) one set may cost, so that an execution stays within milliseconds.
constexpr std::size_t kMaxProducts = std::size_t{1} << 16;

// The presets that take a set's codes, D and block scales: none for 8-bit codes with a float16 D.
std::vector<const ref::MmaModel*> fitting_presets(const ref::MmaVectorSet& s) {
  std::vector<const ref::MmaModel*> out;
  for (const ref::MmaModel& m : ref::mma_presets())
    if (ref::mma_input_bits(m.input) == s.input_bits && (m.accumulator == ref::MmaAccumulator::f16) == s.f16_output &&
        (m.partition != ref::MmaPartition::k_mod4_pairs || s.depth % 4 == 0) &&
        s.scale_blocks == (m.scale_block > 0 && s.depth % static_cast<std::size_t>(m.scale_block) == 0
                               ? s.depth / static_cast<std::size_t>(m.scale_block)
                               : 0) &&
        (m.scale_block == 0 || s.scale_blocks > 0))
      out.push_back(&m);
  return out;
}

void check_sets(const std::vector<qattn::NamedTensor>& members) {
  for (const ref::MmaVectorSet& s : ref::mma_vector_sets(members, "fuzz-input")) {
    const std::size_t tests = std::min<std::size_t>(2, s.batch);
    if (tests * s.rows * s.cols * s.depth > kMaxProducts) continue;  // counts of existing members: no overflow
    for (const ref::MmaModel* m : fitting_presets(s)) {
      const ref::MmaAgreement r = ref::mma_agreement(*m, s, 2);
      if (r.equal + r.nonfinite + r.gpu_zero > r.outputs || r.outputs != tests * s.rows * s.cols) __builtin_trap();
    }
  }
}

void check_operands(const std::vector<qattn::NamedTensor>& members) {
  if (members.size() < 2) return;
  const qattn::Tensor &a = members[0].tensor, &bt = members[1].tensor;
  const ref::MmaShape shape = ref::mma_shape(a.shape, bt.shape, members[0].name, members[1].name);
  const ref::MmaModel& m = ref::mma_preset("h100-wgmma-e4m3");
  std::vector<float> c;
  if (members.size() > 2) {
    const qattn::Tensor& ct = members[2].tensor;
    c = ref::mma_accumulator(m, shape, qattn::dtype_name(ct.dtype), ct.shape, ct.bytes.data(), members[2].name);
  }
  if (a.dtype != qattn::DType::u8 || bt.dtype != qattn::DType::u8 ||
      shape.outputs > kMaxProducts / (shape.depth + 1))
    return;
  const std::vector<std::uint16_t> ac(reinterpret_cast<const std::uint8_t*>(a.bytes.data()),
                                      reinterpret_cast<const std::uint8_t*>(a.bytes.data()) + a.bytes.size()),
      bc(reinterpret_cast<const std::uint8_t*>(bt.bytes.data()),
         reinterpret_cast<const std::uint8_t*>(bt.bytes.data()) + bt.bytes.size());
  std::vector<float> d(shape.outputs);
  ref::mma_batched(m, shape, ac, bc, c, d);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::byte> bytes = std::as_bytes(std::span(data, size));
  const bool zip = size >= 2 && data[0] == 'P' && data[1] == 'K';
  if (zip && !qattn::have_npz()) return 0;
  try {
    const std::vector<qattn::NamedTensor> members =
        zip ? qattn::parse_npz(bytes, "fuzz-input") : qattn::parse_safetensors(bytes, "fuzz-input");
    try {
      check_sets(members);
    } catch (const qattn::InputError&) {
    }
    check_operands(members);
  } catch (const qattn::InputError&) {
  }
  return 0;
}

// Test vectors of a GPU's matrix instructions, and how far an MMA model (qattn/reference/mma.h) reproduces them.
//
// A vector file (.npz or .safetensors; docs/mma.md "Vector files") holds sets. A set `S` is the members
//   S_A  [..., M, K]   codes of the input format (uint8 for FP8, uint16 for 16-bit formats)
//   S_Bt [..., N, K]   the same, row n holding column n of B
//   S_C  [..., M, N]   optional accumulator (float32, or float16 for an f16 accumulator); zero when absent
//   S_D  [..., M, N] or S_<variant>_D: what the GPU returned, one output per variant (e.g. `fast` and `default`)
// This is the layout of ../shared/data/h100-fp8 and of what experiments/mma-probe writes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "qattn/reference/mma.h"
#include "qattn/tensor_io.h"

namespace qattn::ref {

struct MmaVectorSet {
  std::string name;     // "random", "K128_bytes"
  std::string variant;  // "" for S_D, "fast" for S_fast_D
  std::size_t batch = 0, rows = 0, cols = 0, depth = 0;
  int input_bits = 8;   // 8 or 16: the width of the codes
  std::vector<std::uint16_t> a, bt;  // batch x rows x depth, batch x cols x depth
  std::vector<float> c;              // batch x rows x cols (empty: zero)
  std::vector<float> d;              // batch x rows x cols
  bool f16_output = false;           // D (and C) were float16
};

// The sets of a file's members, in member order, one per (set, variant). Throws InputError naming `source`, the
// member and the reason for a missing or mis-shaped member or a wrong dtype.
std::vector<MmaVectorSet> mma_vector_sets(const std::vector<NamedTensor>& members, const std::string& source);

struct MmaAgreement {
  std::size_t outputs = 0;
  std::size_t equal = 0;        // bit-equal outputs (every NaN equals every NaN)
  double max_rel_error = 0;     // largest |model - GPU| / |GPU| among finite, differing outputs
  double share() const { return outputs == 0 ? 0.0 : static_cast<double>(equal) / static_cast<double>(outputs); }
};

// The model's output beside the GPU's for every output of the set (or for the first `limit` tests when limit > 0).
// Throws std::invalid_argument when the model's input width or accumulator does not fit the set.
MmaAgreement mma_agreement(const MmaModel& m, const MmaVectorSet& set, std::size_t limit = 0);

// Coordinate search over the model's parameters (step_products, fraction_bits, sum_bits, exponent rule, partition,
// where C is added, promotion interval) from `start`, keeping the input format and accumulator: the model that
// reproduces most outputs over every set, on the first `limit` tests of each while searching. `log` receives one
// line per improvement.
MmaModel mma_fit(const MmaModel& start, const std::vector<MmaVectorSet>& sets, std::size_t limit,
                 std::vector<std::string>* log = nullptr);

}  // namespace qattn::ref

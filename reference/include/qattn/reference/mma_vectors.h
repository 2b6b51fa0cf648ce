// Test vectors of a GPU's matrix instructions, and how far an MMA model (qattn/reference/mma.h) reproduces them.
//
// A vector file (.npz or .safetensors; docs/mma.md "Vector files") holds sets. A set `S` is the members
//   S_A  [..., M, K]   codes of the input format (uint8 for FP8, uint16 for 16-bit formats)
//   S_Bt [..., N, K]   the same, row n holding column n of B
//   S_C  [..., M, N]   optional accumulator (float32, or float16 for an f16 accumulator); zero when absent
//   S_D  [..., M, N] or S_<variant>_D: what the GPU returned, one output per variant (e.g. `fast` and `default`)
//   S_SA [..., M, K/block], S_SBt [..., N, K/block]: uint8 block scale codes, for a block-scaled instruction only
// This is the layout of ../shared/data/h100-fp8, of ../shared/data/mmasim (whose sets are named <preset>.<kind>)
// and of what experiments/mma-probe writes.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "qattn/reference/mma.h"
#include "qattn/tensor_io.h"

namespace qattn::ref {

// The operands of one set, read once and shared by all its variants.
struct MmaSetOperands {
  std::vector<std::uint16_t> a, bt;
  std::vector<float> c;
  std::vector<std::uint8_t> sa, sbt;
};

struct MmaVectorSet {
  std::string name;     // "random", "K128_bytes"
  std::string variant;  // "" for S_D, "fast" for S_fast_D
  std::size_t batch = 0, rows = 0, cols = 0, depth = 0;
  int input_bits = 8;   // 8 or 16: the width of the codes
  std::span<const std::uint16_t> a, bt;  // batch x rows x depth, batch x cols x depth (views of `operands`)
  std::span<const float> c;              // batch x rows x cols (empty: zero)
  std::size_t scale_blocks = 0;          // K / block for a block-scaled set, 0 without scales
  std::span<const std::uint8_t> sa, sbt; // batch x rows x scale_blocks, batch x cols x scale_blocks
  std::vector<float> d;                  // batch x rows x cols
  bool f16_output = false;               // D (and C) were float16
  std::shared_ptr<const MmaSetOperands> operands;  // what a, bt and c view: one copy for every variant of the set
};

// The bound on a vector file: its members together hold at most 256 MiB as read (the measured files hold at most
// 16 MiB), checked before any member is converted; a file larger than that on disk is refused before it is read.
// mma-check's peak memory is then at most the members plus twice their size in codes and floats.
inline constexpr std::size_t kMmaMaxVectorBytes = std::size_t{256} << 20;

// The sets of a file's members, in member order, one per (set, variant); the variants of a set share its operands.
// An output S_x_D belongs to the set with the longest name S for which S_A exists (set S_x when S_x_A exists), found
// in time linear in the members' names. Throws InputError naming `source`, the member and the reason for a missing or
// mis-shaped member, a wrong dtype, a set without a name (member `_A`) or named twice, a set with no output
// (zero tests, M or N), scales given for one operand only, not uint8, or whose block count does not fit both
// operands and divide K, or members beyond kMmaMaxVectorBytes.
std::vector<MmaVectorSet> mma_vector_sets(const std::vector<NamedTensor>& members, const std::string& source);

struct MmaAgreement {
  std::size_t outputs = 0;
  std::size_t equal = 0;           // bit-equal outputs (every NaN equals every NaN)
  std::size_t nonfinite = 0;       // differing outputs where the model or the GPU is NaN or +-inf
  std::size_t gpu_zero = 0;        // differing outputs, both finite, where the GPU returned +-0
  double max_rel_error = 0;        // largest |model - GPU| / |GPU| among the other differing outputs (0: none)
  std::size_t measured() const { return outputs - equal - nonfinite - gpu_zero; }
  double share() const { return outputs == 0 ? 0.0 : static_cast<double>(equal) / static_cast<double>(outputs); }
};

// The model's output beside the GPU's for every output of the set (or for the first `limit` tests when limit > 0).
// Throws std::invalid_argument when the model's input width, accumulator or block scales do not fit the set.
MmaAgreement mma_agreement(const MmaModel& m, const MmaVectorSet& set, std::size_t limit = 0);
// The same for every set, in order; the model runs once for consecutive sets that share their operands (the
// variants of a set), not once per variant.
std::vector<MmaAgreement> mma_agreements(const MmaModel& m, const std::vector<MmaVectorSet>& sets,
                                         std::size_t limit = 0);

// Coordinate search over the model's parameters (step_products, fraction_bits, sum_bits, exponent rule, partition,
// where C is added, promotion interval) from `start`, keeping the input format and accumulator: the model that
// reproduces most outputs over every set, on the first `limit` tests of each while searching. `log` receives one
// line per improvement. When no setting reproduces more outputs than `start` itself, the result is `start`,
// unchanged and under its own name; otherwise it is named `<start>-fit`.
// The preset a set's name designates: "<preset>.<kind>" (../shared/data/mmasim) for a preset name, else empty.
std::string mma_set_preset(const std::string& set_name);

MmaModel mma_fit(const MmaModel& start, const std::vector<MmaVectorSet>& sets, std::size_t limit,
                 std::vector<std::string>* log = nullptr);

}  // namespace qattn::ref

// A flash kernel's description (flash_kernel.h) as a file a user edits, and its fields one by one
// (docs/kernels-as-data.md). The file is JSON: one object per part (qk, v, softmax, p, pv, keys, output) and the
// kernel's name; every field present, with the types and values kernel_fields() lists. `qattn kernel show NAME`
// prints one; `--method file:PATH` runs one wherever a method spec is taken.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "qattn/method.h"
#include "qattn/reference/flash_kernel.h"

namespace qattn::ref {

enum class KernelFieldType { text, choice, integer, real, boolean };

struct KernelField {
  std::string name;  // dotted path: "p.offset", "qk.groups.block_q"
  KernelFieldType type;
  std::vector<std::string> choices;  // choice: the allowed values
  std::string doc;                   // one line: meaning, default, which official kernel uses which value
};

// Every field of a description, in file order.
const std::vector<KernelField>& kernel_fields();

// A field's value as text (choices by name, numbers as %.17g, booleans true/false).
std::string get_kernel_field(const FlashKernel& k, const std::string& field);
// Sets a field from text. SpecError naming the field and what it takes for an unknown field or a bad value. The
// description is not validated here (validate() checks combinations).
void set_kernel_field(FlashKernel& k, const std::string& field, const std::string& value);

// The description as the JSON file `qattn kernel show` prints (two-space indent, a final newline).
std::string kernel_to_json(const FlashKernel& k);
// Parses and validates a description file's text. InputError(file, field, reason) for malformed JSON, an unknown
// or missing field, a wrong type, a value not allowed or an impossible combination.
FlashKernel kernel_from_json(const std::string& text, const std::string& file);
// Reads a description file (InputError naming it when it cannot be read, or is larger than kMaxKernelFileBytes:
// refused before it is read).
inline constexpr std::uintmax_t kMaxKernelFileBytes = 1 << 20;
FlashKernel read_kernel_file(const std::string& path);

// The description a registry method runs on: sage1, sage2, fa3-fp8 (any preset and parameters) and file:PATH.
// nullopt for a method that is not a flash kernel.
std::optional<FlashKernel> kernel_of(const Method& m);

// The method a description makes: it runs prepare_flash, named by spec text in tables. traits: keys regroup
// with their order (scales per block of keys), masked keys count in tensor-wide scales, query rows stream in
// blocks of 64.
std::unique_ptr<Method> make_flash_method(FlashKernel k);
MethodTraits flash_kernel_traits(const FlashKernel& k);

// The contracts of a description (docs/kernels-as-data.md "Contracts"): ranges every stage can reach, derived from
// the description alone, each against the limit of the format or accumulator it lands in.
struct KernelContract {
  std::string name;     // what is bounded
  std::string bound;    // the reachable value, with its derivation
  std::string limit;    // what it must stay within
  bool violated = false;
  std::string fix;      // where violated: the fields to change and the condition they must meet
};
struct ContractOptions {
  long long keys = 8192;    // the diffuse-mass contract's row length
  double tolerance = 0.05;  // the diffuse-mass contract's largest lost fraction of a row's mass
};
std::vector<KernelContract> kernel_contracts(const FlashKernel& k, const ContractOptions& o = {});

// The parts of a description that no vector measured on a GPU validates, one line each, in step order: a matrix unit
// from MMA-Sim's model (docs/mma.md), the per-product FP22 bound, and the exponential (computed in float64 and rounded
// once, or by the C library, where the kernels run ex2.approx). Empty when every part is validated. `qattn methods`
// prints them under each flash-kernel method and preset.
std::vector<std::string> kernel_unvalidated_parts(const FlashKernel& k);

}  // namespace qattn::ref

// The "file" method: a flash kernel described in a file (docs/kernels-as-data.md), `--method file:PATH`. Every field
// of the description is also a key, empty by default ("as the file says"), so a spec or a sweep's grid changes one
// field of the file: file:k.json,p.offset=4, or `qattn sweep --method file:k.json --grid p.offset=0:8`.
#include "qattn/error.h"
#include "qattn/reference/kernel_file.h"
#include "qattn/reference/method_entries.h"

namespace qattn::ref {
namespace {

FlashKernel kernel_from_params(const ParamMap& m) {
  const std::string& path = m.values().at("path");
  if (path.empty()) throw SpecError("method 'file': no description file: give file:PATH");
  FlashKernel k = read_kernel_file(path);
  for (const KernelField& f : kernel_fields()) {
    const std::string& v = m.values().at(f.name);
    if (!v.empty()) set_kernel_field(k, f.name, v);
  }
  validate(k);
  return k;
}

}  // namespace

MethodEntry flash_pipeline_entry(std::function<FlashKernel(const ParamMap&)> kernel) {
  MethodEntry e;
  e.make = [kernel](const ParamMap& m) { return make_flash_method(kernel(m)); };
  e.overflow = OverflowRule::refuse;
  e.kind = MethodKind::attention_pipeline;
  e.traits = [kernel](const ParamMap& m) { return flash_kernel_traits(kernel(m)); };
  return e;
}

void register_kernel_file_method(Registry& registry) {
  MethodEntry e = flash_pipeline_entry(kernel_from_params);
  e.name = "file";
  e.summary = "a flash kernel from a description file (qattn kernel show NAME prints one to edit): file:PATH";
  e.params.push_back({"path", ParamType::text, "", "the description file (JSON)"});
  for (const KernelField& f : kernel_fields())
    e.params.push_back({f.name, ParamType::text, "", "overrides the file's " + f.name + ": " + f.doc});
  e.overflow_note = "as the description's parts: inputs beyond their formats' float32 or binary16, and S beyond float32, "
                    "are refused";
  e.doc = "docs/kernels-as-data.md";
  e.positional_key = "path";
  e.in_default_lists = false;
  registry.add(std::move(e));
}

}  // namespace qattn::ref

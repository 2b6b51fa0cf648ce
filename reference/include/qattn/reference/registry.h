// Registers every reference method (reference/) into a Registry. The CLI, the tests and the benchmarks all
// start from this one list.
#pragma once

#include "qattn/method.h"

namespace qattn::ref {

void register_reference_methods(Registry& registry);

// A registry holding the reference methods, built once.
const Registry& reference_registry();

}  // namespace qattn::ref

// Registry entries of the reference softmax models, one function per method family (registry.cc lists them).
#pragma once

#include "qattn/method.h"

namespace qattn::ref {

MethodEntry index_method_entry();
MethodEntry sas_method_entry();
MethodEntry exaq_method_entry();

}  // namespace qattn::ref

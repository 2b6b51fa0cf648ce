// The evaluation layer (qattn/eval/evaluate.h) under the names the commands use.
#pragma once

#include "qattn/eval/evaluate.h"

namespace qattn::cli {
using namespace qattn::eval;
}  // namespace qattn::cli

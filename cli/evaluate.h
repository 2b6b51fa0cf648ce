// The evaluation layer (qattn/eval/evaluate.h) and its report (qattn/eval/report.h) under the names the commands use.
#pragma once

#include "qattn/eval/evaluate.h"
#include "qattn/eval/report.h"
#include "qattn/eval/table.h"

namespace qattn::cli {
using namespace qattn::eval;
}  // namespace qattn::cli

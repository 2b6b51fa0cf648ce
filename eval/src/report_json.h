// The JSON forms of the report's values, shared by the evaluation layer's report and shard files and by the
// commands that read them back (`qattn merge`). Not installed: a program of the user's reads the documents, not
// these functions.
#pragma once

#include <nlohmann/json.hpp>

#include "qattn/eval/evaluate.h"
#include "qattn/eval/report.h"
#include "qattn/metrics.h"

namespace qattn::eval {

// A double as JSON that reads back to the same bits: a number when finite, "nan", "inf" or "-inf" otherwise
// (docs/metrics.md). The reverse throws std::invalid_argument for anything else.
nlohmann::json exact_number(double v);
double exact_number(const nlohmann::json& j);

// One ErrorStats as the report's JSON writes it.
nlohmann::json stats_json(const ErrorStats& s);

// One head's metrics as JSON and back, every double bit for bit (the rows of a part file).
nlohmann::json head_result_json(const HeadResult& r);
HeadResult head_result_from_json(const nlohmann::json& j);

// The view as a part file stores it, and back.
nlohmann::json report_view_json(const ReportView& v);
ReportView report_view_from_json(const nlohmann::json& j);

// The sweep's header ({"keys", "target", "metric", "heads"}) as a part file stores it, and the table from it.
nlohmann::json sweep_header_json(const SweepTable& t);
SweepTable sweep_header_from_json(const nlohmann::json& j);

}  // namespace qattn::eval

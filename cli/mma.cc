// qattn mma and qattn mma-check: the tensor-core MMA models (qattn/reference/mma.h) on a user's arrays, and against
// vectors measured on a GPU (docs/mma.md).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <memory>
#include <sstream>
#include <tuple>

#include "commands.h"
#include "qattn/error.h"
#include "qattn/reference/mma.h"
#include "qattn/reference/mma_vectors.h"

namespace qattn::cli {
namespace {

using ref::MmaModel;

struct MmaOptions {
  std::string model, a, bt, c, scale_a, scale_bt, out;
  bool list = false;
};

struct MmaCheckOptions {
  std::string vectors, model, format = "md", out;
  bool fit = false;
  std::size_t limit = 0, fit_limit = 64;
};

const MmaModel& model_or_usage(const std::string& name) {
  try {
    return ref::mma_preset(name);
  } catch (const std::invalid_argument& e) {
    throw CLI::ValidationError("--model", e.what());
  }
}

Tensor read_one(const std::string& path, const std::string& option) {
  std::vector<NamedTensor> ts = read_tensor_file(path);
  if (ts.size() != 1)
    throw InputError(path, option, "holds " + std::to_string(ts.size()) + " tensors; expected one array");
  return std::move(ts.front().tensor);
}

// A or Bt as codes of the model's input format: uint8 codes (FP8; E2M1 one code per byte, in the low nibble), uint16
// patterns (16-bit formats), or floats that are values of the format.
std::vector<std::uint16_t> operand_codes(const Tensor& t, const MmaModel& m, const std::string& path) {
  const int bits = ref::mma_input_bits(m.input);
  const ref::LowpFormat& f = ref::mma_input_format(m.input);
  std::vector<std::uint16_t> codes(static_cast<std::size_t>(t.element_count()));
  if (t.dtype == DType::u8 || t.dtype == DType::u16) {
    if ((t.dtype == DType::u8) != (bits == 8))
      throw InputError(path, "dtype", std::string(dtype_name(t.dtype)) + " codes, but model " + m.name + " takes " +
                                          f.name + (bits == 8 ? " (uint8 codes)" : " (uint16 bit patterns)"));
    for (std::size_t i = 0; i < codes.size(); ++i) {
      codes[i] = bits == 8 ? std::to_integer<std::uint16_t>(t.bytes[i])
                           : static_cast<std::uint16_t>(std::to_integer<unsigned>(t.bytes[2 * i]) |
                                                        std::to_integer<unsigned>(t.bytes[2 * i + 1]) << 8);
      if (m.input == ref::MmaInput::e2m1 && codes[i] > 0x0f)
        throw InputError(path, "element " + std::to_string(i),
                         "code " + std::to_string(codes[i]) + " is not an E2M1 code: one code per byte, 0 to 15 "
                                                              "(the low nibble; packed pairs are not read)");
    }
    return codes;
  }
  if (!dtype_is_float(t.dtype))
    throw InputError(path, "dtype", std::string(dtype_name(t.dtype)) + ": expected " +
                                        (bits == 8 ? "uint8 codes" : "uint16 bit patterns") + " or floats exact in " +
                                        f.name);
  const Eigen::ArrayXd v = t.to_double();
  for (std::size_t i = 0; i < codes.size(); ++i) {
    const double x = v[static_cast<Eigen::Index>(i)];
    try {
      codes[i] = static_cast<std::uint16_t>(ref::lowp_encode(x, f));
    } catch (const std::invalid_argument&) {
      std::ostringstream s;
      s << std::setprecision(17) << "value " << x << " is not a value of " << f.name
        << " (round it first, e.g. qattn.fp8_encode)";
      throw InputError(path, "element " + std::to_string(i), s.str());
    }
  }
  return codes;
}

void run_mma(const MmaOptions& o) {
  if (o.list) {
    std::ostringstream s;
    for (const MmaModel& m : ref::mma_presets())
      s << m.name
        << (!m.validated ? "  [not validated by vectors]" : !m.measured ? "  [MMA-Sim model, not measured here]" : "")
        << "\n  " << m.describe() << "\n  " << m.provenance << "\n";
    emit(s.str(), "");
    return;
  }
  for (const char* needed : {"--model", "--a", "--bt", "--out"})
    if ((std::string(needed) == "--model" && o.model.empty()) || (std::string(needed) == "--a" && o.a.empty()) ||
        (std::string(needed) == "--bt" && o.bt.empty()) || (std::string(needed) == "--out" && o.out.empty()))
      throw CLI::ValidationError(needed, "is required (or --list)");
  std::vector<std::pair<std::string, std::string>> inputs{{"--a", o.a}, {"--bt", o.bt}};
  if (!o.c.empty()) inputs.emplace_back("--c", o.c);
  if (!o.scale_a.empty()) inputs.emplace_back("--scale-a", o.scale_a);
  if (!o.scale_bt.empty()) inputs.emplace_back("--scale-bt", o.scale_bt);
  require_distinct_files(inputs, {{"--out", o.out}});
  const MmaModel& m = model_or_usage(o.model);
  const Tensor a = read_one(o.a, "--a"), bt = read_one(o.bt, "--bt");
  const ref::MmaShape shape = ref::mma_shape(a.shape, bt.shape, o.a, o.bt);  // before anything is allocated
  ref::mma_check_depth(m, shape, o.a);
  std::vector<float> c;
  if (!o.c.empty()) {
    const Tensor ct = read_one(o.c, "--c");
    c = ref::mma_accumulator(m, shape, dtype_name(ct.dtype), ct.shape, ct.bytes.data(), o.c);
  }
  std::vector<std::uint8_t> sa, sbt;
  for (const auto& [path, is_bt, operand] : {std::tuple{&o.scale_a, false, &o.a}, std::tuple{&o.scale_bt, true, &o.bt}}) {
    std::vector<std::uint8_t>& dst = is_bt ? sbt : sa;
    if (path->empty()) {
      dst = ref::mma_scales(m, shape, is_bt, false, "", {}, nullptr, *operand);
    } else {
      const Tensor st = read_one(*path, is_bt ? "--scale-bt" : "--scale-a");
      dst = ref::mma_scales(m, shape, is_bt, true, dtype_name(st.dtype), st.shape, st.bytes.data(), *path);
    }
  }
  const std::vector<std::uint16_t> ac = operand_codes(a, m, o.a), bc = operand_codes(bt, m, o.bt);
  std::vector<float> d(shape.outputs);
  ref::mma_batched(m, shape, ac, bc, c, d, sa, sbt);
  const bool f16 = m.accumulator == ref::MmaAccumulator::f16;
  Tensor out{f16 ? DType::f16 : DType::f32, shape.d, std::vector<std::byte>(shape.outputs * (f16 ? 2 : 4))};
  for (std::size_t i = 0; i < d.size(); ++i) {
    if (f16) {
      const std::uint16_t h = f32_to_f16_bits(d[i]);  // exact: an f16 accumulator's outputs are binary16 values
      std::memcpy(out.bytes.data() + 2 * i, &h, 2);
    } else {
      std::memcpy(out.bytes.data() + 4 * i, &d[i], 4);
    }
  }
  std::vector<float>().swap(d);  // D is now held twice at most: the tensor and the encoded file
  write_tensor_file(o.out, {{"D", std::move(out)}});
}

std::string percent(double share) {
  std::ostringstream s;
  s << std::fixed << std::setprecision(share == 1.0 || share == 0.0 ? 0 : 3) << 100 * share << " %";
  return s.str();
}

// The last column of the report: the largest relative error of the differing outputs where there is one, and how
// many differ where no relative error exists (a NaN or an infinity on either side, or a GPU zero).
std::string disagreement(const ref::MmaAgreement& r) {
  if (r.equal == r.outputs) return "-";
  std::ostringstream s;
  if (r.measured() > 0) s << std::setprecision(3) << r.max_rel_error;
  for (const auto& [n, what] : {std::pair{r.nonfinite, " NaN/inf"}, std::pair{r.gpu_zero, " vs a GPU zero"}})
    if (n > 0) s << (s.tellp() > 0 ? "; " : "") << n << what;
  return s.str();
}

// The vector file's members, refused before reading when the file alone is beyond the bound on them.
std::vector<NamedTensor> read_vectors(const std::string& path) {
  std::error_code ec;
  const std::uintmax_t size = std::filesystem::file_size(path, ec);  // a non-regular file: the reader says why
  if (!ec && size > ref::kMmaMaxVectorBytes)
    throw InputError(path, "file", std::to_string(size) + " bytes, beyond the bound of " +
                                       std::to_string(ref::kMmaMaxVectorBytes) + " bytes on a vector file (docs/mma.md)");
  return read_tensor_file(path);
}

// With --model on a file of named sets: only the model's own sets (<preset>.<kind>) stay; returns how many left.
std::size_t keep_own_sets(std::vector<ref::MmaVectorSet>& sets, const MmaModel& start, const std::string& vectors) {
  std::size_t left_out = 0;
  std::vector<ref::MmaVectorSet> own;
  std::string presets;
  for (ref::MmaVectorSet& s : sets) {
    const std::string p = ref::mma_set_preset(s.name);
    if (p == start.name) own.push_back(std::move(s));
    else ++left_out;
    if (!p.empty() && presets.find(p) == std::string::npos) presets += (presets.empty() ? "" : ", ") + p;
  }
  if (own.empty())
    throw InputError(vectors, "members", "no set for model " + start.name + ": its sets are named " +
                                             "<preset>.<kind>, for " + presets);
  sets = std::move(own);
  return left_out;
}

// The model of each set: `start`, or (without --model) the preset the set's name designates; each checked against
// the set's operand width, D format and scales.
std::vector<const MmaModel*> set_models(const std::vector<ref::MmaVectorSet>& sets, const MmaModel* start,
                                        const std::string& vectors) {
  std::vector<const MmaModel*> models;
  for (const ref::MmaVectorSet& s : sets) {
    const MmaModel* m = start;
    if (m == nullptr) {
      const std::string p = ref::mma_set_preset(s.name);
      if (p.empty())
        throw CLI::ValidationError("--model", "is needed: set '" + s.name + "' does not name a preset "
                                              "(<preset>.<kind>)");
      m = &ref::mma_preset(p);
    }
    if (ref::mma_input_bits(m->input) != s.input_bits || (m->accumulator == ref::MmaAccumulator::f16) != s.f16_output ||
        s.scale_blocks != (m->scale_block > 0 ? s.depth / static_cast<std::size_t>(m->scale_block) : 0))
      throw InputError(vectors, s.name + "_A",
                       std::to_string(s.input_bits) + "-bit codes with a " + (s.f16_output ? "float16" : "float32") +
                           " D and " + (s.scale_blocks > 0 ? std::to_string(s.scale_blocks) + " scales per row" : "no scales") +
                           " do not fit model " + m->name + " (" + m->describe() + ")");
    models.push_back(m);
  }
  return models;
}

// Each set's agreement with its model; consecutive sets of one model and operands run once (the variants of a set).
std::vector<ref::MmaAgreement> agreements_of(const std::vector<ref::MmaVectorSet>& sets,
                                             const std::vector<const MmaModel*>& models, std::size_t limit) {
  std::vector<ref::MmaAgreement> agreements;
  for (std::size_t i = 0; i < sets.size();) {
    std::size_t j = i + 1;
    while (j < sets.size() && models[j] == models[i]) ++j;
    const std::vector<ref::MmaVectorSet> run(sets.begin() + static_cast<std::ptrdiff_t>(i),
                                             sets.begin() + static_cast<std::ptrdiff_t>(j));
    for (const ref::MmaAgreement& r : ref::mma_agreements(*models[i], run, limit)) agreements.push_back(r);
    i = j;
  }
  return agreements;
}

void run_mma_check(const MmaCheckOptions& o) {
  if (o.format != "md" && o.format != "json") throw CLI::ValidationError("--format", "md or json, not '" + o.format + "'");
  if (o.fit && o.model.empty()) throw CLI::ValidationError("--fit", "needs --model, the preset to start from");
  require_distinct_files({{"vectors", o.vectors}}, {{"--out", o.out}});
  const MmaModel* start = o.model.empty() ? nullptr : &model_or_usage(o.model);
  std::vector<ref::MmaVectorSet> sets = ref::mma_vector_sets(read_vectors(o.vectors), o.vectors);
  // Sets named <preset>.<kind> belong to that preset: with --model, the model's own sets (or, in a file of unnamed
  // sets, all of them); without, each set against its own preset.
  const bool named = std::any_of(sets.begin(), sets.end(),
                                 [](const ref::MmaVectorSet& s) { return !ref::mma_set_preset(s.name).empty(); });
  const std::size_t left_out = start != nullptr && named ? keep_own_sets(sets, *start, o.vectors) : 0;
  std::vector<const MmaModel*> models = set_models(sets, start, o.vectors);  // per set
  MmaModel fitted;
  std::vector<std::string> log;
  if (o.fit) {
    fitted = ref::mma_fit(*start, sets, o.fit_limit, &log);
    for (const std::string& line : log) std::cerr << "qattn mma-check --fit: " << line << "\n";
    std::fill(models.begin(), models.end(), &fitted);
  }
  const bool changed = o.fit && fitted.name != start->name;
  const bool one_model = start != nullptr;
  const MmaModel* shown = o.fit ? &fitted : start;
  nlohmann::json rows = nlohmann::json::array();
  std::ostringstream md;
  if (one_model) {
    md << "# " << o.vectors << " against " << shown->name << "\n\n" << shown->describe() << "\n\n";
    if (!shown->provenance.empty()) md << "Provenance: " << shown->provenance << "\n\n";
    if (left_out > 0) md << left_out << " sets of other presets left out.\n\n";
  } else {
    md << "# " << o.vectors << ", each set against the preset it names\n\n";
  }
  if (o.fit && !changed)
    md << "--fit: no setting of the parameters reproduces more outputs than " << start->name
       << "; the preset is reported unchanged.\n\n";
  md << "| set | " << (one_model ? "" : "model | ") << "variant | tests | M x N x K | outputs | bit-equal | share | "
     << "max rel. error where not equal |\n|---|" << (one_model ? "" : "---|") << "---|---:|---|---:|---:|---:|---:|\n";
  std::size_t all = 0, equal = 0;
  const std::vector<ref::MmaAgreement> agreements = agreements_of(sets, models, o.limit);
  for (std::size_t i = 0; i < sets.size(); ++i) {
    const ref::MmaVectorSet& s = sets[i];
    const ref::MmaAgreement& r = agreements[i];
    all += r.outputs, equal += r.equal;
    const std::size_t tests = o.limit > 0 ? std::min(o.limit, s.batch) : s.batch;
    md << "| " << s.name << " | " << (one_model ? "" : models[i]->name + " | ") << (s.variant.empty() ? "-" : s.variant)
       << " | " << tests << " | " << s.rows << " x " << s.cols << " x " << s.depth << " | " << r.outputs << " | "
       << r.equal << " | " << percent(r.share()) << " | " << disagreement(r) << " |\n";
    rows.push_back({{"set", s.name}, {"model", models[i]->name}, {"variant", s.variant}, {"tests", tests},
                    {"m", s.rows}, {"n", s.cols}, {"k", s.depth}, {"outputs", r.outputs}, {"equal", r.equal},
                    {"share", r.share()},
                    {"max_rel_error", r.measured() > 0 ? nlohmann::json(r.max_rel_error) : nlohmann::json()},
                    {"nonfinite", r.nonfinite}, {"gpu_zero", r.gpu_zero}});
  }
  md << "\nAll sets: " << equal << " of " << all << " outputs bit-equal ("
     << percent(all == 0 ? 0.0 : static_cast<double>(equal) / static_cast<double>(all)) << ").\n";
  if (o.format == "json") {
    nlohmann::json j{{"vectors", o.vectors}, {"model", one_model ? nlohmann::json(shown->name) : nlohmann::json()},
                     {"parameters", one_model ? nlohmann::json(shown->describe()) : nlohmann::json()},
                     {"provenance", one_model ? nlohmann::json(shown->provenance) : nlohmann::json()},
                     {"fitted", o.fit}, {"sets", rows}, {"outputs", all}, {"equal", equal},
                     {"sets_left_out", left_out}};
    if (o.fit) j["fit_log"] = log, j["fit_changed"] = changed;
    emit(j.dump(2) + "\n", o.out);
  } else {
    emit(md.str(), o.out);
  }
}

}  // namespace

void add_mma(CLI::App& app) {
  auto* sub = app.add_subcommand(
      "mma", "D = A·B + C through a matrix-unit MMA model (docs/mma.md): A [..., M, K], BT [..., N, K] as uint8 FP8 "
             "codes (E2M1: one per byte, low nibble), uint16 16-bit patterns or floats exact in the input format; "
             "C, D [..., M, N]; block-scaled models take --scale-a and --scale-bt");
  auto o = std::make_shared<MmaOptions>();
  sub->add_option("--model", o->model, "A preset (--list)");
  sub->add_option("--a", o->a, "A [..., M, K] (.npy, or a one-array .npz/.safetensors)");
  sub->add_option("--bt", o->bt, "B transposed, [..., N, K]");
  sub->add_option("--c", o->c, "C [..., M, N], float32 (float16 values for an f16 accumulator); zero if absent");
  sub->add_option("--scale-a", o->scale_a, "SA [..., M, K/block]: uint8 block scale codes of A (block-scaled models)");
  sub->add_option("--scale-bt", o->scale_bt, "SBt [..., N, K/block]: uint8 block scale codes of Bt");
  sub->add_option("--out", o->out, "D [..., M, N]: float32, or float16 for an f16 accumulator (written atomically)");
  sub->add_flag("--list", o->list, "Print the presets, their parameters and provenance");
  sub->callback([o] { run_mma(*o); });
}

void add_mma_check(CLI::App& app) {
  auto* sub = app.add_subcommand(
      "mma-check", "The share of a GPU's MMA outputs an MMA model reproduces bit for bit, per set of a vector file "
                   "(docs/mma.md \"Vector files\"); --fit searches the model's parameters for the best match");
  auto o = std::make_shared<MmaCheckOptions>();
  sub->add_option("vectors", o->vectors, "Vector file (.npz or .safetensors)")->required();
  sub->add_option("--model", o->model,
                  "The preset to check, or to start the search from with --fit; without it, each set named "
                  "<preset>.<kind> is checked against that preset (../shared/data/mmasim's layout)");
  sub->add_flag("--fit", o->fit, "Search step size, fraction bits, sum bits, exponent rule, partition, C addition and "
                                 "promotion for the best match (progress on stderr)");
  sub->add_option("--fit-tests", o->fit_limit, "Tests per set the search scores each candidate on (default 64)")
      ->check(CLI::Range(std::size_t{1}, std::size_t{1} << 30));
  sub->add_option("--tests", o->limit, "Check only the first N tests of each set (default: all)")
      ->check(CLI::Range(std::size_t{1}, std::size_t{1} << 30));
  sub->add_option("--format", o->format, "md (default) or json");
  sub->add_option("--out", o->out, "Write here (atomically) instead of stdout");
  sub->callback([o] { run_mma_check(*o); });
}

}  // namespace qattn::cli

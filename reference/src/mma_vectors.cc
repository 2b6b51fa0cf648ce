#include "qattn/reference/mma_vectors.h"

#include <bit>
#include <cmath>
#include <cstring>
#include <map>
#include <sstream>
#include <stdexcept>

#include "qattn/error.h"

namespace qattn::ref {
namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::vector<std::uint16_t> codes_of(const Tensor& t, const std::string& source, const std::string& member) {
  std::vector<std::uint16_t> out(static_cast<std::size_t>(t.element_count()));
  if (t.dtype == DType::u8) {
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = std::to_integer<std::uint16_t>(t.bytes[i]);
  } else if (t.dtype == DType::u16 || t.dtype == DType::i16) {
    std::memcpy(out.data(), t.bytes.data(), 2 * out.size());
  } else {
    throw InputError(source, member, "dtype " + std::string(dtype_name(t.dtype)) +
                                         ": the codes of the input format are uint8 (FP8) or uint16 (16-bit formats)");
  }
  return out;
}

std::vector<float> floats_of(const Tensor& t, const std::string& source, const std::string& member) {
  if (t.dtype != DType::f32 && t.dtype != DType::f16)
    throw InputError(source, member, "dtype " + std::string(dtype_name(t.dtype)) + ": expected float32 or float16");
  const Eigen::ArrayXd v = t.to_double();
  std::vector<float> out(static_cast<std::size_t>(v.size()));
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = static_cast<float>(v[static_cast<Eigen::Index>(i)]);
  return out;
}

// The shape [..., x, y] of a member: the batch (product of the leading dimensions), x and y.
struct Shape3 {
  std::size_t batch, x, y;
  std::vector<std::int64_t> lead;
};
Shape3 shape3(const Tensor& t, const std::string& source, const std::string& member) {
  if (t.shape.size() < 2) throw InputError(source, member, "shape " + t.shape_string() + ": expected [..., rows, cols]");
  Shape3 s{1, static_cast<std::size_t>(t.shape[t.shape.size() - 2]), static_cast<std::size_t>(t.shape.back()), {}};
  for (std::size_t i = 0; i + 2 < t.shape.size(); ++i) {
    s.batch *= static_cast<std::size_t>(t.shape[i]);
    s.lead.push_back(t.shape[i]);
  }
  return s;
}

bool same_bits(float model, float gpu, bool f16) {
  if (std::isnan(model) && std::isnan(gpu)) return true;
  if (f16) return f32_to_f16_bits(model) == f32_to_f16_bits(gpu);
  return std::bit_cast<std::uint32_t>(model) == std::bit_cast<std::uint32_t>(gpu);
}

}  // namespace

std::vector<MmaVectorSet> mma_vector_sets(const std::vector<NamedTensor>& members, const std::string& source) {
  std::map<std::string, const Tensor*> by;
  for (const NamedTensor& t : members) by[t.name] = &t.tensor;
  std::vector<MmaVectorSet> sets;
  for (const NamedTensor& member : members) {
    if (!ends_with(member.name, "_A")) continue;
    const std::string name = member.name.substr(0, member.name.size() - 2);
    const auto bt_it = by.find(name + "_Bt");
    if (bt_it == by.end()) throw InputError(source, name + "_Bt", "missing: set '" + name + "' has an _A member");
    const Tensor& a = member.tensor;
    const Tensor& bt = *bt_it->second;
    const Shape3 sa = shape3(a, source, member.name), sb = shape3(bt, source, name + "_Bt");
    if (sa.lead != sb.lead || sa.y != sb.y)
      throw InputError(source, name + "_Bt", "shape " + bt.shape_string() + " does not fit " + name + "_A " +
                                                 a.shape_string() + " (expected [..., N, K] with the same ... and K)");
    if (a.dtype != bt.dtype)
      throw InputError(source, name + "_Bt", "dtype " + std::string(dtype_name(bt.dtype)) + " differs from " + name +
                                                 "_A's " + std::string(dtype_name(a.dtype)));
    MmaVectorSet base;
    base.name = name;
    base.batch = sa.batch;
    base.rows = sa.x;
    base.cols = sb.x;
    base.depth = sa.y;
    base.input_bits = a.dtype == DType::u8 ? 8 : 16;
    base.a = codes_of(a, source, member.name);
    base.bt = codes_of(bt, source, name + "_Bt");
    auto check_out = [&](const Tensor& t, const std::string& key) {
      const Shape3 s = shape3(t, source, key);
      if (s.lead != sa.lead || s.x != base.rows || s.y != base.cols)
        throw InputError(source, key, "shape " + t.shape_string() + ": expected [..., M, N] = [..., " +
                                          std::to_string(base.rows) + ", " + std::to_string(base.cols) + "]");
    };
    if (const auto c = by.find(name + "_C"); c != by.end()) {
      check_out(*c->second, c->first);
      base.c = floats_of(*c->second, source, c->first);
    }
    bool any = false;
    for (const NamedTensor& out : members) {
      const std::string& key = out.name;
      if (key.rfind(name + "_", 0) != 0 || !ends_with(key, "_D")) continue;
      const std::string middle = key.substr(name.size() + 1, key.size() - name.size() - 3);
      bool longer_set = false;  // S_x_D belongs to set S_x when S_x_A exists
      for (const NamedTensor& other : members)
        if (ends_with(other.name, "_A") && other.name.size() > member.name.size() &&
            key.rfind(other.name.substr(0, other.name.size() - 1), 0) == 0)
          longer_set = true;
      if (longer_set) continue;
      check_out(out.tensor, key);
      MmaVectorSet s = base;
      s.variant = key == name + "_D" ? "" : middle;
      s.d = floats_of(out.tensor, source, key);
      s.f16_output = out.tensor.dtype == DType::f16;
      sets.push_back(std::move(s));
      any = true;
    }
    if (!any) throw InputError(source, name + "_D", "missing: set '" + name + "' has no output (_D or _<variant>_D)");
  }
  if (sets.empty()) throw InputError(source, "members", "no set: no member named <set>_A (docs/mma.md \"Vector files\")");
  return sets;
}

MmaAgreement mma_agreement(const MmaModel& m, const MmaVectorSet& set, std::size_t limit) {
  if (mma_input_bits(m.input) != set.input_bits)
    throw std::invalid_argument("model " + m.name + " takes " + std::to_string(mma_input_bits(m.input)) +
                                "-bit codes; set " + set.name + " holds " + std::to_string(set.input_bits) + "-bit codes");
  if ((m.accumulator == MmaAccumulator::f16) != set.f16_output)
    throw std::invalid_argument("model " + m.name + " has an " +
                                (m.accumulator == MmaAccumulator::f16 ? "f16" : "f32") + " accumulator; set " +
                                set.name + "'s D is " + (set.f16_output ? "float16" : "float32"));
  const std::size_t batch = limit > 0 ? std::min(limit, set.batch) : set.batch;
  const std::size_t mk = set.rows * set.depth, nk = set.cols * set.depth, mn = set.rows * set.cols;
  MmaAgreement r;
  std::vector<float> d(mn);
  for (std::size_t t = 0; t < batch; ++t) {
    mma_matmul(m, std::span(set.a).subspan(t * mk, mk), std::span(set.bt).subspan(t * nk, nk),
               set.c.empty() ? std::span<const float>() : std::span<const float>(set.c).subspan(t * mn, mn), d,
               set.rows, set.cols, set.depth);
    for (std::size_t i = 0; i < mn; ++i) {
      const float gpu = set.d[t * mn + i];
      ++r.outputs;
      if (same_bits(d[i], gpu, set.f16_output)) {
        ++r.equal;
      } else if (std::isfinite(d[i]) && std::isfinite(gpu) && gpu != 0) {
        r.max_rel_error = std::max(r.max_rel_error, std::fabs(static_cast<double>(d[i]) - gpu) / std::fabs(gpu));
      }
    }
  }
  return r;
}

MmaModel mma_fit(const MmaModel& start, const std::vector<MmaVectorSet>& sets, std::size_t limit,
                 std::vector<std::string>* log) {
  auto score = [&](const MmaModel& m) {
    std::size_t equal = 0;
    for (const MmaVectorSet& s : sets) {
      try {
        if (m.partition == MmaPartition::k_mod4_pairs && s.depth % 4 != 0) return std::size_t{0};
        equal += mma_agreement(m, s, limit).equal;
      } catch (const std::invalid_argument&) {
        return std::size_t{0};
      }
    }
    return equal;
  };
  MmaModel best = start;
  best.per_product = false;
  best.validated = false;
  best.name = start.name + "-fit";
  best.provenance = "fitted by mma_fit from " + start.name;
  std::size_t best_score = score(best);
  std::size_t total = 0;
  for (const MmaVectorSet& s : sets) total += (limit > 0 ? std::min(limit, s.batch) : s.batch) * s.rows * s.cols;
  auto note = [&](const char* what) {
    if (log != nullptr) {
      std::ostringstream line;
      line << what << ": " << best_score << " / " << total << " outputs equal: " << best.describe();
      log->push_back(line.str());
    }
  };
  note("start");
  // One parameter at a time, each over its whole range, until a sweep over all of them changes nothing.
  for (bool improved = true; improved;) {
    improved = false;
    auto try_values = [&](auto set_value, const std::vector<int>& values, const char* what) {
      for (int v : values) {
        MmaModel m = best;
        set_value(m, v);
        if (const std::size_t sc = score(m); sc > best_score) {
          best = m, best_score = sc, improved = true;
          note(what);
        }
      }
    };
    std::vector<int> frac, sums, steps{1, 2, 4, 8, 16, 32, 64, 128}, promote{0, 1, 2, 4, 8, 16};
    for (int f = 0; f <= 40; ++f) frac.push_back(f);
    for (int b = 8; b <= 24; ++b) sums.push_back(b);
    try_values([](MmaModel& m, int v) { m.step_products = v; }, steps, "step_products");
    try_values([](MmaModel& m, int v) { m.fraction_bits = v; }, frac, "fraction_bits");
    try_values([](MmaModel& m, int v) { m.sum_bits = v; }, sums, "sum_bits");
    try_values([](MmaModel& m, int v) { m.exponent_rule = static_cast<MmaExponentRule>(v); }, {0, 1}, "exponent_rule");
    try_values([](MmaModel& m, int v) { m.partition = static_cast<MmaPartition>(v); }, {0, 1}, "partition");
    try_values([](MmaModel& m, int v) { m.c_add = static_cast<MmaCAdd>(v); }, {0, 1}, "c_add");
    try_values([](MmaModel& m, int v) { m.promote_steps = v; }, promote, "promote_steps");
  }
  return best;
}

}  // namespace qattn::ref

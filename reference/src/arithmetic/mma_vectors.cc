#include "qattn/reference/mma_vectors.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string_view>
#include <unordered_map>

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
    if (__builtin_mul_overflow(s.batch, static_cast<std::size_t>(t.shape[i]), &s.batch))
      throw InputError(source, member, "shape " + t.shape_string() + ": the product of the leading dimensions overflows");
    s.lead.push_back(t.shape[i]);
  }
  return s;
}

// The set names, by a polynomial hash of their characters (mod 2^61 - 1): for an output member, the set with the
// longest name S such that S + "_" begins the member's name, in one pass over that name and one lookup per '_' in it,
// however many sets there are. Memory: one entry per set; the names are views of the members' own.
class SetNames {
 public:
  static constexpr std::size_t kNone = static_cast<std::size_t>(-1);
  // Adds the next set (its index is the count of sets before it); false when a set of this name exists already.
  bool add(std::string_view name) {
    const auto [head, fresh] = first_.try_emplace(hash(name), kNone);
    for (std::size_t s = head->second; s != kNone; s = next_[s])
      if (names_[s] == name) return false;
    names_.push_back(name);
    next_.push_back(head->second);
    head->second = names_.size() - 1;
    return true;
  }
  std::size_t owner(std::string_view member) const {
    std::vector<std::uint64_t> prefix(member.size() + 1, 0);  // prefix[i]: the hash of member[0, i)
    for (std::size_t i = 0; i < member.size(); ++i) prefix[i + 1] = step(prefix[i], member[i]);
    for (std::size_t i = member.size(); i-- > 1;) {
      if (member[i] != '_') continue;
      const auto head = first_.find(prefix[i]);
      if (head == first_.end()) continue;
      for (std::size_t s = head->second; s != kNone; s = next_[s])
        if (names_[s] == member.substr(0, i)) return s;
    }
    return kNone;
  }

 private:
  static constexpr std::uint64_t kPrime = (std::uint64_t{1} << 61) - 1, kBase = 0x2f0b3c5d7e1a9u;
  static std::uint64_t step(std::uint64_t h, char ch) {
    const unsigned __int128 x = static_cast<unsigned __int128>(h) * kBase + static_cast<unsigned char>(ch) + 1;
    const std::uint64_t r = static_cast<std::uint64_t>(x & kPrime) + static_cast<std::uint64_t>(x >> 61);
    return r >= kPrime ? r - kPrime : r;
  }
  static std::uint64_t hash(std::string_view s) {
    std::uint64_t h = 0;
    for (const char ch : s) h = step(h, ch);
    return h;
  }
  std::unordered_map<std::uint64_t, std::size_t> first_;  // hash -> the last set added with it
  std::vector<std::size_t> next_;                          // per set: the set added before it with the same hash
  std::vector<std::string_view> names_;
};

bool same_bits(float model, float gpu, bool f16) {
  if (std::isnan(model) && std::isnan(gpu)) return true;
  if (f16) return f32_to_f16_bits(model) == f32_to_f16_bits(gpu);
  return std::bit_cast<std::uint32_t>(model) == std::bit_cast<std::uint32_t>(gpu);
}

// The sets of a file in member order: each set's _A member, and its outputs (S_D, S_<variant>_D) in member order.
struct SetMembers {
  std::vector<const NamedTensor*> a;
  std::vector<std::vector<const NamedTensor*>> outputs;
};

SetMembers find_sets(const std::vector<NamedTensor>& members, const std::string& source) {
  SetMembers sets;
  SetNames names;
  for (const NamedTensor& member : members) {
    if (!ends_with(member.name, "_A")) continue;
    const std::string name = member.name.substr(0, member.name.size() - 2);
    if (name.empty())
      throw InputError(source, member.name, "a set needs a name: S_A, S_Bt and S_D for a set S (docs/mma.md)");
    if (!names.add(std::string_view(member.name).substr(0, name.size())))
      throw InputError(source, member.name, "set '" + name + "' is given twice");
    sets.a.push_back(&member);
  }
  sets.outputs.resize(sets.a.size());
  for (const NamedTensor& out : members)
    if (ends_with(out.name, "_D"))
      if (const std::size_t set = names.owner(out.name); set != SetNames::kNone) sets.outputs[set].push_back(&out);
  return sets;
}

// A member shaped like D [..., M, N] for A's shape sa and Bt's sb (an output or C), with at least one output.
void check_output_shape(const Tensor& t, const std::string& key, const std::string& source, const Shape3& sa,
                        const Shape3& sb) {
  const Shape3 s = shape3(t, source, key);
  if (s.lead != sa.lead || s.x != sa.x || s.y != sb.x)
    throw InputError(source, key, "shape " + t.shape_string() + ": expected [..., M, N] = [..., " +
                                      std::to_string(sa.x) + ", " + std::to_string(sb.x) + "]");
  if (sa.batch == 0 || sa.x == 0 || sb.x == 0)
    throw InputError(source, key, "shape " + t.shape_string() + ": no output to check (a set needs tests, M and "
                                                                "N of 1 or more)");
}

using MembersByName = std::map<std::string, const Tensor*>;

// Set `name`'s block scales S_SA and S_SBt into `operands`, checked against A's shape sa and Bt's sb: both or
// neither, uint8, the same block count for both, dividing K. Returns the block count (0: no scales).
std::size_t read_block_scales(const MembersByName& by, const std::string& name, const Shape3& sa, const Shape3& sb,
                              const std::string& source, MmaSetOperands& operands) {
  const auto sa_it = by.find(name + "_SA"), sbt_it = by.find(name + "_SBt");
  if ((sa_it == by.end()) != (sbt_it == by.end()))
    throw InputError(source, sa_it == by.end() ? name + "_SA" : name + "_SBt",
                     "missing: set '" + name + "' has block scales for one operand only (S_SA and S_SBt go together)");
  if (sa_it == by.end()) return 0;
  const Shape3 ssa = shape3(*sa_it->second, source, sa_it->first), ssb = shape3(*sbt_it->second, source, sbt_it->first);
  for (const auto& [it, shape, x] : {std::tuple{sa_it, ssa, sa.x}, std::tuple{sbt_it, ssb, sb.x}}) {
    if (it->second->dtype != DType::u8)
      throw InputError(source, it->first, "dtype " + std::string(dtype_name(it->second->dtype)) +
                                              ": block scale codes are uint8");
    if (shape.lead != sa.lead || shape.x != x || shape.y != ssa.y || shape.y == 0 || sa.y % shape.y != 0)
      throw InputError(source, it->first, "shape " + it->second->shape_string() + ": expected [..., " +
                                              std::to_string(x) + ", K/block] with the same blocks for both "
                                              "operands and K = " + std::to_string(sa.y) + " a multiple of them");
  }
  for (const auto& [it, dst] : {std::pair{sa_it, &operands.sa}, std::pair{sbt_it, &operands.sbt}}) {
    const auto* p = reinterpret_cast<const std::uint8_t*>(it->second->bytes.data());
    dst->assign(p, p + it->second->bytes.size());
  }
  return ssa.y;
}

// One set's variants (one per output), sharing the set's operands: its members checked, its codes, C and scales read.
void add_set(const MembersByName& by, const NamedTensor& member, const std::vector<const NamedTensor*>& outputs,
             const std::string& source, std::vector<MmaVectorSet>& sets) {
  const std::string name = member.name.substr(0, member.name.size() - 2);
  const auto bt_it = by.find(name + "_Bt");
  if (bt_it == by.end()) throw InputError(source, name + "_Bt", "missing: set '" + name + "' has an _A member");
  if (outputs.empty())
    throw InputError(source, name + "_D", "missing: set '" + name + "' has no output (_D or _<variant>_D)");
  const Tensor& a = member.tensor;
  const Tensor& bt = *bt_it->second;
  const Shape3 sa = shape3(a, source, member.name), sb = shape3(bt, source, name + "_Bt");
  if (sa.lead != sb.lead || sa.y != sb.y)
    throw InputError(source, name + "_Bt", "shape " + bt.shape_string() + " does not fit " + name + "_A " +
                                               a.shape_string() + " (expected [..., N, K] with the same ... and K)");
  if (a.dtype != bt.dtype)
    throw InputError(source, name + "_Bt", "dtype " + std::string(dtype_name(bt.dtype)) + " differs from " + name +
                                               "_A's " + std::string(dtype_name(a.dtype)));
  for (const NamedTensor* out : outputs) {
    check_output_shape(out->tensor, out->name, source, sa, sb);
    if (out->name.size() == name.size() + 3)  // S__D
      throw InputError(source, out->name, "an output S_<variant>_D needs a variant name (S_D has none)");
  }
  auto operands = std::make_shared<MmaSetOperands>();
  operands->a = codes_of(a, source, member.name);
  operands->bt = codes_of(bt, source, name + "_Bt");
  if (const auto c = by.find(name + "_C"); c != by.end()) {
    check_output_shape(*c->second, c->first, source, sa, sb);
    operands->c = floats_of(*c->second, source, c->first);
  }
  MmaVectorSet base;
  base.name = name;
  base.scale_blocks = read_block_scales(by, name, sa, sb, source, *operands);
  base.batch = sa.batch;
  base.rows = sa.x;
  base.cols = sb.x;
  base.depth = sa.y;
  base.input_bits = a.dtype == DType::u8 ? 8 : 16;
  base.a = operands->a;
  base.bt = operands->bt;
  base.c = operands->c;
  base.sa = operands->sa;
  base.sbt = operands->sbt;
  base.operands = std::move(operands);
  for (const NamedTensor* out : outputs) {
    const std::string& key = out->name;
    MmaVectorSet s = base;
    s.variant = key == name + "_D" ? "" : key.substr(name.size() + 1, key.size() - name.size() - 3);
    s.d = floats_of(out->tensor, source, key);
    s.f16_output = out->tensor.dtype == DType::f16;
    sets.push_back(std::move(s));
  }
}

}  // namespace

std::vector<MmaVectorSet> mma_vector_sets(const std::vector<NamedTensor>& members, const std::string& source) {
  std::size_t total = 0;
  for (const NamedTensor& t : members) total += t.tensor.bytes.size();
  if (total > kMmaMaxVectorBytes)
    throw InputError(source, "members", "hold " + std::to_string(total) + " bytes, beyond the bound of " +
                                            std::to_string(kMmaMaxVectorBytes) + " bytes (256 MiB, docs/mma.md)");
  MembersByName by;
  for (const NamedTensor& t : members) by[t.name] = &t.tensor;
  const SetMembers found = find_sets(members, source);
  std::vector<MmaVectorSet> sets;
  for (std::size_t i = 0; i < found.a.size(); ++i) add_set(by, *found.a[i], found.outputs[i], source, sets);
  if (sets.empty()) throw InputError(source, "members", "no set: no member named <set>_A (docs/mma.md \"Vector files\")");
  return sets;
}

namespace {

void check_fits(const MmaModel& m, const MmaVectorSet& set) {
  if (mma_input_bits(m.input) != set.input_bits)
    throw std::invalid_argument("model " + m.name + " takes " + std::to_string(mma_input_bits(m.input)) +
                                "-bit codes; set " + set.name + " holds " + std::to_string(set.input_bits) + "-bit codes");
  if ((m.accumulator == MmaAccumulator::f16) != set.f16_output)
    throw std::invalid_argument("model " + m.name + " has an " +
                                (m.accumulator == MmaAccumulator::f16 ? "f16" : "f32") + " accumulator; set " +
                                set.name + "'s D is " + (set.f16_output ? "float16" : "float32"));
  const std::size_t want = m.scale_block > 0 ? set.depth / static_cast<std::size_t>(m.scale_block) : 0;
  if (set.scale_blocks != want || (m.scale_block > 0 && set.depth % static_cast<std::size_t>(m.scale_block) != 0))
    throw std::invalid_argument("model " + m.name + " takes " +
                                (m.scale_block > 0 ? std::string(mma_scale_name(m.scale)) + " scales per " +
                                                         std::to_string(m.scale_block) + " k"
                                                   : std::string("no block scales")) +
                                "; set " + set.name + " holds " +
                                (set.scale_blocks > 0 ? std::to_string(set.scale_blocks) + " scales per row (K = " +
                                                            std::to_string(set.depth) + ")"
                                                      : std::string("none")));
}

std::size_t tests_of(const MmaVectorSet& set, std::size_t limit) {
  return limit > 0 ? std::min(limit, set.batch) : set.batch;
}

// The model's outputs for the first `tests` tests of the set: tests x rows x cols.
std::vector<float> model_outputs(const MmaModel& m, const MmaVectorSet& set, std::size_t tests) {
  const std::size_t mk = set.rows * set.depth, nk = set.cols * set.depth, mn = set.rows * set.cols,
                    ms = set.rows * set.scale_blocks, ns = set.cols * set.scale_blocks;
  std::vector<float> d(tests * mn);
  for (std::size_t t = 0; t < tests; ++t)
    mma_matmul(m, set.a.subspan(t * mk, mk), set.bt.subspan(t * nk, nk),
               set.c.empty() ? set.c : set.c.subspan(t * mn, mn), std::span(d).subspan(t * mn, mn), set.rows,
               set.cols, set.depth, set.sa.subspan(t * ms, ms), set.sbt.subspan(t * ns, ns));
  return d;
}

MmaAgreement agreement(const std::vector<float>& model, const MmaVectorSet& set) {
  MmaAgreement r;
  for (std::size_t i = 0; i < model.size(); ++i) {
    const float gpu = set.d[i];
    ++r.outputs;
    if (same_bits(model[i], gpu, set.f16_output)) {
      ++r.equal;
    } else if (!std::isfinite(model[i]) || !std::isfinite(gpu)) {
      ++r.nonfinite;
    } else if (gpu == 0) {
      ++r.gpu_zero;
    } else {
      r.max_rel_error = std::max(r.max_rel_error, std::fabs(static_cast<double>(model[i]) - gpu) / std::fabs(gpu));
    }
  }
  return r;
}

}  // namespace

MmaAgreement mma_agreement(const MmaModel& m, const MmaVectorSet& set, std::size_t limit) {
  check_fits(m, set);
  return agreement(model_outputs(m, set, tests_of(set, limit)), set);
}

std::vector<MmaAgreement> mma_agreements(const MmaModel& m, const std::vector<MmaVectorSet>& sets, std::size_t limit) {
  std::vector<MmaAgreement> out;
  std::vector<float> model;
  const MmaVectorSet* modelled = nullptr;  // the set `model` was computed for
  for (const MmaVectorSet& s : sets) {
    check_fits(m, s);
    if (modelled == nullptr || s.operands == nullptr || s.operands != modelled->operands) {
      model = model_outputs(m, s, tests_of(s, limit));
      modelled = &s;
    }
    out.push_back(agreement(model, s));
  }
  return out;
}

std::string mma_set_preset(const std::string& set_name) {
  const std::size_t dot = set_name.find('.');
  if (dot == std::string::npos) return "";
  const std::string prefix = set_name.substr(0, dot);
  for (const MmaModel& m : mma_presets())
    if (m.name == prefix) return prefix;
  return "";
}

MmaModel mma_fit(const MmaModel& start, const std::vector<MmaVectorSet>& sets, std::size_t limit,
                 std::vector<std::string>* log) {
  const bool any_depth_not_4 = std::any_of(sets.begin(), sets.end(), [](const MmaVectorSet& s) { return s.depth % 4; });
  auto score = [&](const MmaModel& m) {
    if (m.partition == MmaPartition::k_mod4_pairs && any_depth_not_4) return std::size_t{0};
    std::size_t equal = 0;
    try {
      for (const MmaAgreement& r : mma_agreements(m, sets, limit)) equal += r.equal;
    } catch (const std::invalid_argument&) {
      return std::size_t{0};
    }
    return equal;
  };
  std::size_t total = 0;
  for (const MmaVectorSet& s : sets) total += tests_of(s, limit) * s.rows * s.cols;
  const std::size_t start_score = score(start);
  // The search moves the parameters of the fused step, which a per-product model does not read: it starts from the
  // same model without per-product rounding.
  MmaModel best = start;
  best.per_product = false;
  std::size_t best_score = start.per_product ? score(best) : start_score;
  auto note = [&](const std::string& what) {
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
    try_values([](MmaModel& m, int v) { m.exponent_rule = static_cast<MmaExponentRule>(v); }, {0, 1, 2, 3},
               "exponent_rule");
    try_values([](MmaModel& m, int v) { m.partition = static_cast<MmaPartition>(v); }, {0, 1}, "partition");
    try_values([](MmaModel& m, int v) { m.c_add = static_cast<MmaCAdd>(v); }, {0, 1}, "c_add");
    try_values([](MmaModel& m, int v) { m.promote_steps = v; }, promote, "promote_steps");
  }
  if (best_score <= start_score) {
    if (log != nullptr)
      log->push_back("no change: no setting reproduces more than the " + std::to_string(start_score) + " / " +
                     std::to_string(total) + " outputs of " + start.name + ", which is kept as it is");
    return start;
  }
  best.validated = false;
  best.name = start.name + "-fit";
  best.provenance = "fitted by mma_fit from " + start.name;
  return best;
}

}  // namespace qattn::ref

#include "qattn/method.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <mutex>
#include <stdexcept>

#include "qattn/error.h"

namespace qattn {
namespace {

bool valid_identifier(std::string_view s) {
  if (s.empty()) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' || c == '.';
  });
}

std::string join(const std::vector<std::string>& v, const char* sep = ", ") {
  std::string s;
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? sep : "") + v[i];
  return s;
}

bool parse_integer(const std::string& s, long long* out) {
  if (s.empty()) return false;
  errno = 0;
  char* end = nullptr;
  *out = std::strtoll(s.c_str(), &end, 10);
  return errno == 0 && end == s.c_str() + s.size();
}

bool parse_real(const std::string& s, double* out) {
  if (s.empty()) return false;
  errno = 0;
  char* end = nullptr;
  *out = std::strtod(s.c_str(), &end);
  return errno == 0 && end == s.c_str() + s.size() && std::isfinite(*out);
}

std::string describe_param(const ParamInfo& p) {
  switch (p.type) {
    case ParamType::choice: return p.key + " (one of " + join(p.choices, "|") + ")";
    case ParamType::boolean: return p.key + " (true|false)";
    case ParamType::integer: return p.key + " (integer)";
    case ParamType::real: return p.key + " (real)";
    case ParamType::text: return p.key + " (text)";
  }
  return p.key;
}

// A bound of a real parameter's range as the message shows it: 6 significant digits; the defaults +-1e300 as +-inf.
std::string range_bound(double v) {
  if (v <= -1e299) return "-inf";
  if (v >= 1e299) return "inf";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

void validate(const MethodEntry& e, const ParamInfo& p, const std::string& value) {
  const std::string where = "method '" + e.name + "', key '" + p.key + "': ";
  // A value holding ':' is most often the next key joined with the wrong separator ("b=4:c=5")
  const std::string hint = value.find(':') != std::string::npos
                               ? " (parameters are separated by commas: " + e.name + ":key=value,key=value)"
                               : "";
  switch (p.type) {
    case ParamType::integer: {
      long long v;
      if (!parse_integer(value, &v)) throw SpecError(where + "'" + value + "' is not an integer" + hint);
      if (v < p.min || v > p.max)
        throw SpecError(where + value + " is outside [" + std::to_string(static_cast<long long>(p.min)) + ", " +
                        std::to_string(static_cast<long long>(p.max)) + "]");
      break;
    }
    case ParamType::real: {
      double v;
      if (!parse_real(value, &v)) throw SpecError(where + "'" + value + "' is not a finite real number" + hint);
      if (v < p.min || v > p.max)
        throw SpecError(where + value + " is outside [" + range_bound(p.min) + ", " + range_bound(p.max) + "]");
      break;
    }
    case ParamType::choice:
      if (std::find(p.choices.begin(), p.choices.end(), value) == p.choices.end())
        throw SpecError(where + "'" + value + "' is not one of " + join(p.choices, "|") + hint);
      break;
    case ParamType::boolean:
      if (value != "true" && value != "false") throw SpecError(where + "'" + value + "' is not true|false" + hint);
      break;
    case ParamType::text: break;  // the method checks it when it is built
  }
}

}  // namespace

MethodSpec parse_method_spec(std::string_view text) {
  MethodSpec spec;
  const std::string full(text);
  const std::size_t colon = text.find(':');
  std::string_view head = text.substr(0, colon);
  const std::size_t at = head.find('@');
  spec.name = std::string(head.substr(0, at));
  if (at != std::string_view::npos) {
    spec.preset = std::string(head.substr(at + 1));
    if (!valid_identifier(spec.preset)) throw SpecError("method spec '" + full + "': empty or malformed preset after '@'");
  }
  if (!valid_identifier(spec.name))
    throw SpecError("method spec '" + full + "': expected name[@preset][:key=value,...]");
  if (colon == std::string_view::npos) return spec;
  std::string_view rest = text.substr(colon + 1);
  if (rest.empty()) throw SpecError("method spec '" + full + "': nothing after ':'");
  {  // a bare first value
    const std::string_view first = rest.substr(0, rest.find(','));
    if (!first.empty() && first.find('=') == std::string_view::npos) {
      spec.positional = std::string(first);
      rest = rest.substr(first.size());
      if (!rest.empty()) {
        rest = rest.substr(1);
        if (rest.empty()) throw SpecError("method spec '" + full + "': trailing ','");
      }
    }
  }
  while (!rest.empty()) {
    const std::size_t comma = rest.find(',');
    const std::string_view item = rest.substr(0, comma);
    const std::size_t eq = item.find('=');
    if (eq == std::string_view::npos || eq == 0 || eq + 1 == item.size())
      throw SpecError("method spec '" + full + "': '" + std::string(item) + "' is not key=value");
    const std::string key(item.substr(0, eq));
    for (const auto& [k, v] : spec.overrides)
      if (k == key) throw SpecError("method spec '" + full + "': key '" + key + "' given twice");
    spec.overrides.emplace_back(key, std::string(item.substr(eq + 1)));
    if (comma == std::string_view::npos) break;
    rest = rest.substr(comma + 1);
    if (rest.empty()) throw SpecError("method spec '" + full + "': trailing ','");
  }
  return spec;
}

const std::string& ParamMap::raw(const std::string& key) const {
  const auto it = values_.find(key);
  if (it == values_.end()) throw std::logic_error("ParamMap: no parameter '" + key + "'");
  return it->second;
}
long long ParamMap::integer(const std::string& key) const {
  long long v;
  if (!parse_integer(raw(key), &v)) throw std::logic_error("ParamMap: '" + key + "' is not an integer");
  return v;
}
double ParamMap::real(const std::string& key) const {
  double v;
  if (!parse_real(raw(key), &v)) throw std::logic_error("ParamMap: '" + key + "' is not real");
  return v;
}
const std::string& ParamMap::choice(const std::string& key) const { return raw(key); }
bool ParamMap::boolean(const std::string& key) const { return raw(key) == "true"; }

RowMatrixXb AttentionMask::visible(Eigen::Index lq, Eigen::Index lk) const {
  if (valid.size() != 0 && (valid.rows() != lq || valid.cols() != lk))
    throw std::invalid_argument("attention mask is " + std::to_string(valid.rows()) + "x" + std::to_string(valid.cols()) +
                                ", logits are " + std::to_string(lq) + "x" + std::to_string(lk));
  RowMatrixXb v = valid.size() ? valid : RowMatrixXb::Constant(lq, lk, true);
  if (causal)
    for (Eigen::Index i = 0; i < lq; ++i)
      for (Eigen::Index j = std::max<Eigen::Index>(0, i + (lk - lq) + causal_shift + 1); j < lk; ++j) v(i, j) = false;
  return v;
}

AttentionMask AttentionMask::rows(Eigen::Index r0, Eigen::Index n, Eigen::Index lq) const {
  AttentionMask m;
  if (valid.size() != 0) {
    if (valid.rows() != lq)
      throw std::invalid_argument("attention mask has " + std::to_string(valid.rows()) + " rows, the call " +
                                  std::to_string(lq) + " queries");
    m.valid = valid.middleRows(r0, n);
  }
  m.causal = causal;
  m.causal_shift = causal ? causal_shift + r0 + n - lq : 0;
  return m;
}

void AttentionMask::apply_to_logits(RowMatrixXd& logits) const {
  if (empty()) return;
  const RowMatrixXb v = visible(logits.rows(), logits.cols());
  for (Eigen::Index i = 0; i < logits.size(); ++i)
    if (!v.data()[i]) logits.data()[i] = -std::numeric_limits<double>::infinity();
}

namespace {

// The first entry of x that `bad` rejects, as an InputError naming `tensor`, the index and the value.
template <class View, class Bad>
void check_entries(const View& x, const std::string& tensor, Bad bad) {
  for (Eigen::Index i = 0; i < x.rows(); ++i)
    for (Eigen::Index j = 0; j < x.cols(); ++j) {
      const double v = x(i, j);
      if (!bad(v)) continue;
      const std::string what = std::isnan(v) ? "NaN" : v > 0 ? "+inf" : "-inf";
      throw InputError(tensor, "[" + std::to_string(i) + ", " + std::to_string(j) + "]",
                       "is " + what + "; non-finite input is refused (docs/non-finite.md)");
    }
}

// Every row of x finite (Eigen's allFinite on a strided Ref is a scalar loop, several times slower).
template <class View>
bool rows_finite(const View& x) {
  using Scalar = typename View::Scalar;
  for (Eigen::Index i = 0; i < x.rows(); ++i) {
    const std::span<const Scalar> row(x.row(i).data(), static_cast<std::size_t>(x.cols()));
    if (finite_prefix(row) != row.size()) return false;
  }
  return true;
}

}  // namespace

void require_finite(const MatrixView& x, const std::string& tensor) {
  if (rows_finite(x)) return;
  check_entries(x, tensor, [](double v) { return !std::isfinite(v); });
}

void require_finite(const MatrixViewF& x, const std::string& tensor) {
  if (rows_finite(x)) return;
  check_entries(x, tensor, [](double v) { return !std::isfinite(v); });
}

void require_softmax_logits(const MatrixView& x, const std::string& tensor) {
  if (rows_finite(x)) return;
  check_entries(x, tensor, [](double v) { return std::isnan(v) || v == std::numeric_limits<double>::infinity(); });
}

void require_softmax_logits(const MatrixViewF& x, const std::string& tensor) {
  if (rows_finite(x)) return;
  check_entries(x, tensor, [](double v) { return std::isnan(v) || v == std::numeric_limits<double>::infinity(); });
}

void require_attention_shapes(const MatrixView& q, const MatrixView& k, const MatrixView& v) {
  if (q.cols() != k.cols() || k.rows() != v.rows())
    throw std::invalid_argument("attention: q [" + std::to_string(q.rows()) + ", " + std::to_string(q.cols()) +
                                "], k [" + std::to_string(k.rows()) + ", " + std::to_string(k.cols()) + "], v [" +
                                std::to_string(v.rows()) + ", " + std::to_string(v.cols()) + "] do not fit");
}

namespace {

template <class View>
void require_attention_inputs(const View& q, const View& k, const View& v, double scale) {
  require_finite(q, "Q");
  require_finite(k, "K");
  require_finite(v, "V");
  if (!(std::isfinite(scale) && scale > 0))
    throw InputError("scale", "value", std::to_string(scale) + " is not a finite number > 0");
}

template <class View>
void require_heads(const std::vector<View>& q, const std::vector<View>& k, const std::vector<View>& v, double scale) {
  if (q.size() != k.size() || k.size() != v.size()) throw std::invalid_argument("attention_heads: head counts of q, k, v differ");
  for (std::size_t h = 0; h < q.size(); ++h) require_attention_inputs(q[h], k[h], v[h], scale);
}

}  // namespace

void throw_logit_overflow(const std::string& method, const std::string& format, Eigen::Index i, Eigen::Index j) {
  throw InputError("logits", "[" + std::to_string(i) + ", " + std::to_string(j) + "]",
                   "scale * q k^T overflows " + format + ", in which " + method +
                       " forms its logits; the inputs are too large for this method (docs/non-finite.md)");
}

RowMatrixXd Method::softmax_rows(const MatrixView& logits) const {
  require_softmax_logits(logits, "logits");
  return softmax_rows_impl(logits);
}

RowMatrixXd Method::softmax_rows(const MatrixViewF& logits) const {
  require_softmax_logits(logits, "logits");
  return softmax_rows_f32_impl(logits);
}

RowMatrixXd Method::softmax_rows_f32_impl(const MatrixViewF& logits) const {
  const RowMatrixXd widened = logits.cast<double>();
  return softmax_rows_impl(widened);
}

AttentionResult Method::attention(const MatrixView& q, const MatrixView& k, const MatrixView& v, double scale,
                                  const AttentionMask& mask) const {
  require_attention_inputs(q, k, v, scale);
  return attention_impl(q, k, v, scale, mask);
}

// The default preparation: nothing tensor-wide, so a block of rows is an attention call of its own. prepare() has
// checked the whole inputs, so a block does not check K and V again (O(L_k d) per block).
class Method::SlicedCall final : public PreparedCall {
 public:
  SlicedCall(const Method& method, const MatrixView& q, const MatrixView& k, const MatrixView& v, double scale,
             const AttentionMask& mask)
      : PreparedCall(q.rows()), method_(method), q_(q), k_(k), v_(v), scale_(scale), mask_(mask) {}

 protected:
  AttentionResult rows_impl(Eigen::Index r0, Eigen::Index n) const override {
    return method_.attention_impl(q_.middleRows(r0, n), k_, v_, scale_, mask_.rows(r0, n, q_.rows()));
  }

 private:
  const Method& method_;
  const MatrixView q_, k_, v_;
  double scale_;
  const AttentionMask& mask_;
};

std::unique_ptr<PreparedCall> Method::prepare(const MatrixView& q, const MatrixView& k, const MatrixView& v,
                                              double scale, const AttentionMask& mask) const {
  require_attention_inputs(q, k, v, scale);
  if (mask.valid.size() != 0 && (mask.valid.rows() != q.rows() || mask.valid.cols() != k.rows()))
    throw std::invalid_argument("attention mask is " + std::to_string(mask.valid.rows()) + "x" +
                                std::to_string(mask.valid.cols()) + ", logits are " + std::to_string(q.rows()) + "x" +
                                std::to_string(k.rows()));
  return prepare_impl(q, k, v, scale, mask);
}

std::unique_ptr<PreparedCall> Method::prepare_impl(const MatrixView& q, const MatrixView& k, const MatrixView& v,
                                                   double scale, const AttentionMask& mask) const {
  return std::make_unique<SlicedCall>(*this, q, k, v, scale, mask);
}

AttentionResult PreparedCall::rows(Eigen::Index r0, Eigen::Index n) const {
  if (r0 < 0 || n < 1 || r0 + n > query_rows_)
    throw std::out_of_range("prepared attention call: rows [" + std::to_string(r0) + ", " + std::to_string(r0 + n) +
                            ") of " + std::to_string(query_rows_));
  return rows_impl(r0, n);
}

std::optional<AttentionResult> PreparedCall::rows_from_logits(Eigen::Index r0, Eigen::Index n,
                                                              const RowMatrixXd& logits) const {
  if (r0 < 0 || n < 1 || r0 + n > query_rows_ || logits.rows() != n)
    throw std::out_of_range("prepared attention call: rows [" + std::to_string(r0) + ", " + std::to_string(r0 + n) +
                            ") of " + std::to_string(query_rows_) + " with logits of " +
                            std::to_string(logits.rows()) + " rows");
  return rows_from_logits_impl(r0, n, logits);
}

std::vector<AttentionResult> Method::attention_heads(const std::vector<MatrixView>& q, const std::vector<MatrixView>& k,
                                                     const std::vector<MatrixView>& v, double scale,
                                                     const AttentionMask& mask) const {
  require_heads(q, k, v, scale);
  return attention_heads_impl(q, k, v, scale, mask);
}

std::vector<AttentionResult> Method::attention_heads_impl(const std::vector<MatrixView>& q,
                                                          const std::vector<MatrixView>& k,
                                                          const std::vector<MatrixView>& v, double scale,
                                                          const AttentionMask& mask) const {
  std::vector<AttentionResult> out;
  out.reserve(q.size());
  for (std::size_t h = 0; h < q.size(); ++h) out.push_back(attention_impl(q[h], k[h], v[h], scale, mask));
  return out;
}

std::vector<AttentionResult> Method::attention_heads(const std::vector<MatrixViewF>& q,
                                                     const std::vector<MatrixViewF>& k,
                                                     const std::vector<MatrixViewF>& v, double scale,
                                                     const AttentionMask& mask) const {
  require_heads(q, k, v, scale);
  return attention_heads_f32_impl(q, k, v, scale, mask);
}

std::vector<AttentionResult> Method::attention_heads_f32_impl(const std::vector<MatrixViewF>& q,
                                                              const std::vector<MatrixViewF>& k,
                                                              const std::vector<MatrixViewF>& v, double scale,
                                                              const AttentionMask& mask) const {
  const auto widen = [](const std::vector<MatrixViewF>& x) {
    std::vector<RowMatrixXd> out;
    out.reserve(x.size());
    for (const MatrixViewF& m : x) out.emplace_back(m.cast<double>());
    return out;
  };
  const std::vector<RowMatrixXd> qd = widen(q), kd = widen(k), vd = widen(v);
  return attention_heads_impl(views(qd), views(kd), views(vd), scale, mask);
}

IntegerSoftmaxResult Method::softmax_integer_impl(const IntegerLogits&) const {
  throw SpecError("this method has no integer-logit softmax; give it floating-point logits");
}

std::string_view method_kind_name(MethodKind kind) {
  static constexpr Choice<MethodKind> kKinds[] = {{"float format", MethodKind::float_format},
                                                  {"softmax model", MethodKind::softmax_model},
                                                  {"attention pipeline", MethodKind::attention_pipeline}};
  return name_of(kKinds, kind, "");
}

namespace {

std::mutex& alias_notice_lock() {
  static std::mutex m;
  return m;
}
std::function<void(const std::string&)>& alias_notice() {
  static std::function<void(const std::string&)> f;
  return f;
}

}  // namespace

void set_preset_alias_notice(std::function<void(const std::string&)> notice) {
  const std::lock_guard<std::mutex> hold(alias_notice_lock());
  alias_notice() = std::move(notice);
}

void Registry::add(MethodEntry entry) {
  if (find(entry.name)) throw std::logic_error("Registry: duplicate method '" + entry.name + "'");
  for (const PresetInfo& pr : entry.presets) {
    if (pr.alias_of.empty()) continue;
    const auto target = std::find_if(entry.presets.begin(), entry.presets.end(),
                                     [&](const PresetInfo& p) { return p.name == pr.alias_of; });
    if (!pr.values.empty() || target == entry.presets.end() || !target->alias_of.empty())
      throw std::logic_error("Registry: preset alias '" + entry.name + "@" + pr.name +
                             "' needs no values and a preset that is not an alias ('" + pr.alias_of + "')");
  }
  for (const PresetInfo& pr : entry.presets)
    for (const auto& [key, v] : pr.values) {
      const std::string& k = key;  // a structured binding cannot be captured by a lambda in C++20
      const auto it = std::find_if(entry.params.begin(), entry.params.end(), [&](const ParamInfo& p) { return p.key == k; });
      if (it == entry.params.end())
        throw std::logic_error("Registry: preset '" + entry.name + "@" + pr.name + "' sets unknown key '" + k + "'");
      validate(entry, *it, v);
    }
  for (const ParamInfo& p : entry.params) validate(entry, p, p.default_value);
  entries_.push_back(std::move(entry));
}

const MethodEntry* Registry::find(std::string_view name) const {
  for (const MethodEntry& e : entries_)
    if (e.name == name) return &e;
  return nullptr;
}

ParamMap Registry::resolve(const MethodSpec& spec) const {
  const MethodEntry* e = find(spec.name);
  if (!e) {
    std::vector<std::string> names;
    for (const MethodEntry& m : entries_) names.push_back(m.name);
    throw SpecError("unknown method '" + spec.name + "' (valid: " + join(names) + ")");
  }
  std::map<std::string, std::string> values;
  for (const ParamInfo& p : e->params) values[p.key] = p.default_value;
  if (!spec.preset.empty()) {
    const auto pr = std::find_if(e->presets.begin(), e->presets.end(), [&](const PresetInfo& p) { return p.name == spec.preset; });
    if (pr == e->presets.end()) {
      std::vector<std::string> names;
      for (const PresetInfo& p : e->presets) names.push_back("@" + p.name);
      throw SpecError("method '" + e->name + "' has no preset '@" + spec.preset + "' (valid: " +
                      (names.empty() ? std::string("none") : join(names)) + ")");
    }
    const PresetInfo* chosen = &*pr;
    if (!pr->alias_of.empty()) {
      chosen = &*std::find_if(e->presets.begin(), e->presets.end(), [&](const PresetInfo& p) { return p.name == pr->alias_of; });
      std::function<void(const std::string&)> notice;
      {
        const std::lock_guard<std::mutex> hold(alias_notice_lock());
        notice = alias_notice();
      }
      if (notice)  // called without the lock: it may take its own (Python's GIL) or resolve a spec itself
        notice(e->name + "@" + pr->name + " now means " + e->name + "@" + chosen->name +
               ", the preset named after the kernel it matches (`qattn methods` describes it); the old spelling "
               "is kept for this release");
    }
    for (const auto& [k, v] : chosen->values) values[k] = v;
  }
  std::vector<std::pair<std::string, std::string>> overrides = spec.overrides;
  if (!spec.positional.empty()) {
    if (e->positional_key.empty())
      throw SpecError("method '" + e->name + "': '" + spec.positional + "' is not key=value");
    for (const auto& [k, v] : overrides)
      if (k == e->positional_key)
        throw SpecError("method '" + e->name + "': key '" + k + "' given twice (" + e->name + ":" + spec.positional +
                        " sets it)");
    overrides.insert(overrides.begin(), {e->positional_key, spec.positional});
  }
  for (const auto& [key, v] : overrides) {
    const std::string& k = key;
    const auto it = std::find_if(e->params.begin(), e->params.end(), [&](const ParamInfo& p) { return p.key == k; });
    if (it == e->params.end()) {
      std::vector<std::string> keys;
      for (const ParamInfo& p : e->params) keys.push_back(describe_param(p));
      throw SpecError("method '" + e->name + "' has no key '" + k + "' (valid: " +
                      (keys.empty() ? std::string("none, it takes no parameters") : join(keys)) + ")");
    }
    validate(*e, *it, v);
    values[k] = v;
  }
  return ParamMap(std::move(values));
}

std::unique_ptr<Method> Registry::create(const MethodSpec& spec) const {
  const ParamMap params = resolve(spec);
  return find(spec.name)->make(params);
}

MethodTraits Registry::traits(const MethodSpec& spec) const {
  const ParamMap params = resolve(spec);
  return find(spec.name)->traits_of(params);
}

std::string Registry::canonical(const MethodSpec& spec) const {
  const ParamMap params = resolve(spec);
  const MethodEntry* e = find(spec.name);
  std::string s = e->name;
  char sep = ':';
  for (const ParamInfo& p : e->params) {
    if (p.type == ParamType::text && params.values().at(p.key).empty()) continue;
    s += sep + p.key + "=" + params.values().at(p.key);
    sep = ',';
  }
  return s;
}

}  // namespace qattn

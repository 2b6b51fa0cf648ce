// Method specs and the method registry: one parser and one registry shared by the CLI, the tests and the
// benchmarks. A spec reads
//
//     name[@preset][:key=value,key=value,...]
//
// e.g. "fp16", "index@paper", "index:b=5,c=6.6,p=u8". The preset's values apply first, then the explicit keys.
// Unknown names, presets or keys, and values that do not parse or lie outside their range, raise
// qattn::SpecError whose message lists what is valid.
//
// The registry only knows the interface. A method is described once, by its MethodEntry: name, summary, doc page,
// parameters and presets, its kind (which decides whether it has a softmax form), the traits the property suite
// checks and the analysis uses (MethodTraits), and its overflow rule. Nothing else in the program switches on a
// method's name. Implementations register themselves from reference/src/*/*_method.cc (reference/src/registry.cc).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "qattn/choice.h"
#include "qattn/tensor.h"

namespace qattn {

// text: any value; its meaning is the method's own (the fields of a kernel file, whose values it checks when it is
// built). An empty default means "not given": canonical() leaves such a key out.
enum class ParamType { integer, real, choice, boolean, text };

struct ParamInfo {
  std::string key;
  ParamType type;
  std::string default_value;
  std::string doc;
  std::vector<std::string> choices;  // for ParamType::choice
  double min = -1e300, max = 1e300;  // inclusive range for integer and real
};

struct PresetInfo {
  std::string name;
  std::map<std::string, std::string> values;
  std::string doc;
  // Non-empty: an old spelling of the preset of that name, kept for one release (no values or doc of its own); a
  // spec naming it resolves to that preset, and the notice (set_preset_alias_notice) says so.
  std::string alias_of;
};

// Called when a spec names a preset by an old spelling (PresetInfo::alias_of), with a line saying which preset it now
// means: the CLI prints it on stderr once per spelling, the Python package warns (FutureWarning). Nothing by default.
// Safe to set while other threads resolve specs.
void set_preset_alias_notice(std::function<void(const std::string&)> notice);

struct MethodSpec {
  std::string name;
  std::string preset;  // empty when none
  std::vector<std::pair<std::string, std::string>> overrides;
  std::string positional;  // a bare first value (file:PATH); empty when none
};

// Parses the syntax only; validation against a method's parameters happens in Registry::create. The first item after
// ':' may be a bare value (file:PATH): MethodSpec::positional, which the method's positional_key takes; it runs to
// the first ',' (a value holding ',' or '=' is given as key=value).
MethodSpec parse_method_spec(std::string_view text);

// Resolved, validated parameter values of one method instance.
class ParamMap {
 public:
  ParamMap() = default;
  explicit ParamMap(std::map<std::string, std::string> values) : values_(std::move(values)) {}
  long long integer(const std::string& key) const;
  double real(const std::string& key) const;
  const std::string& choice(const std::string& key) const;
  bool boolean(const std::string& key) const;
  const std::map<std::string, std::string>& values() const { return values_; }

 private:
  const std::string& raw(const std::string& key) const;
  std::map<std::string, std::string> values_;
};

// A choice parameter that selects an enum value: one name table per mode (qattn/choice.h), listing the names in the
// order `qattn methods` shows them. ParamInfo::choices is built from the table (choice_names), so the registry
// validates the text against it; choice_value then maps the validated text back (a name missing from the table would
// be a programming error: std::logic_error).
template <class Enum, std::size_t N>
std::vector<std::string> choice_names(const Choice<Enum> (&table)[N]) {
  std::vector<std::string> names;
  for (const Choice<Enum>& c : table) names.emplace_back(c.name);
  return names;
}
template <class Enum, std::size_t N>
Enum choice_value(const ParamMap& params, const std::string& key, const Choice<Enum> (&table)[N]) {
  const std::string& text = params.choice(key);
  if (const std::optional<Enum> value = value_named(table, text)) return *value;
  throw std::logic_error("choice '" + key + "=" + text + "' is not in its name table");
}

// Integer logits a with real logits alpha * a (INT32 Q K^T). Exactly one of cint / alpha is set: cint is the
// method's integer clip given directly, alpha lets the method derive its own. `values` views the caller's matrix,
// which must outlive the call.
struct IntegerLogits {
  IntMatrixView values;
  std::optional<std::int64_t> cint;
  std::optional<double> alpha;
};

// Softmax of integer logits: probabilities, plus the integer P and its scale when the method produces one.
struct IntegerSoftmaxResult {
  RowMatrixXd probabilities;
  std::optional<Tensor> raw;  // e.g. uint8 P with scale 255; shape [rows, L]
  double raw_scale = 1;       // probabilities = raw / raw_scale
};

// Which (query i, key j) pairs of one attention call take part. `valid` is empty (every pair) or [L_q, L_k]
// (a boolean padding mask: false = masked). Causal: query i sees key j iff j <= i + (L_k - L_q), i.e. aligned at
// the bottom right as in decoding, so that with L_q = L_k it is the lower triangle and the last query always sees
// every key. A query row with no visible key is fully masked: its P and O rows are all zeros.
// causal_shift moves the causal diagonal: query i sees key j iff j <= i + (L_k - L_q) + causal_shift. A block of
// rows [r0, r0 + n) of a causal call with L_q queries is itself a causal call with causal_shift = r0 + n - L_q, which
// is how a streamed evaluation (docs/streaming.md) hands a method one block of query rows.
struct AttentionMask {
  RowMatrixXb valid;
  bool causal = false;
  Eigen::Index causal_shift = 0;

  bool empty() const { return valid.size() == 0 && !causal; }
  // The mask of query rows [r0, r0 + n) of a call with lq query rows: those rows of `valid`, and the causal
  // diagonal shifted so that each row sees the keys it sees in the whole call.
  AttentionMask rows(Eigen::Index r0, Eigen::Index n, Eigen::Index lq) const;
  // The pairs as a matrix; throws std::invalid_argument if `valid` has another shape.
  RowMatrixXb visible(Eigen::Index lq, Eigen::Index lk) const;
  // Sets the logits of masked pairs to -inf.
  void apply_to_logits(RowMatrixXd& logits) const;
};

// Result of one attention call: O [L_q, d_v] and, where the method materialises it, P [L_q, L_k] as
// probabilities (integer P divided by its scale).
struct AttentionResult {
  RowMatrixXd o;
  RowMatrixXd p;
  RowMatrixXi32 p_int;  // the integer P of integer pipelines (empty otherwise); p = p_int / p_scale
  int p_scale = 0;
  DType p_dtype = DType::u8;
  // O in float32 in place of o, from a method built with EngineOptions::o_float32 that runs on the fused kernels
  // (their O is float32 already, so no float64 copy is made and o stays empty); empty otherwise. Where it is set,
  // o_f32.cast<double>() is exactly what o would hold.
  RowMatrixXf o_f32;
};

// The non-finite policy of the whole registry (docs/non-finite.md has the table, method by method):
//  - Q, K and V must be finite: NaN or +-inf anywhere is refused with an InputError naming the tensor ("Q", "K",
//    "V") and the first bad index, by every method, before it computes anything;
//  - logits given to softmax_rows may hold -inf, which means "masked" (P = 0 there; a row with every entry -inf is
//    fully masked and gives P = 0); NaN and +inf are refused the same way;
//  - what a method does when finite inputs overflow its own arithmetic (e.g. scale * q k^T beyond float32) is its
//    OverflowRule, declared in its registry entry.
// The public calls below check their inputs under this policy and then call the protected *_impl a method
// implements, so no method can skip the checks.
// Inputs are MatrixViews (qattn/tensor.h): a caller's RowMatrixXd, a block of whole rows or a mapped buffer reaches
// the method without a copy. A view may be a block of some columns, so a method reads it by row and column, or
// through packed_rows() where it walks data(); tests/unit/method_spec_test.cc runs every method on such a view.
class PreparedCall;

class Method {
 public:
  virtual ~Method() = default;
  // Row-wise softmax of logits [rows, L] as this method computes it, returned as probabilities.
  RowMatrixXd softmax_rows(const MatrixView& logits) const;
  // The same on float32 logits (a caller's float32 buffer): the float64 entry's bits on the widened values. fp32,
  // fp16 and bf16 round them to storage from the buffer; the default, for models that compute from float64, widens
  // the logits and calls softmax_rows_impl.
  RowMatrixXd softmax_rows(const MatrixViewF& logits) const;
  // Softmax of integer logits. Methods without an integer form keep the default, which throws SpecError.
  IntegerSoftmaxResult softmax_integer(const IntegerLogits& logits) const { return softmax_integer_impl(logits); }
  // softmax(scale * q k^T) v as this method computes it. q [L_q, d], k [L_k, d], v [L_k, d_v]; scale finite, > 0.
  AttentionResult attention(const MatrixView& q, const MatrixView& k, const MatrixView& v, double scale,
                            const AttentionMask& mask) const;
  // One whole attention call, prepared so that its result can be computed a block of query rows at a time
  // (docs/streaming.md): the first pass over the call happens here (a per-tensor Q scale, the INT8 codes of K and V,
  // a softmax model's tensor-wide statistic of the logits), and PreparedCall::rows(r0, n) then gives rows
  // r0 .. r0 + n - 1 of attention(q, k, v, scale, mask), bit for bit, for the blocks MethodTraits::query_block_rows
  // declares. q, k, v and mask are held by reference: they must outlive the returned call. Inputs are checked as by
  // attention(). The default prepares nothing and runs attention() on the block with its share of the mask
  // (AttentionMask::rows), which is exact for methods whose rows depend on nothing tensor-wide.
  std::unique_ptr<PreparedCall> prepare(const MatrixView& q, const MatrixView& k, const MatrixView& v, double scale,
                                        const AttentionMask& mask) const;
  // The heads of one layer, one attention call each (q[h], k[h], v[h]). Methods whose choices look across heads
  // (TurboAttention's head-wise KV precision) override the _impl; the default calls attention() per head.
  std::vector<AttentionResult> attention_heads(const std::vector<MatrixView>& q, const std::vector<MatrixView>& k,
                                               const std::vector<MatrixView>& v, double scale,
                                               const AttentionMask& mask) const;
  // The same call on float32 inputs (MatrixViewF: a caller's float32 buffer). Same policy, and the same bits as the
  // float64 entry on the widened values, which float32 widens to exactly. Methods whose first step quantises their
  // inputs read the float32 buffer as it is (the fused kernels of qattn/engine.h: no float64 copy is made); the
  // others widen the heads of this one call to float64 (a copy the size of their inputs, next to their own [L_q, L_k]
  // float64 logits and P) and run the float64 entry.
  std::vector<AttentionResult> attention_heads(const std::vector<MatrixViewF>& q, const std::vector<MatrixViewF>& k,
                                               const std::vector<MatrixViewF>& v, double scale,
                                               const AttentionMask& mask) const;

 protected:
  virtual RowMatrixXd softmax_rows_impl(const MatrixView& logits) const = 0;
  virtual RowMatrixXd softmax_rows_f32_impl(const MatrixViewF& logits) const;
  virtual IntegerSoftmaxResult softmax_integer_impl(const IntegerLogits& logits) const;
  virtual AttentionResult attention_impl(const MatrixView& q, const MatrixView& k, const MatrixView& v,
                                         double scale, const AttentionMask& mask) const = 0;
  virtual std::vector<AttentionResult> attention_heads_impl(const std::vector<MatrixView>& q,
                                                            const std::vector<MatrixView>& k,
                                                            const std::vector<MatrixView>& v, double scale,
                                                            const AttentionMask& mask) const;
  // Default: widens the heads to float64 and calls attention_heads_impl.
  virtual std::vector<AttentionResult> attention_heads_f32_impl(const std::vector<MatrixViewF>& q,
                                                                const std::vector<MatrixViewF>& k,
                                                                const std::vector<MatrixViewF>& v, double scale,
                                                                const AttentionMask& mask) const;
  virtual std::unique_ptr<PreparedCall> prepare_impl(const MatrixView& q, const MatrixView& k, const MatrixView& v,
                                                     double scale, const AttentionMask& mask) const;

 private:
  class SlicedCall;  // the default prepared call: attention_impl on each block, the inputs checked once in prepare()
};

// An attention call after Method::prepare. rows() may be called from several threads at once.
class PreparedCall {
 public:
  virtual ~PreparedCall() = default;
  // Rows [r0, r0 + n) of the call's O and P (n >= 1, r0 + n <= L_q; std::out_of_range otherwise).
  AttentionResult rows(Eigen::Index r0, Eigen::Index n) const;
  // The same rows from their logits, for a call whose softmax reads the float64 logits scale * q k^T (a softmax
  // model: MethodKind::softmax_model): `logits` [n, L_k] must be those rows' logits as the fp64 reference forms
  // them, (fl(q k^T) * scale, q k^T by qattn::ref::product_abt, masked pairs -inf), and the result is rows(r0, n)'s, bit for bit.
  // An evaluation computes them once per block for its reference and every softmax model. nullopt where the call
  // does not read them so (every other method), or where a logit is +inf or NaN (rows() then names the overflow).
  std::optional<AttentionResult> rows_from_logits(Eigen::Index r0, Eigen::Index n, const RowMatrixXd& logits) const;
  Eigen::Index query_rows() const { return query_rows_; }

 protected:
  explicit PreparedCall(Eigen::Index query_rows) : query_rows_(query_rows) {}
  virtual AttentionResult rows_impl(Eigen::Index r0, Eigen::Index n) const = 0;
  virtual std::optional<AttentionResult> rows_from_logits_impl(Eigen::Index, Eigen::Index, const RowMatrixXd&) const {
    return std::nullopt;
  }

 private:
  Eigen::Index query_rows_;
};

// The input checks of the policy above, for code that takes tensors from users outside a Method. `tensor` names
// the tensor in the InputError ("Q", "logits", or a file name); the field is the first bad index, "[row, col]".
void require_finite(const MatrixView& x, const std::string& tensor);
// q [L_q, d], k [L_k, d], v [L_k, d_v] fit together; std::invalid_argument giving the three shapes otherwise.
void require_attention_shapes(const MatrixView& q, const MatrixView& k, const MatrixView& v);
void require_finite(const MatrixViewF& x, const std::string& tensor);
void require_softmax_logits(const MatrixView& x, const std::string& tensor);  // -inf allowed (masked)
void require_softmax_logits(const MatrixViewF& x, const std::string& tensor);

// The InputError of a method under OverflowRule::refuse whose logit (row i, key j) does not fit `format`.
[[noreturn]] void throw_logit_overflow(const std::string& method, const std::string& format, Eigen::Index i,
                                       Eigen::Index j);

// What a method does when finite inputs overflow its own arithmetic.
enum class OverflowRule {
  refuse,     // InputError naming the tensor whose values overflow and where (integer and quantised pipelines)
  propagate,  // the IEEE result of the method's format: the rows concerned come out NaN, never finite and wrong
};

// What a method is. The kind decides where the program uses it: the first two have a softmax form (softmax_rows,
// `analyze --softmax-only`); softmax models are the approximations the long-context experiment compares.
enum class MethodKind {
  float_format,        // softmax and attention carried out in one IEEE format (fp64, fp32, fp16, bf16)
  softmax_model,       // an approximate softmax; inside attention, exact fp64 logits and P V around it
  attention_pipeline,  // a whole attention pipeline with its own softmax inside: no softmax-only form
};
std::string_view method_kind_name(MethodKind kind);

// Properties of one method instance (they may depend on its parameters), declared by the entry and checked for every
// registered method and preset by tests/property/registry_property_test.cc.
struct MethodTraits {
  // softmax_rows(x + c) == softmax_rows(x) bit for bit, for logits x and a shift c that the method's input format
  // holds exactly. False where the input quantisation depends on the values (a max-|x| scale, an absolute grid).
  bool row_shift_invariant = false;
  // softmax_rows of one row alone == that row of a batch, bit for bit. False where a scale spans the tensor.
  bool rows_independent = true;
  // Attention with keys (and their values) reordered: |O' - O| <= key_order_tolerance * max|V|, and P's columns
  // reorder the same way within that tolerance. 0: exact (integer sums); empty: not invariant (scales per block
  // of keys).
  std::optional<double> key_order_tolerance = 0.0;
  // Masking a key for every query equals dropping it, to key_order_tolerance. False where a scale is computed over
  // all keys, masked ones included (the quantised pipelines' per-tensor K and V scales).
  bool masked_keys_dropped = true;
  // Nominal bits per element in which the method holds K and V during attention (scales and zero points excluded);
  // 0 for the softmax models, which leave Q, K, V and P V in fp64.
  double kv_bits = 0;
  // attention_heads(q, k, v) == attention(q[h], k[h], v[h]) for every head h, bit for bit: nothing the method
  // chooses looks across the heads of a layer. False for TurboAttention's head-wise KV precision. A sharded
  // `qattn analyze` (docs/scale-out.md) evaluates single heads of such methods only with their whole layer.
  bool heads_independent = true;
  // N > 0: query rows stream in blocks of N. For any block of query rows [r0, r1) with r0 a multiple of N and r1 a
  // multiple of N or L_q, prepare(q, k, v, scale, mask)->rows(r0, r1 - r0) gives exactly the whole call's rows
  // r0 .. r1 - 1 of O and P, bit for bit, so a streamed evaluation (docs/streaming.md) never holds an [L_q, L_k]
  // matrix for the method. 64 for methods built on Eigen's float GEMMs, whose per-element result is the same
  // wherever a block of 64 rows sits (checked, like every trait, for every method and preset); methods with a
  // tensor-wide statistic take it in prepare()'s first pass. 0: the method runs on whole heads.
  int query_block_rows = 0;
  // True where a result depends on the calls made before it (EXAQ's calibration over its first calls): an
  // evaluation then makes this method's calls one after another in the dump's (layer, batch entry) order.
  bool calls_in_order = false;
};

struct MethodEntry {
  std::string name;
  std::string summary;
  std::vector<ParamInfo> params;
  std::vector<PresetInfo> presets;
  std::function<std::unique_ptr<Method>(const ParamMap&)> make;
  OverflowRule overflow = OverflowRule::refuse;
  std::string overflow_note;  // one line: where the method's arithmetic overflows and what it then does
  MethodKind kind = MethodKind::softmax_model;
  std::string doc;  // its derivation page, relative to the source root: "docs/methods/exaq.md"
  bool reference = false;  // the fp64 reference every error table compares against (left out of default lists)
  std::function<MethodTraits(const ParamMap&)> traits;  // empty: MethodTraits{}
  std::string positional_key;    // NAME:VALUE sets this key (file:PATH sets path); empty: no bare value is taken
  bool in_default_lists = true;  // false for a method its defaults alone do not build (file): left out of the lists
                                 // of every method (analyze without --method, the leaderboard)

  bool has_softmax_form() const { return kind != MethodKind::attention_pipeline; }
  MethodTraits traits_of(const ParamMap& params) const { return traits ? traits(params) : MethodTraits{}; }
};

class Registry {
 public:
  // Throws std::logic_error on a duplicate name or a preset that names an unknown key.
  void add(MethodEntry entry);
  const MethodEntry* find(std::string_view name) const;
  const std::vector<MethodEntry>& entries() const { return entries_; }

  // Resolves defaults, preset and overrides, validates them, and builds the method.
  ParamMap resolve(const MethodSpec& spec) const;
  std::unique_ptr<Method> create(const MethodSpec& spec) const;
  std::unique_ptr<Method> create(std::string_view spec_text) const { return create(parse_method_spec(spec_text)); }
  // The traits of the resolved method (MethodEntry::traits_of).
  MethodTraits traits(const MethodSpec& spec) const;
  // The canonical spec text of a resolved method: "name:k=v,..." with every parameter listed.
  std::string canonical(const MethodSpec& spec) const;

 private:
  std::vector<MethodEntry> entries_;
};

}  // namespace qattn

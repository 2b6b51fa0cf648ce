// The "turboquant" KV quantizer (docs/quantizers.md): randomized Hadamard rotation, per-vector norm, Lloyd-Max
// codebook of the rotated coordinate (kv_quant.cc's building blocks); `prod` adds the QJL residual sketch.
#include "qattn/reference/kv_quant.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "kv_files.h"
#include "qattn/reference/quant.h"

namespace qattn::ref {
namespace {

using kv_files::check_heads;

constexpr Choice<bool> kTurboKeys[] = {{"mse", false}, {"prod", true}};

class TurboQuantKv final : public KvQuantizer {
 public:
  explicit TurboQuantKv(const ParamMap& p)
      : bits_(static_cast<int>(p.integer("bits"))), prod_(choice_value(p, "k", kTurboKeys)),
        seed_(static_cast<std::uint64_t>(p.integer("seed"))), first_chunk_(p.integer("first-chunk")) {
    if (prod_ && bits_ < 1) throw SpecError("turboquant: the prod variant needs bits >= 1");
  }
  KvQuantized apply(const std::vector<MatrixView>& k, const std::vector<MatrixView>& v) const override {
    check_heads(k, v);
    KvQuantized out;
    for (std::size_t h = 0; h < k.size(); ++h) {
      out.k.push_back(rows(k[h], prod_));
      out.v.push_back(rows(v[h], false));
      out.k_bits += bits_per_element(k[h].cols(), prod_) / k.size();
      out.v_bits += bits_per_element(v[h].cols(), false) / k.size();
    }
    out.raw_query_rows = first_chunk_;
    return out;
  }

  // A d that is not a power of two (or is below 4) is zero-padded to D, the next power of two >= 4: the rotation,
  // codebook and sketch are D-dimensional, and D codes are stored for d values.
  static Eigen::Index padded(Eigen::Index d) {
    Eigen::Index n = 4;
    while (n < d) n *= 2;
    return n;
  }
  double bits_per_element(Eigen::Index d, bool prod) const {
    return (static_cast<double>(bits_) * padded(d) + (prod ? 64.0 : 32.0)) / static_cast<double>(d);
  }

 private:
  RowMatrixXd rows(const MatrixView& x, bool prod) const {
    const Eigen::Index d = x.cols(), n = padded(d);
    // One rotation (and sketch) per dimension, shared by all heads and tokens; the seed fixes them.
    const RowMatrixXd rot = randomized_hadamard(n, seed_);
    const RowMatrixXd s = prod ? gaussian_matrix(n, seed_ + 1) : RowMatrixXd();
    RowMatrixXd out(x.rows(), d);
    Eigen::VectorXd row = Eigen::VectorXd::Zero(n);
    for (Eigen::Index t = 0; t < x.rows(); ++t) {
      row.head(d) = x.row(t).transpose();
      const Eigen::VectorXd q = prod ? turboquant_prod(row, rot, s, bits_) : turboquant_mse(row, rot, bits_);
      out.row(t) = q.head(d).transpose();
    }
    return out;
  }
  int bits_;
  bool prod_;
  std::uint64_t seed_;
  Eigen::Index first_chunk_;
};

}  // namespace

void register_turboquant_kv(KvRegistry& r) {
  r.add({{"turboquant", "TurboQuant: randomized Hadamard rotation, per-vector norm, Lloyd-Max codebook of the "
                        "rotated coordinate; prod: b-1 bits + 1-bit QJL residual sketch (unbiased inner products)",
          {int_param("bits", "3", "bits per coordinate", 1, 8),
           choice_param("k", "mse", "K variant (V always uses mse)", choice_names(kTurboKeys)),
           int_param("seed", "1", "seed of the rotation signs (and of the QJL matrix: seed + 1)", 0, 1e15),
           int_param("first-chunk", "0", "serving path (FlashInfer): the queries of the first prompt chunk, this many "
                                         "tokens, attend to the raw K and V; the later ones read the cache. 0: every "
                                         "query reads the cache", 0, 1 << 30)},
          {}, nullptr},
         [](const ParamMap& p) { return std::make_unique<TurboQuantKv>(p); }});
}

}  // namespace qattn::ref

// The NVFP4 KV cache (reference/src/quantizers/nvfp4_kv.cc): every value attention reads is an E2M1 value times its block's
// UE4M3 scale times the global scale; the global scale spans the layer or one head as asked; bf16 and bf16-e4m3
// reads round what they say; a head_dim that is not whole blocks of 16 is refused.
#include <catch2/catch.hpp>

#include <cmath>
#include <set>

#include "qattn/error.h"
#include "qattn/reference/kv_quant.h"
#include "qattn/reference/lowp_convert.h"
#include "qattn/reference/lowp_float.h"
#include "qattn/reference/random.h"

namespace {

using qattn::RowMatrixXd;
using qattn::ref::KvQuantized;
using qattn::ref::kv_registry;

RowMatrixXd nvfp4_normals(Eigen::Index rows, Eigen::Index cols, std::uint64_t seed, double sigma) {
  qattn::ref::Normals g(seed);
  RowMatrixXd m(rows, cols);
  for (Eigen::Index i = 0; i < m.size(); ++i) m.data()[i] = static_cast<double>(static_cast<float>(sigma * g()));
  return m;
}

}  // namespace

TEST_CASE("nvfp4 KV: each value read is an E2M1 value x its block scale x the global scale", "[kv][nvfp4]") {
  const RowMatrixXd k0 = nvfp4_normals(24, 32, 1, 1.0), k1 = nvfp4_normals(24, 32, 2, 50.0);
  const KvQuantized c = kv_registry().create("nvfp4")->apply({k0, k1}, {k0, k1});
  // the layer's global scale: 1 / (2688 / amax) over both heads
  const float amax = static_cast<float>(std::max(k0.cwiseAbs().maxCoeff(), k1.cwiseAbs().maxCoeff()));
  const double g = 1.0f / (2688.0f / amax);
  std::set<double> e2m1;
  for (int code = 0; code < 16; ++code) e2m1.insert(qattn::ref::lowp_decode_code(static_cast<std::uint8_t>(code), qattn::ref::LowpCode::e2m1));
  for (const RowMatrixXd* h : {&c.k[0], &c.k[1]})
    for (Eigen::Index t = 0; t < h->rows(); ++t)
      for (Eigen::Index b = 0; b < 2; ++b) {
        const auto block = h->row(t).segment(16 * b, 16);
        // some UE4M3 scale s_b makes every element of the block an E2M1 value times s_b x g
        bool found = false;
        for (int code = 1; code < 0x7f && !found; ++code) {
          const double unit = qattn::ref::lowp_decode_code(static_cast<std::uint8_t>(code), qattn::ref::LowpCode::ue4m3) * g;
          found = true;
          for (Eigen::Index i = 0; i < 16 && found; ++i) found = e2m1.count(block(i) / unit) == 1;
        }
        INFO("row " << t << " block " << b);
        REQUIRE((found || block.isZero()));
      }
  CHECK(c.k_bits == Approx(4.5 + 32.0 / (2 * 24 * 32)));
  const double rel = ((c.k[0] - k0).squaredNorm() + (c.k[1] - k1).squaredNorm()) / (k0.squaredNorm() + k1.squaredNorm());
  CHECK(rel < 0.02);  // E2M1 per 16 with an amax scale: about 1 % of the energy (measured 0.9 %)
}

TEST_CASE("nvfp4 KV: global=layer couples the heads, global=head does not", "[kv][nvfp4]") {
  const RowMatrixXd a = nvfp4_normals(16, 32, 3, 1.0), b = nvfp4_normals(16, 32, 4, 1.0);
  // another head 2^20 louder: under the layer's global scale a's block scales, amax_b x 2688 / (6 amax), fall below
  // half of E4M3's least subnormal (2^-9) and round to 0: head a reads zeros
  RowMatrixXd loud = b * 1048576.0;
  const auto layer = kv_registry().create("nvfp4:global=layer");
  const auto head = kv_registry().create("nvfp4:global=head");
  const KvQuantized quiet_l = layer->apply({a, b}, {a, b}), loud_l = layer->apply({a, loud}, {a, loud});
  const KvQuantized quiet_h = head->apply({a, b}, {a, b}), loud_h = head->apply({a, loud}, {a, loud});
  CHECK(quiet_h.k[0] == loud_h.k[0]);   // head a's own global scale
  CHECK(quiet_l.k[0] != loud_l.k[0]);   // the layer's global scale
  const double err_l = (loud_l.k[0] - a).squaredNorm() / a.squaredNorm(), err_h = (loud_h.k[0] - a).squaredNorm() / a.squaredNorm();
  INFO("head a's relative error: layer " << err_l << ", head " << err_h);
  CHECK(err_l == 1.0);
  CHECK(err_h < 0.02);
}

TEST_CASE("nvfp4 KV: bf16 and bf16-e4m3 reads round the dequantised values as they say", "[kv][nvfp4]") {
  const RowMatrixXd k = nvfp4_normals(32, 64, 5, 3.0);
  const KvQuantized exact = kv_registry().create("nvfp4")->apply({k}, {k});
  const KvQuantized bf = kv_registry().create("nvfp4:read=bf16")->apply({k}, {k});
  const KvQuantized fp8 = kv_registry().create("nvfp4@fp8-attention")->apply({k}, {k});
  double amax = 0;
  for (Eigen::Index i = 0; i < k.size(); ++i) {
    const double x = exact.k[0].data()[i], y = bf.k[0].data()[i];
    REQUIRE(y == qattn::ref::lowp_round(x, qattn::ref::bf16_bfloat16(), qattn::ref::LowpRounding::rne,
                                         qattn::ref::LowpOverflow::saturate));
    amax = std::max(amax, std::fabs(y));
  }
  CHECK(bf.k[0] != exact.k[0]);  // 30-bit products do not all fit bfloat16's 8
  const float s = static_cast<float>(amax) / 448.0f;
  for (Eigen::Index i = 0; i < k.size(); ++i) {
    const float q = static_cast<float>(fp8.k[0].data()[i]) / s;  // the E4M3 value, exact: q x s was rounded once
    REQUIRE(std::fabs(q) <= 448.0f);
  }
  CHECK(fp8.k[0] != bf.k[0]);
  CHECK_THROWS_AS(kv_registry().create("nvfp4")->apply({nvfp4_normals(4, 40, 6, 1.0)}, {nvfp4_normals(4, 40, 7, 1.0)}),
                  qattn::SpecError);
}

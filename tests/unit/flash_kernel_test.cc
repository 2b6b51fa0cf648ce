// Kernel descriptions (docs/kernels-as-data.md): the file form round-trips, bad files are refused naming the file and
// field, the contracts find the P-path overflows and flushes, and the loop's parts that no preset uses (the rescale
// threshold, a row sum of rounded P) do what the doc says. That the presets run on the loop bit for bit as before is
// flash_loop_digest_test.cc.
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <string>

#include "qattn/error.h"
#include "qattn/metrics.h"
#include "qattn/reference/fa3_fp8.h"
#include "qattn/reference/flashq.h"
#include "qattn/reference/float_attention.h"
#include "qattn/reference/kernel_file.h"
#include "qattn/reference/registry.h"
#include "qattn/reference/sage1.h"
#include "qattn/reference/sage2.h"
#include "qattn/reference/turbo.h"
#include "support/random_matrix.h"

using namespace qattn;
using namespace qattn::ref;

namespace {

FlashKernel kernel(const std::string& spec) {
  const auto m = reference_registry().create(spec);
  const auto k = kernel_of(*m);
  REQUIRE(k);
  return *k;
}

std::string refusal(const std::string& text) {
  try {
    kernel_from_json(text, "k.json");
  } catch (const InputError& e) {
    return e.what();
  }
  return "accepted";
}

// The fa3-fp8 description's JSON with one line's value replaced.
std::string edited(const std::string& field_line, const std::string& replacement) {
  std::string j = kernel_to_json(kernel("fa3-fp8"));
  const auto at = j.find(field_line);
  REQUIRE(at != std::string::npos);
  j.replace(at, field_line.size(), replacement);
  return j;
}

// Removes a field (its dotted name) from a description's JSON.
void erase_field(nlohmann::json& j, const std::string& field) {
  nlohmann::json* node = &j;
  std::string rest = field;
  for (std::size_t dot; (dot = rest.find('.')) != std::string::npos; rest = rest.substr(dot + 1))
    node = &node->at(rest.substr(0, dot));
  CHECK(node->erase(rest) == 1);
}

double rel_l1(const RowMatrixXd& o, const RowMatrixXd& ref) {
  return compare(std::span(o.data(), o.size()), std::span(ref.data(), ref.size())).rel_l1;
}

}  // namespace

TEST_CASE("kernel files: every preset's description round-trips through its file", "[kernel_file]") {
  for (const char* spec : {"sage1", "sage1:acc=fp32,pad=upstream,out=fp32", "sage2", "sage2@paper-4b", "sage2@paper-hadmdattn",
                           "sage2:acc=mma", "sage2:acc=two-level,p=e5m2", "fa3-fp8", "fa3-fp8:scale=none,out=fp32",
                           "turbo", "turbo@paper:poly=lsq,exp=exact,int8-max=126"}) {
    INFO(spec);
    const FlashKernel k = kernel(spec);
    const std::string j = kernel_to_json(k);
    CHECK(kernel_to_json(kernel_from_json(j, "k.json")) == j);
    // every field is in the file, and reads back as the description holds it
    for (const KernelField& f : kernel_fields()) CHECK(get_kernel_field(kernel_from_json(j, "k.json"), f.name) == get_kernel_field(k, f.name));
  }
  // the presets differ where their kernels do
  CHECK(get_kernel_field(kernel("fa3-fp8"), "keys.order") == "reverse");
  CHECK(get_kernel_field(kernel("sage2"), "pv.promote_keys") == "128");
  CHECK(get_kernel_field(kernel("sage1"), "pv.unit") == "h100-hmma-f16-acc16");
  CHECK(get_kernel_field(kernel("turbo:br=32"), "qk.groups.block_q") == "32");
  CHECK(get_kernel_field(kernel("turbo@paper"), "softmax.sas_half") == "true");
  CHECK(get_kernel_field(kernel("turbo:poly=lsq"), "softmax.sas_poly") == "lsq");
  CHECK(get_kernel_field(kernel("turbo:exp=exact"), "softmax.exp") == "f64-rounded");
  CHECK(get_kernel_field(kernel("turbo:int8-max=126"), "p.max") == "126");
}

TEST_CASE("kernel files: bad files are refused naming the file, the field and what it takes", "[kernel_file]") {
  CHECK_THAT(refusal("{"), Catch::Contains("k.json") && Catch::Contains("not valid JSON"));
  // a key given twice, at the top and inside a part (the parser alone would keep the last one)
  std::string twice = kernel_to_json(kernel("fa3-fp8"));
  twice.insert(twice.find("\"offset\""), "\"offset\": 3.0,\n    ");
  CHECK_THAT(refusal(twice), Catch::Contains("p.offset") && Catch::Contains("given twice"));
  twice = kernel_to_json(kernel("fa3-fp8"));
  twice.insert(twice.find("\"block_k\""), "\"block_k\": 7,\n      ");
  CHECK_THAT(refusal(twice), Catch::Contains("qk.groups.block_k") && Catch::Contains("given twice"));
  CHECK_THAT(refusal("{\"name\": \"a\", \"name\": \"b\"}"), Catch::Contains("name: given twice"));
  // a file beyond the bound is refused before it is read
  const std::string big = (std::filesystem::temp_directory_path() / "qattn_big_kernel.json").string();
  {
    std::ofstream out(big);
    out << std::string(kMaxKernelFileBytes + 1, ' ');
  }
  try {
    read_kernel_file(big);
    FAIL("a file beyond the bound was read");
  } catch (const InputError& e) {
    CHECK_THAT(std::string(e.what()), Catch::Contains("at most 1048576 bytes"));
  }
  std::filesystem::remove(big);
  CHECK_THAT(refusal("[1]"), Catch::Contains("a JSON object"));
  CHECK_THAT(refusal(edited("\"offset\": 8.0", "\"ofset\": 8.0")),
             Catch::Contains("p.ofset") && Catch::Contains("no such field") && Catch::Contains("p.offset"));
  CHECK_THAT(refusal(edited("\"offset\": 8.0,", "")), Catch::Contains("p.offset") && Catch::Contains("missing"));
  CHECK_THAT(refusal(edited("\"offset\": 8.0", "\"offset\": \"8\"")),
             Catch::Contains("p.offset") && Catch::Contains("expected a number"));
  CHECK_THAT(refusal(edited("\"row_sum_threads\": 4", "\"row_sum_threads\": 4.5")),
             Catch::Contains("softmax.row_sum_threads") && Catch::Contains("expected an integer"));
  CHECK_THAT(refusal(edited("\"order\": \"reverse\"", "\"order\": \"backward\"")),
             Catch::Contains("keys.order") && Catch::Contains("forward, reverse"));
  CHECK_THAT(refusal(edited("\"smooth\": false", "\"smooth\": 0")),
             Catch::Contains("v.smooth") && Catch::Contains("true or false"));
  // a combination the loop cannot run: the FP8 wgmma with binary16 P
  const std::string fp16_p = edited("\"scale\": 1.0,\n    \"format\": \"e4m3\"", "\"scale\": 1.0,\n    \"format\": \"fp16\"");
  CHECK_THAT(refusal(fp16_p), Catch::Contains("pv.unit") && Catch::Contains("E4M3 P and V"));
  CHECK_THAT(refusal(edited("\"rescale_threshold\": 0.0", "\"rescale_threshold\": -1")),
             Catch::Contains("softmax.rescale_threshold") && Catch::Contains(">= 0"));
  CHECK(refusal(kernel_to_json(kernel("fa3-fp8"))) == "accepted");
  FlashKernel k = kernel("sage2");
  CHECK_THROWS_WITH(set_kernel_field(k, "p.format", "e3m4"), Catch::Contains("e4m3, e5m2"));
  CHECK_THROWS_WITH(set_kernel_field(k, "p.nope", "1"), Catch::Contains("does not exist"));
  CHECK_THROWS_AS(read_kernel_file("/nonexistent/k.json"), InputError);
}

TEST_CASE("kernel contracts: the FA4 P saturation and the FP8 P flush are found, their fixes pass", "[kernel_file]") {
  const auto violated = [](const FlashKernel& k, const std::string& name) {
    for (const KernelContract& c : kernel_contracts(k))
      if (c.name.rfind(name, 0) == 0) return c.violated;
    FAIL("no contract " << name);
    return false;
  };
  // FlashAttention-4's FP8 forward: max_offset 8 and rescale_threshold 4 let P~ reach 2^12 against E4M3's 448
  FlashKernel fa4 = kernel("fa3-fp8");
  fa4.softmax.rescale_threshold = 4;
  CHECK(violated(fa4, "largest P~"));
  const auto contracts = kernel_contracts(fa4);
  CHECK_THAT(contracts[0].bound, Catch::Contains("4096"));
  CHECK_THAT(contracts[0].fix, Catch::Contains("8.80735"));
  fa4.softmax.rescale_threshold = 0.75;  // 8 + 0.75 <= log2 448
  CHECK(!violated(fa4, "largest P~"));
  fa4.softmax.rescale_threshold = 0.81;
  CHECK(violated(fa4, "largest P~"));
  // P in (0, 1] cast to E4M3 (FlashInfer's sm120 FP8 prefill before its fix): the diffuse mass flushes
  FlashKernel flush = kernel("fa3-fp8");
  flush.p.offset = 0;
  CHECK(violated(flush, "diffuse mass"));
  flush.p.offset = 8;  // the fix: P pre-scaled by 2^8
  CHECK(!violated(flush, "diffuse mass"));
  CHECK(!violated(kernel("sage2"), "largest P~"));  // 448 e^0 = 448: at E4M3's top, not beyond
  CHECK(violated(kernel("sage2:p=int8,acc=fp32"), "diffuse mass"));  // INT8 P rounds weights below 1/254 of the top
  // sage1's FP16 accumulator over 64 keys of P~ <= 1: holds for |V| up to 65504 / 64
  bool found = false;
  for (const KernelContract& c : kernel_contracts(kernel("sage1")))
    if (c.name.rfind("P V's FP16", 0) == 0) {
      found = true;
      CHECK_THAT(c.limit, Catch::Contains("1023.5"));
    }
  CHECK(found);
  FlashKernel one_acc = kernel("sage1");
  one_acc.pv.promote_keys = 0;
  CHECK(violated(one_acc, "P V's FP16"));
}

TEST_CASE("flash loop: a rescale threshold keeps the max, and E4M3 P saturates when offset + threshold exceeds it",
          "[kernel_file]") {
  // Keys in blocks of 128: the first block's logits are N(0, 1), the second's hold one key 3 (log2 units) above every
  // earlier logit of its row, so the running max grows by 3 at the second block.
  std::mt19937_64 g(7);
  const Eigen::Index l = 256, d = 64;
  RowMatrixXd q = test::random_matrix(16, d, 1.0, g), k = test::random_matrix(l, d, 0.3, g), v = test::random_matrix(l, d, 1.0, g);
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  // put a key in the second block along each query's direction: logit 3 log2 units above the row's others
  for (Eigen::Index i = 0; i < 16; ++i) {
    RowMatrixXd row = q.row(i) * scale;
    const double top = (k.topRows(128) * row.transpose()).maxCoeff();
    k.row(128 + i) = q.row(i) / q.row(i).squaredNorm() / scale * (top + 3 / std::log2(std::exp(1.0)));
  }
  const AttentionResult exact = float_attention(q, k, v, scale, FloatPrecision::fp64);
  FlashKernel base = kernel("fa3-fp8:out=fp32");
  base.keys.block = 128;
  base.keys.order = KeyOrder::forward;
  const auto err = [&](double threshold, KernelFormat p) {
    FlashKernel kk = base;
    kk.softmax.rescale_threshold = threshold;
    kk.p.format = p;
    if (p != KernelFormat::e4m3) kk.pv.unit = PvUnit::fp32;
    return rel_l1(flash_attention(q, k, v, scale, {}, kk).o, exact.o);
  };
  // without P's rounding, keeping the max changes nothing but roundings: all close to the FP8 Q/K/V error
  const double exact_p0 = err(0, KernelFormat::fp32), exact_p4 = err(4, KernelFormat::fp32);
  CHECK(std::abs(exact_p4 - exact_p0) < 1e-3);
  // E4M3 P: with 8 + 4 the second block's top keys reach 2^11 and saturate at 448; 8 + 0.75 stays within 448
  const double fp8_0 = err(0, KernelFormat::e4m3), fp8_075 = err(0.75, KernelFormat::e4m3), fp8_4 = err(4, KernelFormat::e4m3);
  std::cout << "rescale threshold, rel L1 of O: fp32 P " << exact_p0 << " (0), " << exact_p4 << " (4); E4M3 P "
            << fp8_0 << " (0), " << fp8_075 << " (0.75), " << fp8_4 << " (4)\n";
  CHECK(fp8_075 < 1.5 * fp8_0);
  CHECK(fp8_4 > 5 * fp8_0);
}

TEST_CASE("flash loop: a row sum of rounded P makes P's rows sum to 1, one of unrounded P~ does not", "[kernel_file]") {
  std::mt19937_64 g(11);
  const RowMatrixXd q = test::random_matrix(32, 64, 1.0, g), k = test::random_matrix(512, 64, 1.0, g),
                    v = test::random_matrix(512, 64, 1.0, g);
  FlashKernel kk = kernel("sage2");
  const auto worst = [&](RowSumOf of) {
    kk.softmax.row_sum_of = of;
    const AttentionResult r = flash_attention(q, k, v, 0.125, {}, kk);
    return (r.p.rowwise().sum().array() - 1.0).abs().maxCoeff();
  };
  std::cout << "max |row sum of P - 1|: rounded " << worst(RowSumOf::rounded) << ", unrounded "
            << worst(RowSumOf::unrounded) << "\n";
  CHECK(worst(RowSumOf::rounded) < 1e-5);
  CHECK(worst(RowSumOf::unrounded) > 1e-4);
}

TEST_CASE("fa3-fp8@paper: block quantisation and incoherent processing against per-tensor FP8 on outlier inputs",
          "[kernel_file]") {
  // The FlashAttention-3 paper's error experiment draws Q, K, V as N(0, 1) + N(0, 100) Bernoulli(0.001) (Sec. 4.3);
  // its table credits the two features with an RMSE of 9.1e-3 against 2.4e-2 for per-tensor FP8.
  std::mt19937_64 g(240708);
  std::normal_distribution<double> n(0, 1);
  std::bernoulli_distribution outlier(0.001);
  const Eigen::Index l = 1024, d = 128;
  const auto draw = [&] {
    RowMatrixXd x(l, d);
    for (Eigen::Index i = 0; i < x.size(); ++i) x.data()[i] = n(g) + (outlier(g) ? 10 * n(g) : 0.0);
    return x;
  };
  const RowMatrixXd q = draw(), k = draw(), v = draw();
  const double scale = 1 / std::sqrt(static_cast<double>(d));
  const RowMatrixXd exact = float_attention(q, k, v, scale, FloatPrecision::fp64).o;
  const auto rmse = [&](const std::string& spec) {
    const RowMatrixXd o = reference_registry().create(spec)->attention(q, k, v, scale, {}).o;
    return std::sqrt((o - exact).squaredNorm() / static_cast<double>(o.size()));
  };
  const double base = rmse("fa3-fp8:out=fp32"), paper = rmse("fa3-fp8@paper:out=fp32"),
               block = rmse("fa3-fp8:out=fp32,block-quant=true"), incoherent = rmse("fa3-fp8:out=fp32,incoherent=true");
  std::cout << "fa3-fp8 O RMSE on outlier inputs: per tensor " << base << ", block quantisation " << block
            << ", incoherent processing " << incoherent << ", both (@paper) " << paper << "\n";
  CHECK(paper < base / 1.5);       // the paper's two features together lower the error
  CHECK(incoherent < base / 1.5);  // the Hadamard spreads the outliers over every channel
  CHECK(block > base / 1.2);       // per-block scales alone do not help outliers scattered through every block
  // The description: K blocks and Q blocks of 128 each carry a descale; the max is of fma(S, s2, -8)
  const FlashKernel k8 = kernel("fa3-fp8@paper");
  CHECK(get_kernel_field(k8, "qk.granularity") == "block");
  CHECK(get_kernel_field(k8, "softmax.max_rule") == "scaled");
  CHECK(get_kernel_field(k8, "qk.transform") == "hadamard");
}

TEST_CASE("kernel_unvalidated_parts names the MMA-Sim units, the FP22 bound and the exponential", "[kernel_file]") {
  const auto parts_of = [](const char* spec) {
    return kernel_unvalidated_parts(*kernel_of(*reference_registry().create(spec)));
  };
  // fa3-fp8: S and P V on the H100's measured wgmma; only the exponential is not measured
  const std::vector<std::string> fa3 = parts_of("fa3-fp8");
  REQUIRE(fa3.size() == 1);
  CHECK(fa3[0].find("ex2.approx") != std::string::npos);
  // fa4-fp8 and sage3: both units from MMA-Sim's model, in step order
  for (const char* spec : {"fa4-fp8", "sage3"}) {
    const std::vector<std::string> p = parts_of(spec);
    INFO(spec);
    REQUIRE(p.size() == 3);
    CHECK(p[0].rfind("S on b200-", 0) == 0);
    CHECK(p[2].rfind("P V on b200-", 0) == 0);
    CHECK(p[2].find("MMA-Sim") != std::string::npos);
  }
  CHECK(parts_of("fa4-fp8:units=h100").size() == 1);  // the same kernel on the H100's units
  // sage2's per-product FP22 accumulator is a bound, not an instruction; its exp is the C library's
  const std::vector<std::string> fp22 = parts_of("sage2:acc=fp22");
  REQUIRE(fp22.size() == 2);
  CHECK(fp22[0].find("C library") != std::string::npos);
  CHECK(fp22[1].find("FP22") != std::string::npos);
}

TEST_CASE("flash loop, turbo's parts: FlashQ codes, P~ tiles across rows, SAS, exact integer P V", "[kernel_file]") {
  std::mt19937_64 gen(51);
  const RowMatrixXd q = test::random_matrix(150, 32, 1.5, gen), k = test::random_matrix(200, 32, 1.5, gen),
                    v = test::random_matrix(200, 24, 1.0, gen);
  AttentionMask causal;
  causal.causal = true;
  // A P~ tile spans block_q rows: any block of rows, aligned with the tiles or not, gives the rows of the whole call
  // (the loop computes the tiles around them). 48-row tiles against 64-row chunks of the caller.
  FlashKernel t = kernel("turbo:br=48,bc=40");
  for (const AttentionMask& mask : {AttentionMask{}, causal}) {
    const auto call = prepare_flash(q, k, v, 0.2, mask, t);
    const AttentionResult whole = call->rows(0, 150);
    for (const auto& [r0, n] : {std::pair<Eigen::Index, Eigen::Index>{10, 50}, {47, 2}, {96, 54}, {149, 1}}) {
      const AttentionResult part = call->rows(r0, n);
      CHECK(part.o == whole.o.middleRows(r0, n));
      CHECK(part.p == whole.p.middleRows(r0, n));
    }
  }
  const AttentionResult a = flash_attention(q, k, v, 0.2, {}, t);
  // P's weights are the codes times s_P and the rescales as applied (SAS(0) = a0 = 0.9996: a block that leaves the max
  // unchanged still rescales O and l), so P times V as the exact unit reads it (FlashQ's codes per 40-key block,
  // dequantised) gives O to float32's rounding
  RowMatrixXd v_read(200, 24);
  for (Eigen::Index b0 = 0; b0 < 200; b0 += 40) {
    const FlashQBlock blk = flashq_quantize_block(v.middleRows(b0, 40), 119);
    v_read.middleRows(b0, 40) = blk.values.cast<double>() * blk.scale;
  }
  CHECK((a.p * v_read - a.o).cwiseAbs().maxCoeff() < 1e-5 * a.o.cwiseAbs().maxCoeff());
  // exact exp: f64-rounded in place of SAS; the same identity, other bits
  FlashKernel e = t;
  e.softmax.exp = ExpImpl::f64_rounded;
  const AttentionResult c = flash_attention(q, k, v, 0.2, {}, e);
  CHECK(c.o != a.o);
  CHECK((c.p * v_read - c.o).cwiseAbs().maxCoeff() < 1e-5 * c.o.cwiseAbs().maxCoeff());
  // with P from the exponents instead (the codes times s_P times e^(ref_b - ref_last)): with the exact exp the same
  // identity to float32's rounding; with SAS, P misstates its weights and the identity breaks by SAS's error
  FlashKernel x = t;
  x.output.p_from = PFrom::exponents;
  const AttentionResult d = flash_attention(q, k, v, 0.2, {}, x);
  CHECK(d.o == a.o);
  const double sas_gap = (d.p * v_read - d.o).cwiseAbs().maxCoeff() / d.o.cwiseAbs().maxCoeff();
  CHECK(sas_gap > 1e-4);
  CHECK(sas_gap < 1e-2);  // P in probability units: a code-unit P (x 119 / max) would be far off
  x.softmax.exp = ExpImpl::f64_rounded;
  const AttentionResult g = flash_attention(q, k, v, 0.2, {}, x);
  CHECK((g.p * v_read - g.o).cwiseAbs().maxCoeff() < 1e-5 * g.o.cwiseAbs().maxCoeff());
  // a tiled description streams in whole tiles
  CHECK(flash_kernel_traits(kernel("turbo:br=48")).query_block_rows == 48);
  CHECK(flash_kernel_traits(kernel("turbo:br=16")).query_block_rows == 64);
  CHECK(flash_kernel_traits(kernel("fa3-fp8")).query_block_rows == 64);
}

TEST_CASE("flash loop, turbo's parts are refused where the loop cannot run them, naming the field", "[kernel_file]") {
  const auto problem = [](FlashKernel k) {
    const std::optional<KernelProblem> p = check_kernel(k);
    return p ? p->field : std::string("none");
  };
  const FlashKernel t = kernel("turbo");
  CHECK(problem(t) == "none");
  FlashKernel x = t;
  x.qk.granularity = SageGranularity::thread;  // FlashQ's scales are per block
  CHECK(problem(x) == "qk.max");
  x = t;
  x.p.max = 0;  // the exact unit needs tiles
  CHECK(problem(x) == "p.max");
  x = t;
  x.pv.unit = PvUnit::fp32;  // tiles need the exact unit
  CHECK(problem(x) == "p.max");
  x = t;
  x.softmax.base = SoftmaxBase::two;  // SAS is of natural-unit distances
  CHECK(problem(x) == "softmax.exp");
  x = t;
  x.softmax.sas_nr = 0;
  CHECK(problem(x) == "softmax.sas_nr");
  x = t;
  x.v.max = 119.5;
  CHECK(problem(x) == "v.max");
  x = t;
  x.pv.promote_keys = 0;  // each block's exact sum is added to the rescaled O
  CHECK(problem(x) == "pv.promote_keys");
  x = t;
  x.softmax.row_sum_of = RowSumOf::rounded;  // rounded P~ are codes in each tile's own units
  CHECK(problem(x) == "softmax.row_sum_of");
  // its contracts: each tile is scaled to [0, 119], whatever the offset; a diffuse row loses what half a tile step
  // flushes
  const std::vector<KernelContract> c = kernel_contracts(t);
  REQUIRE(c.size() == 3);
  CHECK(!c[0].violated);
  FlashKernel offset = t;
  offset.softmax.exp = ExpImpl::f64_rounded;
  offset.p.offset = 6;
  CHECK(!kernel_contracts(offset)[0].violated);
  CHECK(c[1].violated);
  CHECK_THAT(c[1].bound, Catch::Contains("0.00420168") && Catch::Contains("half a step"));
  FlashKernel wide = t;
  wide.softmax.sas_nr = -3;  // SAS's threshold e^-3 above the tile's half step: it sets the level
  CHECK_THAT(kernel_contracts(wide)[1].bound, Catch::Contains("SAS's threshold"));
  CHECK(kernel_contracts(t, {.keys = 8, .tolerance = 0.05})[1].violated == false);  // 7 x 0.0042 / 1.029: 2.9%
  CHECK(kernel_unvalidated_parts(t).at(0).find("SAS") != std::string::npos);
}

TEST_CASE("kernel files: a file of the format's first version loads, each later field at its default", "[kernel_file]") {
  // the fields added since the format began, which a file may leave out; every other field is required
  const std::set<std::string> later = {
      "qk.unit", "qk.max", "v.max", "v.arith", "softmax.max_rule", "softmax.scale_log2", "softmax.ex2_emu_freq",
      "softmax.ex2_emu_start", "softmax.row_sum_tile", "softmax.row_sum_combine", "softmax.ref_rule",
      "softmax.sas_nr", "softmax.sas_poly", "softmax.sas_half", "p.max", "pv.promote_fma", "output.p_from"};
  for (const char* spec : {"sage1", "sage2@paper-8b", "fa3-fp8", "fa3-fp8:scale=none,out=fp32"}) {
    INFO(spec);
    const FlashKernel k = kernel(spec);
    nlohmann::json j = nlohmann::json::parse(kernel_to_json(k));
    for (const std::string& f : later) erase_field(j, f);
    CHECK(kernel_to_json(kernel_from_json(j.dump(), "old.json")) == kernel_to_json(k));
  }
  // a first-format field is still required
  for (const KernelField& f : kernel_fields()) {
    if (later.count(f.name)) continue;
    INFO(f.name);
    nlohmann::json j = nlohmann::json::parse(kernel_to_json(kernel("sage1")));
    erase_field(j, f.name);
    CHECK_THROWS_WITH(kernel_from_json(j.dump(), "old.json"), Catch::Contains(f.name) && Catch::Contains("missing"));
  }
}

TEST_CASE("flash loop: a ready-made key side that does not fit is refused", "[kernel_file]") {
  std::mt19937_64 gen(53);
  const RowMatrixXd q = test::random_matrix(8, 16, 1.0, gen), k = test::random_matrix(40, 16, 1.0, gen),
                    v = test::random_matrix(40, 8, 1.0, gen);
  TurboParams p;
  p.mode = TurboMode::decode;
  const FlashKernel t = turbo_kernel(p);
  const auto side = [&] {
    auto c = std::make_shared<FlashKeyCodes>();
    c->begin = {0, 20, 40};
    c->k_scale = c->v_scale = {0.01, 0.01};
    c->k_settled = RowMatrixXi32::Zero(40, 16);
    c->v_settled = RowMatrixXi32::Zero(40, 8);
    c->settled_from = 20;
    c->chunk = 8;
    return c;
  };
  CHECK_NOTHROW(prepare_flash(q, k, v, 0.25, {}, t, side()));
  auto far = side();
  far->settled_from = 41;  // past L_k
  CHECK_THROWS_AS(prepare_flash(q, k, v, 0.25, {}, t, far), std::logic_error);
  auto empty = side();
  empty->begin = {0, 20, 20, 40};  // an empty block
  empty->k_scale = empty->v_scale = {0.01, 0.01, 0.01};
  CHECK_THROWS_AS(prepare_flash(q, k, v, 0.25, {}, t, empty), std::logic_error);
  FlashKernel smoothed = t;
  smoothed.qk.smooth_k = true;  // K's codes are given: nothing transforms K to match Q
  CHECK_THROWS_WITH(prepare_flash(q, k, v, 0.25, {}, smoothed, side()), Catch::Contains("as they are"));
}

// Experiment sage2-smoothing: SageAttention2 App. A.5, the theory of smoothing, measured on its own model (Gaussian
// tokens with channel means) and on real and synthetic K. See README.md; `qattn reproduce sage2-smoothing` runs it.
#include <algorithm>
#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include "experiment.h"
#include "qattn/reference/random.h"
#include "qattn/reference/sage_quant.h"

namespace qattn::experiments {
namespace {

// Per-token symmetric INT4 as SageAttention2 quantises K (scale max|x| / 7, half away from zero; the "token"
// granularity, A.5's quantisation group): the mean |x - x^| and the mean per-token max|x| over the rows of x.
struct TokenInt4 {
  double mean_absmax = 0, mean_error = 0;
};
TokenInt4 token_int4(const RowMatrixXd& x) {
  TokenInt4 r;
  for (Eigen::Index i = 0; i < x.rows(); ++i) {
    const double m = x.row(i).cwiseAbs().maxCoeff(), s = m / 7;
    r.mean_absmax += m;
    double err = 0;
    for (Eigen::Index c = 0; c < x.cols(); ++c) {
      const double code = s > 0 ? std::clamp(ref::sage_round(x(i, c) / s, ref::SageRounding::half_away), -7.0, 7.0) : 0.0;
      err += std::fabs(x(i, c) - code * s);
    }
    r.mean_error += err / static_cast<double>(x.cols());
  }
  r.mean_absmax /= static_cast<double>(x.rows());
  r.mean_error /= static_cast<double>(x.rows());
  return r;
}

RowMatrixXd smoothed(const RowMatrixXd& x) {  // Eq. 3: Y = X - the mean over tokens, per channel
  RowMatrixXd y = x;
  y.rowwise() -= x.colwise().mean();
  return y;
}

// Part 1: A.5's model. `trials` draws of X [n, d], X_ij ~ N(mu_j, sigma_j^2) independent, mu_j ~ N(0, m^2) and
// sigma_j ~ U(0.5, 1.5) fixed per setting (seeded).
struct ModelResult {
  double max_mean_z = 0;            // Eq. 4: max over channels of |mean of Y_1j| / its standard error
  double var_ratio = 0;             // Eq. 5: mean over channels of Var[Y_1j] / ((n - 1)/n sigma_j^2)
  double var_ratio_raw = 0;         // the same against sigma_j^2 (no (n - 1)/n)
  double var_se = 0;                // the standard error of one channel's ratio, sqrt(2 / (trials - 1)), over sqrt(d)
  int var_channels_off = 0;         // channels whose ratio is more than 4 standard errors from 1
  std::vector<double> eps, p_x, p_y;  // Eq. 7: P(absmax < eps) for X and Y at three quantiles of absmax(X)
  TokenInt4 q_x, q_y;               // per-token INT4 of X and of Y
  double half_step_ratio_x = 0;     // mean |error| / (max|x| / 14), A.5's "1/2 * 2M / 2^b" form
};

ModelResult run_model(int n, int d, double m, int trials, std::uint64_t seed) {
  ref::Normals g(seed);
  std::vector<double> mu(d), sigma(d);
  for (int j = 0; j < d; ++j) mu[j] = g(), sigma[j] = 0.5 + g.uniform();
  for (double& x : mu) x *= m;
  std::vector<double> sum(d, 0.0), sum2(d, 0.0);
  std::vector<double> absmax_x, absmax_y;
  TokenInt4 qx, qy;
  double half_step = 0;
  for (int t = 0; t < trials; ++t) {
    RowMatrixXd x(n, d);
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < d; ++j) x(i, j) = mu[j] + sigma[j] * g();
    const RowMatrixXd y = smoothed(x);
    for (int j = 0; j < d; ++j) sum[j] += y(0, j), sum2[j] += y(0, j) * y(0, j);
    for (int i = 0; i < n; ++i) {
      absmax_x.push_back(x.row(i).cwiseAbs().maxCoeff());
      absmax_y.push_back(y.row(i).cwiseAbs().maxCoeff());
    }
    const TokenInt4 a = token_int4(x), b = token_int4(y);
    qx.mean_absmax += a.mean_absmax / trials, qx.mean_error += a.mean_error / trials;
    qy.mean_absmax += b.mean_absmax / trials, qy.mean_error += b.mean_error / trials;
    half_step += a.mean_error / (a.mean_absmax / 14) / trials;
  }
  ModelResult r;
  const double shrink = static_cast<double>(n - 1) / n;
  for (int j = 0; j < d; ++j) {
    const double mean = sum[j] / trials, var = (sum2[j] - trials * mean * mean) / (trials - 1);
    r.max_mean_z = std::max(r.max_mean_z, std::fabs(mean) / (sigma[j] * std::sqrt(shrink / trials)));
    const double ratio = var / (shrink * sigma[j] * sigma[j]);
    r.var_ratio += ratio / d;
    r.var_ratio_raw += var / (sigma[j] * sigma[j]) / d;
    r.var_channels_off += std::fabs(ratio - 1) > 4 * std::sqrt(2.0 / (trials - 1));
  }
  r.var_se = std::sqrt(2.0 / (trials - 1)) / std::sqrt(static_cast<double>(d));
  std::vector<double> sorted = absmax_x;
  std::sort(sorted.begin(), sorted.end());
  for (const double q : {0.1, 0.5, 0.9}) {
    const double eps = sorted[static_cast<std::size_t>(q * static_cast<double>(sorted.size()))];
    const auto below = [eps](const std::vector<double>& v) {
      return static_cast<double>(std::count_if(v.begin(), v.end(), [eps](double a) { return a < eps; })) /
             static_cast<double>(v.size());
    };
    r.eps.push_back(eps), r.p_x.push_back(below(absmax_x)), r.p_y.push_back(below(absmax_y));
  }
  r.q_x = qx, r.q_y = qy;
  r.half_step_ratio_x = half_step;
  return r;
}

std::string verdict(bool holds) { return holds ? "HOLDS" : "DOES NOT HOLD"; }

// Part 1's model: N tokens of d channels, drawn kTrials times.
constexpr int kN = 8, kD = 64, kTrials = 4000;

// What Part 1 checks, over both values of m (the channel means' spread).
struct ModelChecks {
  bool eq4 = true, eq5 = true, eq5_not_raw = true, eq7 = true, smaller_error = true, proportional = true;
  double gain_means = 0, gain_none = 0;  // 1 - the INT4 error of Y over that of X, with m = 2 and m = 0
  std::string half_steps;                // per m, X's mean |error| in units of half a step
};

// One m's rows of Part 1's tables `t` (Eqs. 4-5, the INT4 errors) and `p` (Eq. 7), and its checks.
void add_model_rows(double m, const ModelResult& mr, Table& t, Table& p, ModelChecks& c) {
  t.rows.push_back({fixed(m, 0), fixed(mr.max_mean_z, 2), fixed(mr.var_ratio, 4) + " +- " + fixed(mr.var_se, 4),
                    fixed(mr.var_ratio_raw, 4), std::to_string(mr.var_channels_off) + " of " + std::to_string(kD),
                    fixed(mr.q_x.mean_error, 5), fixed(mr.q_y.mean_error, 5),
                    fixed(mr.q_y.mean_error / mr.q_x.mean_error, 3), fixed(mr.q_x.mean_absmax, 3),
                    fixed(mr.q_y.mean_absmax, 3)});
  static const char* kQuantiles[] = {"10 %", "50 %", "90 %"};
  for (std::size_t i = 0; i < mr.eps.size(); ++i) {
    p.rows.push_back(
        {fixed(m, 0), fixed(mr.eps[i], 3) + " (" + kQuantiles[i] + ")", fixed(mr.p_x[i], 4), fixed(mr.p_y[i], 4)});
    c.eq7 = c.eq7 && mr.p_y[i] > mr.p_x[i];
  }
  c.eq4 = c.eq4 && mr.max_mean_z < 4.5;  // 64 channels: a |z| above 4.5 has probability ~4e-4 under Eq. 4
  c.eq5 = c.eq5 && std::fabs(mr.var_ratio - 1) < 4 * mr.var_se && mr.var_channels_off <= 1;
  c.eq5_not_raw = c.eq5_not_raw && std::fabs(mr.var_ratio_raw - 1) > 4 * mr.var_se;
  c.smaller_error = c.smaller_error && mr.q_y.mean_error < mr.q_x.mean_error;
  const double err_per_absmax_x = mr.q_x.mean_error / mr.q_x.mean_absmax;
  const double err_per_absmax_y = mr.q_y.mean_error / mr.q_y.mean_absmax;
  c.proportional = c.proportional && std::fabs(err_per_absmax_y / err_per_absmax_x - 1) < 0.05;
  (m > 0 ? c.gain_means : c.gain_none) = 1 - mr.q_y.mean_error / mr.q_x.mean_error;
  c.half_steps +=
      "m = " + fixed(m, 0) + ": mean |error| of X = " + fixed(mr.half_step_ratio_x, 3) + " x (max|x| / 14)\n";
}

std::string model_verdicts(const ModelChecks& c) {
  std::ostringstream r;
  r << "verdict: Eq. 4, E[Y_ij] = 0 (|z| < 4.5 on every channel): " << verdict(c.eq4) << "\n"
    << "verdict: Eq. 5, Var[Y_ij] = (N-1)/N sigma_j^2 (mean ratio within 4 SE of 1, at most one channel off), and "
       "not sigma_j^2: "
    << verdict(c.eq5 && c.eq5_not_raw) << "\n"
    << "verdict: Eq. 7, P(absmax(Y_i) < eps) > P(absmax(X_i) < eps) at the three eps, with and without channel "
       "means: "
    << verdict(c.eq7) << "\n"
    << "verdict: smoothing lowers the per-token INT4 error, with and without channel means: "
    << verdict(c.smaller_error) << "\n"
    << "  with channel means (m = 2) by " << fixed(100 * c.gain_means, 1) << " %; without (m = 0) by "
    << fixed(100 * c.gain_none, 1) << " %: the gain is Eq. 4's removed mean; Eq. 5's (N-1)/N alone is worth "
    << fixed(100 * (1 - std::sqrt(static_cast<double>(kN - 1) / kN)), 1) << " % of sigma\n"
    << "verdict: the error is proportional to the absmax (mean |err| / mean absmax the same for X and Y within 5 %): "
    << verdict(c.proportional) << "\n"
    << "A.5's \"expected quantization error 1/2 * 2M / 2^b\" is half a step, the largest rounding error, not the "
       "mean:\n"
    << c.half_steps << "(a uniform remainder would give 0.5)\n\n";
  return r.str();
}

// Part 1: the model of A.5, with channel means (m = 2) and without (m = 0).
std::string model_part() {
  std::ostringstream r;
  r << "Part 1: A.5's model by Monte Carlo: " << kTrials << " draws of X [N = " << kN << ", d = " << kD
    << "], X_ij ~ N(mu_j, sigma_j^2) independent,\nsigma_j ~ U(0.5, 1.5), mu_j ~ N(0, m^2); per-token INT4: scale "
       "max|x| / 7, half away from zero (SageAttention2's token granularity)\n\n";
  Table t{{"m (channel means)", "Eq. 4 max |z| of E[Y]", "Eq. 5 Var / ((N-1)/N sigma^2)", "Var / sigma^2",
           "channels off (> 4 SE)", "INT4 mean |err| X", "INT4 mean |err| Y", "Y / X", "mean absmax X",
           "mean absmax Y"},
          {}};
  Table p{{"m", "eps (absmax(X) quantile)", "P(absmax X < eps)", "P(absmax Y < eps)"}, {}};
  ModelChecks checks;
  for (const double m : {2.0, 0.0})
    add_model_rows(m, run_model(kN, kD, m, kTrials, 31), t, p, checks);  // the same noise and sigma_j for both m
  r << t.markdown() << "\n" << p.markdown() << "\n" << model_verdicts(checks);
  return r.str();
}

// Part 2's rows for each head of `dump`: K's per-token INT4 error before and after smoothing. Whether smoothing
// lowered it on every head.
bool add_head_rows(const std::string& name, const std::vector<DumpLayer>& dump, Table& k) {
  bool every_head = true;
  for (const DumpLayer& l : dump)
    for (std::size_t h = 0; h < l.heads.size(); ++h) {
      const RowMatrixXd& kk = l.k[h].front();
      const Eigen::RowVectorXd mu = kk.colwise().mean();
      const RowMatrixXd centred = kk.rowwise() - mu;
      std::vector<double> snr;
      for (Eigen::Index c = 0; c < kk.cols(); ++c) {
        const double sd = std::sqrt(centred.col(c).squaredNorm() / static_cast<double>(kk.rows()));
        snr.push_back(sd > 0 ? std::fabs(mu(c)) / sd : 0.0);
      }
      std::nth_element(snr.begin(), snr.begin() + static_cast<std::ptrdiff_t>(snr.size() / 2), snr.end());
      const TokenInt4 a = token_int4(kk), b = token_int4(smoothed(kk));
      every_head = every_head && b.mean_error < a.mean_error;
      k.rows.push_back({name, "layer " + std::to_string(l.layer) + " head " + std::to_string(l.heads[h]),
                        fixed(snr[snr.size() / 2], 3), fixed(a.mean_absmax, 3), fixed(b.mean_absmax, 3),
                        fixed(a.mean_error, 5), fixed(b.mean_error, 5), fixed(b.mean_error / a.mean_error, 3)});
    }
  return every_head;
}

// Part 2: K of the dump's heads and of synthetic outlier heads.
std::string heads_part(const ExperimentContext& ctx) {
  std::ostringstream r;
  r << "Part 2: K of each head, per-token INT4 before and after smoothing K (sage2's smooth-k)\n\n";
  Table k{{"source", "head", "median |mu_j| / sigma_j", "mean absmax K", "mean absmax K - mean", "INT4 |err| K",
           "INT4 |err| K - mean", "ratio"},
          {}};
  const bool use_lite = add_head_rows("USE-Lite", load_dump(ctx.tensors), k);
  const bool synthetic = add_head_rows("synthetic", synthetic_outlier_dump(4, ctx.fast ? 128 : 512, 128, 7), k);
  r << k.markdown() << "\n";
  r << "verdict: smoothing K lowers its per-token INT4 error on every head: " << verdict(use_lite && synthetic) << "\n";
  return r.str();
}

}  // namespace

std::string run_sage2_smoothing(const ExperimentContext& ctx) {
  std::ostringstream r;
  r << "sage2-smoothing: SageAttention2 App. A.5, the theory of smoothing (Eqs. 3-7)\n"
    << "claim: Y = X - mean over tokens has mean 0 and variance (N-1)/N sigma^2 (Eqs. 4-5); its per-token absmax is\n"
    << "more concentrated toward 0 (Eqs. 6-7), so its quantisation error, proportional to absmax, is smaller\n\n"
    << model_part() << heads_part(ctx);
  return r.str();
}

}  // namespace qattn::experiments

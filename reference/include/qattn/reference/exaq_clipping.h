// The EXAQ clipping problem (paper Eq. 14) for Gaussian inputs, solved numerically (docs/methods/exaq.md §4 and
// experiments/exaq-clipping). Values X ~ N(mu, sigma^2) are clipped at C < 0 and the range [C, 0] is quantised
// uniformly to 2^M levels:
//     MSE(C) = MSE_quant(C) + E[(X - C)^2 ; X < C]
//     E[(X - C)^2 ; X < C] = sigma^2 ((1 + z^2) Phi(z) + z phi(z)),  z = (C - mu) / sigma
// The quantisation-noise term has three readings; the experiment reports each:
//     step_midpoint:  D = -C / 2^M,       MSE_quant = D^2 / 12              (the paper's grid)
//     step_endpoints: D = -C / (2^M - 1), MSE_quant = D^2 / 12              (the upstream grid)
//     symmetric:      MSE_quant = C^2 / (3 4^M)                             (the symmetric-range formula of ACIQ)
// Where the max-subtracted values sit (mu) is an assumption: mu = 0, or mu = -sigma E[max of n N(0, 1)] for rows
// of n entries (the row maximum is subtracted).
#pragma once

namespace qattn::ref {

enum class QuantNoise { step_midpoint, step_endpoints, symmetric };

// E[max of n independent N(0, 1)], by quadrature (exact to ~1e-10 for n <= 1e6).
double expected_max_std_normal(int n);

double exaq_clip_mse(double clip, double sigma, double mu, int bits, QuantNoise noise);

// Eq. 14 measured after exp: E[(e^{Q(X)} - e^X)^2] with the actual quantiser Q of the paper's grid (midpoints,
// step -C/2^M, values below C reconstructed at C + D/2, values above 0 at -D/2), by Simpson quadrature over
// [mu - 12 sigma, max(0, mu + 12 sigma)]. Not homogeneous in sigma: exp weights values near the maximum.
double exaq_clip_mse_exp(double clip, double sigma, double mu, int bits);
double exaq_solve_clip_exp(double sigma, double mu, int bits);

// Eq. 14 as the paper prints it, an error in the exp domain (the minus sign before its second term read as the
// typo it is: both terms are errors and add):
//     MSE_exp(C) = C^2 / (12 4^M) int_C^0 e^{2x} f(x) dx + int_{-inf}^C (e^C - e^x)^2 f(x) dx,  f = N(mu, sigma^2)
// in closed form: with z = (C - mu) / sigma, E2 = e^{2 mu + 2 sigma^2}, E1 = e^{mu + sigma^2 / 2},
//     int_C^0 e^{2x} f = E2 (Phi((-mu - 2 sigma^2) / sigma) - Phi(z - 2 sigma))
//     int_{-inf}^C (e^C - e^x)^2 f = e^{2C} Phi(z) - 2 e^C E1 Phi(z - sigma) + E2 Phi(z - 2 sigma)
double exaq_clip_mse_eq14(double clip, double sigma, double mu, int bits);
double exaq_solve_clip_eq14(double sigma, double mu, int bits);

// argmin_C MSE(C) over C in [mu - 12 sigma, 0), by golden-section search after a coarse scan.
double exaq_solve_clip(double sigma, double mu, int bits, QuantNoise noise);

}  // namespace qattn::ref

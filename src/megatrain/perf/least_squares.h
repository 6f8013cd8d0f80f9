// Bounded nonlinear least squares for the performance model's calibration: minimise sum_i r_i(x)^2 over a few
// parameters x, each kept inside [lo, hi]. Levenberg-Marquardt (Marquardt 1963): each step solves
// (J^T J + lambda diag(J^T J)) dx = -J^T r, accepts it when the sum of squares falls (then lambda /= 10) and refuses
// it otherwise (lambda *= 10). J comes from central finite differences, because the residuals are simulations (a
// pipeline schedule, maxima over ranks) without an analytic derivative; a step that leaves the box is clipped to it.
// Written for a handful of parameters and tens of residuals: the normal equations are solved by Gaussian elimination
// with partial pivoting.
#pragma once
#include <functional>
#include <string>
#include <vector>

namespace mt::perf {

struct Bounds {
  double lo = 0, hi = 0;
};

struct LeastSquaresResult {
  std::vector<double> x;          // the parameters at the minimum found
  std::vector<double> residuals;  // r(x)
  double sum_squares = 0;
  int iterations = 0;
  bool converged = false;  // the relative fall of the sum of squares, or the step, went below tolerance
};

using Residuals = std::function<std::vector<double>(const std::vector<double>&)>;

// Central differences of r at x, one column per parameter, with step h_j = rel_step * max(|x_j|, 1) (one-sided
// where a bound is closer than h_j). Rows are residuals.
std::vector<std::vector<double>> finite_difference_jacobian(const Residuals& r, const std::vector<double>& x,
                                                            const std::vector<Bounds>& bounds, double rel_step = 1e-5);

// Throws (mt::Error) when x0 and bounds differ in size, a bound is empty, or r returns a non-finite value at x0.
LeastSquaresResult levenberg_marquardt(const Residuals& r, std::vector<double> x0, const std::vector<Bounds>& bounds,
                                       int max_iterations = 100, double tolerance = 1e-10);

}  // namespace mt::perf

#include "megatrain/perf/least_squares.h"

#include <algorithm>
#include <cmath>

#include "megatrain/core/error.h"

namespace mt::perf {

namespace {

double sum_squares(const std::vector<double>& r) {
  double s = 0;
  for (double v : r) s += v * v;
  return s;
}

bool all_finite(const std::vector<double>& r) {
  return std::all_of(r.begin(), r.end(), [](double v) { return std::isfinite(v); });
}

// Solves A x = b (A square) by Gaussian elimination with partial pivoting; false when A is singular.
bool solve(std::vector<std::vector<double>> A, std::vector<double> b, std::vector<double>& x) {
  const size_t n = b.size();
  for (size_t k = 0; k < n; ++k) {
    size_t piv = k;
    for (size_t i = k + 1; i < n; ++i)
      if (std::abs(A[i][k]) > std::abs(A[piv][k])) piv = i;
    if (std::abs(A[piv][k]) < 1e-300) return false;
    std::swap(A[k], A[piv]);
    std::swap(b[k], b[piv]);
    for (size_t i = k + 1; i < n; ++i) {
      const double f = A[i][k] / A[k][k];
      for (size_t j = k; j < n; ++j) A[i][j] -= f * A[k][j];
      b[i] -= f * b[k];
    }
  }
  x.assign(n, 0);
  for (size_t k = n; k-- > 0;) {
    double s = b[k];
    for (size_t j = k + 1; j < n; ++j) s -= A[k][j] * x[j];
    x[k] = s / A[k][k];
  }
  return true;
}

std::vector<double> clip(std::vector<double> x, const std::vector<Bounds>& b) {
  for (size_t j = 0; j < x.size(); ++j) x[j] = std::clamp(x[j], b[j].lo, b[j].hi);
  return x;
}

}  // namespace

std::vector<std::vector<double>> finite_difference_jacobian(const Residuals& r, const std::vector<double>& x,
                                                            const std::vector<Bounds>& bounds, double rel_step) {
  const size_t n = x.size();
  std::vector<std::vector<double>> J;
  for (size_t j = 0; j < n; ++j) {
    const double h = rel_step * std::max(std::abs(x[j]), 1.0);
    std::vector<double> up = x, down = x;
    up[j] = std::min(x[j] + h, bounds[j].hi);
    down[j] = std::max(x[j] - h, bounds[j].lo);
    const std::vector<double> ru = r(up), rd = r(down);
    const double dx = up[j] - down[j];
    if (J.empty()) J.assign(ru.size(), std::vector<double>(n, 0));
    for (size_t i = 0; i < ru.size(); ++i) J[i][j] = dx > 0 ? (ru[i] - rd[i]) / dx : 0;
  }
  return J;
}

LeastSquaresResult levenberg_marquardt(const Residuals& r, std::vector<double> x0, const std::vector<Bounds>& bounds,
                                       int max_iterations, double tolerance) {
  MT_CHECK(x0.size() == bounds.size() && !x0.empty(), "least squares: {} parameters but {} bounds", x0.size(),
           bounds.size());
  for (size_t j = 0; j < bounds.size(); ++j)
    MT_CHECK(bounds[j].lo <= bounds[j].hi, "least squares: parameter {} has empty bounds [{}, {}]", j, bounds[j].lo,
             bounds[j].hi);
  LeastSquaresResult out;
  out.x = clip(std::move(x0), bounds);
  out.residuals = r(out.x);
  MT_CHECK(all_finite(out.residuals), "least squares: the residuals are not finite at the starting point");
  out.sum_squares = sum_squares(out.residuals);
  const size_t n = out.x.size();
  double lambda = 1e-3;
  for (out.iterations = 0; out.iterations < max_iterations && !out.converged; ++out.iterations) {
    const auto J = finite_difference_jacobian(r, out.x, bounds);
    std::vector<std::vector<double>> JtJ(n, std::vector<double>(n, 0));
    std::vector<double> Jtr(n, 0);
    for (size_t i = 0; i < J.size(); ++i)
      for (size_t a = 0; a < n; ++a) {
        Jtr[a] += J[i][a] * out.residuals[i];
        for (size_t b = 0; b < n; ++b) JtJ[a][b] += J[i][a] * J[i][b];
      }
    // A parameter on a bound that the descent direction pushes outwards stays there this iteration: solving for it
    // as if free would give a step the box then clips, which can stall the others (the active set of bounded
    // least squares).
    std::vector<bool> held(n, false);
    for (size_t a = 0; a < n; ++a)
      held[a] = (out.x[a] <= bounds[a].lo && Jtr[a] > 0) || (out.x[a] >= bounds[a].hi && Jtr[a] < 0);
    bool accepted = false;
    while (!accepted && lambda < 1e12) {
      std::vector<std::vector<double>> A = JtJ;
      for (size_t a = 0; a < n; ++a) A[a][a] += lambda * std::max(JtJ[a][a], 1e-12);
      std::vector<double> step, minus_g(n);
      for (size_t a = 0; a < n; ++a) minus_g[a] = -Jtr[a];
      for (size_t a = 0; a < n; ++a)
        if (held[a]) {
          for (size_t b = 0; b < n; ++b) A[a][b] = A[b][a] = 0;
          A[a][a] = 1;
          minus_g[a] = 0;
        }
      if (!solve(A, minus_g, step)) {
        lambda *= 10;
        continue;
      }
      std::vector<double> x = out.x;
      for (size_t a = 0; a < n; ++a) x[a] += step[a];
      x = clip(std::move(x), bounds);
      const std::vector<double> rx = r(x);
      const double ss = all_finite(rx) ? sum_squares(rx) : INFINITY;
      if (ss < out.sum_squares) {
        double moved = 0;
        for (size_t a = 0; a < n; ++a)
          moved = std::max(moved, std::abs(x[a] - out.x[a]) / std::max(1.0, std::abs(x[a])));
        out.converged = (out.sum_squares - ss) <= tolerance * std::max(out.sum_squares, 1e-300) || moved < 1e-9;
        out.x = std::move(x);
        out.residuals = rx;
        out.sum_squares = ss;
        lambda = std::max(lambda / 10, 1e-12);
        accepted = true;
      } else {
        lambda *= 10;
      }
    }
    if (!accepted) out.converged = true;  // no step lowers the sum: a (bounded) minimum
  }
  return out;
}

}  // namespace mt::perf

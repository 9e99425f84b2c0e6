// Arithmetic the estimators (power_iter, sketch) of every backend share, so
// that the CPU and CUDA engines give the same estimate for the same seed.
// Private to kernels/; pure functions.
#ifndef RVD_KERNELS_ESTIMATOR_MATH_H_
#define RVD_KERNELS_ESTIMATOR_MATH_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace rvd {

// Keeps an estimate of ||G||_F^2 where a PR in [1, n] puts it:
// trace^2 / n <= ||G||_F^2 <= trace^2.
inline double ClampedPR(double trace, double g2_estimate, int64_t n) {
  const double t2 = trace * trace;
  const double g2 = std::clamp(g2_estimate, t2 / static_cast<double>(n), t2);
  return t2 / g2;
}

// Modified Gram-Schmidt, twice, in float64, on the m columns of q (n x m,
// row-major f32). Columns that vanish (rank < m) are zeroed. `work` is
// scratch, reused across calls.
inline void Orthonormalize(float* q, int64_t n, int64_t m, std::vector<double>& work) {
  work.assign(q, q + n * m);
  double* d = work.data();
  for (int64_t c = 0; c < m; ++c) {
    double n0 = 0;
    for (int64_t i = 0; i < n; ++i) n0 += d[i * m + c] * d[i * m + c];
    const double norm0 = std::sqrt(n0);
    for (int pass = 0; pass < 2; ++pass) {
      for (int64_t p = 0; p < c; ++p) {
        double dot = 0;
        for (int64_t i = 0; i < n; ++i) dot += d[i * m + p] * d[i * m + c];
        for (int64_t i = 0; i < n; ++i) d[i * m + c] -= dot * d[i * m + p];
      }
    }
    double nn = 0;
    for (int64_t i = 0; i < n; ++i) nn += d[i * m + c] * d[i * m + c];
    nn = std::sqrt(nn);
    const double inv = (nn > 1e-10 * norm0 && nn > 0) ? 1.0 / nn : 0.0;
    for (int64_t i = 0; i < n; ++i) d[i * m + c] *= inv;
  }
  for (int64_t i = 0; i < n * m; ++i) q[i] = static_cast<float>(d[i]);
}

}  // namespace rvd

#endif  // RVD_KERNELS_ESTIMATOR_MATH_H_

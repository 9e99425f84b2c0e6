// The check of an engine's Gram eigenvalues (Engine::GramEigenvalues)
// against the float64 SVD oracle's singular values squared, shared by the
// CPU and the CUDA tests (test-only, header-only).
//
// Tolerance: both sides read the same stored values, so only float64
// rounding separates them. The Gram's entries carry an absolute error of up
// to ~len * 2^-53 * max eigenvalue (its accumulation over the long side),
// the symmetric eigensolver one of ~n * 2^-53 * max eigenvalue, so every
// eigenvalue is held to an absolute slack of 8 * max(rows, cols) * 2^-52 *
// lambda_max plus 1e-10 relative to itself (measured: the largest errors
// are below 1/20 of this).
//
// Thread-safe: pure functions.
#ifndef RVD_KERNELS_GRAM_EIGEN_CHECK_H_
#define RVD_KERNELS_GRAM_EIGEN_CHECK_H_

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <vector>

#include "absl/types/span.h"
#include "kernels/pr_check.h"

namespace rvd {

struct EigenCheck {
  CheckResult result;
  double max_abs_error_rel_to_max = 0;  // max |got - ref| / lambda_max
};

// got: the engine's eigenvalues (ascending); singular_values: the oracle's
// (any order); long_side = max(rows, cols).
inline EigenCheck CheckGramEigenvalues(absl::Span<const double> got,
                                       absl::Span<const double> singular_values,
                                       int64_t long_side) {
  std::vector<double> ref;
  for (double s : singular_values) ref.push_back(s * s);
  std::sort(ref.begin(), ref.end());
  const double top = ref.empty() ? 0.0 : ref.back();
  const Tolerance tol{8.0 * static_cast<double>(long_side) * DBL_EPSILON * top, 1e-10};
  EigenCheck c;
  c.result = CheckPR(got, ref, tol);
  for (size_t i = 0; i < got.size() && i < ref.size(); ++i) {
    const double e = std::fabs(got[i] - ref[i]) / (top > 0 ? top : 1.0);
    if (!(e <= c.max_abs_error_rel_to_max)) c.max_abs_error_rel_to_max = e;
  }
  // Ascending order is part of the contract.
  for (size_t i = 1; i < got.size(); ++i) {
    if (!(got[i - 1] <= got[i])) {
      ++c.result.mismatches;
      c.result.report += "  not ascending\n";
      break;
    }
  }
  return c;
}

}  // namespace rvd

#endif  // RVD_KERNELS_GRAM_EIGEN_CHECK_H_

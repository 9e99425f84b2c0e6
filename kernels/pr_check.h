// The one tolerance rule for PR results (private to rvd; tests, benchmarks
// and the self-improvement accept/reject step use the same checker):
//   |got - ref| <= atol + rtol * |ref|
// A NaN on either side is a mismatch.
//
// Thread-safe: pure functions.
#ifndef RVD_KERNELS_PR_CHECK_H_
#define RVD_KERNELS_PR_CHECK_H_

#include <cmath>
#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"

namespace rvd {

struct Tolerance {
  double atol = 0.0;  // absolute slack
  double rtol = 0.0;  // slack relative to |ref|
};

// Exact variants against the float64 SVD oracle.
inline constexpr Tolerance kExactPrTolerance{0.0, 2e-6};

inline bool WithinTolerance(double got, double ref, Tolerance tol) {
  return std::fabs(got - ref) <= tol.atol + tol.rtol * std::fabs(ref);
}

struct CheckResult {
  int64_t mismatches = 0;
  double max_rel_error = 0;  // max |got - ref| / |ref| over all entries
  std::string report;        // the first ten mismatches, one per line
};

// Compares got[i] with ref[i] for every i (the spans have the same size).
inline CheckResult CheckPR(absl::Span<const double> got,
                           absl::Span<const double> ref, Tolerance tol) {
  CheckResult r;
  for (size_t i = 0; i < got.size() && i < ref.size(); ++i) {
    const double rel =
        std::fabs(got[i] - ref[i]) / (ref[i] != 0 ? std::fabs(ref[i]) : 1.0);
    if (!(rel <= r.max_rel_error)) r.max_rel_error = rel;  // NaN sticks
    if (!WithinTolerance(got[i], ref[i], tol)) {
      if (++r.mismatches <= 10) {
        absl::StrAppend(&r.report, "  [", i, "] got ", got[i], " ref ", ref[i],
                        " rel ", rel, "\n");
      }
    }
  }
  if (got.size() != ref.size()) {
    ++r.mismatches;
    absl::StrAppend(&r.report, "  size ", got.size(), " vs ", ref.size(), "\n");
  }
  return r;
}

}  // namespace rvd

#endif  // RVD_KERNELS_PR_CHECK_H_

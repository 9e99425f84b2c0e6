// The host float64 reference of the per-job contract (self_improve/,
// public): what a candidate's g2, trace and maxabs must be for a job, from
// the stored values converted to float64 and summed in float64. The
// verifier compares every job's sums with these (recomputed for every
// check, never cached), and PR from the matrix's summed jobs with the SVD
// oracle's.
//
// Thread-safe: pure functions.
#ifndef RVD_SELF_IMPROVE_REFERENCE_H_
#define RVD_SELF_IMPROVE_REFERENCE_H_

#include <vector>

#include "absl/types/span.h"
#include "kernels/engine.h"
#include "self_improve/candidate_abi.h"

namespace rvd::tune {

struct JobSums {
  double g2 = 0;
  double trace = 0;
  double maxabs = 0;  // NaN when the job read a NaN
};

// The sums `job` must produce on `w` (the job's matrix; its Gram on the
// smaller side, as the contract in generator.h).
JobSums ReferenceJobSums(const MatrixView& w, const TuneJob& job);

// PR from a matrix's job sums, as the finalize computes it: t^2 / g, 0 for
// a matrix of zeros, NaN when a sum is not finite.
double PrFromJobSums(absl::Span<const JobSums> sums);

}  // namespace rvd::tune

#endif  // RVD_SELF_IMPROVE_REFERENCE_H_

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

// The sums `job` must produce on `w` (the job's matrix, a strided host
// view; its Gram on the smaller side, as the contract in generator.h). Each
// Gram entry is one float64 dot product of the converted operand rows
// (OpenBLAS dgemm, dsyrk on the diagonal), so a sum differs from a
// sequential one only in the rounding of its order.
JobSums ReferenceJobSums(const MatrixView& w, const TuneJob& job);

// The same for every job of `jobs` on `w`, the matrix converted to float64
// once: what a caller with many jobs of one matrix uses.
std::vector<JobSums> ReferenceMatrixSums(const MatrixView& w, absl::Span<const TuneJob> jobs);

// PR from a matrix's job sums, as the finalize computes it: t^2 / g, 0 for
// a matrix of zeros, NaN when a sum is not finite.
double PrFromJobSums(absl::Span<const JobSums> sums);

}  // namespace rvd::tune

#endif  // RVD_SELF_IMPROVE_REFERENCE_H_

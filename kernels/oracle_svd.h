// The float64 SVD reference's core (oracle.cc), shared by OraclePR and the
// CPU engine's naive variant. Private to kernels/; thread-safe.
#ifndef RVD_KERNELS_ORACLE_SVD_H_
#define RVD_KERNELS_ORACLE_SVD_H_

#include <cstddef>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/engine.h"

namespace rvd {

// PR of `m` (which passed ValidateView) from the singular values of its
// float64 conversion (LAPACK dgesdd, jobz = 'N'). Errors name batch[index]:
// INVALID_ARGUMENT for NaN/Inf or more than 2^31 elements (LAPACK's int
// indexing), RESOURCE_EXHAUSTED when the float64 copy cannot be allocated,
// INTERNAL when dgesdd fails.
absl::StatusOr<double> SvdPR(const MatrixView& m, size_t index);

// The singular values SvdPR takes PR from: min(rows, cols) of them,
// descending (all 0 for a zero matrix). Errors as SvdPR's. The reference of
// the engines' Gram eigenvalues (their squares), in the tests.
absl::StatusOr<std::vector<double>> SvdSingularValues(const MatrixView& m, size_t index);

}  // namespace rvd

#endif  // RVD_KERNELS_ORACLE_SVD_H_

// Engine::GramEigenvalues (engine.h): the call contract both engines share
// and the CPU engine's implementation (gram_eigen_cpu.cc). Private to
// kernels/ (the CUDA engine's kernels/cuda/gram_eigen.cc uses the contract).
//
// Thread-safe: functions only.
#ifndef RVD_KERNELS_GRAM_EIGEN_H_
#define RVD_KERNELS_GRAM_EIGEN_H_

#include <cstdint>
#include <functional>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "kernels/engine.h"

namespace rvd {

// The checks before any work: out poisoned with NaN (an error leaves no
// stale values), then the view (ValidateView: not blocked, dimensions below
// 2^31, aligned data) and one slot per eigenvalue (out.size() ==
// min(rows, cols)); INVALID_ARGUMENT otherwise.
absl::Status CheckGramEigenvaluesCall(const MatrixView& m, absl::Span<double> out);

// Runs fn(i) for every i in [0, n) on the engine's threads and returns when
// all have returned (the CPU engine's pool).
using ParallelForFn = std::function<void(int64_t n, const std::function<void(int64_t)>& fn)>;

// The CPU engine's GramEigenvalues. The Gram on the smaller side in float64
// (the matrix converted a chunk of the long side at a time, OpenBLAS dsyrk
// accumulating into the n x n Gram), then LAPACK dsyevd (eigenvalues only).
// A Gram of at least `split_min_flops` multiply-adds is cut along its long
// side into up to `threads` parts run by `parallel_for`, each part's
// partial Gram (n^2 doubles) held until the parts are summed; the parts
// beyond the first are held within `budget` bytes. Cancellation is looked at
// before each chunk.
absl::Status CpuGramEigenvalues(const MatrixView& m, absl::Span<double> out,
                                const CallOptions& call, const ParallelForFn& parallel_for,
                                int threads, uint64_t budget, double split_min_flops);

}  // namespace rvd

#endif  // RVD_KERNELS_GRAM_EIGEN_H_

// MeasureActivations (rvd.v1): the statistics of activation matrices (seed
// 000's VActivationMonitor) from the eigenvalues of their Gram, computed by
// the engine (Engine::GramEigenvalues). Request validation, the statistics
// from a spectrum (the one owner of their definitions), and the
// computation of a request. No gRPC here: testable in-process.
//
// Thread-safe: functions only; the Engine they call is thread-safe.
#ifndef RVD_SERVER_ACTIVATIONS_H_
#define RVD_SERVER_ACTIVATIONS_H_

#include <atomic>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/engine.h"
#include "rvd/v1/rvd.pb.h"

namespace rvd {

// What one request may ask for (ValidateActivations; each error names its
// limit). Activation matrices per request, as tensors of a MeasureHeader.
inline constexpr int kMaxActivationTensors = 4096;
// The smaller side of one activation matrix: its Gram (side^2 doubles, 128
// MiB at the limit) is held whole for the eigensolver, whose work grows as
// side^3: LAPACK dsyevd on one core of the build host took 41 s at 4096 and
// 0.33 s at 1024 (numpy's eigvalsh, the same OpenBLAS); cuSOLVER's on the
// GPU is not measured yet.
inline constexpr int64_t kMaxActivationSide = 4096;

// The statistics of a matrix A from the eigenvalues lambda_i of its Gram
// (the squared singular values s_i^2 of A).
//
// Eigenvalues at or below the Gram's rounding floor, long_side * 2^-52 *
// lambda_max (long_side = max(rows, cols): the float64 Gram's accumulation
// error grows with it), are taken as 0, negative ones included: below it a
// float64 Gram cannot tell an eigenvalue from 0, and the noise would
// otherwise add sqrt(floor) per zero singular value to sum s_j (a rank-one
// 1024 x 4096 matrix would report an effective rank of 1.005, not 1).
//
//   frobenius_norm      sqrt(sum lambda_i) = ||A||_F
//   max_singular_value  sqrt(max lambda_i) = s_1
//   entropy             H = -sum p_i log p_i (nats) of p_i = s_i / sum s_j,
//                       over the s_i > 0
//   effective_rank      exp(H) (Roy and Vetterli 2007): 1 for rank one,
//                       k for k equal singular values
//   participation_ratio (sum lambda_i)^2 / sum lambda_i^2
// A zero matrix (every lambda_i at the floor) has no spectrum: every
// statistic is 0 (effective rank 0, as its PR is 0 in engine.h).
// INVALID_ARGUMENT for a NaN or infinite eigenvalue, or long_side < 1.
struct SpectrumStats {
  double frobenius_norm = 0;
  double max_singular_value = 0;
  double entropy = 0;
  double effective_rank = 0;
  double participation_ratio = 0;
};
absl::StatusOr<SpectrumStats> StatsFromGramEigenvalues(absl::Span<const double> eigenvalues,
                                                       int64_t long_side);

// Everything about a request that can be checked before computing: model
// id syntax (measure.h), 1..kMaxActivationTensors activations, each a known
// dtype, a 2-D positive shape with min(rows, cols) <= kMaxActivationSide and
// exactly rows * cols * dtype size bytes; distinct layers; total bytes <=
// max_request_bytes (RESOURCE_EXHAUSTED). Errors name activations[i] and
// its layer. Returns the total bytes.
absl::StatusOr<uint64_t> ValidateActivations(const rvd::v1::MeasureActivationsRequest& request,
                                             uint64_t max_request_bytes);

// The statistics of every activation, in request order, one
// GramEigenvalues call each; the request must have passed
// ValidateActivations. The answer carries the model id, step, the engine's
// backend and the elapsed time. `cancel` (may be null): once set, the
// engine call stops at its next checkpoint and the answer is CANCELLED.
// Engine errors name activations[i] and its layer.
absl::StatusOr<rvd::v1::MeasureActivationsResponse> ComputeActivationStats(
    Engine& engine, const rvd::v1::MeasureActivationsRequest& request,
    const std::atomic<bool>* cancel = nullptr);

}  // namespace rvd

#endif  // RVD_SERVER_ACTIVATIONS_H_

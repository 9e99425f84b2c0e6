// The call contract every Engine::ComputePR shares (engine.h), written once
// for the CPU and CUDA backends: the checks a call makes before any work,
// the errors it answers with, and PR from singular values. A backend calls
// CheckCall first, then decides whether it has the parsed variant (the CPU
// engine answers UNIMPLEMENTED for kFused), then computes.
//
// Errors (every message that concerns one matrix names batch[index]):
//   INVALID_ARGUMENT  out.size() != batch.size(); a bad view; NaN/Inf in a
//                     matrix; probes or sketch_rank outside [1, max].
//   UNIMPLEMENTED     an unknown variant name (the message names the backend
//                     and the known variants).
//
//   CANCELLED         the caller set CallOptions::cancel (CallCancelled).
//
// Thread-safe: pure functions.
#ifndef RVD_KERNELS_CALL_CONTRACT_H_
#define RVD_KERNELS_CALL_CONTRACT_H_

#include <cstddef>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/engine.h"

namespace rvd {

// The variants of KnownVariants(), as the engines switch on them.
enum class VariantKind { kFused, kAlgebraic, kNaive, kPowerIter, kSketch };

// Upper bounds on the parameters that size an estimator's work (its probe
// and sketch blocks are n x probes and r x (n + len) floats). Checked before
// anything is allocated: an unbounded request must be an error, not an
// allocation that kills the daemon.
inline constexpr int kMaxProbes = 4096;
inline constexpr int kMaxSketchRank = 4096;

// The kind of v.name (empty: `default_variant`). Errors: UNIMPLEMENTED for a
// name not in KnownVariants() (naming `backend` and the known variants);
// INVALID_ARGUMENT for power_iter with probes outside [1, kMaxProbes] or
// sketch with sketch_rank outside [1, kMaxSketchRank] (naming the limit).
// A parameter the variant does not use is not checked.
absl::StatusOr<VariantKind> ParseVariant(const VariantSpec& v,
                                         std::string_view backend,
                                         std::string_view default_variant);

// INVALID_ARGUMENT, naming batch[index], unless v has data, rows >= 1,
// cols >= 1, ld >= cols, rows/cols/ld below 2^31 (BLAS and the kernels take
// int dimensions), a byte extent that fits int64, data aligned to its
// element size, and is not blocked (MatrixView::block_rows: only the device
// path takes those, through ValidateBlockedView).
absl::Status ValidateView(const MatrixView& v, size_t index);

// The same for a blocked view (block_rows > 0): each block a valid view
// (ValidateView of block_rows x cols), block_rows dividing rows, blocks
// that neither overlap nor go backwards (block_stride >= block_rows * ld),
// and the whole extent in int64 bytes.
absl::Status ValidateBlockedView(const MatrixView& v, size_t index);

// INVALID_ARGUMENT "batch[index]: matrix contains NaN or Inf".
absl::Status NonFiniteError(size_t index);

// The checks every call makes before any work, in this order: one result
// slot per matrix; out poisoned with NaN (a slot nobody writes cannot pass
// for a result, and an error leaves no stale values); the variant parsed;
// every view validated. Returns the variant's kind.
absl::StatusOr<VariantKind> CheckCall(absl::Span<const MatrixView> batch,
                                      const VariantSpec& variant,
                                      absl::Span<double> out,
                                      std::string_view backend,
                                      std::string_view default_variant);

// Whether the caller has asked the call to stop (CallOptions::cancel set).
// Cheap (one relaxed load): the engines call it at every checkpoint.
inline bool CancelRequested(const CallOptions& call) {
  return call.cancel != nullptr && call.cancel->load(std::memory_order_relaxed);
}

// CANCELLED "the caller cancelled the call; no result".
absl::Status CallCancelled();

// PR = (sum s_i^2)^2 / sum s_i^4 from singular values, in float64, each
// scaled by the largest first so that s^4 can neither overflow nor
// underflow to zero. 0 when every value is zero (or there are none): a zero
// matrix has no spectrum. The oracle, the CPU naive path and the CUDA naive
// path all finish here.
double PRFromSingularValues(absl::Span<const double> sv);

}  // namespace rvd

#endif  // RVD_KERNELS_CALL_CONTRACT_H_

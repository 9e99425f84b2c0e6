// Host-side planning for the CUDA engine (private to kernels/cuda/): the
// choice of a fused kernel and its LaunchPolicy (the policies themselves:
// descriptors.h, which the kernels include too), the enumeration of its jobs (upper-
// triangle tiles of each Gram), grouping a batch by shape for the cuBLAS
// variants, and chunking a batch by bytes. Pure C++ with no CUDA types, so
// it is tested on machines without a GPU (launch_policy_test.cc, label unit).
//
// Thread-safe: pure functions and constants.
#ifndef RVD_KERNELS_CUDA_LAUNCH_POLICY_H_
#define RVD_KERNELS_CUDA_LAUNCH_POLICY_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "kernels/cuda/descriptors.h"
#include "kernels/engine.h"

namespace rvd::cuda {

// The kernel version string, e.g.
// "cuda/sm90/fused:tma-wgmma-square+tma-wgmma-triangle+mma-sync-wide+wmma-tall":
// the techniques that serve fused calls on that device (v4 on 9.0 only), by
// the stable names the served counts use.
std::string KernelVersion(int sm_major, int sm_minor);
// Each technique's tuning knobs (its policy's name), for the log and an info
// metric: a retune changes these, never a technique's name.
std::map<std::string, std::string> KernelPolicies(int sm_major, int sm_minor);

// Whether the device runs fused v4 (sm_90a code: compute capability 9.0).
bool FusedV4Runs(int sm_major, int sm_minor);

// The fused kernels, in the order a launch groups them.
enum class FusedKernel { kV4 = 0, kV4Triangle = 1, kV3 = 2, kV1Tall = 3 };

// Whether `kernel` is one of v4's (TMA tensor maps, LaunchFusedV4).
inline bool IsFusedV4(FusedKernel kernel) {
  return kernel == FusedKernel::kV4 || kernel == FusedKernel::kV4Triangle;
}

// Which fused kernel serves a rows x cols matrix of `dtype` on a device of
// compute capability sm_major.sm_minor; `aligned`: its data and rows start
// on 16-byte boundaries (what TMA needs). Tall matrices: v1. Wide: v4 where
// it runs, for aligned rows (f32 of Gram side > 128 only with the policy's
// f32_pairs), 16-bit up to 128 as v4's triangle; else v3. Depends on nothing
// else: a matrix gets the same bits in every call.
FusedKernel ChooseFusedKernel(int sm_major, int sm_minor, DType dtype, int64_t rows,
                              int64_t cols, bool aligned);

// Whether v4 `kernel` runs a matrix of `dtype` and Gram side `gram_side` as
// paired tiles (FusedV4Launch::pairs: f32 of side > 128, whose off-diagonal
// jobs need both row blocks converted). Such matrices launch apart from
// v4's other f32 ones, so each gets the same kernel in every call.
inline bool FusedV4Pairs(FusedKernel kernel, DType dtype, int64_t gram_side) {
  return kernel == FusedKernel::kV4 && dtype == DType::kF32 &&
         gram_side > kFusedPolicyV4Sm90.block_tile;
}

// Whether v4's triangle can take a tall rows x cols matrix (16-bit, rows >
// cols <= 128, aligned rows: G = W^T W from MN-major tiles,
// FusedV4Launch::tall). It serves them only with its policy's `tall` (off:
// unmeasured; rvd_bench_gpu times it as "v4-tall" against v1).
inline bool FusedV4TallRuns(DType dtype, int64_t rows, int64_t cols, bool aligned) {
  return dtype != DType::kF32 && rows > cols && cols <= kFusedPolicyV4TriangleSm90.block_tile &&
         aligned;
}

// Whether fused v4 writes a matrix's PR itself (LaunchFusedV4's pr): a
// matrix it serves in one job, Gram side <= 128.
inline bool FusedV4FinishesMatrix(FusedKernel kernel, int64_t gram_side) {
  return IsFusedV4(kernel) && gram_side <= kFusedPolicyV4Sm90.block_tile;
}

// The launch policy of a fused kernel.
const LaunchPolicy& FusedPolicyOf(FusedKernel kernel);

// Appends matrix `matrix`'s v2 jobs (Gram side `side`) in order: for each
// row tile, its diagonal job, then its off-diagonal column tiles.
void AppendFusedJobsV2(int32_t matrix, int64_t side, const LaunchPolicy& p,
                       std::vector<FusedJobV2>* jobs);

// The plan for `jobs` jobs of at least `min_slices` K-slices each on
// `sms` SMs: pieces (<= tail_pieces) chosen to make the busiest block's
// share of the last round's work smallest, the fewest on ties.
FusedV4Plan PlanFusedV4(int jobs, int sms, int min_slices, int tail_pieces);

// The policy's tail_pieces for a launch of v4 `kernel` on `dtype`.
int FusedV4TailPieces(FusedKernel kernel, DType dtype);

// Device memory a plan needs: one 128 x 128 f32 partial Gram per piece of
// a cut job, and kFusedV4TicketInts int32 tickets.
// (kFusedV4PartialFloats, kFusedV4TicketInts: descriptors.h.)
int64_t FusedV4PartialBytes(const FusedV4Plan& plan);

// The Gram's side for a rows x cols matrix: min(rows, cols).
int64_t GramSide(int64_t rows, int64_t cols);

// Jobs for each matrix in order, tiles of each matrix in row-major order of
// the upper triangle; job_begin has grams.size() + 1 entries and matrix i's
// jobs are [job_begin[i], job_begin[i+1]). `sides` holds each Gram's side.
void EnumerateFusedJobs(absl::Span<const int64_t> sides, int block_tile,
                        std::vector<FusedJob>* jobs,
                        std::vector<int32_t>* job_begin);

// Indices of a batch grouped by (rows, cols, ld, dtype), groups in order of
// first appearance, members in batch order.
struct ShapeKey {
  int64_t rows, cols, ld;
  DType dtype;
  bool operator==(const ShapeKey& o) const {
    return rows == o.rows && cols == o.cols && ld == o.ld && dtype == o.dtype;
  }
};
struct ShapeGroup {
  ShapeKey key;
  std::vector<size_t> members;
};
std::vector<ShapeGroup> GroupByShape(absl::Span<const MatrixView> batch);

// Cuts [0, sizes.size()) into consecutive chunks whose byte sums stay within
// `budget`; a single item larger than the budget gets a chunk of its own.
// Returns the chunk boundaries (first = 0, last = sizes.size()).
std::vector<size_t> ChunkByBytes(absl::Span<const uint64_t> sizes,
                                 uint64_t budget);

// Bytes of a matrix packed for the device: rows padded to a multiple of 16
// bytes (so the fused kernel's 16-byte loads apply), the whole rounded up to
// 256 bytes. *ld_out receives the packed leading dimension in elements.
uint64_t PackedBytes(const MatrixView& v, int64_t* ld_out);

}  // namespace rvd::cuda

#endif  // RVD_KERNELS_CUDA_LAUNCH_POLICY_H_

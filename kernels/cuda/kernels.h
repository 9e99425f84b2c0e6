// Launchers of the CUDA engine's own kernels (private to kernels/cuda/).
// Host code calls these; the fused kernels live in the device headers
// (descriptors.h and the .cuh files: no host-only includes, so NVRTC
// compiles them too, nvrtc_headers_test.cc), their launches in
// fused_launch.cuh, the other kernels in kernels.cu. Each launcher checks its own constraints and returns the
// launch error; none synchronizes.
#ifndef RVD_KERNELS_CUDA_KERNELS_H_
#define RVD_KERNELS_CUDA_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/descriptors.h"
#include "kernels/cuda/launch_policy.h"
#include "kernels/engine.h"

namespace rvd::cuda {

MatrixDesc MakeDesc(const MatrixView& device_view);

// The fused kernel v1 (fused_kernel.cuh): a block per job, or `grid`
// blocks (1 .. num_jobs; 0: num_jobs) taking the jobs round-robin (the SM
// cap: fused_plan.h, ProductGrid); writes per job the weighted sum of
// squares of its Gram tile (g2), ||rows||^2 for diagonal jobs (trace, 0
// otherwise) and the largest |w| seen (maxabs). All jobs of one launch have
// matrices of `dtype`. The grid changes no result.
cudaError_t LaunchFused(DType dtype, const MatrixDesc* mats,
                        const FusedJob* jobs, int num_jobs,
                        bool any_offdiagonal, double* g2, double* trace,
                        float* maxabs, cudaStream_t stream, int grid = 0);

// The fused kernel v2 (wide matrices, rows <= cols; fused_v2_kernel.cuh):
// FusedJobV2s on `grid` blocks as LaunchFused, outputs per job as LaunchFused.
cudaError_t LaunchFusedV2(DType dtype, const MatrixDesc* mats,
                          const FusedJobV2* jobs, int num_jobs,
                          bool any_offdiagonal, double* g2, double* trace,
                          float* maxabs, cudaStream_t stream, int grid = 0);

// The fused kernel v4 (sm_90a: TMA + wgmma; fused_v4_kernel.cuh) for the
// matrices ChooseFusedKernel (launch_policy.h) gives it: FusedV4Launch
// (descriptors.h).
// Host only: writes matrix d's tensor map (d.data a device pointer) to `map`.
cudaError_t EncodeFusedV4Map(DType dtype, const MatrixDesc& d, void* map);
cudaError_t LaunchFusedV4(DType dtype, const FusedV4Launch& launch, cudaStream_t stream);

// The launchers' signatures (fused_plan.h's FusedLaunchers).
using FusedLauncher = cudaError_t (*)(DType, const MatrixDesc*,
                                      const FusedJob*, int, bool, double*,
                                      double*, float*, cudaStream_t, int);
using FusedV2Launcher = cudaError_t (*)(DType, const MatrixDesc*,
                                        const FusedJobV2*, int, bool, double*,
                                        double*, float*, cudaStream_t, int);
using FusedV4Launcher = cudaError_t (*)(DType, const FusedV4Launch&, cudaStream_t);

// Per matrix m: sums its jobs [job_begin[m], job_begin[m+1]) in job order,
// in float64, and writes pr[m] and status[m]. A warp per matrix, in blocks
// of kFinalizeThreads: FinalizeBlocks(num_matrices) blocks, or `grid` (1 ..
// that; 0: that) taking the matrices round-robin (the SM cap). The grid
// changes no result.
inline constexpr int kFinalizeThreads = 128;
inline constexpr int FinalizeBlocks(int num_matrices) {
  return (num_matrices * 32 + kFinalizeThreads - 1) / kFinalizeThreads;
}
cudaError_t LaunchFinalize(const MatrixDesc* mats, const int32_t* job_begin,
                           int num_matrices, const double* g2,
                           const double* trace, const float* maxabs,
                           double* pr, int32_t* status, cudaStream_t stream,
                           int grid = 0);

// One block per matrix: trace[m] = ||W_m||_F^2 (float64), maxabs[m].
cudaError_t LaunchStats(DType dtype, const MatrixDesc* mats, int num_matrices,
                        double* trace, float* maxabs, cudaStream_t stream);

// Sums of squares of `count` f32 matrices, each rows x cols, column-major
// with leading dimension ld, matrix i at base + i * stride, in float64. Each
// matrix is the sum of `chunks` parts (part c at + c * chunk_stride; split-K
// Grams), summed per entry in float64 before squaring:
//   kAll: every entry; kSymUpper: entries with row <= col, weight 2 above
//   the diagonal (||G||_F^2 of a symmetric G); kStrictUpper: row < col.
enum class SumMode { kAll, kSymUpper, kStrictUpper };
cudaError_t LaunchSumSquares(const float* base, int64_t stride, int chunks,
                             int64_t chunk_stride, int count, int rows,
                             int cols, int64_t ld, SumMode mode, double* out,
                             cudaStream_t stream);

// Converts a matrix to a dense f32 copy, row-major rows x cols.
cudaError_t LaunchToF32(DType dtype, const MatrixDesc& m, float* dst,
                        cudaStream_t stream);

// Converts a matrix to float64, column-major with at least as many rows as
// columns (W^T when rows <= cols, else W): the layout gesvd takes.
cudaError_t LaunchToF64ForSvd(DType dtype, const MatrixDesc& m, double* dst,
                              cudaStream_t stream);

// Zeroes the entries below the diagonal of the n x n column-major `a`
// (leading dimension ld): R of a QR factorization, without its reflectors.
cudaError_t LaunchZeroBelowDiagonal(double* a, int n, int64_t ld, cudaStream_t stream);

}  // namespace rvd::cuda

#endif  // RVD_KERNELS_CUDA_KERNELS_H_

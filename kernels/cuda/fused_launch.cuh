// The fused kernels v1 and v2/v3's launches (host code, private to
// kernels/cuda/, nvcc only): grid, shared memory and the opt-ins each
// kernel needs. The kernels are device headers (fused_kernel.cuh,
// fused_v2_kernel.cuh); kernels.cu instantiates them with the product's
// Hooks (fused::Product, fused_v2::Product), the test's mutants
// (fused_mutant.cu) and the benchmark's probes (bench/dev/fused_probes.cu)
// with their own, in their own translation units.
#ifndef RVD_KERNELS_CUDA_FUSED_LAUNCH_CUH_
#define RVD_KERNELS_CUDA_FUSED_LAUNCH_CUH_

#include <cuda_runtime.h>

#include "kernels/cuda/fused_kernel.cuh"
#include "kernels/cuda/fused_v2_kernel.cuh"
#include "kernels/cuda/kernels.h"

namespace rvd::cuda {
namespace fused {

// `grid`: blocks of the launch, 1 .. num_jobs (0: num_jobs).
template <typename T, class Hooks>
cudaError_t LaunchFusedT(const MatrixDesc* mats, const FusedJob* jobs,
                         int num_jobs, bool any_offdiagonal, double* g2,
                         double* trace, float* maxabs, int grid, cudaStream_t stream) {
  if (num_jobs <= 0) return cudaSuccess;
  if (grid <= 0 || grid > num_jobs) grid = num_jobs;
  const int operands = any_offdiagonal ? 2 : 1;
  const int smem = kStages * operands * kOperandBytes;
  auto* kernel = grid < num_jobs ? FusedKernel<T, Hooks, true> : FusedKernel<T, Hooks, false>;
  // Above 48 KB needs the opt-in; cheap, and per device, so set every time.
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       kStages * 2 * kOperandBytes);
  if (e != cudaSuccess) return e;
  kernel<<<grid, kThreads, smem, stream>>>(mats, jobs, num_jobs, operands, g2, trace, maxabs);
  return cudaGetLastError();
}

template <class Hooks>
cudaError_t LaunchFusedDispatch(DType dtype, const MatrixDesc* mats,
                                const FusedJob* jobs, int num_jobs,
                                bool any_offdiagonal, double* g2,
                                double* trace, float* maxabs, int grid,
                                cudaStream_t stream) {
  switch (dtype) {
    case DType::kF32:
      return LaunchFusedT<float, Hooks>(mats, jobs, num_jobs, any_offdiagonal, g2, trace,
                                        maxabs, grid, stream);
    case DType::kF16:
      return LaunchFusedT<__half, Hooks>(mats, jobs, num_jobs, any_offdiagonal, g2, trace,
                                         maxabs, grid, stream);
    case DType::kBF16:
      return LaunchFusedT<__nv_bfloat16, Hooks>(mats, jobs, num_jobs, any_offdiagonal, g2,
                                                trace, maxabs, grid, stream);
  }
  return cudaErrorInvalidValue;
}
}  // namespace fused

namespace fused_v2 {

// `grid`: blocks of the launch, 1 .. num_jobs (0: num_jobs). kChain: the
// live policy's for T (0: v2's code).
template <typename T, class Hooks, int kChain = LiveChain<T>()>
cudaError_t LaunchFusedV2T(const MatrixDesc* mats, const FusedJobV2* jobs,
                           int num_jobs, bool any_offdiagonal, double* g2,
                           double* trace, float* maxabs, int grid, cudaStream_t stream) {
  if (num_jobs <= 0) return cudaSuccess;
  if (grid <= 0 || grid > num_jobs) grid = num_jobs;
  const int stage_bytes = any_offdiagonal ? kABytes + kBBytes : kABytes;
  const int smem = (any_offdiagonal ? kStagesMixed : kStagesDiag) * stage_bytes;
  const bool strided = grid < num_jobs;
  auto* kernel = any_offdiagonal ? (strided ? FusedV2Kernel<T, Hooks, kStagesMixed, kChain, true>
                                            : FusedV2Kernel<T, Hooks, kStagesMixed, kChain>)
                                 : (strided ? FusedV2Kernel<T, Hooks, kStagesDiag, kChain, true>
                                            : FusedV2Kernel<T, Hooks, kStagesDiag, kChain>);
  // Above 48 KB needs the opt-in; and the whole carveout as shared memory so
  // that two blocks of 108 KB fit an SM. Cheap, per device: set every time.
  cudaError_t e = cudaFuncSetAttribute(
      kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e != cudaSuccess) return e;
  e = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                           cudaSharedmemCarveoutMaxShared);
  if (e != cudaSuccess) return e;
  kernel<<<grid, kThreads, smem, stream>>>(mats, jobs, num_jobs, stage_bytes, g2, trace,
                                           maxabs);
  return cudaGetLastError();
}

template <class Hooks>
cudaError_t LaunchFusedV2Dispatch(DType dtype, const MatrixDesc* mats,
                                  const FusedJobV2* jobs, int num_jobs,
                                  bool any_offdiagonal, double* g2,
                                  double* trace, float* maxabs, int grid,
                                  cudaStream_t stream) {
  switch (dtype) {
    case DType::kF32:
      return LaunchFusedV2T<float, Hooks>(mats, jobs, num_jobs, any_offdiagonal, g2, trace,
                                          maxabs, grid, stream);
    case DType::kF16:
      return LaunchFusedV2T<__half, Hooks>(mats, jobs, num_jobs, any_offdiagonal, g2, trace,
                                           maxabs, grid, stream);
    case DType::kBF16:
      return LaunchFusedV2T<__nv_bfloat16, Hooks>(mats, jobs, num_jobs, any_offdiagonal, g2,
                                                  trace, maxabs, grid, stream);
  }
  return cudaErrorInvalidValue;
}
}  // namespace fused_v2
}  // namespace rvd::cuda

#endif  // RVD_KERNELS_CUDA_FUSED_LAUNCH_CUH_

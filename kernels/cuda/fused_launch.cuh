// The fused kernels v1 and v2/v3's launches (host code, private to
// kernels/cuda/, nvcc only): grid, shared memory and the opt-ins each
// kernel needs. The kernels are device headers (fused_kernel.cuh,
// fused_v2_kernel.cuh); kernels.cu instantiates the product's, the test
// and bench translation units their own.
#ifndef RVD_KERNELS_CUDA_FUSED_LAUNCH_CUH_
#define RVD_KERNELS_CUDA_FUSED_LAUNCH_CUH_

#include <cuda_runtime.h>

#include "kernels/cuda/fused_kernel.cuh"
#include "kernels/cuda/fused_v2_kernel.cuh"
#include "kernels/cuda/kernels.h"

namespace rvd::cuda {
namespace fused {

// `grid`: blocks of the launch, 1 .. num_jobs (0: num_jobs).
template <typename T, bool kMutant>
cudaError_t LaunchFusedT(const MatrixDesc* mats, const FusedJob* jobs,
                         int num_jobs, bool any_offdiagonal, double* g2,
                         double* trace, float* maxabs, int grid, cudaStream_t stream) {
  if (num_jobs <= 0) return cudaSuccess;
  if (grid <= 0 || grid > num_jobs) grid = num_jobs;
  const int operands = any_offdiagonal ? 2 : 1;
  const int smem = kStages * operands * kOperandBytes;
  // Above 48 KB needs the opt-in; cheap, and per device, so set every time.
  cudaError_t e = cudaFuncSetAttribute(
      FusedKernel<T, kMutant>, cudaFuncAttributeMaxDynamicSharedMemorySize,
      kStages * 2 * kOperandBytes);
  if (e != cudaSuccess) return e;
  FusedKernel<T, kMutant><<<grid, kThreads, smem, stream>>>(
      mats, jobs, num_jobs, operands, g2, trace, maxabs);
  return cudaGetLastError();
}

template <bool kMutant>
cudaError_t LaunchFusedDispatch(DType dtype, const MatrixDesc* mats,
                                const FusedJob* jobs, int num_jobs,
                                bool any_offdiagonal, double* g2,
                                double* trace, float* maxabs, int grid,
                                cudaStream_t stream) {
  switch (dtype) {
    case DType::kF32:
      return LaunchFusedT<float, kMutant>(mats, jobs, num_jobs, any_offdiagonal, g2, trace,
                                          maxabs, grid, stream);
    case DType::kF16:
      return LaunchFusedT<__half, kMutant>(mats, jobs, num_jobs, any_offdiagonal, g2, trace,
                                           maxabs, grid, stream);
    case DType::kBF16:
      return LaunchFusedT<__nv_bfloat16, kMutant>(mats, jobs, num_jobs, any_offdiagonal, g2,
                                                   trace, maxabs, grid, stream);
  }
  return cudaErrorInvalidValue;
}
}  // namespace fused

namespace fused_v2 {

// `grid`: blocks of the launch, 1 .. num_jobs (0: num_jobs).
template <typename T, bool kMutant, int kChain = LiveChain<T>()>
cudaError_t LaunchFusedV2T(const MatrixDesc* mats, const FusedJobV2* jobs,
                           int num_jobs, bool any_offdiagonal, double* g2,
                           double* trace, float* maxabs, int grid, cudaStream_t stream) {
  if (num_jobs <= 0) return cudaSuccess;
  if (grid <= 0 || grid > num_jobs) grid = num_jobs;
  const int stage_bytes = any_offdiagonal ? kABytes + kBBytes : kABytes;
  const int smem = (any_offdiagonal ? kStagesMixed : kStagesDiag) * stage_bytes;
  auto* kernel = any_offdiagonal
                     ? FusedV2Kernel<T, kMutant, kStagesMixed, kChain>
                     : FusedV2Kernel<T, kMutant, kStagesDiag, kChain>;
  // Above 48 KB needs the opt-in; and the whole carveout as shared memory so
  // that two blocks of 108 KB fit an SM. Cheap, per device: set every time.
  cudaError_t e = cudaFuncSetAttribute(
      kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e != cudaSuccess) return e;
  e = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                           cudaSharedmemCarveoutMaxShared);
  if (e != cudaSuccess) return e;
  kernel<<<grid, kThreads, smem, stream>>>(mats, jobs, num_jobs, stage_bytes, g2, trace,
                                           maxabs, 0, 1);
  return cudaGetLastError();
}

// The benchmark's probe: bf16, the live kernel (v3) with the probe flags and `splits` blocks
// per job (each a contiguous 1/splits of K; outputs per block, not summed:
// timing only).
inline cudaError_t LaunchFusedV2ProbeBf16(const MatrixDesc* mats,
                                          const FusedJobV2* jobs, int num_jobs,
                                          bool any_offdiagonal, double* g2,
                                          double* trace, float* maxabs,
                                          int probe, int splits,
                                          cudaStream_t stream) {
  if (num_jobs <= 0 || splits < 1) return cudaSuccess;
  const int stage_bytes = any_offdiagonal ? kABytes + kBBytes : kABytes;
  const int smem = (any_offdiagonal ? kStagesMixed : kStagesDiag) * stage_bytes;
  auto* kernel = any_offdiagonal
                     ? FusedV2Kernel<__nv_bfloat16, false, kStagesMixed, kLiveChain, true>
                     : FusedV2Kernel<__nv_bfloat16, false, kStagesDiag, kLiveChain, true>;
  cudaError_t e = cudaFuncSetAttribute(
      kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e != cudaSuccess) return e;
  e = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                           cudaSharedmemCarveoutMaxShared);
  if (e != cudaSuccess) return e;
  kernel<<<num_jobs * splits, kThreads, smem, stream>>>(
      mats, jobs, num_jobs * splits, stage_bytes, g2, trace, maxabs, probe, splits);
  return cudaGetLastError();
}

template <bool kMutant>
cudaError_t LaunchFusedV2Dispatch(DType dtype, const MatrixDesc* mats,
                                  const FusedJobV2* jobs, int num_jobs,
                                  bool any_offdiagonal, double* g2,
                                  double* trace, float* maxabs, int grid,
                                  cudaStream_t stream) {
  switch (dtype) {
    case DType::kF32:
      return LaunchFusedV2T<float, kMutant>(mats, jobs, num_jobs, any_offdiagonal, g2, trace,
                                            maxabs, grid, stream);
    case DType::kF16:
      return LaunchFusedV2T<__half, kMutant>(mats, jobs, num_jobs, any_offdiagonal, g2, trace,
                                             maxabs, grid, stream);
    case DType::kBF16:
      return LaunchFusedV2T<__nv_bfloat16, kMutant>(mats, jobs, num_jobs, any_offdiagonal, g2,
                                                    trace, maxabs, grid, stream);
  }
  return cudaErrorInvalidValue;
}
}  // namespace fused_v2
}  // namespace rvd::cuda

#endif  // RVD_KERNELS_CUDA_FUSED_LAUNCH_CUH_

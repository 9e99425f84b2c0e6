// Fused v4's launches (host code, private to kernels/cuda/, nvcc only,
// sm_90a translation units): the kernel is a device header
// (fused_v4_kernel.cuh); fused_v4.cu instantiates the product's.
#ifndef RVD_KERNELS_CUDA_FUSED_V4_LAUNCH_CUH_
#define RVD_KERNELS_CUDA_FUSED_V4_LAUNCH_CUH_

#include <cuda_runtime.h>

#include <type_traits>

#include "kernels/cuda/fused_v4_kernel.cuh"
#include "kernels/cuda/kernels.h"

namespace rvd::cuda::fused_v4 {

template <typename T, int kMode, bool kTriangle, bool kPairs = false, bool kTall = false>
cudaError_t LaunchFusedV4Shape(const FusedV4Launch& l, cudaStream_t stream) {
  const FusedV4Plan& plan = l.plan;
  if (plan.units <= 0) return cudaSuccess;
  const bool cut = plan.pieces > 1;
  if (cut && (l.partials == nullptr || l.tickets == nullptr ||
              plan.cut > kFusedV4MaxCutJobs)) {
    return cudaErrorInvalidValue;
  }
  const Schedule sched{plan.cut, plan.pieces, plan.units, cut ? l.partials : nullptr,
                       cut ? l.tickets : nullptr};
  auto* kernel = FusedV4Kernel<T, kMode, kTriangle, kPairs, kTall>;
  constexpr int smem = Layout<T, kTriangle, kPairs>::kSmemBytes;
  const cudaError_t e =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e != cudaSuccess) return e;
  kernel<<<plan.grid, Layout<T, kTriangle>::kThreads, smem, stream>>>(
      static_cast<const TensorMap*>(l.maps), l.mats, l.jobs, sched, l.g2, l.trace, l.maxabs,
      l.pr, l.status);
  return cudaGetLastError();
}

template <typename T, int kMode>
cudaError_t LaunchFusedV4T(const FusedV4Launch& l, cudaStream_t stream) {
  if constexpr (std::is_same_v<T, float>) {
    if (l.triangle || l.tall) return cudaErrorInvalidValue;
    if (l.pairs) {
      // (The paired-tile kernel's instances: live, mutant, and the probes
      // that leave out its copies, its conversion or both.)
      if constexpr (kMode == kLive || kMode == kMutant || kMode == kProbeNoLoad ||
                    kMode == kProbeNoConvert || kMode == kProbeMmaOnly) {
        return LaunchFusedV4Shape<T, kMode, false, true>(l, stream);
      } else {
        return cudaErrorNotSupported;
      }
    }
    return LaunchFusedV4Shape<T, kMode, false>(l, stream);
  } else {
    if (l.pairs || (l.tall && !l.triangle)) return cudaErrorInvalidValue;
    if (l.tall) {
      // (The tall triangle's instances: live and mutant.)
      if constexpr (kMode == kLive || kMode == kMutant) {
        return LaunchFusedV4Shape<T, kMode, true, false, true>(l, stream);
      } else {
        return cudaErrorNotSupported;
      }
    }
    return l.triangle ? LaunchFusedV4Shape<T, kMode, true>(l, stream)
                      : LaunchFusedV4Shape<T, kMode, false>(l, stream);
  }
}

template <int kMode>
cudaError_t LaunchFusedV4Dispatch(DType dtype, const FusedV4Launch& l, cudaStream_t stream) {
  switch (dtype) {
    case DType::kBF16: return LaunchFusedV4T<__nv_bfloat16, kMode>(l, stream);
    case DType::kF16: return LaunchFusedV4T<__half, kMode>(l, stream);
    case DType::kF32: return LaunchFusedV4T<float, kMode>(l, stream);
  }
  return cudaErrorInvalidValue;
}
}  // namespace rvd::cuda::fused_v4

#endif  // RVD_KERNELS_CUDA_FUSED_V4_LAUNCH_CUH_

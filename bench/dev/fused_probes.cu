// Benchmark build only (rvd_bench_gpu --probe, --ab): the fused kernels with
// one part changed, to place their time; none of this is in the product
// module. sm_90a.
//   LaunchFusedV2Probe  bf16 v2 with probe flags (kernels.h)
//   LaunchFusedV4Probe  fused v4 in a probe mode (fused_v4_kernel.cuh, Mode)
#include "kernels/cuda/fused_launch.cuh"
#include "kernels/cuda/fused_v4_launch.cuh"
#include "kernels/cuda/kernels.h"

namespace rvd::cuda {

cudaError_t LaunchFusedV2Probe(const MatrixDesc* mats, const FusedJobV2* jobs,
                               int num_jobs, bool any_offdiagonal, double* g2,
                               double* trace, float* maxabs, int probe,
                               int splits, cudaStream_t stream) {
  return fused_v2::LaunchFusedV2ProbeBf16(mats, jobs, num_jobs, any_offdiagonal,
                                          g2, trace, maxabs, probe, splits,
                                          stream);
}

cudaError_t LaunchFusedV4Probe(fused_v4::Mode mode, DType dtype, const FusedV4Launch& launch,
                               cudaStream_t stream) {
  namespace v4 = fused_v4;
  const bool f32 = dtype == DType::kF32;
  // Probes time the kernel's parts, not its results: no in-kernel PR.
  FusedV4Launch l = launch;
  l.pr = nullptr;
  l.status = nullptr;
  switch (mode) {
#define RVD_V4_PROBE(m) \
  case v4::m:           \
    return v4::LaunchFusedV4Dispatch<v4::m>(dtype, l, stream)
    RVD_V4_PROBE(kProbeBIsA);
    RVD_V4_PROBE(kProbeNoLoad);
    RVD_V4_PROBE(kProbeLoadOnly);
    RVD_V4_PROBE(kProbeRetire1);
    RVD_V4_PROBE(kProbeNoCombine);
#undef RVD_V4_PROBE
    case v4::kProbeChain1:  // 16-bit only
      if (f32) return cudaErrorInvalidValue;
      return v4::LaunchFusedV4Dispatch<v4::kProbeChain1>(dtype, l, stream);
    case v4::kProbeNoConvert:
      if (!f32) return cudaErrorInvalidValue;
      return v4::LaunchFusedV4T<float, v4::kProbeNoConvert>(l, stream);
    case v4::kProbeMmaOnly:
      if (!f32) return cudaErrorInvalidValue;
      return v4::LaunchFusedV4T<float, v4::kProbeMmaOnly>(l, stream);
    case v4::kLive:    // not probes: the daemon's kernel and the GPU
    case v4::kMutant:  // test's, launched elsewhere
      break;
  }
  return cudaErrorInvalidValue;
}

}  // namespace rvd::cuda

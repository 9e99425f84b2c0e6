// Benchmark build only (rvd_bench_gpu --probe, --ab): the fused kernels with
// one part changed, to place their time; none of this is in the product
// module. sm_90a.
//   LaunchFusedV2Probe  bf16 v3 with probe flags: the product kernel with
//                       its hooks (dev::V2Probe), here alone
//   LaunchFusedV4Probe  fused v4 in a probe mode (fused_v4_kernel.cuh, Mode)
#include "kernels/cuda/fused_launch.cuh"
#include "kernels/cuda/fused_v4_launch.cuh"
#include "bench/dev/fused_probes.h"
#include "kernels/cuda/kernels.h"

namespace rvd::cuda {

namespace dev {

// LaunchFusedV2Probe's flags and blocks per job, read by V2Probe.
enum ProbeFlags : int {
  kProbeNoMma = 1,    // skip the ldmatrix/MMA work
  kProbeNoLoads = 2,  // load only the prologue's slices
  kProbeRotate = 4,   // start each block at a different K-slice
};
__constant__ int g_probe_flags;
__constant__ int g_probe_splits;

// The live v2/v3 kernel with `splits` units per job, unit u taking part
// u % splits (a contiguous 1/splits of K) of job u / splits, and the flags'
// parts left out (fused_v2_kernel.cuh, Product: the points it changes).
struct V2Probe : fused_v2::Product {
  static __device__ __forceinline__ int Job(int unit) { return unit / g_probe_splits; }
  static __device__ __forceinline__ void Slices(int unit, int job, int* first, int* nks,
                                                int* rot) {
    const int splits = g_probe_splits, split = unit % splits;
    *first = split * *nks / splits;
    *nks = (split + 1) * *nks / splits - *first;
    if ((g_probe_flags & kProbeRotate) && *nks > 0) *rot = (job * 5 + split) % *nks;
  }
  static __device__ __forceinline__ int Slice(int i, int first, int nks, int rot) {
    return first + (i + rot) % nks;
  }
  static __device__ __forceinline__ bool LoadsAfterPrologue() {
    return (g_probe_flags & kProbeNoLoads) == 0;
  }
  static __device__ __forceinline__ bool Multiplies() {
    return (g_probe_flags & kProbeNoMma) == 0;
  }
};

}  // namespace dev

// bf16, the live kernel (v3) with the probe flags and `splits` blocks per
// job; outputs per block, not summed: timing only.
cudaError_t LaunchFusedV2Probe(const MatrixDesc* mats, const FusedJobV2* jobs,
                               int num_jobs, bool any_offdiagonal, double* g2,
                               double* trace, float* maxabs, int probe,
                               int splits, cudaStream_t stream) {
  namespace v2 = fused_v2;
  if (num_jobs <= 0 || splits < 1) return cudaSuccess;
  const int stage_bytes = any_offdiagonal ? v2::kABytes + v2::kBBytes : v2::kABytes;
  const int smem = (any_offdiagonal ? v2::kStagesMixed : v2::kStagesDiag) * stage_bytes;
  auto* kernel =
      any_offdiagonal
          ? v2::FusedV2Kernel<__nv_bfloat16, dev::V2Probe, v2::kStagesMixed, v2::kLiveChain>
          : v2::FusedV2Kernel<__nv_bfloat16, dev::V2Probe, v2::kStagesDiag, v2::kLiveChain>;
  cudaError_t e = cudaMemcpyToSymbolAsync(dev::g_probe_flags, &probe, sizeof(int), 0,
                                          cudaMemcpyHostToDevice, stream);
  if (e == cudaSuccess) {
    e = cudaMemcpyToSymbolAsync(dev::g_probe_splits, &splits, sizeof(int), 0,
                                cudaMemcpyHostToDevice, stream);
  }
  if (e == cudaSuccess) {
    e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  }
  if (e == cudaSuccess) {
    e = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                             cudaSharedmemCarveoutMaxShared);
  }
  if (e != cudaSuccess) return e;
  kernel<<<num_jobs * splits, v2::kThreads, smem, stream>>>(mats, jobs, num_jobs * splits,
                                                           stage_bytes, g2, trace, maxabs);
  return cudaGetLastError();
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

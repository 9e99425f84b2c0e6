// Benchmark build only, for one A-B (session 4): fused v4 as it stood at
// the end of session 3 (the f32 conversion in the consumer warps), to time
// the converter warpgroup against it in one binary. Removed once measured.
#include "kernels/cuda/fused_v4_s3_kernel.cuh"
#include "kernels/cuda/kernels.h"

namespace rvd::cuda {

cudaError_t LaunchFusedV4Session3(DType dtype, const void* maps, const MatrixDesc* mats,
                                  const FusedJobV2* jobs, int num_jobs, double* g2,
                                  double* trace, float* maxabs, cudaStream_t stream) {
  return fused_v4_s3::LaunchFusedV4Dispatch<fused_v4::kLive>(dtype, maps, mats, jobs, num_jobs,
                                                             g2, trace, maxabs, stream);
}

}  // namespace rvd::cuda

// The fused kernels' probes (benchmark build only, fused_probes.cu): the
// product kernels with one part changed, to place their time. None of this
// is in the product module.
#ifndef RVD_BENCH_DEV_FUSED_PROBES_H_
#define RVD_BENCH_DEV_FUSED_PROBES_H_

#include <cuda_runtime_api.h>

#include "kernels/cuda/kernels.h"

namespace rvd::cuda {

// rvd_bench_gpu --probe: bf16 v3 with probe flags (1: no
// MMA, 2: no loads after the prologue, 4: rotated K start) and `splits`
// blocks per job over contiguous parts of K. Outputs per block (num_jobs x
// splits entries), for timing only.
cudaError_t LaunchFusedV2Probe(const MatrixDesc* mats, const FusedJobV2* jobs,
                               int num_jobs, bool any_offdiagonal, double* g2,
                               double* trace, float* maxabs, int probe,
                               int splits, cudaStream_t stream);

// rvd_bench_gpu --ab: v4 in a probe mode (fused_v4::Mode). kProbeChain1 is
// exact, the others wrong on purpose.
cudaError_t LaunchFusedV4Probe(fused_v4::Mode mode, DType dtype, const FusedV4Launch& launch,
                               cudaStream_t stream);

}  // namespace rvd::cuda

#endif  // RVD_BENCH_DEV_FUSED_PROBES_H_

// One matrix's PR from its sums (private to kernels/cuda/): the finalize
// kernel (kernels.cu) runs it on every matrix's job sums, and fused v4 on
// the matrices it serves (one job: that job's epilogue; several: the block
// writing the matrix's last job, FinalizeMatrixWarp), so that a launch of
// only v4's matrices needs no finalize kernel. Both give the same bits for
// the same sums.
#ifndef RVD_KERNELS_CUDA_FINALIZE_CUH_
#define RVD_KERNELS_CUDA_FINALIZE_CUH_

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "kernels/cuda/kernels.h"

namespace rvd::cuda {

// g = ||G||_F^2, t = trace G = ||W||_F^2, mx: the largest |w| (or v4's
// stand-in for it), all of matrix d.
__device__ inline void FinalizeMatrix(const MatrixDesc& d, double g, double t, float mx,
                                      double* pr, int32_t* status) {
  if (!isfinite(t)) {
    // NaN or Inf in the matrix (then t is NaN, or mx is Inf or NaN); or,
    // with fused v3's trace from f32 Gram entries (16-bit inputs), the
    // entries overflowed at finite |w| (t = Inf, mx finite): untrusted, as
    // any f32 overflow. Exact float64 traces never overflow.
    *pr = nan("");
    *status = isinf(t) && isfinite(mx) ? kStatusUntrusted : kStatusNonFinite;
    return;
  }
  // All zero: no spectrum. (t == 0 with mx > 0: v3's f32 trace underflowed;
  // the trust test below then fails.)
  if (t == 0.0 && mx == 0.0f) {
    *pr = 0.0;
    *status = kStatusOk;
    return;
  }
  // f32 Gram entries are trusted when no product can underflow to a
  // denormal at the largest |w| and no entry (<= k * max^2) can overflow,
  // and when ||G||^2 lies where a PR in [1, n] puts it.
  const double mx2 = static_cast<double>(mx) * mx;
  const double t2 = t * t;
  const bool trusted = isfinite(g) && g > 0.0 && mx2 >= 1e-30 && mx2 * d.k <= 1e36 &&
                       g >= t2 / d.n * (1.0 - 1e-4) && g <= t2 * (1.0 + 1e-4);
  *pr = trusted ? t2 / g : nan("");
  *status = trusted ? kStatusOk : kStatusUntrusted;
}

// One warp: matrix d's PR from its jobs' sums [begin, end) (lanes stride
// over the jobs, then a fixed xor tree: the same bits on every run). The
// loads go to L2: in fused v4 other blocks wrote the sums.
__device__ inline void FinalizeMatrixWarp(const MatrixDesc& d, int begin, int end,
                                          const double* g2, const double* trace,
                                          const float* maxabs, double* pr, int32_t* status) {
  const int lane = threadIdx.x % 32;
  double g = 0.0, t = 0.0;
  float mx = 0.0f;
  for (int j = begin + lane; j < end; j += 32) {
    g += __ldcg(g2 + j);
    t += __ldcg(trace + j);
    mx = fmaxf(mx, __ldcg(maxabs + j));
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    g += __shfl_xor_sync(0xffffffffu, g, o);
    t += __shfl_xor_sync(0xffffffffu, t, o);
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  }
  if (lane == 0) FinalizeMatrix(d, g, t, mx, pr, status);
}

}  // namespace rvd::cuda

#endif  // RVD_KERNELS_CUDA_FINALIZE_CUH_

// One matrix's PR from its sums (device code, private to kernels/cuda/; no
// host-only includes: NVRTC compiles it): the finalize
// kernel (kernels.cu) runs it on every matrix's job sums, and fused v4 on
// a matrix it serves in one job (Gram side <= 128), so that a launch of
// only such matrices needs no finalize kernel. Both give the same bits for
// the same sums.
#ifndef RVD_KERNELS_CUDA_FINALIZE_CUH_
#define RVD_KERNELS_CUDA_FINALIZE_CUH_

#include <cuda/std/cstdint>

#include "kernels/cuda/descriptors.h"

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

}  // namespace rvd::cuda

#endif  // RVD_KERNELS_CUDA_FINALIZE_CUH_

// The end of a v1 or v2/v3 fused block (device code, private to
// kernels/cuda/): the block's float64 sum of squares of its Gram tile, its
// float64 sum of squared rows (the trace part) and its largest |w|, reduced
// over the warps' lanes, then over the warps in warp order by thread 0, and
// written to the job's slots. The order is fixed (no atomics): the same
// inputs give the same bits. Fused v4 reduces per job in its own epilogue
// (ReduceJob): its sums come from two consumer warpgroups, not every warp.
#ifndef RVD_KERNELS_CUDA_BLOCK_SUMS_CUH_
#define RVD_KERNELS_CUDA_BLOCK_SUMS_CUH_

#include <cuda/std/cstdint>

namespace rvd::cuda {

// Every thread of the block calls it (it synchronizes the block). `max_op`
// combines two warps' maxima in the block step (the lanes' step is fmaxf).
template <int kWarps, typename MaxOp>
__device__ __forceinline__ void WriteBlockSums(double g2, double trace, float maxabs,
                                               MaxOp max_op, double* g2_out,
                                               double* trace_out, float* maxabs_out) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
  for (int off = 16; off > 0; off /= 2) {
    g2 += __shfl_xor_sync(0xffffffffu, g2, off);
    trace += __shfl_xor_sync(0xffffffffu, trace, off);
    maxabs = fmaxf(maxabs, __shfl_xor_sync(0xffffffffu, maxabs, off));
  }
  __shared__ double red_g2[kWarps], red_trace[kWarps];
  __shared__ float red_max[kWarps];
  if (lane == 0) {
    red_g2[warp] = g2;
    red_trace[warp] = trace;
    red_max[warp] = maxabs;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    double bs = 0.0, bt = 0.0;
    float bm = 0.0f;
    for (int w = 0; w < kWarps; ++w) {
      bs += red_g2[w];
      bt += red_trace[w];
      bm = max_op(bm, red_max[w]);
    }
    *g2_out = bs;
    *trace_out = bt;
    *maxabs_out = bm;
  }
}

}  // namespace rvd::cuda

#endif  // RVD_KERNELS_CUDA_BLOCK_SUMS_CUH_

// The CUDA engine's kernels other than the fused tile kernel's body: the
// fused launcher, the per-matrix finalize, the float64 statistics and sums
// of squares used by the cuBLAS/cuSOLVER variants, and dtype conversions.
// All reductions are fixed-order (no atomics): deterministic.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "kernels/cuda/finalize.cuh"
#include "kernels/cuda/fused_launch.cuh"
#include "kernels/cuda/kernels.h"

namespace rvd::cuda {

MatrixDesc MakeDesc(const MatrixView& v) {
  MatrixDesc d;
  d.data = v.data;
  d.ld = v.ld;
  d.rows = static_cast<int32_t>(v.rows);
  d.cols = static_cast<int32_t>(v.cols);
  d.tall = v.rows > v.cols ? 1 : 0;
  d.n = static_cast<int32_t>(d.tall ? v.cols : v.rows);
  d.k = static_cast<int32_t>(d.tall ? v.rows : v.cols);
  const uint64_t es = DTypeSize(v.dtype);
  d.aligned = (reinterpret_cast<uintptr_t>(v.data) % 16 == 0 &&
               (static_cast<uint64_t>(v.ld) * es) % 16 == 0)
                  ? 1
                  : 0;
  return d;
}

cudaError_t LaunchFused(DType dtype, const MatrixDesc* mats,
                        const FusedJob* jobs, int num_jobs,
                        bool any_offdiagonal, double* g2, double* trace,
                        float* maxabs, cudaStream_t stream, int grid) {
  return fused::LaunchFusedDispatch<fused::Product>(dtype, mats, jobs, num_jobs, any_offdiagonal, g2,
                                           trace, maxabs, grid, stream);
}

cudaError_t LaunchFusedV2(DType dtype, const MatrixDesc* mats,
                          const FusedJobV2* jobs, int num_jobs,
                          bool any_offdiagonal, double* g2, double* trace,
                          float* maxabs, cudaStream_t stream, int grid) {
  return fused_v2::LaunchFusedV2Dispatch<fused_v2::Product>(dtype, mats, jobs, num_jobs, any_offdiagonal,
                                                g2, trace, maxabs, grid, stream);
}

namespace {

constexpr int kReduceThreads = 256;

__device__ __forceinline__ float LoadAsFloat(DType dtype, const void* base,
                                             int64_t idx) {
  switch (dtype) {
    case DType::kF32:
      return static_cast<const float*>(base)[idx];
    case DType::kF16:
      return __half2float(static_cast<const __half*>(base)[idx]);
    case DType::kBF16:
      return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[idx]);
  }
  return 0.0f;
}

// Fixed-order block sums: xor-shuffle tree within warps, then warps in
// index order by thread 0. Result valid in thread 0.
__device__ double BlockSum(double v) {
  __shared__ double part[kReduceThreads / 32];
  for (int off = 16; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
  __syncthreads();  // part[] may still be read by a previous call
  if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = v;
  __syncthreads();
  double s = 0.0;
  if (threadIdx.x == 0) {
    for (int w = 0; w < static_cast<int>(blockDim.x / 32); ++w) s += part[w];
  }
  return s;
}

__device__ float BlockMax(float v) {
  __shared__ float part[kReduceThreads / 32];
  for (int off = 16; off > 0; off /= 2)
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
  __syncthreads();
  if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = v;
  __syncthreads();
  float s = 0.0f;
  if (threadIdx.x == 0) {
    for (int w = 0; w < static_cast<int>(blockDim.x / 32); ++w) s = fmaxf(s, part[w]);
  }
  return s;
}

// One warp per matrix: lane l sums jobs l, l + 32, ... of the matrix, then
// a fixed xor tree (the same bits on every run). (One thread per matrix
// waited for each job's loads in turn.) Warp w takes matrices w, w + warps
// of the grid, ... (fewer blocks than matrices / 4 under the SM cap).
__global__ void FinalizeKernel(const MatrixDesc* mats, const int32_t* job_begin,
                               int num_matrices, const double* g2,
                               const double* trace, const float* maxabs,
                               double* pr, int32_t* status) {
  const int lane = threadIdx.x % 32;
  const int warps = gridDim.x * blockDim.x / 32;
  // Whole warps: m is warp-uniform.
  for (int m = (blockIdx.x * blockDim.x + threadIdx.x) / 32; m < num_matrices; m += warps) {
    double g = 0.0, t = 0.0;
    float mx = 0.0f;
    for (int j = job_begin[m] + lane; j < job_begin[m + 1]; j += 32) {
      g += g2[j];
      t += trace[j];
      mx = fmaxf(mx, maxabs[j]);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      g += __shfl_xor_sync(0xffffffffu, g, o);
      t += __shfl_xor_sync(0xffffffffu, t, o);
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    }
    if (lane == 0) FinalizeMatrix(mats[m], g, t, mx, pr + m, status + m);
  }
}

__global__ void StatsKernel(DType dtype, const MatrixDesc* mats, double* trace,
                            float* maxabs) {
  const MatrixDesc d = mats[blockIdx.x];
  // kRows rows at a time: independent loads in flight per thread. With one
  // at a time (and a launch per matrix) the estimators spent ~0.8 ms per
  // 128 x 4096 matrix here; with eight, 480 of them took 14 ms (H200 s5-7).
  constexpr int kRows = 8;
  double s[kRows] = {};
  float mx = 0.0f;
  for (int64_t r0 = 0; r0 < d.rows; r0 += kRows) {
    for (int64_t c = threadIdx.x; c < d.cols; c += blockDim.x) {
#pragma unroll
      for (int u = 0; u < kRows; ++u) {
        if (r0 + u < d.rows) {
          const float x = LoadAsFloat(dtype, d.data, (r0 + u) * d.ld + c);
          s[u] = fma(static_cast<double>(x), static_cast<double>(x), s[u]);
          mx = fmaxf(mx, fabsf(x));
        }
      }
    }
  }
  double t = 0.0;
#pragma unroll
  for (int u = 0; u < kRows; ++u) t += s[u];
  t = BlockSum(t);
  mx = BlockMax(mx);
  if (threadIdx.x == 0) {
    trace[blockIdx.x] = t;
    maxabs[blockIdx.x] = mx;
  }
}

__global__ void SumSquaresKernel(const float* base, int64_t stride,
                                 int chunks, int64_t chunk_stride, int rows,
                                 int cols, int64_t ld, SumMode mode,
                                 double* out) {
  const float* a = base + blockIdx.x * stride;
  double s = 0.0;
  for (int c = 0; c < cols; ++c) {
    for (int r = threadIdx.x; r < rows; r += blockDim.x) {
      double w = 1.0;
      if (mode == SumMode::kSymUpper) w = r < c ? 2.0 : (r == c ? 1.0 : 0.0);
      if (mode == SumMode::kStrictUpper) w = r < c ? 1.0 : 0.0;
      if (w == 0.0) continue;
      double x = 0.0;
      for (int ch = 0; ch < chunks; ++ch) x += a[ch * chunk_stride + r + c * ld];
      s += w * x * x;
    }
  }
  s = BlockSum(s);
  if (threadIdx.x == 0) out[blockIdx.x] = s;
}

__global__ void ToF32Kernel(DType dtype, MatrixDesc d, float* dst) {
  const int64_t total = int64_t{d.rows} * d.cols;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < total;
       e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = e / d.cols, c = e % d.cols;
    dst[e] = LoadAsFloat(dtype, d.data, r * d.ld + c);
  }
}

__global__ void ToF64ForSvdKernel(DType dtype, MatrixDesc d, double* dst) {
  const int64_t total = int64_t{d.rows} * d.cols;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < total;
       e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = e / d.cols, c = e % d.cols;
    const double x = LoadAsFloat(dtype, d.data, r * d.ld + c);
    // Wide: column-major W^T (cols x rows): (c, r) at c + r * cols = e.
    // Tall: column-major W (rows x cols): (r, c) at r + c * rows.
    dst[d.tall ? r + c * int64_t{d.rows} : e] = x;
  }
}

int GridFor(int64_t total) {
  const int64_t blocks = (total + kReduceThreads - 1) / kReduceThreads;
  return static_cast<int>(blocks < 4096 ? (blocks > 0 ? blocks : 1) : 4096);
}

}  // namespace

cudaError_t LaunchFinalize(const MatrixDesc* mats, const int32_t* job_begin,
                           int num_matrices, const double* g2,
                           const double* trace, const float* maxabs,
                           double* pr, int32_t* status, cudaStream_t stream, int grid) {
  if (num_matrices <= 0) return cudaSuccess;
  const int blocks = FinalizeBlocks(num_matrices);
  if (grid <= 0 || grid > blocks) grid = blocks;
  FinalizeKernel<<<grid, kFinalizeThreads, 0, stream>>>(mats, job_begin, num_matrices, g2,
                                                       trace, maxabs, pr, status);
  return cudaGetLastError();
}

cudaError_t LaunchStats(DType dtype, const MatrixDesc* mats, int num_matrices,
                        double* trace, float* maxabs, cudaStream_t stream) {
  if (num_matrices <= 0) return cudaSuccess;
  StatsKernel<<<num_matrices, kReduceThreads, 0, stream>>>(dtype, mats, trace,
                                                           maxabs);
  return cudaGetLastError();
}

cudaError_t LaunchSumSquares(const float* base, int64_t stride, int chunks,
                             int64_t chunk_stride, int count, int rows,
                             int cols, int64_t ld, SumMode mode, double* out,
                             cudaStream_t stream) {
  if (count <= 0) return cudaSuccess;
  SumSquaresKernel<<<count, kReduceThreads, 0, stream>>>(
      base, stride, chunks, chunk_stride, rows, cols, ld, mode, out);
  return cudaGetLastError();
}

cudaError_t LaunchToF32(DType dtype, const MatrixDesc& m, float* dst,
                        cudaStream_t stream) {
  ToF32Kernel<<<GridFor(int64_t{m.rows} * m.cols), kReduceThreads, 0,
                stream>>>(dtype, m, dst);
  return cudaGetLastError();
}

cudaError_t LaunchToF64ForSvd(DType dtype, const MatrixDesc& m, double* dst,
                              cudaStream_t stream) {
  ToF64ForSvdKernel<<<GridFor(int64_t{m.rows} * m.cols), kReduceThreads, 0,
                      stream>>>(dtype, m, dst);
  return cudaGetLastError();
}

namespace {
__global__ void ZeroBelowDiagonalKernel(double* a, int n, int64_t ld) {
  const int64_t total = int64_t{n} * n;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < total;
       e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t col = e / n, row = e % n;
    if (row > col) a[col * ld + row] = 0.0;
  }
}
}  // namespace

cudaError_t LaunchZeroBelowDiagonal(double* a, int n, int64_t ld, cudaStream_t stream) {
  ZeroBelowDiagonalKernel<<<GridFor(int64_t{n} * n), kReduceThreads, 0, stream>>>(a, n, ld);
  return cudaGetLastError();
}

}  // namespace rvd::cuda

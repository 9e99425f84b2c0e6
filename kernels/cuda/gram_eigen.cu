// The Gram eigenvalues' one kernel (gram_eigen.h): a block of a matrix to
// dense float64, with a NaN/Inf flag. Consecutive threads read and write
// consecutive elements of a row (coalesced in both directions).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/gram_eigen.h"

namespace rvd::cuda {
namespace {

constexpr int kThreads = 256;

template <typename T>
__device__ __forceinline__ double ToDouble(T x);
template <>
__device__ __forceinline__ double ToDouble<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ double ToDouble<__half>(__half x) {
  return __half2float(x);
}
template <>
__device__ __forceinline__ double ToDouble<__nv_bfloat16>(__nv_bfloat16 x) {
  return __bfloat162float(x);
}

template <typename T>
__global__ void BlockToF64Kernel(const T* src, int64_t ld, int64_t rows, int64_t cols,
                                 double* dst, int* nonfinite) {
  const int64_t total = rows * cols;
  bool bad = false;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < total;
       e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = e / cols, c = e % cols;
    const double x = ToDouble(src[r * ld + c]);
    bad |= !isfinite(x);
    dst[e] = x;
  }
  if (bad) *nonfinite = 1;  // every writer writes the same value
}

template <typename T>
cudaError_t Launch(const void* src, int64_t ld, int64_t rows, int64_t cols, double* dst,
                   int* nonfinite, cudaStream_t stream) {
  const int64_t blocks = (rows * cols + kThreads - 1) / kThreads;
  const int grid = static_cast<int>(blocks < 4096 ? (blocks > 0 ? blocks : 1) : 4096);
  BlockToF64Kernel<T><<<grid, kThreads, 0, stream>>>(static_cast<const T*>(src), ld, rows, cols,
                                                     dst, nonfinite);
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchBlockToF64(DType dtype, const void* src, int64_t ld, int64_t rows,
                             int64_t cols, double* dst, int* nonfinite, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  switch (dtype) {
    case DType::kF32:
      return Launch<float>(src, ld, rows, cols, dst, nonfinite, stream);
    case DType::kF16:
      return Launch<__half>(src, ld, rows, cols, dst, nonfinite, stream);
    case DType::kBF16:
      return Launch<__nv_bfloat16>(src, ld, rows, cols, dst, nonfinite, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace rvd::cuda

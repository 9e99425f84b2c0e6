// The launcher of the Gram eigenvalues' conversion kernel (gram_eigen.cu;
// private to kernels/cuda/). CudaEngine::GramEigenvalues (gram_eigen.cc)
// drives it: a chunk of the long side converted to float64, cuBLAS dsyrk
// into the float64 Gram, cuSOLVER dsyevd.
#ifndef RVD_KERNELS_CUDA_GRAM_EIGEN_H_
#define RVD_KERNELS_CUDA_GRAM_EIGEN_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/engine.h"

namespace rvd::cuda {

// dst[r * cols + c] = src[r * ld + c] as double, for r < rows, c < cols
// (device memory; src of `dtype`): a row-major block copied dense. Sets
// *nonfinite to 1 (never back to 0) when an element is NaN or infinite.
cudaError_t LaunchBlockToF64(DType dtype, const void* src, int64_t ld, int64_t rows,
                             int64_t cols, double* dst, int* nonfinite, cudaStream_t stream);

}  // namespace rvd::cuda

#endif  // RVD_KERNELS_CUDA_GRAM_EIGEN_H_

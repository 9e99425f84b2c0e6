// One error macro for CUDA, cuBLAS and cuSOLVER (private to kernels/cuda/):
// every failing call becomes an absl::Status naming the call, the library's
// error name, and the file and line, and is returned to the caller. Nothing
// here exits or aborts.
//
//   RVD_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(...));
//   RVD_CUDA_RETURN_IF_ERROR(cublasGemmBatchedEx(...));
//
// Thread-safe: pure functions.
#ifndef RVD_KERNELS_CUDA_CUDA_CHECK_H_
#define RVD_KERNELS_CUDA_CUDA_CHECK_H_

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cusolverDn.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace rvd::cuda_internal {

inline absl::Status ToStatus(cudaError_t e, const char* expr, const char* file,
                             int line) {
  if (e == cudaSuccess) return absl::OkStatus();
  // A launch or copy that ran out of device memory is the caller's size.
  const auto code = e == cudaErrorMemoryAllocation
                        ? absl::StatusCode::kResourceExhausted
                        : absl::StatusCode::kInternal;
  return absl::Status(code, absl::StrCat(file, ":", line, ": ", expr, ": ",
                                         cudaGetErrorName(e), " (",
                                         cudaGetErrorString(e), ")"));
}

inline absl::Status ToStatus(cublasStatus_t e, const char* expr,
                             const char* file, int line) {
  if (e == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  const auto code = e == CUBLAS_STATUS_ALLOC_FAILED
                        ? absl::StatusCode::kResourceExhausted
                        : absl::StatusCode::kInternal;
  return absl::Status(code, absl::StrCat(file, ":", line, ": ", expr, ": ",
                                         cublasGetStatusName(e), " (",
                                         cublasGetStatusString(e), ")"));
}

inline absl::Status ToStatus(cusolverStatus_t e, const char* expr,
                             const char* file, int line) {
  if (e == CUSOLVER_STATUS_SUCCESS) return absl::OkStatus();
  const auto code = e == CUSOLVER_STATUS_ALLOC_FAILED
                        ? absl::StatusCode::kResourceExhausted
                        : absl::StatusCode::kInternal;
  return absl::Status(code, absl::StrCat(file, ":", line, ": ", expr,
                                         ": cusolver status ",
                                         static_cast<int>(e)));
}

}  // namespace rvd::cuda_internal

#define RVD_CUDA_RETURN_IF_ERROR(expr)                                    \
  do {                                                                    \
    ::absl::Status rvd_cuda_status_ =                                     \
        ::rvd::cuda_internal::ToStatus((expr), #expr, __FILE__, __LINE__); \
    if (!rvd_cuda_status_.ok()) return rvd_cuda_status_;                  \
  } while (0)

// Checks the last launch error (a bad configuration is reported here; a
// fault inside the kernel surfaces at the next synchronizing call).
#define RVD_CUDA_RETURN_IF_LAUNCH_ERROR(what) \
  RVD_CUDA_RETURN_IF_ERROR(cudaGetLastError())

#endif  // RVD_KERNELS_CUDA_CUDA_CHECK_H_

// One error macro for CUDA, cuBLAS and cuSOLVER (private to kernels/cuda/):
// every failing call becomes an absl::Status naming the call and the
// library's error name, and is returned to the caller; it is also counted by
// error name, and an error that leaves the CUDA context unusable (an illegal
// address, a kernel fault, a lost device: "sticky") marks the device lost.
// Nothing here exits or aborts. Messages name the source file without its
// directory: no build-machine path reaches a client.
//
//   RVD_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(...));
//   RVD_CUDA_RETURN_IF_ERROR(cublasGemmBatchedEx(...));
//
// Thread-safe.
#ifndef RVD_KERNELS_CUDA_CUDA_CHECK_H_
#define RVD_KERNELS_CUDA_CUDA_CHECK_H_

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cusolverDn.h>

#include <map>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace rvd::cuda_internal {

// The process's record of failed device calls (one CUDA context per
// process and device: a sticky error ends it for every engine).
struct DeviceErrorSnapshot {
  std::map<std::string, int64_t> by_name;  // failed calls per error name
  bool lost = false;                       // a sticky error happened
  std::string lost_reason;                 // the first sticky error
};
void NoteDeviceError(const char* name, bool sticky, const std::string& what);
DeviceErrorSnapshot DeviceErrors();
// Whether `e` leaves the context unusable: every later call fails with it.
bool IsSticky(cudaError_t e);

// "a/b/c.cc" -> "c.cc".
inline const char* BaseName(const char* file) {
  const char* base = file;
  for (const char* p = file; *p != '\0'; ++p) {
    if (*p == '/') base = p + 1;
  }
  return base;
}

inline absl::Status ToStatus(cudaError_t e, const char* expr, const char* file,
                             int line) {
  if (e == cudaSuccess) return absl::OkStatus();
  std::string what = absl::StrCat(BaseName(file), ":", line, ": ", expr, ": ",
                                  cudaGetErrorName(e), " (", cudaGetErrorString(e), ")");
  const bool sticky = IsSticky(e);
  NoteDeviceError(cudaGetErrorName(e), sticky, what);
  // A launch or copy that ran out of device memory is the caller's size; a
  // lost device is UNAVAILABLE (health says NOT_SERVING).
  const auto code = e == cudaErrorMemoryAllocation ? absl::StatusCode::kResourceExhausted
                    : sticky                       ? absl::StatusCode::kUnavailable
                                                   : absl::StatusCode::kInternal;
  return absl::Status(code, what);
}

inline absl::Status ToStatus(cublasStatus_t e, const char* expr,
                             const char* file, int line) {
  if (e == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  NoteDeviceError(cublasGetStatusName(e), false, expr);
  const auto code = e == CUBLAS_STATUS_ALLOC_FAILED
                        ? absl::StatusCode::kResourceExhausted
                        : absl::StatusCode::kInternal;
  return absl::Status(code, absl::StrCat(BaseName(file), ":", line, ": ", expr, ": ",
                                         cublasGetStatusName(e), " (",
                                         cublasGetStatusString(e), ")"));
}

inline absl::Status ToStatus(cusolverStatus_t e, const char* expr,
                             const char* file, int line) {
  if (e == CUSOLVER_STATUS_SUCCESS) return absl::OkStatus();
  NoteDeviceError(absl::StrCat("cusolver_status_", static_cast<int>(e)).c_str(), false, expr);
  const auto code = e == CUSOLVER_STATUS_ALLOC_FAILED
                        ? absl::StatusCode::kResourceExhausted
                        : absl::StatusCode::kInternal;
  return absl::Status(code, absl::StrCat(BaseName(file), ":", line, ": ", expr,
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

#endif  // RVD_KERNELS_CUDA_CUDA_CHECK_H_

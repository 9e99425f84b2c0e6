// The few CUDA driver API calls the module needs (private to kernels/cuda/):
// the virtual memory management calls that map PyTorch's expandable
// segments (live.cc) and that a test producer uses to make them.
//
// The module links the CUDA runtime statically and not libcuda: the
// entries come from the driver the runtime already loaded, through
// cudaGetDriverEntryPointByVersion, pinned to the CUDA 12.0 ABI of each
// function (the PFN_*_v* typedefs below are those versions), so a newer
// driver still hands out the signatures compiled against.
//
// Thread-safe: loaded once.
#ifndef RVD_KERNELS_CUDA_DRIVER_API_H_
#define RVD_KERNELS_CUDA_DRIVER_API_H_

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <cudaTypedefs.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace rvd::cuda {

struct DriverApi {
  PFN_cuGetErrorName_v6000 cuGetErrorName = nullptr;
  PFN_cuMemImportFromShareableHandle_v10020 cuMemImportFromShareableHandle = nullptr;
  PFN_cuMemGetAllocationPropertiesFromHandle_v10020 cuMemGetAllocationPropertiesFromHandle =
      nullptr;
  PFN_cuMemGetAllocationGranularity_v10020 cuMemGetAllocationGranularity = nullptr;
  PFN_cuMemAddressReserve_v10020 cuMemAddressReserve = nullptr;
  PFN_cuMemAddressFree_v10020 cuMemAddressFree = nullptr;
  PFN_cuMemMap_v10020 cuMemMap = nullptr;
  PFN_cuMemUnmap_v10020 cuMemUnmap = nullptr;
  PFN_cuMemSetAccess_v10020 cuMemSetAccess = nullptr;
  PFN_cuMemRelease_v10020 cuMemRelease = nullptr;
  PFN_cuMemGetAddressRange_v3020 cuMemGetAddressRange = nullptr;
  // A producer's side (tests).
  PFN_cuMemCreate_v10020 cuMemCreate = nullptr;
  PFN_cuMemExportToShareableHandle_v10020 cuMemExportToShareableHandle = nullptr;
  // Tuning candidates (tune.cc): NVRTC's CUBIN loaded and launched.
  PFN_cuModuleLoadData_v2000 cuModuleLoadData = nullptr;
  PFN_cuModuleGetFunction_v2000 cuModuleGetFunction = nullptr;
  PFN_cuModuleUnload_v2000 cuModuleUnload = nullptr;
  PFN_cuLaunchKernel_v4000 cuLaunchKernel = nullptr;
  PFN_cuFuncSetAttribute_v9000 cuFuncSetAttribute = nullptr;
};

// The table, loaded on first use (needs the CUDA runtime initialized on a
// device). FAILED_PRECONDITION naming the entry a driver does not have.
absl::StatusOr<const DriverApi*> GetDriverApi();

// Whether the CUDA context of the current device is unusable now (a sticky
// error: a fresh event cannot be created). For calls whose failure is
// usually the caller's input (an IPC handle, a file descriptor) and only
// rarely a broken context: an error that looks sticky marks the device
// lost only when this confirms it, so a producer's garbage cannot take
// rvd's device down.
bool ContextBroken();

// A failed driver call as a Status: "file:line: expr: CUDA_ERROR_... " with
// `code`, counted by error name (cuda_check.h's record). A driver error
// that leaves the context unusable (as cuda_check.h's IsSticky; confirmed
// by the context still failing) marks the device lost and is UNAVAILABLE.
absl::Status DriverStatus(const DriverApi& api, CUresult e, const char* expr, const char* file,
                          int line, absl::StatusCode code);

}  // namespace rvd::cuda

// Returns the call's failure as DriverStatus(api, ..., code).
#define RVD_CU_RETURN_IF_ERROR(api, expr, code)                                             \
  do {                                                                                      \
    const CUresult rvd_cu_result_ = (expr);                                                 \
    if (rvd_cu_result_ != CUDA_SUCCESS) {                                                   \
      return ::rvd::cuda::DriverStatus((api), rvd_cu_result_, #expr, __FILE__, __LINE__,    \
                                       (code));                                             \
    }                                                                                       \
  } while (0)

#endif  // RVD_KERNELS_CUDA_DRIVER_API_H_

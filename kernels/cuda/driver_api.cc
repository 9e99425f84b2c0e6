// The driver entries the module uses (driver_api.h).
#include "kernels/cuda/driver_api.h"

#include <cuda_runtime_api.h>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_check.h"

namespace rvd::cuda {
namespace {

// Every entry at its CUDA 12.0 ABI (the typedefs' versions).
constexpr unsigned kEntryVersion = 12000;

template <typename Fn>
absl::Status Load(const char* name, Fn* fn) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  const cudaError_t e =
      cudaGetDriverEntryPointByVersion(name, &p, kEntryVersion, cudaEnableDefault, &found);
  if (e != cudaSuccess || found != cudaDriverEntryPointSuccess || p == nullptr) {
    cudaGetLastError();  // not sticky
    return absl::FailedPreconditionError(absl::StrCat(
        "the CUDA driver has no ", name, " (", e != cudaSuccess ? cudaGetErrorName(e) : "not found",
        "); live weights of PyTorch's expandable segments need a CUDA 12 driver"));
  }
  *fn = reinterpret_cast<Fn>(p);
  return absl::OkStatus();
}

absl::Status LoadAll(DriverApi* api) {
  absl::Status s;
  auto load = [&](const char* name, auto* fn) {
    if (s.ok()) s = Load(name, fn);
  };
  load("cuGetErrorName", &api->cuGetErrorName);
  load("cuMemImportFromShareableHandle", &api->cuMemImportFromShareableHandle);
  load("cuMemGetAllocationPropertiesFromHandle", &api->cuMemGetAllocationPropertiesFromHandle);
  load("cuMemGetAllocationGranularity", &api->cuMemGetAllocationGranularity);
  load("cuMemAddressReserve", &api->cuMemAddressReserve);
  load("cuMemAddressFree", &api->cuMemAddressFree);
  load("cuMemMap", &api->cuMemMap);
  load("cuMemUnmap", &api->cuMemUnmap);
  load("cuMemSetAccess", &api->cuMemSetAccess);
  load("cuMemRelease", &api->cuMemRelease);
  load("cuMemGetAddressRange", &api->cuMemGetAddressRange);
  load("cuMemCreate", &api->cuMemCreate);
  load("cuMemExportToShareableHandle", &api->cuMemExportToShareableHandle);
  load("cuModuleLoadData", &api->cuModuleLoadData);
  load("cuModuleGetFunction", &api->cuModuleGetFunction);
  load("cuModuleUnload", &api->cuModuleUnload);
  load("cuLaunchKernel", &api->cuLaunchKernel);
  load("cuFuncSetAttribute", &api->cuFuncSetAttribute);
  return s;
}

// The driver's sticky errors, as cuda_check.h's IsSticky for the runtime.
bool IsStickyDriverError(CUresult e) {
  switch (e) {
    case CUDA_ERROR_ILLEGAL_ADDRESS:
    case CUDA_ERROR_LAUNCH_FAILED:
    case CUDA_ERROR_HARDWARE_STACK_ERROR:
    case CUDA_ERROR_ILLEGAL_INSTRUCTION:
    case CUDA_ERROR_MISALIGNED_ADDRESS:
    case CUDA_ERROR_INVALID_ADDRESS_SPACE:
    case CUDA_ERROR_INVALID_PC:
    case CUDA_ERROR_ASSERT:
    case CUDA_ERROR_ECC_UNCORRECTABLE:
    case CUDA_ERROR_LAUNCH_TIMEOUT:
    case CUDA_ERROR_UNKNOWN:
      return true;
    default:
      return false;
  }
}

}  // namespace

absl::StatusOr<const DriverApi*> GetDriverApi() {
  struct Loaded {
    DriverApi api;
    absl::Status status;
  };
  // Loaded once (thread-safe static initialization), never destroyed: it
  // lives as long as the module.
  static const Loaded* const loaded = [] {
    auto* l = new Loaded;
    l->status = LoadAll(&l->api);
    return l;
  }();
  if (!loaded->status.ok()) return loaded->status;
  return &loaded->api;
}

bool ContextBroken() {
  cudaEvent_t probe = nullptr;
  const cudaError_t e = cudaEventCreateWithFlags(&probe, cudaEventDisableTiming);
  if (e == cudaSuccess) {
    cudaEventDestroy(probe);
    return false;
  }
  cudaGetLastError();
  return cuda_internal::IsSticky(e);
}

absl::Status DriverStatus(const DriverApi& api, CUresult e, const char* expr, const char* file,
                          int line, absl::StatusCode code) {
  const char* name = nullptr;
  if (api.cuGetErrorName == nullptr || api.cuGetErrorName(e, &name) != CUDA_SUCCESS ||
      name == nullptr) {
    name = "CUDA_ERROR_UNRECOGNIZED";
  }
  const std::string what = absl::StrCat(cuda_internal::BaseName(file), ":", line, ": ", expr,
                                        ": ", name, " (", static_cast<int>(e), ")");
  const bool lost = IsStickyDriverError(e) && ContextBroken();
  cuda_internal::NoteDeviceError(name, lost, what);
  if (lost) return absl::UnavailableError(what);
  if (e == CUDA_ERROR_OUT_OF_MEMORY) return absl::ResourceExhaustedError(what);
  return absl::Status(code, what);
}

}  // namespace rvd::cuda

// Chooses the engine: the CPU engine, or the CUDA engine from a module
// loaded at run time (librvd_cuda.so next to the rvd binary or in ../lib).
// The CUDA side is never linked into rvd: see ../shared/GPU.md (cuBLAS's
// static TLS breaks civetweb's threads) and one binary serves CPU hosts.
#ifndef RVD_SERVER_BACKEND_H_
#define RVD_SERVER_BACKEND_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "kernels/engine.h"

namespace rvd {

// backend: "cpu", "cuda" (an error if unavailable) or "auto" (CUDA when the
// module loads and a device exists, else CPU). `why` receives a sentence
// for the log saying which backend was chosen and why.
absl::StatusOr<std::unique_ptr<Engine>> CreateEngine(
    const std::string& backend, int cpu_threads,
    const CudaEngineOptions& cuda_options, std::string* why);

}  // namespace rvd

#endif  // RVD_SERVER_BACKEND_H_

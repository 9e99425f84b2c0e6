// Chooses the engine: the CPU engine, or the CUDA engine from a module
// loaded at run time (librvd_cuda.so next to the rvd binary or in ../lib),
// driven through the module's versioned C table (kernels/cuda_module.h, which
// says why the CUDA side is never linked into rvd).
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
// Loads the module at `path`: FAILED_PRECONDITION when it speaks another ABI
// (checked before anything of it runs but the table's accessor), UNAVAILABLE
// when it loads but no device is usable.
absl::StatusOr<std::unique_ptr<Engine>> LoadCudaModule(const std::string& path,
                                                       const CudaEngineOptions& options);

absl::StatusOr<std::unique_ptr<Engine>> CreateEngine(
    const std::string& backend, int cpu_threads,
    const CudaEngineOptions& cuda_options, std::string* why);

}  // namespace rvd

#endif  // RVD_SERVER_BACKEND_H_

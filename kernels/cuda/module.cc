// The module's one exported symbol (kCudaEngineSymbol in kernels/engine.h):
// the daemon dlopens librvd_cuda.so and calls it. Everything else in the
// module is hidden (exports.map).
#include <string>

#include "kernels/cuda/cuda_engine.h"
#include "kernels/engine.h"

extern "C" __attribute__((visibility("default"))) rvd::Engine*
rvd_create_cuda_engine(const rvd::CudaEngineOptions& options,
                       std::string* error) {
  absl::StatusOr<std::unique_ptr<rvd::cuda::CudaEngine>> e =
      rvd::cuda::CudaEngine::Create(options);
  if (!e.ok()) {
    if (error != nullptr) *error = std::string(e.status().message());
    return nullptr;
  }
  return e->release();
}

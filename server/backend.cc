#include "server/backend.h"

#include <dlfcn.h>
#include <unistd.h>

#include <filesystem>
#include <vector>

#include "absl/strings/str_cat.h"

namespace rvd {
namespace {

// Directories searched for librvd_cuda.so: the binary's own and ../lib.
std::vector<std::filesystem::path> ModuleDirs() {
  std::error_code ec;
  std::filesystem::path exe =
      std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return {};
  return {exe.parent_path(), exe.parent_path().parent_path() / "lib"};
}

absl::StatusOr<std::unique_ptr<Engine>> LoadCudaEngine(
    const CudaEngineOptions& options) {
  std::string tried;
  for (const auto& dir : ModuleDirs()) {
    const std::filesystem::path path = dir / "librvd_cuda.so";
    if (!std::filesystem::exists(path)) {
      absl::StrAppend(&tried, " ", path.string(), " (absent)");
      continue;
    }
    // Never dlclose: the engine's code lives in the module until exit.
    void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      return absl::UnavailableError(
          absl::StrCat("cannot load ", path.string(), ": ", dlerror()));
    }
    auto create =
        reinterpret_cast<CreateCudaEngineFn>(dlsym(handle, kCudaEngineSymbol));
    if (create == nullptr) {
      return absl::UnavailableError(
          absl::StrCat(path.string(), " does not export ", kCudaEngineSymbol));
    }
    std::string error;
    Engine* engine = create(options, &error);
    if (engine == nullptr) {
      return absl::UnavailableError(
          absl::StrCat(path.string(), " loaded, but: ", error));
    }
    return std::unique_ptr<Engine>(engine);
  }
  return absl::UnavailableError(
      absl::StrCat("no CUDA module found; looked for", tried));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Engine>> CreateEngine(
    const std::string& backend, int cpu_threads,
    const CudaEngineOptions& cuda_options, std::string* why) {
  if (backend == "cpu") {
    *why = "backend cpu: chosen by configuration";
    return NewCpuEngine(cpu_threads);
  }
  if (backend != "auto" && backend != "cuda") {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown backend '", backend, "' (auto, cpu or cuda)"));
  }
  absl::StatusOr<std::unique_ptr<Engine>> cuda = LoadCudaEngine(cuda_options);
  if (cuda.ok()) {
    *why = absl::StrCat("backend cuda: module loaded (", backend, ")");
    return cuda;
  }
  if (backend == "cuda") return cuda.status();
  *why = absl::StrCat("backend cpu: CUDA unavailable (",
                      cuda.status().message(), ")");
  return NewCpuEngine(cpu_threads);
}

}  // namespace rvd

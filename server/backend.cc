#include "server/backend.h"

#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/cuda_module.h"
#include "kernels/live_device.h"
#include "kernels/tune_device.h"

// rvd_call::cancel crosses the boundary as the caller's std::atomic<bool>.
static_assert(sizeof(std::atomic<bool>) == 1 && std::atomic<bool>::is_always_lock_free,
              "rvd_call::cancel must be a one-byte lock-free flag (C11 atomic_bool)");

namespace rvd {
namespace {

// Directories searched for librvd_cuda.so: the binary's own and ../lib.
std::vector<std::filesystem::path> ModuleDirs() {
  std::error_code ec;
  std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return {};
  return {exe.parent_path(), exe.parent_path().parent_path() / "lib"};
}

absl::Status FromModule(const rvd_status& s) {
  return absl::Status(static_cast<absl::StatusCode>(s.code), s.message);
}

rvd_matrix ToModuleMatrix(const MatrixView& v, int32_t memory) {
  return rvd_matrix{v.data, v.rows, v.cols, v.ld, static_cast<int32_t>(v.dtype),
                    memory, v.block_rows, v.block_stride};
}

// rvd::LiveDevice over the module's rvd_cuda_live table: a translation, no
// policy (the module checks and maps; server/live_registry.cc decides).
class ModuleLive final : public LiveDevice {
 public:
  ModuleLive(const rvd_cuda_live* live, rvd_cuda_engine* engine)
      : live_(live), engine_(engine) {}

  absl::StatusOr<MappedSegment> OpenSegment(IpcKind kind, absl::Span<const uint8_t> handle,
                                            int32_t producer_pid,
                                            uint64_t segment_bytes) override {
    const rvd_ipc_segment_desc desc{static_cast<int32_t>(kind), handle.data(),
                                    static_cast<uint32_t>(handle.size()), producer_pid,
                                    segment_bytes};
    MappedSegment out;
    rvd_status status{};
    rvd_ipc_segment* segment = live_->ipc_open(engine_, &desc, &out.base, &out.bytes, &status);
    if (segment == nullptr) return Failed(status, "ipc_open");
    out.segment = reinterpret_cast<Segment*>(segment);
    return out;
  }
  void CloseSegment(Segment* segment) override {
    live_->ipc_close(engine_, reinterpret_cast<rvd_ipc_segment*>(segment));
  }

  absl::StatusOr<std::string> DeviceUuid() override {
    char out[64] = {};
    rvd_status status{};
    if (live_->device_uuid(engine_, out, &status) != 0) return FromModule(status);
    out[63] = '\0';
    return std::string(out);
  }

  absl::StatusOr<void*> OpenEvent(const IpcHandle& handle) override {
    rvd_status status{};
    void* event = live_->ipc_open_event(engine_, handle.data(), &status);
    if (event == nullptr) return Failed(status, "ipc_open_event");
    return event;
  }
  absl::StatusOr<OwnEvent> CreateEvent() override {
    OwnEvent out;
    rvd_status status{};
    out.event = live_->ipc_create_event(engine_, out.handle.data(), &status);
    if (out.event == nullptr) return Failed(status, "ipc_create_event");
    return out;
  }
  void DestroyEvent(void* event) override { live_->event_destroy(engine_, event); }

  absl::StatusOr<void*> AllocDevice(uint64_t bytes) override {
    rvd_status status{};
    void* p = live_->alloc_device(engine_, bytes, &status);
    if (p == nullptr) return Failed(status, "alloc_device");
    return p;
  }
  void FreeDevice(void* p) override { live_->free_device(engine_, p); }

  absl::StatusOr<Snapshot*> StartSnapshot(absl::Span<const SnapshotItem> items, void* wait,
                                          void* done) override {
    std::vector<rvd_snapshot_item> m(items.size());
    for (size_t i = 0; i < items.size(); ++i) {
      m[i] = rvd_snapshot_item{ToModuleMatrix(items[i].src, RVD_MEMORY_DEVICE), items[i].dst,
                               items[i].last};
    }
    rvd_status status{};
    rvd_snapshot* snapshot =
        live_->snapshot_start(engine_, m.data(), m.size(), wait, done, &status);
    if (snapshot == nullptr) return Failed(status, "snapshot_start");
    return reinterpret_cast<Snapshot*>(snapshot);
  }
  absl::Status FinishSnapshot(Snapshot* snapshot, absl::Span<double> delta_sq,
                              absl::Span<double> last_sq, const CallOptions& options) override {
    const rvd_call call{nullptr, options.cancel};
    rvd_status status{};
    live_->snapshot_finish(engine_, reinterpret_cast<rvd_snapshot*>(snapshot), delta_sq.data(),
                           last_sq.data(), &call, &status);
    return FromModule(status);
  }

 private:
  // A NULL result must carry an error: a module that returned NULL with
  // status OK is a bug of the module, said as such.
  static absl::Status Failed(const rvd_status& s, const char* what) {
    if (s.code != 0) return FromModule(s);
    return absl::InternalError(absl::StrCat("the CUDA module's ", what,
                                            " returned nothing and no error"));
  }

  const rvd_cuda_live* const live_;
  rvd_cuda_engine* const engine_;
};

// rvd::TuneDevice over the module's rvd_cuda_tune table: a translation,
// plus the one classification the module's codes leave to its caller,
// whether a failed run is the candidate's (ABORTED) or the harness's.
class ModuleTune final : public TuneDevice {
 public:
  ModuleTune(const rvd_cuda_module* module, rvd_cuda_engine* engine)
      : module_(module), tune_(module->tune), engine_(engine) {}

  absl::StatusOr<Info> Device() override {
    rvd_tune_device d{};
    rvd_status status{};
    if (tune_->device(engine_, &d, &status) != 0) return FromModule(status);
    d.arch[sizeof(d.arch) - 1] = '\0';
    return Info{d.sm, d.arch, d.dram_bytes_per_s, d.fp32_flop_per_s, d.l2_bytes};
  }

  // The module's INVALID_ARGUMENT is the source's fault (it does not
  // compile, or defines no entry): a result without module.
  absl::StatusOr<Compiled> Compile(const std::string& source) override {
    char* log = nullptr;
    rvd_status status{};
    rvd_tune_module* m = tune_->compile(engine_, source.c_str(), &log, &status);
    Compiled out;
    if (log != nullptr) out.log = log;
    tune_->free_log(log);
    if (m != nullptr) {
      out.module = reinterpret_cast<Module*>(m);
      return out;
    }
    if (status.code == static_cast<int32_t>(absl::StatusCode::kInvalidArgument)) {
      absl::StrAppend(&out.log, out.log.empty() ? "" : "\n", status.message);
      return out;
    }
    if (status.code == 0) {
      return absl::InternalError("the CUDA module's tune compile returned nothing and no error");
    }
    return FromModule(status);
  }

  // The arguments are checked here first, so that the module's
  // INVALID_ARGUMENT can only be the launch refused; a sticky error during
  // the call (UNAVAILABLE) is the candidate's fault, one before it is not.
  absl::StatusOr<RunResult> Run(Module* module, absl::Span<const MatrixView> batch,
                                const void* jobs, size_t num_jobs, const RunSpec& spec) override {
    if (module == nullptr || jobs == nullptr || num_jobs == 0) {
      return absl::InvalidArgumentError("tune run: no module or no jobs");
    }
    std::vector<rvd_matrix> m(batch.size());
    for (size_t i = 0; i < batch.size(); ++i) {
      const MatrixView& v = batch[i];
      if (v.data == nullptr || v.block_rows != 0 || v.rows <= 0 || v.cols <= 0 || v.ld < v.cols) {
        return absl::InvalidArgumentError(
            absl::StrCat("tune run: matrix ", i, " is not a non-empty strided host matrix"));
      }
      m[i] = ToModuleMatrix(v, RVD_MEMORY_HOST);
    }
    if (const char* lost = module_->lost(engine_); lost != nullptr) {
      return absl::FailedPreconditionError(absl::StrCat("the device is lost: ", lost));
    }
    RunResult out;
    out.g2.resize(num_jobs);
    out.trace.resize(num_jobs);
    out.maxabs.resize(num_jobs);
    out.seconds.resize(spec.timed_launches);
    rvd_tune_run io{};
    io.threads = spec.threads;
    io.smem_bytes = spec.smem_bytes;
    io.grid = spec.grid;
    io.timed_launches = spec.timed_launches;
    io.poison64 = spec.poison64;
    io.poison32 = spec.poison32;
    io.g2 = out.g2.data();
    io.trace = out.trace.data();
    io.maxabs = out.maxabs.data();
    io.seconds = out.seconds.data();
    rvd_status status{};
    tune_->run(engine_, reinterpret_cast<rvd_tune_module*>(module), m.data(), m.size(), jobs,
               num_jobs, &io, &status);
    const absl::Status s = FromModule(status);
    if (absl::IsInvalidArgument(s) || absl::IsUnavailable(s)) {
      return absl::AbortedError(absl::StrCat("the candidate failed at run time: ", s.message()));
    }
    if (!s.ok()) return s;
    out.input_written = io.input_written != 0;
    return out;
  }

  void Release(Module* module) override {
    tune_->release(engine_, reinterpret_cast<rvd_tune_module*>(module));
  }

 private:
  const rvd_cuda_module* const module_;
  const rvd_cuda_tune* const tune_;
  rvd_cuda_engine* const engine_;
};

// rvd::Engine over the module's C table (kernels/cuda_module.h).
class ModuleEngine : public Engine {
 public:
  ModuleEngine(const rvd_cuda_module* module, rvd_cuda_engine* engine)
      : module_(module), engine_(engine), version_(module->version(engine)) {
    if (module->live != nullptr) live_ = std::make_unique<ModuleLive>(module->live, engine);
    if (module->tune != nullptr) tune_ = std::make_unique<ModuleTune>(module, engine);
  }
  ~ModuleEngine() override { module_->destroy(engine_); }

  LiveDevice* Live() override { return live_.get(); }
  TuneDevice* Tune() override { return tune_.get(); }

  std::string Backend() const override { return "cuda"; }
  std::string Version() const override { return version_; }
  std::string DefaultVariant() const override { return "fused"; }

  using Engine::ComputePR;
  absl::Status ComputePR(absl::Span<const MatrixView> batch, const VariantSpec& variant,
                         absl::Span<double> out, const CallOptions& call) override {
    return Compute(batch, variant, out, RVD_MEMORY_HOST, nullptr, call);
  }

  using Engine::ComputePRDevice;
  absl::Status ComputePRDevice(absl::Span<const MatrixView> batch, const VariantSpec& variant,
                               absl::Span<double> out, void* ready,
                               const CallOptions& call) override {
    return Compute(batch, variant, out, RVD_MEMORY_DEVICE, ready, call);
  }

  // The module's gram_eigenvalues (ABI 4); a module whose table has it NULL
  // answers UNIMPLEMENTED. out is checked here: the module writes
  // min(rows, cols) values into it.
  absl::Status GramEigenvalues(const MatrixView& m, absl::Span<double> out,
                               const CallOptions& options) override {
    if (module_->gram_eigenvalues == nullptr) {
      return absl::UnimplementedError(
          "this CUDA module has no Gram eigenvalues (its gram_eigenvalues is NULL)");
    }
    const int64_t n = std::min(m.rows, m.cols);
    if (n <= 0 || out.size() != static_cast<size_t>(n)) {
      return absl::InvalidArgumentError(absl::StrCat("out has ", out.size(),
                                                     " slots for the eigenvalues of a ",
                                                     m.rows, " x ", m.cols, " matrix's Gram"));
    }
    const rvd_matrix mm{m.data,         m.rows,          m.cols,       m.ld,
                        static_cast<int32_t>(m.dtype), RVD_MEMORY_HOST, m.block_rows,
                        m.block_stride};
    const rvd_call call{nullptr, options.cancel};
    rvd_status status{};
    module_->gram_eigenvalues(engine_, &mm, out.data(), &call, &status);
    return FromModule(status);
  }

  absl::Status Compute(absl::Span<const MatrixView> batch, const VariantSpec& variant,
                       absl::Span<double> out, int32_t memory, void* ready,
                       const CallOptions& options) {
    if (out.size() != batch.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("out has ", out.size(), " slots for a batch of ", batch.size()));
    }
    std::vector<rvd_matrix> m(batch.size());
    for (size_t i = 0; i < batch.size(); ++i) {
      const MatrixView& v = batch[i];
      m[i] = ToModuleMatrix(v, memory);
    }
    const rvd_variant spec{variant.name.c_str(), variant.probes, variant.sketch_rank,
                           variant.seed, variant.hutch_plus_plus ? 1 : 0};
    const rvd_call call{ready, options.cancel};
    rvd_status status{};
    module_->compute(engine_, m.data(), m.size(), &spec, out.data(), &call, &status);
    return FromModule(status);
  }

  EngineStats Stats() const override {
    EngineStats s;
    module_->stats(engine_, &Sink, &s);
    if (const char* lost = module_->lost(engine_); lost != nullptr) {
      s.healthy = false;
      s.unhealthy_reason = lost;
    }
    return s;
  }

  void* AllocateHostBuffer(uint64_t bytes) override {
    return module_->alloc_host(engine_, bytes);
  }
  void FreeHostBuffer(void* p) override { module_->free_host(engine_, p); }

 private:
  static void Sink(void* ctx, const char* kind, const char* key, double value) {
    auto* s = static_cast<EngineStats*>(ctx);
    const std::string k = key;
    if (std::strcmp(kind, "served") == 0) {
      s->served[k] = static_cast<int64_t>(value);
    } else if (std::strcmp(kind, "event") == 0) {
      s->events[k] = static_cast<int64_t>(value);
    } else if (std::strcmp(kind, "phase_seconds") == 0) {
      s->phase_seconds[k] = value;
    } else if (std::strcmp(kind, "device_error") == 0) {
      s->device_errors[k] = static_cast<int64_t>(value);
    } else if (std::strcmp(kind, "policy") == 0) {
      const size_t eq = k.find('=');
      if (eq != std::string::npos) s->kernel_policies[k.substr(0, eq)] = k.substr(eq + 1);
    } else if (std::strcmp(kind, "device_bytes") == 0) {
      s->device_bytes_held = static_cast<uint64_t>(value);
    } else if (std::strcmp(kind, "pinned_bytes") == 0) {
      s->pinned_bytes_held = static_cast<uint64_t>(value);
    }  // kinds a newer module adds are ignored
  }

  const rvd_cuda_module* const module_;
  rvd_cuda_engine* const engine_;
  const std::string version_;
  std::unique_ptr<ModuleLive> live_;  // null: the module has no live table
  std::unique_ptr<ModuleTune> tune_;  // null: the module has no tuning table
};

absl::StatusOr<std::unique_ptr<Engine>> LoadFromDirs(const CudaEngineOptions& options) {
  std::string tried;
  for (const auto& dir : ModuleDirs()) {
    const std::filesystem::path path = dir / "librvd_cuda.so";
    if (!std::filesystem::exists(path)) {
      absl::StrAppend(&tried, " ", path.string(), " (absent)");
      continue;
    }
    return LoadCudaModule(path.string(), options);
  }
  return absl::UnavailableError(absl::StrCat("no CUDA module found; looked for", tried));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Engine>> LoadCudaModule(const std::string& path,
                                                       const CudaEngineOptions& options) {
  // Never dlclose: the engine's code lives in the module until exit.
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    return absl::UnavailableError(absl::StrCat("cannot load ", path, ": ", dlerror()));
  }
  auto table = reinterpret_cast<rvd_cuda_module_fn>(dlsym(handle, RVD_CUDA_MODULE_SYMBOL));
  if (table == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        path, " does not export ", RVD_CUDA_MODULE_SYMBOL,
        ": a module from another rvd version; install the librvd_cuda.so built with this rvd"));
  }
  const rvd_cuda_module* module = table();
  // Checked before anything is created: a module of another ABI must not be
  // called at all.
  if (module == nullptr || module->abi_version != RVD_CUDA_MODULE_ABI_VERSION ||
      module->size < sizeof(rvd_cuda_module)) {
    return absl::FailedPreconditionError(absl::StrCat(
        path, " speaks CUDA module ABI ", module == nullptr ? 0 : module->abi_version,
        " (table of ", module == nullptr ? 0 : module->size, " bytes); this rvd needs ABI ",
        RVD_CUDA_MODULE_ABI_VERSION, " (", sizeof(rvd_cuda_module),
        " bytes): install the librvd_cuda.so built with this rvd"));
  }
  const rvd_cuda_options o{options.device, options.streams, options.max_device_bytes,
                           options.max_sms};
  rvd_status status{};
  rvd_cuda_engine* engine = module->create(&o, &status);
  if (engine == nullptr) {
    return absl::UnavailableError(absl::StrCat(path, " loaded, but: ", status.message));
  }
  return std::unique_ptr<Engine>(new ModuleEngine(module, engine));
}

absl::StatusOr<std::unique_ptr<Engine>> CreateEngine(const std::string& backend,
                                                     int cpu_threads,
                                                     const CudaEngineOptions& cuda_options,
                                                     std::string* why) {
  if (backend == "cpu") {
    *why = "backend cpu: chosen by configuration";
    return NewCpuEngine(cpu_threads);
  }
  if (backend != "auto" && backend != "cuda") {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown backend '", backend, "' (auto, cpu or cuda)"));
  }
  absl::StatusOr<std::unique_ptr<Engine>> cuda = LoadFromDirs(cuda_options);
  if (cuda.ok()) {
    *why = absl::StrCat("backend cuda: module loaded (", backend, ")");
    return cuda;
  }
  if (backend == "cuda") return cuda.status();
  // A module of another ABI is an installation error, not a missing GPU:
  // auto still serves on the CPU, and the log says why.
  *why = absl::StrCat("backend cpu: CUDA unavailable (", cuda.status().message(), ")");
  return NewCpuEngine(cpu_threads);
}

}  // namespace rvd

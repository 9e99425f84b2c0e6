// The module's one exported symbol (RVD_CUDA_MODULE_SYMBOL, kernels/
// cuda_module.h): the daemon dlopens librvd_cuda.so, checks the ABI version
// of the table this returns, and drives the CUDA engine through it.
// Everything else in the module is hidden (exports.map).
#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "kernels/cuda/abi_status.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_engine.h"
#include "kernels/cuda/live.h"
#include "kernels/cuda/tune.h"
#include "kernels/cuda_module.h"
#include "kernels/engine.h"

// rvd_call::cancel crosses the boundary as the caller's std::atomic<bool>.
static_assert(sizeof(std::atomic<bool>) == 1 && std::atomic<bool>::is_always_lock_free,
              "rvd_call::cancel must be a one-byte lock-free flag (C11 atomic_bool)");

struct rvd_cuda_engine {
  std::unique_ptr<rvd::cuda::CudaEngine> engine;
  std::string version;
  absl::Mutex mu;
  std::string lost ABSL_GUARDED_BY(mu);  // set once, when the device is first seen lost
  // Live weights (live.h) over the engine's device, cap and counters;
  // declared last, so destroyed before the engine.
  std::unique_ptr<rvd::cuda::Live> live;
};

rvd::cuda::Live* LiveOf(rvd_cuda_engine* engine) { return engine->live.get(); }
int rvd::cuda::TuneDeviceOf(rvd_cuda_engine* engine) { return engine->engine->device(); }
int rvd::cuda::TuneMaxSmsOf(rvd_cuda_engine* engine) { return engine->engine->max_sms(); }

namespace {

using ::rvd::cuda_internal::SetAbiStatus;


rvd_cuda_engine* Create(const rvd_cuda_options* o, rvd_status* status) {
  rvd::CudaEngineOptions options;
  options.device = o->device;
  options.streams = o->streams;
  options.max_device_bytes = o->max_device_bytes;
  options.max_sms = o->max_sms;
  absl::StatusOr<std::unique_ptr<rvd::cuda::CudaEngine>> e =
      rvd::cuda::CudaEngine::Create(options);
  if (!e.ok()) {
    SetAbiStatus(e.status(), status);
    return nullptr;
  }
  SetAbiStatus(absl::OkStatus(), status);
  auto* h = new rvd_cuda_engine;
  h->engine = std::move(*e);
  h->version = h->engine->Version();
  h->live = std::make_unique<rvd::cuda::Live>(h->engine->device(), h->engine->max_sms(),
                                              h->engine->memory_cap(), h->engine->counters());
  return h;
}

void Destroy(rvd_cuda_engine* h) { delete h; }

const char* Version(rvd_cuda_engine* h) { return h->version.c_str(); }

int32_t Compute(rvd_cuda_engine* h, const rvd_matrix* batch, size_t n,
                const rvd_variant* variant, double* out, const rvd_call* call,
                rvd_status* status) {
  std::vector<rvd::MatrixView> views(n);
  bool device = false;
  for (size_t i = 0; i < n; ++i) {
    const rvd_matrix& m = batch[i];
    if (m.dtype < RVD_DTYPE_F32 || m.dtype > RVD_DTYPE_BF16 ||
        (m.memory != RVD_MEMORY_HOST && m.memory != RVD_MEMORY_DEVICE) ||
        (i > 0 && (m.memory == RVD_MEMORY_DEVICE) != device)) {
      SetAbiStatus(absl::InvalidArgumentError(absl::StrCat(
                    "batch[", i, "]: bad dtype or memory kind (one kind per call)")),
                status);
      return status->code;
    }
    device = m.memory == RVD_MEMORY_DEVICE;
    views[i] = rvd::MatrixView{m.data, m.rows, m.cols, m.ld, static_cast<rvd::DType>(m.dtype),
                               m.block_rows, m.block_stride};
  }
  rvd::VariantSpec spec;
  if (variant != nullptr) {
    spec.name = variant->name != nullptr ? variant->name : "";
    spec.probes = variant->probes;
    spec.sketch_rank = variant->sketch_rank;
    spec.seed = variant->seed;
    spec.hutch_plus_plus = variant->hutch_plus_plus != 0;
  }
  void* ready = call != nullptr ? call->ready : nullptr;
  rvd::CallOptions options;
  if (call != nullptr) options.cancel = static_cast<const std::atomic<bool>*>(call->cancel);
  absl::Span<double> results(out, n);
  const absl::Status s =
      device ? h->engine->ComputePRDevice(views, spec, results, ready, options)
             : h->engine->ComputePR(views, spec, results, options);
  SetAbiStatus(s, status);
  return status->code;
}

void Stats(rvd_cuda_engine* h, rvd_stats_sink sink, void* ctx) {
  const rvd::EngineStats s = h->engine->Stats();
  for (const auto& [k, v] : s.served) sink(ctx, "served", k.c_str(), static_cast<double>(v));
  for (const auto& [k, v] : s.events) sink(ctx, "event", k.c_str(), static_cast<double>(v));
  for (const auto& [k, v] : s.phase_seconds) sink(ctx, "phase_seconds", k.c_str(), v);
  for (const auto& [k, v] : s.device_errors) {
    sink(ctx, "device_error", k.c_str(), static_cast<double>(v));
  }
  for (const auto& [k, v] : s.kernel_policies) {
    sink(ctx, "policy", absl::StrCat(k, "=", v).c_str(), 1.0);
  }
  sink(ctx, "device_bytes", "", static_cast<double>(s.device_bytes_held));
  sink(ctx, "pinned_bytes", "", static_cast<double>(s.pinned_bytes_held));
}

const char* Lost(rvd_cuda_engine* h) {
  absl::MutexLock lock(&h->mu);
  if (h->lost.empty()) {
    const rvd::cuda_internal::DeviceErrorSnapshot e = rvd::cuda_internal::DeviceErrors();
    if (!e.lost) return nullptr;
    h->lost = e.lost_reason.empty() ? "device lost" : e.lost_reason;
  }
  // Never changed once set: the pointer stays valid until destroy.
  return h->lost.c_str();
}

void* AllocHost(rvd_cuda_engine* h, uint64_t bytes) { return h->engine->AllocateHostBuffer(bytes); }
void FreeHost(rvd_cuda_engine* h, void* p) { h->engine->FreeHostBuffer(p); }

// The Gram eigenvalues (cuda_module.h, gram_eigen.cc): min(rows, cols)
// doubles into out.
int32_t GramEigenvalues(rvd_cuda_engine* h, const rvd_matrix* m, double* out,
                        const rvd_call* call, rvd_status* status) {
  if (m == nullptr || out == nullptr || m->dtype < RVD_DTYPE_F32 || m->dtype > RVD_DTYPE_BF16 ||
      (m->memory != RVD_MEMORY_HOST && m->memory != RVD_MEMORY_DEVICE)) {
    SetAbiStatus(absl::InvalidArgumentError("gram_eigenvalues: no matrix or output, or a bad dtype "
                                         "or memory kind"),
              status);
    return status->code;
  }
  const rvd::MatrixView v{m->data, m->rows, m->cols, m->ld, static_cast<rvd::DType>(m->dtype),
                          m->block_rows, m->block_stride};
  rvd::CallOptions options;
  if (call != nullptr) options.cancel = static_cast<const std::atomic<bool>*>(call->cancel);
  const int64_t n = std::max<int64_t>(0, std::min(m->rows, m->cols));
  SetAbiStatus(h->engine->GramEigenvaluesOn(v, m->memory == RVD_MEMORY_DEVICE,
                                         call != nullptr ? call->ready : nullptr,
                                         absl::Span<double>(out, static_cast<size_t>(n)), options),
            status);
  return status->code;
}

constexpr rvd_cuda_module kModule = {
    RVD_CUDA_MODULE_ABI_VERSION, sizeof(rvd_cuda_module), RVD_VERSION, &Create, &Destroy,
    &Version, &Compute, &Stats, &Lost, &AllocHost, &FreeHost,
    /*live=*/&rvd::cuda::kLiveTable, /*gram_eigenvalues=*/&GramEigenvalues,
    /*tune=*/&rvd::cuda::kTuneTable};

}  // namespace

extern "C" __attribute__((visibility("default"))) const rvd_cuda_module* rvd_cuda_module_table() {
  return &kModule;
}

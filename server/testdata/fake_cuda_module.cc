// A stand-in for librvd_cuda.so in backend_test: exports the module table
// with the ABI version FAKE_ABI. Its engine factory fails (no device)
// except for device ordinal kEchoDevice, which gets an engine that computes
// nothing but echoes what crossed the boundary, so that a test can check
// the daemon's side of the table (ModuleEngine) field by field. Built twice:
// once speaking this rvd's ABI, once another.
#include <atomic>
#include <cstring>

#include "kernels/cuda_module.h"

struct rvd_cuda_engine {
  int unused;
};

namespace {

constexpr int32_t kEchoDevice = 7;
int created = 0;  // create() calls: a mismatched module must never see one
rvd_cuda_engine echo_engine{0};

void SetMessage(rvd_status* status, int32_t code, const char* msg) {
  status->code = code;
  std::strncpy(status->message, msg, sizeof(status->message) - 1);
  status->message[sizeof(status->message) - 1] = '\0';
}

rvd_cuda_engine* Create(const rvd_cuda_options* options, rvd_status* status) {
  ++created;
  if (options->device == kEchoDevice) {
    SetMessage(status, 0, "");
    return &echo_engine;
  }
  SetMessage(status, 14, "fake module: no CUDA device");  // UNAVAILABLE
  return nullptr;
}

void Destroy(rvd_cuda_engine*) {}
const char* Version(rvd_cuda_engine*) { return "fake-echo-1"; }

// out[i] = rows + 1000 * memory + 1e6 * block_rows + 1e9 * (block_stride
// > 0) + 0.5 * (ready set); a set cancel flag answers CANCELLED (code 1).
int32_t Compute(rvd_cuda_engine*, const rvd_matrix* batch, size_t n, const rvd_variant*,
                double* out, const rvd_call* call, rvd_status* status) {
  if (call != nullptr && call->cancel != nullptr &&
      static_cast<const std::atomic<bool>*>(call->cancel)->load()) {
    SetMessage(status, 1, "fake module: cancelled");
    return status->code;
  }
  for (size_t i = 0; i < n; ++i) {
    const rvd_matrix& m = batch[i];
    out[i] = static_cast<double>(m.rows) + 1000.0 * m.memory + 1e6 * m.block_rows +
             1e9 * (m.block_stride > 0) + (call != nullptr && call->ready != nullptr ? 0.5 : 0);
  }
  SetMessage(status, 0, "");
  return 0;
}

void Stats(rvd_cuda_engine*, rvd_stats_sink, void*) {}
const char* Lost(rvd_cuda_engine*) { return nullptr; }
void* AllocHost(rvd_cuda_engine*, uint64_t) { return nullptr; }
void FreeHost(rvd_cuda_engine*, void*) {}

const rvd_cuda_module kModule = {FAKE_ABI, sizeof(rvd_cuda_module), "fake", &Create,
                                 &Destroy,  &Version, &Compute, &Stats, &Lost, &AllocHost,
                                 &FreeHost, /*live=*/nullptr, /*gram_eigenvalues=*/nullptr,
                                 /*tune=*/nullptr};

}  // namespace

extern "C" __attribute__((visibility("default"))) const rvd_cuda_module* rvd_cuda_module_table() {
  return &kModule;
}

extern "C" __attribute__((visibility("default"))) int fake_module_created() { return created; }

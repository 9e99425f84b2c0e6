// A stand-in for librvd_cuda.so in backend_test: exports the module table
// with the ABI version FAKE_ABI. Its engine factory fails (no device)
// except for device ordinal kEchoDevice, which gets an engine that computes
// nothing but echoes what crossed the boundary, so that a test can check
// the daemon's side of the table (ModuleEngine, ModuleTune) field by field. Built twice:
// once speaking this rvd's ABI, once another.
#include <atomic>
#include <cstdlib>
#include <cstring>

#include "kernels/cuda_module.h"

struct rvd_cuda_engine {
  int unused;
};
struct rvd_tune_module {
  char source[64];  // what the fake's tuning table reads its behaviour from
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
// NULL, or why the device is lost (a "fault" run sets it; the test may
// set and clear it through fake_module_set_lost).
const char* lost_reason = nullptr;
const char* Lost(rvd_cuda_engine*) { return lost_reason; }
void* AllocHost(rvd_cuda_engine*, uint64_t) { return nullptr; }
void FreeHost(rvd_cuda_engine*, void*) {}

// The tuning table (ABI 5): a candidate's source names its behaviour.
// compile: "syntax" fails as NVRTC would (INVALID_ARGUMENT, a log),
// "no_nvrtc" as a host without it (UNAVAILABLE); else a module. run:
// "refused" is a refused launch (INVALID_ARGUMENT), "fault" a kernel fault
// (UNAVAILABLE, the device lost), "oom" the harness out of memory
// (RESOURCE_EXHAUSTED), "writes" reports its input written; otherwise it
// echoes: g2[j] = j + 100 n, trace[j] = threads + 1e3 smem + 1e6 grid,
// maxabs[j] = the poison32 bits, seconds[t] = (t + 1) * 1e-3 and, to show
// the poison64 crossed, seconds[0] += poison64's low 16 bits * 1e-9.
int released = 0;  // tune modules released

int32_t TuneDeviceInfo(rvd_cuda_engine*, rvd_tune_device* out, rvd_status* status) {
  *out = rvd_tune_device{};
  out->sm = 90;
  std::strncpy(out->arch, "sm_90a", sizeof(out->arch) - 1);
  out->dram_bytes_per_s = 4.8e12;
  out->fp32_flop_per_s = 6.7e13;
  out->l2_bytes = 50u << 20;
  SetMessage(status, 0, "");
  return 0;
}

char* CopyLog(const char* text) {
  char* log = static_cast<char*>(std::malloc(std::strlen(text) + 1));
  std::strcpy(log, text);
  return log;
}

rvd_tune_module* TuneCompile(rvd_cuda_engine*, const char* source, char** log,
                             rvd_status* status) {
  if (std::strstr(source, "syntax") != nullptr) {
    if (log != nullptr) *log = CopyLog("candidate.cu(1): error: expected a \";\"");
    SetMessage(status, 3, "the candidate does not compile for sm_90a");
    return nullptr;
  }
  if (log != nullptr) *log = CopyLog("");
  if (std::strstr(source, "no_nvrtc") != nullptr) {
    SetMessage(status, 14, "NVRTC (libnvrtc.so) is not installed on this host");
    return nullptr;
  }
  auto* m = new rvd_tune_module;
  std::strncpy(m->source, source, sizeof(m->source) - 1);
  m->source[sizeof(m->source) - 1] = '\0';
  SetMessage(status, 0, "");
  return m;
}

void TuneFreeLog(char* log) { std::free(log); }

int32_t TuneRun(rvd_cuda_engine*, rvd_tune_module* m, const rvd_matrix*, size_t n, const void*,
                size_t num_jobs, rvd_tune_run* io, rvd_status* status) {
  if (std::strstr(m->source, "refused") != nullptr) {
    SetMessage(status, 3, "cuLaunchKernel: CUDA_ERROR_INVALID_VALUE");
    return status->code;
  }
  if (std::strstr(m->source, "fault") != nullptr) {
    lost_reason = "cudaErrorIllegalAddress";
    SetMessage(status, 14, "cudaDeviceSynchronize(): cudaErrorIllegalAddress");
    return status->code;
  }
  if (std::strstr(m->source, "oom") != nullptr) {
    SetMessage(status, 8, "cudaMalloc: cudaErrorMemoryAllocation");
    return status->code;
  }
  float p32;
  std::memcpy(&p32, &io->poison32, sizeof p32);
  for (size_t j = 0; j < num_jobs; ++j) {
    io->g2[j] = static_cast<double>(j) + 100.0 * static_cast<double>(n);
    io->trace[j] = io->threads + 1e3 * io->smem_bytes + 1e6 * io->grid;
    io->maxabs[j] = p32;
  }
  for (uint32_t t = 0; t < io->timed_launches; ++t) io->seconds[t] = (t + 1) * 1e-3;
  if (io->timed_launches > 0) io->seconds[0] += static_cast<double>(io->poison64 & 0xffff) * 1e-9;
  io->input_written = std::strstr(m->source, "writes") != nullptr ? 1 : 0;
  SetMessage(status, 0, "");
  return 0;
}

void TuneRelease(rvd_cuda_engine*, rvd_tune_module* m) {
  ++released;
  delete m;
}

const rvd_cuda_tune kTune = {&TuneDeviceInfo, &TuneCompile, &TuneFreeLog, &TuneRun, &TuneRelease};

const rvd_cuda_module kModule = {FAKE_ABI, sizeof(rvd_cuda_module), "fake", &Create,
                                 &Destroy,  &Version, &Compute, &Stats, &Lost, &AllocHost,
                                 &FreeHost, /*live=*/nullptr, /*gram_eigenvalues=*/nullptr,
                                 /*tune=*/&kTune};

}  // namespace

extern "C" __attribute__((visibility("default"))) const rvd_cuda_module* rvd_cuda_module_table() {
  return &kModule;
}

extern "C" __attribute__((visibility("default"))) int fake_module_created() { return created; }

extern "C" __attribute__((visibility("default"))) int fake_module_released() { return released; }
extern "C" __attribute__((visibility("default"))) void fake_module_set_lost(const char* why) {
  lost_reason = why;
}

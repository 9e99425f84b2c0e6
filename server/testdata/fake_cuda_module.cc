// A stand-in for librvd_cuda.so in backend_test: exports the module table
// with the ABI version FAKE_ABI, and an engine factory that always fails (no
// device). Built twice: once speaking this rvd's ABI, once another.
#include "kernels/cuda_module.h"

namespace {

int created = 0;  // create() calls: a mismatched module must never see one

rvd_cuda_engine* Create(const rvd_cuda_options*, rvd_status* status) {
  ++created;
  status->code = 14;  // UNAVAILABLE
  const char msg[] = "fake module: no CUDA device";
  for (unsigned i = 0; i < sizeof(msg); ++i) status->message[i] = msg[i];
  return nullptr;
}

const rvd_cuda_module kModule = {FAKE_ABI, sizeof(rvd_cuda_module), "fake", &Create,
                                 nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                                 nullptr};

}  // namespace

extern "C" __attribute__((visibility("default"))) const rvd_cuda_module* rvd_cuda_module_table() {
  return &kModule;
}

extern "C" __attribute__((visibility("default"))) int fake_module_created() { return created; }

#include "kernels/cuda/device_context.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_check.h"

namespace rvd::cuda_internal {
namespace {
ABSL_CONST_INIT absl::Mutex errors_mu(absl::kConstInit);
// Created on first use, never destroyed: it lives as long as the module.
DeviceErrorSnapshot* errors ABSL_GUARDED_BY(errors_mu) = nullptr;
}  // namespace

void NoteDeviceError(const char* name, bool sticky, const std::string& what) {
  absl::MutexLock lock(&errors_mu);
  if (errors == nullptr) errors = new DeviceErrorSnapshot;
  ++errors->by_name[name];
  if (sticky && !errors->lost) {
    errors->lost = true;
    errors->lost_reason = what;
  }
}

DeviceErrorSnapshot DeviceErrors() {
  absl::MutexLock lock(&errors_mu);
  return errors == nullptr ? DeviceErrorSnapshot{} : *errors;
}

bool IsSticky(cudaError_t e) {
  switch (e) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorAssert:
    case cudaErrorECCUncorrectable:
    case cudaErrorDevicesUnavailable:
    case cudaErrorDeviceUninitialized:
    case cudaErrorLaunchTimeout:
    case cudaErrorUnknown:
      return true;
    default:
      return false;
  }
}

}  // namespace rvd::cuda_internal

namespace rvd::cuda {

absl::Status MemoryCap::Charge(uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  if (held_ + bytes > max_bytes_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "device memory cap: this request needs ", bytes, " more bytes; rvd holds ", held_,
        " of max_device_bytes ", max_bytes_));
  }
  held_ += bytes;
  return absl::OkStatus();
}

void MemoryCap::Uncharge(uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  held_ -= std::min(bytes, held_);
}

uint64_t MemoryCap::held() const {
  absl::MutexLock lock(&mu_);
  return held_;
}

void EngineCounters::Served(const std::map<std::string, int64_t>& served) {
  absl::MutexLock lock(&mu_);
  for (const auto& [key, n] : served) served_[key] += n;
}

void EngineCounters::Event(const std::string& name, int64_t n) {
  absl::MutexLock lock(&mu_);
  events_[name] += n;
}

void EngineCounters::AddMs(const std::string& phase, double ms) {
  absl::MutexLock lock(&mu_);
  ms_[phase] += ms;
}

void EngineCounters::Snapshot(EngineStats* stats) const {
  {
    absl::MutexLock lock(&mu_);
    stats->served = served_;
    stats->events = events_;
    auto ms = [&](const char* phase) {
      auto it = ms_.find(phase);
      return it == ms_.end() ? 0.0 : it->second;
    };
    // "call" is a call's whole wall time; compute is what the other phases
    // leave of it.
    stats->phase_seconds = {
        {"h2d", ms("h2d") / 1e3},
        {"plan", ms("plan") / 1e3},
        {"compute", std::max(0.0, ms("call") - ms("h2d") - ms("plan")) / 1e3}};
  }
  stats->pinned_bytes_held = static_cast<uint64_t>(std::max<int64_t>(0, pinned_bytes_));
  const cuda_internal::DeviceErrorSnapshot errors = cuda_internal::DeviceErrors();
  stats->device_errors = errors.by_name;
  stats->healthy = !errors.lost;
  stats->unhealthy_reason = errors.lost_reason;
}

absl::Status DeviceBuffer::Reserve(MemoryCap& cap, uint64_t bytes, cudaStream_t stream) {
  if (size_ >= bytes) return absl::OkStatus();
  const uint64_t want = (bytes + (1u << 16) - 1) / (1u << 16) * (1u << 16);
  if (ptr_ != nullptr) {
    RVD_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
    Release();
  }
  if (absl::Status s = cap.Charge(want); !s.ok()) return s;
  void* p = nullptr;
  if (cudaError_t e = cudaMalloc(&p, want); e != cudaSuccess) {
    cap.Uncharge(want);
    RVD_CUDA_RETURN_IF_ERROR(e);
  }
  cap_ = &cap;
  ptr_ = p;
  size_ = want;
  return absl::OkStatus();
}

void DeviceBuffer::Release() {
  if (ptr_ == nullptr) return;
  cudaFree(ptr_);
  cap_->Uncharge(size_);
  ptr_ = nullptr;
  size_ = 0;
}

absl::Status PinnedBuffer::Reserve(EngineCounters& counters, uint64_t bytes,
                                   cudaStream_t stream) {
  if (size_ >= bytes) return absl::OkStatus();
  const uint64_t want = (bytes + (1u << 20) - 1) / (1u << 20) * (1u << 20);
  if (ptr_ != nullptr) {
    RVD_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
    Release();
  }
  void* p = nullptr;
  RVD_CUDA_RETURN_IF_ERROR(cudaHostAlloc(&p, want, cudaHostAllocDefault));
  counters_ = &counters;
  counters_->AddPinnedBytes(static_cast<int64_t>(want));
  ptr_ = p;
  size_ = want;
  return absl::OkStatus();
}

void PinnedBuffer::Release() {
  if (ptr_ == nullptr) return;
  cudaFreeHost(ptr_);
  counters_->AddPinnedBytes(-static_cast<int64_t>(size_));
  ptr_ = nullptr;
  size_ = 0;
}

Context::~Context() {
  if (stream != nullptr) cudaStreamSynchronize(stream);
  if (cublas != nullptr) cublasDestroy(cublas);
  if (cusolver != nullptr) cusolverDnDestroy(cusolver);
  ReleaseDeviceBuffers();
  staging.Release();
  up.Release();
  down.Release();
  for (cudaEvent_t e : {copy_begin, copy_end}) {
    if (e != nullptr) cudaEventDestroy(e);
  }
  if (stream != nullptr) cudaStreamDestroy(stream);
}

absl::Status Context::Create(int priority) {
  RVD_CUDA_RETURN_IF_ERROR(
      cudaStreamCreateWithPriority(&stream, cudaStreamNonBlocking, priority));
  return absl::OkStatus();
}

absl::Status Context::Cublas() {
  if (cublas != nullptr) return absl::OkStatus();
  RVD_CUDA_RETURN_IF_ERROR(cublasCreate(&cublas));
  RVD_CUDA_RETURN_IF_ERROR(cublasSetStream(cublas, stream));
  // The default math mode: f32 GEMMs stay IEEE (no TF32).
  RVD_CUDA_RETURN_IF_ERROR(cublasSetMathMode(cublas, CUBLAS_DEFAULT_MATH));
  return absl::OkStatus();
}

absl::Status Context::Cusolver() {
  if (cusolver != nullptr) return absl::OkStatus();
  RVD_CUDA_RETURN_IF_ERROR(cusolverDnCreate(&cusolver));
  RVD_CUDA_RETURN_IF_ERROR(cusolverDnSetStream(cusolver, stream));
  return absl::OkStatus();
}

absl::Status Context::EnsureTickets() {
  if (tickets.data() != nullptr) return absl::OkStatus();
  if (absl::Status s = tickets.Reserve(cap, kFusedV4TicketInts * sizeof(int32_t), stream);
      !s.ok()) {
    return s;
  }
  RVD_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(tickets.data(), 0, tickets.size(), stream));
  return absl::OkStatus();
}

absl::Status Context::RecordCopy(bool begin) {
  if (copy_begin == nullptr) {
    RVD_CUDA_RETURN_IF_ERROR(cudaEventCreate(&copy_begin));
    RVD_CUDA_RETURN_IF_ERROR(cudaEventCreate(&copy_end));
  }
  RVD_CUDA_RETURN_IF_ERROR(cudaEventRecord(begin ? copy_begin : copy_end, stream));
  copy_recorded = !begin;
  return absl::OkStatus();
}

double Context::TakeCopyMs() {
  if (!copy_recorded) return 0.0;
  copy_recorded = false;
  float ms = 0.0f;
  return cudaEventElapsedTime(&ms, copy_begin, copy_end) == cudaSuccess ? ms : 0.0;
}

void Context::ReleaseDeviceBuffers() {
  for (DeviceBuffer* b : {&input, &shared, &descriptors, &work, &tickets}) b->Release();
  fused = FusedCall{};
}

}  // namespace rvd::cuda

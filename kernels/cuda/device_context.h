// What the CUDA engine owns on the device (private to kernels/cuda/): the
// cap on device memory, RAII device and pinned buffers, the engine's
// counters, and a Context (one stream and its buffers) that one call at a
// time uses.
//
// Thread safety: MemoryCap and EngineCounters are thread-safe. A Context and
// its buffers belong to the one call that acquired it from the engine's pool.
#ifndef RVD_KERNELS_CUDA_DEVICE_CONTEXT_H_
#define RVD_KERNELS_CUDA_DEVICE_CONTEXT_H_

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cusolverDn.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "kernels/cuda/fused_plan.h"
#include "kernels/engine.h"

namespace rvd::cuda {

// The engine's cap on the device memory it holds (CudaEngineOptions::
// max_device_bytes). Every DeviceBuffer charges it before allocating.
class MemoryCap {
 public:
  explicit MemoryCap(uint64_t max_bytes) : max_bytes_(max_bytes) {}
  // RESOURCE_EXHAUSTED when `bytes` more would exceed the cap.
  absl::Status Charge(uint64_t bytes);
  void Uncharge(uint64_t bytes);
  uint64_t held() const;
  uint64_t max_bytes() const { return max_bytes_; }

 private:
  const uint64_t max_bytes_;
  mutable absl::Mutex mu_;
  uint64_t held_ ABSL_GUARDED_BY(mu_) = 0;
};

// The engine's cumulative counters, read by Engine::Stats. Thread-safe.
class EngineCounters {
 public:
  void Served(const std::map<std::string, int64_t>& served);
  void Event(const std::string& name, int64_t n);
  void AddMs(const std::string& phase, double ms);
  void AddPinnedBytes(int64_t delta) { pinned_bytes_ += delta; }
  // Fills the counter fields of *stats (device errors and health come from
  // cuda_check.h's DeviceErrors, which every failed call reports to).
  void Snapshot(EngineStats* stats) const;

 private:
  mutable absl::Mutex mu_;
  std::map<std::string, int64_t> served_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int64_t> events_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, double> ms_ ABSL_GUARDED_BY(mu_);
  std::atomic<int64_t> pinned_bytes_{0};
};

// Device memory charged to a MemoryCap; freed and uncharged when released
// or destroyed. Contents do not survive a Reserve that grows the buffer.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  ~DeviceBuffer() { Release(); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  // At least `bytes` (rounded up to 64 KiB). Before an old allocation is
  // freed, `stream` (the only stream that uses it) is synchronized.
  absl::Status Reserve(MemoryCap& cap, uint64_t bytes, cudaStream_t stream);
  // Frees the memory; the caller has synchronized every stream using it.
  void Release();
  void* data() const { return ptr_; }
  uint64_t size() const { return size_; }

 private:
  MemoryCap* cap_ = nullptr;  // charged with size_ while ptr_ is set
  void* ptr_ = nullptr;
  uint64_t size_ = 0;
};

// Page-locked host memory (not charged to the cap, which is on device
// memory; counted in EngineCounters' pinned bytes).
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  ~PinnedBuffer() { Release(); }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

  // At least `bytes` (rounded up to 1 MiB), as DeviceBuffer::Reserve.
  absl::Status Reserve(EngineCounters& counters, uint64_t bytes, cudaStream_t stream);
  void Release();
  void* data() const { return ptr_; }
  uint64_t size() const { return size_; }

 private:
  EngineCounters* counters_ = nullptr;
  void* ptr_ = nullptr;
  uint64_t size_ = 0;
};

// A call's results as the device (or a host-side variant) writes them and
// Context::down receives them: m PRs (double) in slot order, then m
// statuses (int32, MatrixStatus).
inline uint64_t ResultsBytes(size_t m) { return m * (sizeof(double) + sizeof(int32_t)); }

// What the chunk last enqueued on a context left for Collect.
struct PendingChunk {
  size_t count = 0;                       // matrices; 0: nothing pending
  size_t first = 0;                       // batch index of its first matrix
  std::vector<size_t> order;              // down's slot s holds chunk matrix order[s]
  std::vector<MatrixView> device_views;   // the chunk's matrices on the device
};

// One stream and the buffers a call uses on it. Every variant leaves its
// results in `down` (ResultsBytes of pending.count, in pending.order's slot
// order) once the stream has run what it queued: Collect reads them there,
// so no result outlives its context's chunk or crosses to another.
struct Context {
  Context(MemoryCap& cap, EngineCounters& counters) : cap(cap), counters(counters) {}
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  absl::Status Create(int priority);  // the stream
  absl::Status Cublas();              // created on first use
  absl::Status Cusolver();            // created on first use
  // Fused v4's cut-job tickets: zeroed once, left zero by the kernel.
  absl::Status EnsureTickets();
  // Events around this context's host-to-device copies.
  absl::Status RecordCopy(bool begin);
  // After the stream is synchronized: the recorded copies' time, or 0.
  double TakeCopyMs();
  // Frees every device buffer (an idle context gives its memory back to the
  // cap); the stream must be idle. The fused plan, which lives in
  // `descriptors`, is forgotten.
  void ReleaseDeviceBuffers();

  MemoryCap& cap;
  EngineCounters& counters;
  cudaStream_t stream = nullptr;
  cublasHandle_t cublas = nullptr;
  cusolverDnHandle_t cusolver = nullptr;
  DeviceBuffer input;        // packed host inputs
  DeviceBuffer shared;       // host ranges that several views share, uploaded once
  DeviceBuffer descriptors;  // the fused call's descriptors, jobs and tensor maps
  DeviceBuffer work;         // partial sums, results, workspaces
  DeviceBuffer tickets;      // fused v4's cut-job tickets
  PinnedBuffer staging;      // host inputs, packed
  PinnedBuffer up;           // descriptors on their way to the device
  PinnedBuffer down;         // results on their way back
  cudaEvent_t copy_begin = nullptr, copy_end = nullptr;
  bool copy_recorded = false;  // copy_end recorded since the last TakeCopyMs
  PendingChunk pending;
  FusedCall fused;  // the last fused call planned here, on `descriptors`
};

}  // namespace rvd::cuda

#endif  // RVD_KERNELS_CUDA_DEVICE_CONTEXT_H_

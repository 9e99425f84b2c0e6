// The CUDA engine (private to the module librvd_cuda.so and its tests and
// benchmark; the daemon sees only rvd::Engine through rvd_create_cuda_engine).
//
// Contract: as rvd::Engine. Thread-safe: ComputePR and ComputePRDevice may be
// called from several threads at once; each call takes contexts (a stream,
// cuBLAS/cuSOLVER handles, pinned and device buffers) from a pool, so calls
// run in parallel up to the pool's size and wait beyond it. A failed CUDA
// call fails the request that made it with a Status naming file and line.
//
// Variants: fused (default), algebraic, naive, power_iter, sketch; see
// cuda_engine.cc's header comment.
#ifndef RVD_KERNELS_CUDA_CUDA_ENGINE_H_
#define RVD_KERNELS_CUDA_CUDA_ENGINE_H_

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "kernels/engine.h"

namespace rvd::cuda {

struct Context;  // one stream and its buffers (cuda_engine.cc)

class CudaEngine : public Engine {
 public:
  // Creates the engine on options.device; fails when no device is usable.
  static absl::StatusOr<std::unique_ptr<CudaEngine>> Create(
      const CudaEngineOptions& options);
  ~CudaEngine() override;

  std::string Backend() const override { return "cuda"; }
  // e.g. "cuda-fused-v1/sm90/fused-v1-bt128w8s4".
  std::string Version() const override { return version_; }
  std::string DefaultVariant() const override { return "fused"; }

  // `batch` holds HOST pointers: copied through pinned staging in chunks,
  // each chunk's copy overlapped with the previous chunk's compute.
  absl::Status ComputePR(absl::Span<const MatrixView> batch,
                         const VariantSpec& variant,
                         absl::Span<double> out) override;

  // `device_batch` holds DEVICE pointers (the benchmark, tests and the CUDA
  // IPC path). Work is ordered after what is already queued on `stream`
  // (nullptr: the legacy default stream); returns when `out` is written.
  // Views need 2-byte (f16/bf16) or 4-byte (f32) aligned data; the fused
  // kernel's fast loads need 16-byte aligned rows, others take a slower path.
  absl::Status ComputePRDevice(absl::Span<const MatrixView> device_batch,
                               const VariantSpec& variant,
                               absl::Span<double> out, cudaStream_t stream);

  // How many matrices each (variant, kernel version) has served, e.g.
  // {"fused/fused-v1-bt128w8s4": 480}. Proves which code path ran.
  std::map<std::string, int64_t> ServedCounts() const override;
  std::map<std::string, double> PhaseSeconds() const override;
  // Page-locked (portable) host memory: copies from it run at the link's
  // rate (55 GB/s on the H200 host, against ~7-20 GB/s pageable).
  void* AllocateHostBuffer(uint64_t bytes) override;
  void FreeHostBuffer(void* p) override;

  // Device bytes rvd holds now (buffers in the pools).
  uint64_t DeviceBytesHeld() const;

  // Tests only: run the deliberately wrong fused kernel (bf16 only) when
  // fused_mutant.cu is linked in.
  void UseFusedMutantForTest(bool on) { use_mutant_ = on; }

 private:
  explicit CudaEngine(const CudaEngineOptions& options);
  absl::Status Init();

  // The path for host batches whose views share bytes (see cuda_engine.cc);
  // sets *used to false, and does nothing, when it does not apply.
  absl::Status ComputeShared(absl::Span<const MatrixView> batch,
                             const VariantSpec& variant,
                             absl::Span<double> out, bool* used);

  // Takes a context: waits for one when `wait`, else returns nullptr when
  // none is free.
  Context* Acquire(bool wait);
  void Release(Context* ctx);
  // Waits for ctx's stream, drops what it had pending, and releases it.
  void DrainAndRelease(Context* ctx);

  // Charges `bytes` of device memory to the cap, or fails.
  absl::Status Charge(uint64_t bytes);
  void Uncharge(uint64_t bytes);
  friend struct Context;
  friend class Runner;

  void Count(const std::string& key, int64_t n);
  void Count(const std::map<std::string, int64_t>& served);
  // Adds a host call's wall time and the copy time its contexts measured.
  void AddCallTime(double call_ms);
  void AddCopyTime(double copy_ms);
  // Adds the host time of planning a fused call (jobs, schedules, tensor
  // maps, the descriptors' upload).
  void AddPlanTime(double plan_ms);

  CudaEngineOptions options_;
  std::string version_;
  int sm_major_ = 0, sm_minor_ = 0;
  int sms_ = 0;  // multiprocessors (fused v4's schedule)
  std::atomic<bool> use_mutant_{false};

  mutable absl::Mutex mu_;
  std::vector<std::unique_ptr<Context>> contexts_ ABSL_GUARDED_BY(mu_);
  std::vector<Context*> free_ ABSL_GUARDED_BY(mu_);
  uint64_t held_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, int64_t> served_ ABSL_GUARDED_BY(mu_);
  double call_ms_ ABSL_GUARDED_BY(mu_) = 0.0;  // ComputePR wall time
  double copy_ms_ ABSL_GUARDED_BY(mu_) = 0.0;  // host-to-device copies
  double plan_ms_ ABSL_GUARDED_BY(mu_) = 0.0;  // fused calls' planning
};

}  // namespace rvd::cuda

#endif  // RVD_KERNELS_CUDA_CUDA_ENGINE_H_

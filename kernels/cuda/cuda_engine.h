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
#include "kernels/call_contract.h"
#include "kernels/engine.h"

namespace rvd::cuda {

struct Context;        // one stream and its buffers (device_context.h)
class MemoryCap;       // device_context.h
class EngineCounters;  // device_context.h
struct FusedLaunchers;  // kernel_registry.h
class KernelRegistry;   // kernel_registry.h
struct VariantEnv;      // variant.h

class CudaEngine : public Engine {
 public:
  // Creates the engine on options.device; fails when no device is usable.
  static absl::StatusOr<std::unique_ptr<CudaEngine>> Create(
      const CudaEngineOptions& options);
  ~CudaEngine() override;

  std::string Backend() const override { return "cuda"; }
  // e.g. "cuda/sm90/fused:tma-wgmma-square,tma-wgmma-triangle,mma-sync-wide,wmma-tall".
  std::string Version() const override { return version_; }
  std::string DefaultVariant() const override { return "fused"; }

  using Engine::ComputePR;
  using Engine::ComputePRDevice;

  // `batch` holds HOST pointers: copied through pinned staging in chunks,
  // each chunk's copy overlapped with the previous chunk's compute.
  // call.cancel is looked at before each chunk and each launch.
  absl::Status ComputePR(absl::Span<const MatrixView> batch,
                         const VariantSpec& variant, absl::Span<double> out,
                         const CallOptions& call) override;

  // `device_batch` holds DEVICE pointers of this process (the benchmark,
  // tests, and memory mapped from another process). The engine's work waits
  // for `ready` (an event the caller recorded after writing the matrices,
  // possibly an interprocess event; nullptr: no wait) and returns when `out`
  // is written. Views need 2-byte (f16/bf16) or 4-byte (f32) aligned data;
  // the fused kernel's fast loads need 16-byte aligned rows, others take a
  // slower path. A blocked view (MatrixView::block_rows) is gathered on the
  // device first (counted as event "device_gather").
  absl::Status ComputePRDevice(absl::Span<const MatrixView> device_batch,
                               const VariantSpec& variant, absl::Span<double> out,
                               void* ready, const CallOptions& call) override;

  // The Gram eigenvalues (engine.h) of a host matrix, and of one in either
  // memory: device_memory, the engine's work waits for `ready` (a
  // cudaEvent_t, or nullptr) and reads the matrix in place. gram_eigen.cc.
  absl::Status GramEigenvalues(const MatrixView& m, absl::Span<double> out,
                               const CallOptions& call) override;
  absl::Status GramEigenvaluesOn(const MatrixView& m, bool device_memory, void* ready,
                                 absl::Span<double> out, const CallOptions& call);

  // How many matrices each path ("variant/technique") has served, e.g.
  // {"fused/tma-wgmma-square": 480}. Proves which code path ran.
  EngineStats Stats() const override;
  // Page-locked (portable) host memory: copies from it run at the link's
  // rate (55 GB/s on the H200 host, against ~7-20 GB/s pageable).
  void* AllocateHostBuffer(uint64_t bytes) override;
  void FreeHostBuffer(void* p) override;

  // Device bytes rvd holds now (buffers in the pools).
  uint64_t DeviceBytesHeld() const;

  // What the module's live-weights part (live.h) shares with the engine:
  // its device, SM cap, cap on device memory and counters.
  int device() const { return options_.device; }
  int max_sms() const { return options_.max_sms; }
  MemoryCap& memory_cap() { return *cap_; }
  EngineCounters& counters() { return *counters_; }

  // The fused kernels in service: swap an entry to change what serves
  // (calls already running finish on the kernels they started with).
  KernelRegistry& kernels() { return *kernels_; }

  // Tests only: every fused kernel replaced by `mutant`'s deliberately
  // wrong ones (fused_mutant.cu), counted as fused/MUTANT-<technique>;
  // nullptr: the product kernels again.
  void UseFusedMutantForTest(const FusedLaunchers* mutant);

 private:
  explicit CudaEngine(const CudaEngineOptions& options);
  absl::Status Init();

  // The path for host batches whose views share bytes (see cuda_engine.cc);
  // sets *used to false, and does nothing, when it does not apply.
  // `kind` is the variant the call contract parsed.
  absl::Status ComputeShared(absl::Span<const MatrixView> batch, VariantKind kind,
                             const VariantSpec& variant, absl::Span<double> out,
                             const CallOptions& call, bool* used);
  // The packed, chunked path for host batches.
  absl::Status ComputeChunked(absl::Span<const MatrixView> batch, VariantKind kind,
                              const VariantSpec& variant, absl::Span<double> out,
                              const CallOptions& call);

  // Takes a context: waits for one when `wait`, else returns nullptr when
  // none is free.
  Context* Acquire(bool wait);
  void Release(Context* ctx);
  // Waits for ctx's stream, drops what it had pending, and releases it.
  void DrainAndRelease(Context* ctx);
  // Frees the device buffers of every idle context; returns whether any
  // memory was freed (a call that hit the cap may then retry).
  bool TrimIdleContexts();
  // Device bytes one context's work buffer or input chunk should stay within.
  uint64_t Budget() const;
  // What this engine's variants may use, for a call made with `call`.
  VariantEnv Env(const CallOptions& call) const;

  CudaEngineOptions options_;
  std::string version_;
  int sm_major_ = 0, sm_minor_ = 0;
  int device_sms_ = 0;  // the device's multiprocessors (capped by options_.max_sms)
  std::unique_ptr<KernelRegistry> kernels_;  // created in Init (needs the device)
  std::unique_ptr<MemoryCap> cap_;
  std::unique_ptr<EngineCounters> counters_;

  mutable absl::Mutex mu_;
  std::vector<std::unique_ptr<Context>> contexts_ ABSL_GUARDED_BY(mu_);
  std::vector<Context*> free_ ABSL_GUARDED_BY(mu_);
  std::map<void*, uint64_t> host_buffers_ ABSL_GUARDED_BY(mu_);  // AllocateHostBuffer's
};

}  // namespace rvd::cuda

#endif  // RVD_KERNELS_CUDA_CUDA_ENGINE_H_

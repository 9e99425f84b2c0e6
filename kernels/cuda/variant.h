// The CUDA engine's variants (private to kernels/cuda/). One Variant object
// serves one call: it owns that call's state, and whatever a chunk leaves
// behind lives on the chunk's Context, so two contexts' chunks of one call
// can never read each other's results.
//
//   fused      (exact, default) our kernels (fused_plan.h): one pass over W,
//              Gram tiles on tensor cores (3xTF32 for f32, native bf16/f16),
//              ||W||_F^2 and ||G||_F^2 reduced in float64; G never stored.
//   algebraic  (exact) the vendor baseline: cuBLAS batched Gram (compute 32F,
//              no TF32) in split-K parts, our float64 reductions.
//   naive      (exact) cuSOLVER dgesvd on a float64 copy, singular values
//              only: the validation baseline.
//   power_iter (estimate) Hutchinson / Hutch++ for tr(G^2) with the CPU
//              engine's probes (the same draws for the same seed).
//   sketch     (estimate) the CPU engine's Gaussian sketch.
//
// Contract of Enqueue: ctx.pending.device_views holds the chunk (device
// pointers, validated); Enqueue queues the variant on ctx.stream (naive and
// the estimators also wait on it) and sets ctx.pending.order; once the
// stream has run what was queued, ctx.down holds ResultsBytes(count): the
// PRs in slot order, then the statuses (MatrixStatus). A variant that
// launches per matrix looks at the call's cancellation flag (Cancelled())
// before each launch and answers CallCancelled(); the engine looks before
// each Enqueue.
#ifndef RVD_KERNELS_CUDA_VARIANT_H_
#define RVD_KERNELS_CUDA_VARIANT_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "kernels/call_contract.h"
#include "kernels/cuda/byte_layout.h"
#include "kernels/cuda/device_context.h"
#include "kernels/cuda/fused_plan.h"
#include "kernels/cuda/kernel_registry.h"
#include "kernels/engine.h"

namespace rvd::cuda {

// What a variant may use of its engine.
struct VariantEnv {
  EngineCounters* counters = nullptr;
  DeviceInfo device;
  // Device bytes one context's work buffer or input chunk should stay
  // within (max_device_bytes / streams / 2).
  uint64_t budget = 0;
  // The fused kernels in service (the engine's registry).
  const KernelRegistry* kernels = nullptr;
  // The call's cancellation flag (CallOptions::cancel), or nullptr.
  const std::atomic<bool>* cancel = nullptr;
};

class Variant {
 public:
  virtual ~Variant() = default;
  // See the header comment.
  virtual absl::Status Enqueue(Context& ctx) = 0;
  // Matrices this call's chunks were served by, per counted path
  // ("variant/technique"), once each.
  const std::map<std::string, int64_t>& served() const { return served_; }
  // Whether the call's caller asked it to stop (VariantEnv::cancel).
  bool Cancelled() const { return CancelRequested(CallOptions{cancel_}); }

 protected:
  void Serve(const std::string& path, int64_t matrices) { served_[path] += matrices; }

 private:
  friend std::unique_ptr<Variant> NewVariant(VariantKind, const VariantSpec&, const VariantEnv&);
  std::map<std::string, int64_t> served_;
  const std::atomic<bool>* cancel_ = nullptr;  // set by NewVariant
};

std::unique_ptr<Variant> NewVariant(VariantKind kind, const VariantSpec& spec, const VariantEnv& env);

// Shared by the variants (variant.cc).
namespace variant_internal {

// ||W||^2 of every matrix of the chunk, computed on the device and waited
// for; NaN/Inf is INVALID_ARGUMENT naming the batch index. Reserves
// ctx.work for the statistics plus `extra` bytes after them, which start at
// *extra_offset.
absl::Status ChunkTraces(Context& ctx, uint64_t extra, std::vector<double>* trace,
                         uint64_t* extra_offset);

// Host-computed results of the chunk into ctx.down (slot order = chunk
// order, every status kStatusOk).
absl::Status PutHostResults(Context& ctx, const std::vector<double>& pr);

// The variants, one file each.
std::unique_ptr<Variant> NewFused(const VariantEnv& env);
std::unique_ptr<Variant> NewAlgebraic(const VariantEnv& env);
std::unique_ptr<Variant> NewNaive(const VariantEnv& env);
std::unique_ptr<Variant> NewEstimator(const VariantEnv& env, const VariantSpec& spec,
                                      bool sketch);

}  // namespace variant_internal
}  // namespace rvd::cuda

#endif  // RVD_KERNELS_CUDA_VARIANT_H_

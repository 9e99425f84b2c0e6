// fused: our kernels, planned once per distinct call (fused_plan.h).
#include <chrono>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/variant.h"

namespace rvd::cuda {
namespace {


class FusedVariant : public Variant {
 public:
  explicit FusedVariant(const VariantEnv& env) : env_(env) {}

  // A chunk whose views are the context's previous fused call's (a model's
  // live weights, or the context's own input buffer, measured again)
  // launches that call's plan again: its descriptors are still on the
  // device, so no planning, no tensor-map encoding and no upload.
  absl::Status Enqueue(Context& ctx) override {
    FusedCall& call = ctx.fused;
    const size_t m = ctx.pending.device_views.size();
    // One table for the whole chunk; a plan made for another generation of
    // the kernels is not reused.
    const std::shared_ptr<const KernelTable> table = env_.kernels->Snapshot();
    if (call.views != ctx.pending.device_views || call.generation != table->generation()) {
      const auto start = std::chrono::steady_clock::now();
      absl::Status s = Plan(ctx);
      if (!s.ok()) {
        call = FusedCall{};  // no reuse of a plan that did not make it up
        return s;
      }
      env_.counters->AddMs("plan", std::chrono::duration<double, std::milli>(
                                       std::chrono::steady_clock::now() - start)
                                       .count());
    } else {
      env_.counters->Event("fused_plan_reused", static_cast<int64_t>(m));
    }
    if (absl::Status s = ctx.down.Reserve(ctx.counters, ResultsBytes(m), ctx.stream); !s.ok()) {
      return s;
    }
    call.generation = table->generation();
    ctx.pending.order = call.order;
    RVD_CUDA_RETURN_IF_ERROR(LaunchFusedCall(call, *table, ctx.descriptors.data(),
                                             ctx.work.data(),
                                             static_cast<int32_t*>(ctx.tickets.data()),
                                             ctx.stream));
    for (const FusedCall::Launch& l : call.launches) {
      Serve(absl::StrCat("fused/", table->Find(l.dtype, l.kernel).technique), l.matrices);
    }
    RVD_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(ctx.down.data(),
                                             At<unsigned char>(ctx.work.data(), call.o_pr),
                                             ResultsBytes(m), cudaMemcpyDeviceToHost,
                                             ctx.stream));
    return absl::OkStatus();
  }

 private:
  // Plans the chunk into ctx.fused and uploads its descriptors.
  absl::Status Plan(Context& ctx) {
    FusedCall& call = ctx.fused;
    call = FusedCall{};
    FusedCall planned;
    absl::Status s = PlanFusedCall(ctx.pending.device_views, env_.device, &planned);
    if (s.ok()) s = ctx.up.Reserve(ctx.counters, planned.upload.size(), ctx.stream);
    if (s.ok()) s = ctx.descriptors.Reserve(ctx.cap, planned.upload.size(), ctx.stream);
    if (s.ok()) s = ctx.work.Reserve(ctx.cap, planned.work_bytes, ctx.stream);
    if (s.ok() && planned.needs_tickets) s = ctx.EnsureTickets();
    if (!s.ok()) return s;
    std::memcpy(ctx.up.data(), planned.upload.data(), planned.upload.size());
    RVD_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(ctx.descriptors.data(), ctx.up.data(),
                                             planned.upload.size(), cudaMemcpyHostToDevice,
                                             ctx.stream));
    planned.upload.clear();  // on the device now
    planned.upload.shrink_to_fit();
    call = std::move(planned);
    return absl::OkStatus();
  }

  const VariantEnv env_;
};

}  // namespace

namespace variant_internal {
std::unique_ptr<Variant> NewFused(const VariantEnv& env) {
  return std::make_unique<FusedVariant>(env);
}
}  // namespace variant_internal
}  // namespace rvd::cuda

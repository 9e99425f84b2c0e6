#include "kernels/cuda/variant.h"

#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/kernels.h"

namespace rvd::cuda {

std::unique_ptr<Variant> NewVariant(VariantKind kind, const VariantSpec& spec, const VariantEnv& env) {
  using namespace variant_internal;
  std::unique_ptr<Variant> v;
  switch (kind) {
    case VariantKind::kFused: v = NewFused(env); break;
    case VariantKind::kAlgebraic: v = NewAlgebraic(env); break;
    case VariantKind::kNaive: v = NewNaive(env); break;
    case VariantKind::kPowerIter: v = NewEstimator(env, spec, /*sketch=*/false); break;
    case VariantKind::kSketch: v = NewEstimator(env, spec, /*sketch=*/true); break;
  }
  if (v != nullptr) v->cancel_ = env.cancel;
  return v;
}

namespace variant_internal {

absl::Status ChunkTraces(Context& ctx, uint64_t extra, std::vector<double>* trace,
                         uint64_t* extra_offset) {
  const auto& views = ctx.pending.device_views;
  const size_t m = views.size();
  Layout l;
  const uint64_t o_desc = l.Add(m * sizeof(MatrixDesc));
  const uint64_t o_tr = l.Add(m * sizeof(double));
  const uint64_t o_mx = l.Add(m * sizeof(float));
  *extra_offset = l.Add(extra);
  absl::Status s = ctx.up.Reserve(ctx.counters, o_tr, ctx.stream);
  if (s.ok()) s = ctx.work.Reserve(ctx.cap, l.size(), ctx.stream);
  if (!s.ok()) return s;
  auto* descs = At<MatrixDesc>(ctx.up.data(), o_desc);
  for (size_t i = 0; i < m; ++i) descs[i] = MakeDesc(views[i]);
  void* w = ctx.work.data();
  RVD_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(w, ctx.up.data(), o_tr, cudaMemcpyHostToDevice, ctx.stream));
  // One launch per run of one dtype (a block per matrix, all at once).
  for (size_t i = 0; i < m;) {
    size_t e = i;
    while (e < m && views[e].dtype == views[i].dtype) ++e;
    RVD_CUDA_RETURN_IF_ERROR(LaunchStats(views[i].dtype, At<MatrixDesc>(w, o_desc) + i,
                                         static_cast<int>(e - i), At<double>(w, o_tr) + i,
                                         At<float>(w, o_mx) + i, ctx.stream));
    i = e;
  }
  trace->resize(m);
  RVD_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(trace->data(), At<double>(w, o_tr),
                                           m * sizeof(double), cudaMemcpyDeviceToHost,
                                           ctx.stream));
  RVD_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(ctx.stream));
  for (size_t i = 0; i < m; ++i) {
    if (!std::isfinite((*trace)[i])) return NonFiniteError(ctx.pending.first + i);
  }
  return absl::OkStatus();
}

absl::Status PutHostResults(Context& ctx, const std::vector<double>& pr) {
  const size_t m = pr.size();
  if (absl::Status s = ctx.down.Reserve(ctx.counters, ResultsBytes(m), ctx.stream); !s.ok()) {
    return s;
  }
  // The stream may still read nothing of `down` (results are written here,
  // after the variant waited): plain host writes.
  std::copy(pr.begin(), pr.end(), At<double>(ctx.down.data(), 0));
  int32_t* status = At<int32_t>(ctx.down.data(), m * sizeof(double));
  std::fill(status, status + m, static_cast<int32_t>(kStatusOk));
  ctx.pending.order.resize(m);
  std::iota(ctx.pending.order.begin(), ctx.pending.order.end(), size_t{0});
  return absl::OkStatus();
}

}  // namespace variant_internal
}  // namespace rvd::cuda

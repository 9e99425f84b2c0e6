// naive: cuSOLVER's QR and SVD in float64, the validation baseline.
#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/call_contract.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/kernels.h"
#include "kernels/cuda/variant.h"

namespace rvd::cuda {
namespace {

using variant_internal::ChunkTraces;
using variant_internal::PutHostResults;

class NaiveVariant : public Variant {
 public:
  // Per matrix: a float64 copy in LAPACK's layout (m >= n, column-major),
  // its QR (geqrf), and the singular values of the n x n R (gesvd, values
  // only): the same singular values as the matrix's to float64 rounding
  // (what dgesdd does for tall matrices), with a workspace of R's size
  // rather than gesvd's on the whole m x n matrix (82 MB for one 512 x 4096
  // layer, beyond a 64 MiB cap). PR from them in float64 (call_contract.h).
  absl::Status Enqueue(Context& ctx) override {
    const auto& views = ctx.pending.device_views;
    absl::Status s = ctx.Cusolver();
    if (!s.ok()) return s;
    // Workspace (after the stats) for the largest matrix: the float64 copy,
    // tau, R, the singular values, info, then the larger of geqrf's and
    // gesvd's work, whose size cuSOLVER tells once the copy has memory.
    uint64_t a_bytes = 0, n_bytes = 0, r_bytes = 0;
    for (const MatrixView& v : views) {
      const uint64_t mr = std::max(v.rows, v.cols), nc = std::min(v.rows, v.cols);
      a_bytes = std::max<uint64_t>(a_bytes, mr * nc * sizeof(double));
      n_bytes = std::max<uint64_t>(n_bytes, nc * sizeof(double));
      r_bytes = std::max<uint64_t>(r_bytes, nc * nc * sizeof(double));
    }
    Layout l;
    const uint64_t o_a = l.Add(a_bytes), o_tau = l.Add(n_bytes), o_r = l.Add(r_bytes),
                   o_s = l.Add(n_bytes), o_info = l.Add(2 * sizeof(int)), o_w = l.size();
    std::vector<double> trace;
    uint64_t extra = 0;
    s = ChunkTraces(ctx, l.size(), &trace, &extra);
    if (!s.ok()) return s;
    // The traces are on the host now: growing `work` may drop its contents.
    std::vector<int> lwork(views.size());
    int most = 0;
    for (size_t i = 0; i < views.size(); ++i) {
      const int mr = static_cast<int>(std::max(views[i].rows, views[i].cols));
      const int nc = static_cast<int>(std::min(views[i].rows, views[i].cols));
      int qr = 0, svd = 0;
      RVD_CUDA_RETURN_IF_ERROR(cusolverDnDgeqrf_bufferSize(
          ctx.cusolver, mr, nc, At<double>(ctx.work.data(), extra + o_a), mr, &qr));
      RVD_CUDA_RETURN_IF_ERROR(cusolverDnDgesvd_bufferSize(ctx.cusolver, nc, nc, &svd));
      lwork[i] = std::max(qr, svd);
      most = std::max(most, lwork[i]);
    }
    s = ctx.work.Reserve(ctx.cap, extra + o_w + uint64_t(most) * sizeof(double), ctx.stream);
    if (!s.ok()) return s;
    void* const w = At<void>(ctx.work.data(), extra);
    double* const a = At<double>(w, o_a);
    double* const r = At<double>(w, o_r);
    int* const info = At<int>(w, o_info);
    std::vector<double> results(views.size(), 0.0);
    for (size_t i = 0; i < views.size(); ++i) {
      if (trace[i] == 0) continue;  // all zero: PR 0
      if (Cancelled()) return CallCancelled();
      const MatrixView& v = views[i];
      const int mr = static_cast<int>(std::max(v.rows, v.cols));
      const int nc = static_cast<int>(std::min(v.rows, v.cols));
      RVD_CUDA_RETURN_IF_ERROR(LaunchToF64ForSvd(v.dtype, MakeDesc(v), a, ctx.stream));
      RVD_CUDA_RETURN_IF_ERROR(cusolverDnDgeqrf(ctx.cusolver, mr, nc, a, mr,
                                                At<double>(w, o_tau), At<double>(w, o_w),
                                                lwork[i], info));
      // R: the upper triangle of the leading nc x nc block (below it, the
      // Householder vectors, zeroed).
      RVD_CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(r, nc * sizeof(double), a, mr * sizeof(double),
                                                 nc * sizeof(double), nc,
                                                 cudaMemcpyDeviceToDevice, ctx.stream));
      RVD_CUDA_RETURN_IF_ERROR(LaunchZeroBelowDiagonal(r, nc, nc, ctx.stream));
      RVD_CUDA_RETURN_IF_ERROR(cusolverDnDgesvd(ctx.cusolver, 'N', 'N', nc, nc, r, nc,
                                                At<double>(w, o_s), nullptr, 1, nullptr, 1,
                                                At<double>(w, o_w), lwork[i], nullptr,
                                                info + 1));
      std::vector<double> sv(static_cast<size_t>(nc));
      int infos[2] = {0, 0};
      RVD_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(sv.data(), At<double>(w, o_s),
                                               nc * sizeof(double), cudaMemcpyDeviceToHost,
                                               ctx.stream));
      RVD_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(infos, info, sizeof(infos),
                                               cudaMemcpyDeviceToHost, ctx.stream));
      RVD_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(ctx.stream));
      if (infos[0] != 0 || infos[1] != 0) {
        return absl::InternalError(absl::StrCat("batch[", ctx.pending.first + i,
                                                "]: cusolver geqrf info ", infos[0],
                                                ", gesvd info ", infos[1]));
      }
      results[i] = PRFromSingularValues(sv);
    }
    Serve("naive/cusolver-geqrf-dgesvd", static_cast<int64_t>(views.size()));
    return PutHostResults(ctx, results);
  }
};

}  // namespace

namespace variant_internal {
std::unique_ptr<Variant> NewNaive(const VariantEnv&) { return std::make_unique<NaiveVariant>(); }
}  // namespace variant_internal
}  // namespace rvd::cuda

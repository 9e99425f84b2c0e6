// algebraic: the vendor baseline, cuBLAS's batched Gram with our float64
// reductions.
#include <algorithm>
#include <cstring>
#include <numeric>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/kernels.h"
#include "kernels/cuda/launch_policy.h"
#include "kernels/cuda/variant.h"

namespace rvd::cuda {
namespace {


cudaDataType CudaType(DType d) {
  switch (d) {
    case DType::kF32: return CUDA_R_32F;
    case DType::kF16: return CUDA_R_16F;
    case DType::kBF16: return CUDA_R_16BF;
  }
  return CUDA_R_32F;
}

class AlgebraicVariant : public Variant {
 public:
  explicit AlgebraicVariant(const VariantEnv& env) : env_(env) {}

  // Algebraic: per shape group, the cuBLAS Gram (compute 32F, no TF32) in
  // split-K parts of kKChunk into a workspace, in sub-batches that fit the
  // budget; our kernel sums the parts per entry in float64 and reduces the
  // upper triangle; float64 ||W||^2 and max |w| from the stats kernel; the
  // same finalize as fused. Why split-K: the tensor cores' f32 accumulation
  // truncates, and one GEMM over K = 4096 was off by 1e-5 of PR for bf16
  // inputs (H200 run 1); parts of 128 keep each accumulation short (256 still left 2.9e-6 on
  // rank-1 f16 inputs, run 2), as the
  // CPU engine's float64 sum over 1024-column chunks does.
  static constexpr int64_t kKChunk = 128;

  absl::Status Enqueue(Context& ctx) override {
    const auto& views = ctx.pending.device_views;
    const size_t m = views.size();
    ctx.pending.order.resize(m);
    std::iota(ctx.pending.order.begin(), ctx.pending.order.end(), size_t{0});
    std::vector<MatrixDesc> descs(m);
    std::vector<int32_t> jb(m + 1);
    for (size_t i = 0; i < m; ++i) {
      descs[i] = MakeDesc(views[i]);
      jb[i] = static_cast<int32_t>(i);
    }
    jb[m] = static_cast<int32_t>(m);
    const std::vector<ShapeGroup> groups = GroupByShape(views);
    struct Plan {
      bool tall;
      int n, k, ld, chunks, last_k;
      uint64_t per_matrix;  // workspace bytes: chunks x n x n f32
      size_t fit;           // matrices per sub-batch
    };
    std::vector<Plan> plans;
    uint64_t gram_bytes = 0;
    size_t num_ptrs = 0;
    for (const ShapeGroup& g : groups) {
      Plan p;
      p.tall = g.key.rows > g.key.cols;
      p.n = static_cast<int>(GramSide(g.key.rows, g.key.cols));
      p.k = static_cast<int>(p.tall ? g.key.rows : g.key.cols);
      p.ld = static_cast<int>(g.key.ld);
      p.chunks = static_cast<int>((p.k + kKChunk - 1) / kKChunk);
      p.last_k = p.k - (p.chunks - 1) * static_cast<int>(kKChunk);
      p.per_matrix = uint64_t(p.chunks) * p.n * p.n * sizeof(float);
      p.fit = static_cast<size_t>(std::max<uint64_t>(1, env_.budget / p.per_matrix));
      p.fit = std::min(p.fit, g.members.size());
      gram_bytes = std::max(gram_bytes, p.per_matrix * p.fit);
      num_ptrs += g.members.size() * p.chunks;
      plans.push_back(p);
    }
    Layout up;
    const uint64_t o_desc = up.Add(m * sizeof(MatrixDesc));
    const uint64_t o_jb = up.Add((m + 1) * sizeof(int32_t));
    const uint64_t o_aptrs = up.Add(num_ptrs * sizeof(void*));
    const uint64_t o_cptrs = up.Add(num_ptrs * sizeof(void*));
    const uint64_t up_bytes = up.size();
    Layout work = up;
    const uint64_t o_g2 = work.Add(m * sizeof(double));
    const uint64_t o_tr = work.Add(m * sizeof(double));
    const uint64_t o_mx = work.Add(m * sizeof(float));
    const uint64_t o_pr = work.Add(ResultsBytes(m));
    const uint64_t o_st = o_pr + m * sizeof(double);
    const uint64_t o_gram = work.Add(gram_bytes);
    absl::Status s = ctx.up.Reserve(ctx.counters, up_bytes, ctx.stream);
    if (s.ok()) s = ctx.down.Reserve(ctx.counters, ResultsBytes(m), ctx.stream);
    if (s.ok()) s = ctx.Cublas();
    if (s.ok()) s = ctx.work.Reserve(ctx.cap, work.size(), ctx.stream);
    if (!s.ok()) return s;
    void* w = ctx.work.data();
    float* gram = At<float>(w, o_gram);
    std::memcpy(At<void>(ctx.up.data(), o_desc), descs.data(), m * sizeof(MatrixDesc));
    std::memcpy(At<void>(ctx.up.data(), o_jb), jb.data(), (m + 1) * sizeof(int32_t));
    // Pointers per sub-batch: the full-K parts of all its members, then the
    // last parts (a different k): two batched GEMMs per sub-batch.
    const void** aptrs = At<const void*>(ctx.up.data(), o_aptrs);
    void** cptrs = At<void*>(ctx.up.data(), o_cptrs);
    struct Call {
      size_t plan, first_ptr, count;
      int k;
      size_t b0, b1;  // members of the group
      size_t group;
    };
    std::vector<Call> calls;
    size_t slot = 0;
    for (size_t gi = 0; gi < groups.size(); ++gi) {
      const ShapeGroup& g = groups[gi];
      const Plan& p = plans[gi];
      const size_t es = DTypeSize(g.key.dtype);
      for (size_t b0 = 0; b0 < g.members.size(); b0 += p.fit) {
        const size_t b1 = std::min(g.members.size(), b0 + p.fit);
        for (int pass = 0; pass < 2; ++pass) {
          const size_t first = slot;
          for (size_t j = b0; j < b1; ++j) {
            const auto* base = static_cast<const unsigned char*>(views[g.members[j]].data);
            const int c_lo = pass == 0 ? 0 : p.chunks - 1;
            const int c_hi = pass == 0 ? p.chunks - 1 : p.chunks;
            for (int c = c_lo; c < c_hi; ++c) {
              // Part c: W columns (wide) or rows (tall) [c*kKChunk, +kc).
              const int64_t off = p.tall ? c * kKChunk * p.ld : c * kKChunk;
              aptrs[slot] = base + off * es;
              cptrs[slot] = gram + (int64_t((j - b0)) * p.chunks + c) * p.n * p.n;
              ++slot;
            }
          }
          if (slot > first) {
            calls.push_back(Call{gi, first, slot - first,
                                 pass == 0 ? static_cast<int>(kKChunk) : p.last_k,
                                 b0, b1, gi});
          }
        }
      }
    }
    RVD_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(w, ctx.up.data(), up_bytes,
                                             cudaMemcpyHostToDevice, ctx.stream));
    const auto* d_desc = At<MatrixDesc>(w, o_desc);
    double* d_g2 = At<double>(w, o_g2);
    for (size_t i = 0; i < m;) {
      size_t e = i;
      while (e < m && views[e].dtype == views[i].dtype) ++e;
      RVD_CUDA_RETURN_IF_ERROR(LaunchStats(views[i].dtype, d_desc + i,
                                           static_cast<int>(e - i),
                                           At<double>(w, o_tr) + i,
                                           At<float>(w, o_mx) + i, ctx.stream));
      i = e;
    }
    const float one = 1.0f, zero = 0.0f;
    for (size_t ci = 0; ci < calls.size(); ++ci) {
      if (Cancelled()) return CallCancelled();
      const Call& call = calls[ci];
      const Plan& p = plans[call.plan];
      const ShapeGroup& g = groups[call.group];
      const cudaDataType t = CudaType(g.key.dtype);
      const auto* d_a = At<const void*>(w, o_aptrs) + call.first_ptr;
      auto* d_c = At<void*>(w, o_cptrs) + call.first_ptr;
      // Column-major X = W^T (cols x rows, ld): wide G = X^T X, tall X X^T.
      RVD_CUDA_RETURN_IF_ERROR(cublasGemmBatchedEx(
          ctx.cublas, p.tall ? CUBLAS_OP_N : CUBLAS_OP_T,
          p.tall ? CUBLAS_OP_T : CUBLAS_OP_N, p.n, p.n, call.k, &one, d_a, t,
          p.ld, d_a, t, p.ld, &zero, d_c, CUDA_R_32F, p.n,
          static_cast<int>(call.count), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      // After the sub-batch's last GEMM, reduce its members (one launch
      // when they are consecutive in the batch).
      const bool last_of_batch = ci + 1 == calls.size() ||
                                 calls[ci + 1].b0 != call.b0 ||
                                 calls[ci + 1].group != call.group;
      if (!last_of_batch) continue;
      const int64_t nn = int64_t{p.n} * p.n;
      bool consecutive = true;
      for (size_t j = call.b0 + 1; j < call.b1; ++j) {
        consecutive &= g.members[j] == g.members[j - 1] + 1;
      }
      if (consecutive) {
        RVD_CUDA_RETURN_IF_ERROR(LaunchSumSquares(
            gram, p.chunks * nn, p.chunks, nn, static_cast<int>(call.b1 - call.b0),
            p.n, p.n, p.n, SumMode::kSymUpper, d_g2 + g.members[call.b0], ctx.stream));
      } else {
        for (size_t j = call.b0; j < call.b1; ++j) {
          RVD_CUDA_RETURN_IF_ERROR(LaunchSumSquares(
              gram + static_cast<int64_t>(j - call.b0) * p.chunks * nn, 0, p.chunks,
              nn, 1, p.n, p.n, p.n, SumMode::kSymUpper, d_g2 + g.members[j],
              ctx.stream));
        }
      }
    }
    RVD_CUDA_RETURN_IF_ERROR(LaunchFinalize(
        d_desc, At<int32_t>(w, o_jb), static_cast<int>(m), d_g2,
        At<double>(w, o_tr), At<float>(w, o_mx), At<double>(w, o_pr),
        At<int32_t>(w, o_st), ctx.stream));
    RVD_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(ctx.down.data(), At<unsigned char>(w, o_pr),
                                             ResultsBytes(m), cudaMemcpyDeviceToHost,
                                             ctx.stream));
    Serve("algebraic/cublas-gemm-batched-splitk", static_cast<int64_t>(m));
    return absl::OkStatus();
  }

 private:
  const VariantEnv env_;
};

}  // namespace

namespace variant_internal {
std::unique_ptr<Variant> NewAlgebraic(const VariantEnv& env) {
  return std::make_unique<AlgebraicVariant>(env);
}
}  // namespace variant_internal
}  // namespace rvd::cuda

// power_iter and sketch: the CPU engine's estimators on cuBLAS (not the fast
// path). The draws are the CPU engine's, from the seed alone, so matrices
// with the same Gram side share them.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/kernels.h"
#include "kernels/cuda/variant.h"
#include "kernels/estimator_math.h"
#include "kernels/estimator_rng.h"

namespace rvd::cuda {
namespace {

using variant_internal::ChunkTraces;
using variant_internal::PutHostResults;

// Row-major r x c <-> column-major r x c.
std::vector<float> RowToColMajor(const float* x, int64_t r, int64_t c) {
  std::vector<float> y(static_cast<size_t>(r * c));
  for (int64_t i = 0; i < r; ++i)
    for (int64_t j = 0; j < c; ++j) y[i + j * r] = x[i * c + j];
  return y;
}
std::vector<float> ColToRowMajor(const float* x, int64_t r, int64_t c) {
  std::vector<float> y(static_cast<size_t>(r * c));
  for (int64_t i = 0; i < r; ++i)
    for (int64_t j = 0; j < c; ++j) y[i * c + j] = x[i + j * r];
  return y;
}

class EstimatorVariant : public Variant {
 public:
  EstimatorVariant(const VariantSpec& spec, bool sketch) : spec_(spec), sketch_(sketch) {}

  // out (n x w, column-major) = G z for z (n x w, column-major), as two
  // SGEMMs on X = W^T (column-major cols x rows, f32 dense): wide
  // G z = X^T (X z), tall G z = X (X^T z). tmp holds len x w.
  absl::Status GramTimes(Context& ctx, const float* x, bool tall, int n,
                         int len, const float* z, int w, float* tmp,
                         float* out) {
    const float one = 1.0f, zero = 0.0f;
    if (!tall) {  // X is len x n (ld len)
      RVD_CUDA_RETURN_IF_ERROR(cublasSgemm(ctx.cublas, CUBLAS_OP_N, CUBLAS_OP_N,
                                           len, w, n, &one, x, len, z, n, &zero,
                                           tmp, len));
      RVD_CUDA_RETURN_IF_ERROR(cublasSgemm(ctx.cublas, CUBLAS_OP_T, CUBLAS_OP_N,
                                           n, w, len, &one, x, len, tmp, len,
                                           &zero, out, n));
    } else {  // X is n x len (ld n)
      RVD_CUDA_RETURN_IF_ERROR(cublasSgemm(ctx.cublas, CUBLAS_OP_T, CUBLAS_OP_N,
                                           len, w, n, &one, x, n, z, n, &zero,
                                           tmp, len));
      RVD_CUDA_RETURN_IF_ERROR(cublasSgemm(ctx.cublas, CUBLAS_OP_N, CUBLAS_OP_N,
                                           n, w, len, &one, x, n, tmp, len,
                                           &zero, out, n));
    }
    return absl::OkStatus();
  }

  // power_iter and sketch, one matrix after another on the stream
  // (estimators; not the fast path). The draws are the CPU engine's, from
  // the seed alone, so matrices with the same Gram side share them: they
  // are uploaded once per side. Each matrix's sum of squares goes to its own
  // slot, and g2 = offset + scale * sum once all slots are downloaded: one
  // wait per call (Hutch++ still waits per matrix for its host-side
  // Gram-Schmidt).
  struct EstimatorWork {
    float *x, *z, *tmp, *out;
    double* sums;
    int64_t drawn_for = -1;  // the Gram side whose draws z holds (-1: none)
  };
  absl::Status Enqueue(Context& ctx) override {
    const auto& views = ctx.pending.device_views;
    absl::Status s = ctx.Cublas();
    if (!s.ok()) return s;
    // Workspace (after the stats): f32 copy, probes/sketch, tmp, out, each
    // sized for the largest matrix, then one sum per matrix.
    const int64_t kp = spec_.probes, r = spec_.sketch_rank;
    const int64_t wdt = sketch_ ? r : kp;
    uint64_t x_bytes = 0, z_bytes = 0, tmp_bytes = 0, out_bytes = 0;
    for (const MatrixView& v : views) {
      const int64_t n = std::min(v.rows, v.cols), len = std::max(v.rows, v.cols);
      x_bytes = std::max<uint64_t>(x_bytes, uint64_t(v.rows) * v.cols * 4);
      z_bytes = std::max<uint64_t>(z_bytes, uint64_t(n) * wdt * 4);
      tmp_bytes = std::max<uint64_t>(tmp_bytes, uint64_t(len) * wdt * 4);
      out_bytes = std::max<uint64_t>(out_bytes, uint64_t(std::max(n, r)) * wdt * 4);
    }
    Layout l;
    const uint64_t o_x = l.Add(x_bytes), o_z = l.Add(z_bytes), o_tmp = l.Add(tmp_bytes),
                   o_out = l.Add(out_bytes), o_sums = l.Add(views.size() * sizeof(double));
    std::vector<double> trace;
    uint64_t extra = 0;
    s = ChunkTraces(ctx, l.size(), &trace, &extra);
    if (!s.ok()) return s;
    void* w = At<void>(ctx.work.data(), extra);
    EstimatorWork ew{At<float>(w, o_x), At<float>(w, o_z), At<float>(w, o_tmp),
                     At<float>(w, o_out), At<double>(w, o_sums)};
    std::vector<double> offset(views.size(), 0.0), scale(views.size(), 0.0);
    for (size_t i = 0; i < views.size(); ++i) {
      if (trace[i] == 0) continue;
      if (Cancelled()) return CallCancelled();
      const MatrixView& v = views[i];
      const bool tall = v.rows > v.cols;
      const int64_t n = std::min(v.rows, v.cols), len = std::max(v.rows, v.cols);
      RVD_CUDA_RETURN_IF_ERROR(LaunchToF32(v.dtype, MakeDesc(v), ew.x, ctx.stream));
      s = sketch_
              ? Sketch(ctx, tall, n, len, trace[i], &ew, i, &offset[i], &scale[i])
              : Hutch(ctx, tall, n, len, &ew, i, &offset[i], &scale[i]);
      if (!s.ok()) return s;
    }
    std::vector<double> sums(views.size());
    RVD_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(sums.data(), ew.sums, sums.size() * sizeof(double),
                                             cudaMemcpyDeviceToHost, ctx.stream));
    RVD_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(ctx.stream));
    std::vector<double> results(views.size(), 0.0);
    for (size_t i = 0; i < views.size(); ++i) {
      if (trace[i] == 0) continue;
      const double g2 = offset[i] + scale[i] * sums[i];
      if (!std::isfinite(g2)) return NonFiniteError(ctx.pending.first + i);
      results[i] = ClampedPR(trace[i], g2, std::min(views[i].rows, views[i].cols));
    }
    Serve(Path(), static_cast<int64_t>(views.size()));
    return PutHostResults(ctx, results);
  }

  absl::StatusOr<double> DeviceSum(Context& ctx, const float* a, int rows,
                                   int cols, SumMode mode, double* sum) {
    RVD_CUDA_RETURN_IF_ERROR(LaunchSumSquares(a, 0, 1, 0, 1, rows, cols, rows,
                                              mode, sum, ctx.stream));
    double h = 0;
    RVD_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(&h, sum, sizeof(double),
                                             cudaMemcpyDeviceToHost, ctx.stream));
    RVD_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(ctx.stream));
    return h;
  }

  absl::Status Upload(Context& ctx, float* dst, const std::vector<float>& src) {
    RVD_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src.data(),
                                             src.size() * sizeof(float),
                                             cudaMemcpyHostToDevice, ctx.stream));
    // src is pageable and lives on our stack frame: wait before returning.
    RVD_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(ctx.stream));
    return absl::OkStatus();
  }

  // Hutchinson (Hutch++ with spec_.hutch_plus_plus): matrix i's g2 is
  // *offset + *scale * (its sum slot), the slot filled on the stream.
  absl::Status Hutch(Context& ctx, bool tall, int64_t n, int64_t len, EstimatorWork* ew,
                     size_t i, double* offset, double* scale) {
    EstimatorRng rng(spec_.seed);
    const int64_t k = spec_.probes;
    const int64_t m = spec_.hutch_plus_plus && k >= 3 ? k / 3 : 0;
    const int64_t probes = k - 2 * m;
    const int ni = static_cast<int>(n), li = static_cast<int>(len);
    float* const x = ew->x;
    float* const z = ew->z;
    float* const tmp = ew->tmp;
    float* const out = ew->out;
    double* const sum = ew->sums + i;
    std::vector<float> q;  // Hutch++: the range of G Z1, row-major n x m
    if (m > 0) {  // its part of tr(G^2) exactly, a wait per matrix
      ew->drawn_for = -1;
      std::vector<float> z1(static_cast<size_t>(n * m));
      rng.Rademacher(z1.data(), n * m);
      absl::Status s = Upload(ctx, z, RowToColMajor(z1.data(), n, m));
      if (s.ok()) s = GramTimes(ctx, x, tall, ni, li, z, static_cast<int>(m), tmp, out);
      if (!s.ok()) return s;
      std::vector<float> gz(static_cast<size_t>(n * m));
      RVD_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(gz.data(), out, gz.size() * 4,
                                               cudaMemcpyDeviceToHost, ctx.stream));
      RVD_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(ctx.stream));
      q = ColToRowMajor(gz.data(), n, m);
      std::vector<double> work;
      Orthonormalize(q.data(), n, m, work);
      s = Upload(ctx, z, RowToColMajor(q.data(), n, m));
      if (s.ok()) s = GramTimes(ctx, x, tall, ni, li, z, static_cast<int>(m), tmp, out);
      if (!s.ok()) return s;
      absl::StatusOr<double> f = DeviceSum(ctx, out, ni, static_cast<int>(m), SumMode::kAll, sum);
      if (!f.ok()) return f.status();
      *offset = *f;
    }
    // The probes: Hutchinson's are the same for every matrix of this side
    // (uploaded once); Hutch++ deflates them per matrix.
    if (m > 0 || ew->drawn_for != n) {
      std::vector<float> z2(static_cast<size_t>(n * probes));
      rng.Rademacher(z2.data(), n * probes);
      if (m > 0) {  // z -= Q (Q^T z), in float64 on the host
        for (int64_t p = 0; p < probes; ++p) {
          for (int64_t c = 0; c < m; ++c) {
            double dot = 0;
            for (int64_t r = 0; r < n; ++r) dot += double(q[r * m + c]) * z2[r * probes + p];
            for (int64_t r = 0; r < n; ++r) {
              z2[r * probes + p] = static_cast<float>(z2[r * probes + p] - dot * q[r * m + c]);
            }
          }
        }
      }
      absl::Status s = Upload(ctx, z, RowToColMajor(z2.data(), n, probes));
      if (!s.ok()) return s;
      ew->drawn_for = m > 0 ? -1 : n;
    }
    absl::Status s = GramTimes(ctx, x, tall, ni, li, z, static_cast<int>(probes), tmp, out);
    if (!s.ok()) return s;
    RVD_CUDA_RETURN_IF_ERROR(LaunchSumSquares(out, 0, 1, 0, 1, ni, static_cast<int>(probes), ni,
                                              SumMode::kAll, sum, ctx.stream));
    *scale = 1.0 / static_cast<double>(probes);
    return absl::OkStatus();
  }

  // The Gaussian sketch: matrix i's g2 is *offset + *scale * (its sum
  // slot), as Hutch.
  absl::Status Sketch(Context& ctx, bool tall, int64_t n, int64_t len, double trace,
                      EstimatorWork* ew, size_t i, double* offset, double* scale) {
    const int64_t r = spec_.sketch_rank;
    // Omega, row-major r x n, is column-major n x r: O = Omega^T as is.
    if (ew->drawn_for != n) {  // the same draws for every matrix of this side
      EstimatorRng rng(spec_.seed);
      std::vector<float> omega(static_cast<size_t>(r * n));
      rng.Gaussian(omega.data(), r * n);
      absl::Status s = Upload(ctx, ew->z, omega);
      if (!s.ok()) return s;
      ew->drawn_for = n;
    }
    const float one = 1.0f, zero = 0.0f;
    const int ni = static_cast<int>(n), li = static_cast<int>(len), ri = static_cast<int>(r);
    float* const yt = ew->tmp;
    float* const mm = ew->out;
    // Yt (len x r) = X O (wide; X len x n) or X^T O (tall; X n x len).
    RVD_CUDA_RETURN_IF_ERROR(cublasSgemm(
        ctx.cublas, tall ? CUBLAS_OP_T : CUBLAS_OP_N, CUBLAS_OP_N, li, ri, ni,
        &one, ew->x, tall ? ni : li, ew->z, ni, &zero, yt, li));
    // M (r x r) = Yt^T Yt.
    RVD_CUDA_RETURN_IF_ERROR(cublasSgemm(ctx.cublas, CUBLAS_OP_T, CUBLAS_OP_N, ri,
                                         ri, li, &one, yt, li, yt, li, &zero, mm, ri));
    if (r == 1) {  // (m00^2 - trace^2) / 2
      *offset = -trace * trace / 2.0;
      *scale = 0.5;
      RVD_CUDA_RETURN_IF_ERROR(LaunchSumSquares(mm, 0, 1, 0, 1, 1, 1, 1, SumMode::kAll,
                                                ew->sums + i, ctx.stream));
      return absl::OkStatus();
    }
    // The mean of the squared off-diagonal entries (both triangles).
    *scale = 2.0 / static_cast<double>(r * (r - 1));
    RVD_CUDA_RETURN_IF_ERROR(LaunchSumSquares(mm, 0, 1, 0, 1, ri, ri, ri, SumMode::kStrictUpper,
                                              ew->sums + i, ctx.stream));
    return absl::OkStatus();
  }

 private:
  std::string Path() const {
    if (sketch_) return "sketch/cublas-gaussian";
    return spec_.hutch_plus_plus ? "power_iter/cublas-hutch++" : "power_iter/cublas-hutchinson";
  }

  const VariantSpec spec_;
  const bool sketch_;
};

}  // namespace

namespace variant_internal {
std::unique_ptr<Variant> NewEstimator(const VariantEnv&, const VariantSpec& spec, bool sketch) {
  return std::make_unique<EstimatorVariant>(spec, sketch);
}
}  // namespace variant_internal
}  // namespace rvd::cuda

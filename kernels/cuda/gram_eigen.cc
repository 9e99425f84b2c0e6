// CudaEngine::GramEigenvalues (engine.h, cuda_engine.h): the eigenvalues of
// the Gram of a matrix's smaller side, in float64 on the device.
//
// One context of the engine's pool (its stream, cuBLAS and cuSOLVER
// handles, and its buffers, charged to the engine's MemoryCap). The long
// side is taken a chunk at a time: a host matrix's chunk is copied into the
// context's input buffer, converted to float64 (gram_eigen.cu, which flags
// NaN/Inf), and cuBLAS dsyrk adds its Gram into the n x n float64 Gram
// (exact products of f32 values, float64 sums: what the CPU engine does).
// Then cuSOLVER dsyevd, eigenvalues only, ascending. Device memory: the
// Gram, dsyevd's workspace and one chunk (in float64, and for a host
// matrix in its dtype), the chunk sized so that it stays within the
// context's budget beside the Gram. A Gram that does not fit the cap, even
// after the idle contexts gave their buffers back, is RESOURCE_EXHAUSTED.
// The cancellation flag is looked at before each chunk.
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cusolverDn.h>

#include <algorithm>
#include <cstdint>
#include <limits>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "kernels/call_contract.h"
#include "kernels/cuda/byte_layout.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_engine.h"
#include "kernels/cuda/device_context.h"
#include "kernels/cuda/gram_eigen.h"
#include "kernels/gram_eigen.h"

namespace rvd::cuda {
namespace {

// The counted path of every matrix served here (Stats().served).
constexpr char kGramEigenPath[] = "gram_eigen/cublas-dsyrk-cusolver-dsyevd";

// Long-side elements per chunk: within `budget` bytes for the chunk's
// float64 copy and its raw bytes (host matrices), at least one, at most len.
int64_t ChunkLength(int64_t n, int64_t len, uint64_t budget, size_t esize) {
  const uint64_t per = static_cast<uint64_t>(n) * (sizeof(double) + esize);
  return std::clamp<int64_t>(static_cast<int64_t>(budget / per), 1, len);
}

}  // namespace

absl::Status CudaEngine::GramEigenvalues(const MatrixView& m, absl::Span<double> out,
                                         const CallOptions& call) {
  return GramEigenvaluesOn(m, /*device_memory=*/false, nullptr, out, call);
}

absl::Status CudaEngine::GramEigenvaluesOn(const MatrixView& m, bool device_memory, void* ready,
                                           absl::Span<double> out, const CallOptions& call) {
  if (absl::Status s = CheckGramEigenvaluesCall(m, out); !s.ok()) return s;
  if (const cuda_internal::DeviceErrorSnapshot e = cuda_internal::DeviceErrors(); e.lost) {
    return absl::UnavailableError(
        absl::StrCat("the CUDA device is lost (", e.lost_reason, "); restart rvd"));
  }
  if (CancelRequested(call)) return CallCancelled();
  RVD_CUDA_RETURN_IF_ERROR(cudaSetDevice(options_.device));
  const bool wide = m.rows <= m.cols;
  const int64_t n = wide ? m.rows : m.cols, len = wide ? m.cols : m.rows;
  const size_t es = DTypeSize(m.dtype);
  const uint64_t gram_bytes = static_cast<uint64_t>(n) * n * sizeof(double);
  const uint64_t budget = Budget();
  const int64_t kc =
      ChunkLength(n, len, budget > gram_bytes ? budget - gram_bytes : 0, device_memory ? 0 : es);

  Context* ctx = Acquire(true);
  auto release = absl::MakeCleanup([&] { DrainAndRelease(ctx); });
  if (absl::Status s = ctx->Cublas(); !s.ok()) return s;
  if (absl::Status s = ctx->Cusolver(); !s.ok()) return s;
  cudaStream_t stream = ctx->stream;

  // work: the Gram, the eigenvalues, two ints (NaN/Inf flag, dsyevd's
  // info), the chunk in float64, then dsyevd's workspace.
  Layout l;
  const uint64_t o_g = l.Add(gram_bytes);
  const uint64_t o_w = l.Add(static_cast<uint64_t>(n) * sizeof(double));
  const uint64_t o_flags = l.Add(2 * sizeof(int));
  const uint64_t o_x = l.Add(static_cast<uint64_t>(n) * kc * sizeof(double));
  const uint64_t o_ws = l.size();
  // Over the cap, the idle contexts' buffers are given back once and the
  // reservation tried again (as the PR path does).
  bool trimmed = false;
  const auto reserve = [&](DeviceBuffer& buffer, uint64_t bytes) {
    absl::Status s = buffer.Reserve(*cap_, bytes, stream);
    if (s.code() == absl::StatusCode::kResourceExhausted && !trimmed) {
      trimmed = true;
      if (TrimIdleContexts()) s = buffer.Reserve(*cap_, bytes, stream);
    }
    return s;
  };
  if (absl::Status s = reserve(ctx->work, o_ws); !s.ok()) return s;
  int lwork = 0;
  RVD_CUDA_RETURN_IF_ERROR(cusolverDnDsyevd_bufferSize(
      ctx->cusolver, CUSOLVER_EIG_MODE_NOVECTOR, CUBLAS_FILL_MODE_LOWER, static_cast<int>(n),
      At<double>(ctx->work.data(), o_g), static_cast<int>(n), At<double>(ctx->work.data(), o_w),
      &lwork));
  if (absl::Status s =
          reserve(ctx->work, o_ws + static_cast<uint64_t>(std::max(lwork, 1)) * sizeof(double));
      !s.ok()) {
    return s;
  }
  void* const w = ctx->work.data();
  double* const gram = At<double>(w, o_g);
  double* const eig = At<double>(w, o_w);
  int* const flags = At<int>(w, o_flags);
  double* const x = At<double>(w, o_x);
  if (!device_memory) {
    if (absl::Status s = reserve(ctx->input, static_cast<uint64_t>(n) * kc * es); !s.ok()) {
      return s;
    }
  }
  RVD_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(flags, 0, 2 * sizeof(int), stream));
  if (device_memory && ready != nullptr) {
    RVD_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream, static_cast<cudaEvent_t>(ready), 0));
  }

  // Chunk [c0, c1) of the long side: a row-major block of v, wide n x kc
  // (columns c0..), tall kc x n (rows c0..). Its dense float64 copy x is,
  // column-major, kc x n = A with A^T A its Gram (wide), or n x kc = A with
  // A A^T its Gram (tall).
  const double one = 1.0;
  for (int64_t c0 = 0; c0 < len; c0 += kc) {
    if (CancelRequested(call)) return CallCancelled();
    const int64_t c1 = std::min(len, c0 + kc), k = c1 - c0;
    const int64_t br = wide ? n : k, bc = wide ? k : n;
    const auto* src = static_cast<const unsigned char*>(m.data) +
                      (wide ? c0 : c0 * m.ld) * static_cast<int64_t>(es);
    const void* block = src;
    int64_t ld = m.ld;
    if (!device_memory) {
      RVD_CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(ctx->input.data(), bc * es, src, m.ld * es,
                                                 bc * es, br, cudaMemcpyHostToDevice, stream));
      block = ctx->input.data();
      ld = bc;
    }
    RVD_CUDA_RETURN_IF_ERROR(LaunchBlockToF64(m.dtype, block, ld, br, bc, x, flags, stream));
    const double beta = c0 == 0 ? 0.0 : 1.0;
    RVD_CUDA_RETURN_IF_ERROR(cublasDsyrk(ctx->cublas, CUBLAS_FILL_MODE_LOWER,
                                         wide ? CUBLAS_OP_T : CUBLAS_OP_N, static_cast<int>(n),
                                         static_cast<int>(k), &one, x,
                                         static_cast<int>(wide ? k : n), &beta, gram,
                                         static_cast<int>(n)));
  }
  // NaN/Inf is refused before the eigensolver sees it.
  int host_flags[2] = {0, 0};
  RVD_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(host_flags, flags, sizeof(int), cudaMemcpyDeviceToHost, stream));
  RVD_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  if (host_flags[0] != 0) return NonFiniteError(0);
  if (CancelRequested(call)) return CallCancelled();
  RVD_CUDA_RETURN_IF_ERROR(cusolverDnDsyevd(
      ctx->cusolver, CUSOLVER_EIG_MODE_NOVECTOR, CUBLAS_FILL_MODE_LOWER, static_cast<int>(n),
      gram, static_cast<int>(n), eig, At<double>(w, o_ws), std::max(lwork, 1), flags + 1));
  RVD_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(out.data(), eig, static_cast<size_t>(n) * sizeof(double),
                                           cudaMemcpyDeviceToHost, stream));
  RVD_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(host_flags + 1, flags + 1, sizeof(int), cudaMemcpyDeviceToHost, stream));
  RVD_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  if (host_flags[1] != 0) {
    std::fill(out.begin(), out.end(), std::numeric_limits<double>::quiet_NaN());
    return absl::InternalError(absl::StrCat("cusolver dsyevd info ", host_flags[1]));
  }
  counters_->Served({{kGramEigenPath, 1}});
  return absl::OkStatus();
}

}  // namespace rvd::cuda

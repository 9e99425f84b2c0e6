// The CUDA engine (cuda_engine.h).
//
// Variants, in the llm.c order (each names what differs):
//   fused      (exact, default) our kernels: one pass over W, Gram tiles of
//              the upper triangle on tensor cores (3xTF32 for f32, native
//              bf16/f16), ||W||_F^2 and ||G||_F^2 reduced in float64 per job,
//              then per matrix in job order; G never stored. Wide W (rows <=
//              cols) takes v2 (fused_v2_kernel.cuh: mma.sync + ldmatrix, 2
//              blocks per SM), tall W v1 (fused_kernel.cuh: WMMA); the served
//              counts name the policy per matrix.
//   algebraic  (exact) the vendor baseline: cuBLAS batched Gram (compute
//              32F, no TF32) into a workspace, then our float64 reductions
//              of G (upper triangle weighted) and of W.
//   naive      (exact) cuSOLVER dgesvd on a float64 copy, singular values
//              only; PR from them in float64: the validation baseline.
//   power_iter (estimate) Hutchinson / Hutch++ for tr(G^2) with the CPU
//              engine's probes (same SplitMix64 draws for the same seed), G z
//              as two cuBLAS SGEMMs; Hutch++'s small Gram-Schmidt on the host.
//   sketch     (estimate) the CPU engine's Gaussian sketch: Y = Omega W on
//              cuBLAS, the mean of the squared off-diagonal entries of Y Y^T.
//
// A host batch whose views share bytes (a layer's V and the row blocks of its
// heads, as the daemon sends them) is uploaded once per distinct byte range,
// straight from the caller's memory, and computed on device views.
// Other host batches are packed into pinned staging (rows padded to 16 bytes),
// copied in chunks on low-priority streams, two contexts ping-ponging so that
// chunk i+1 is packed and copied while chunk i computes. Matrices whose f32
// Gram could over- or underflow (|w| beyond ~1e15 or below ~1e-15), flagged
// by the finalize kernel, are recomputed with the float64 SVD oracle.
#include "kernels/cuda/cuda_engine.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cusolverDn.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <numeric>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/kernels.h"
#include "kernels/cuda/launch_policy.h"
#include "kernels/engine.h"
#include "kernels/estimator_math.h"
#include "kernels/estimator_rng.h"

namespace rvd::cuda {

// ---------------------------------------------------------------------------
// Buffers and contexts.

// Device memory owned by a context, charged to the engine's cap.
struct DeviceBuffer {
  void* ptr = nullptr;
  uint64_t size = 0;
};

// Pinned host memory (not charged: the cap is on device memory).
struct PinnedBuffer {
  void* ptr = nullptr;
  uint64_t size = 0;
};

// A fused call as planned on the host: the order of its results, its
// launches, and where its descriptors (Context::descriptors) and outputs
// (Context::work) lie. Kept per context, keyed by the call's views, so that
// a repeated call launches it again (Runner::EnqueueFused).
struct FusedCall {
  std::vector<MatrixView> views;  // the key; empty: nothing to reuse
  std::vector<size_t> order;      // result slot s holds matrix order[s]
  struct Launch {
    DType dtype = DType::kF32;
    FusedKernel kernel = FusedKernel::kV3;
    int64_t matrices = 0;
    int j0 = 0, jobs = 0;  // the launch's first job (g2, trace, maxabs) and count
    int list0 = 0;         // its first job in the v1 or v2 job list
    bool offdiag = false;
    FusedV4Plan plan;
  };
  std::vector<Launch> launches;
  bool finished = true;  // fused v4 writes every PR: no finalize
  uint64_t o_desc = 0, o_jobs = 0, o_jobs2 = 0, o_jb = 0, o_maps = 0;  // descriptors
  uint64_t o_g2 = 0, o_tr = 0, o_mx = 0, o_pr = 0, o_st = 0, o_part = 0;  // work
};

struct Context {
  CudaEngine* engine = nullptr;
  cudaStream_t stream = nullptr;
  cublasHandle_t cublas = nullptr;      // created on first use
  cusolverDnHandle_t cusolver = nullptr;  // created on first use
  DeviceBuffer input;   // packed host inputs
  DeviceBuffer shared;  // host ranges that several views share, uploaded once
  DeviceBuffer descriptors;  // the fused call's descriptors, jobs and tensor maps
  DeviceBuffer work;    // partial sums, results, workspaces
  DeviceBuffer tickets;  // fused v4's cut-job tickets: zeroed once, left zero by the kernel
  PinnedBuffer staging;  // host inputs, packed
  PinnedBuffer up;       // descriptors on their way to the device
  PinnedBuffer down;     // results on their way back
  // Events around this context's latest host-to-device copies (created on
  // first use); copy_recorded until their time is taken.
  cudaEvent_t copy_begin = nullptr, copy_end = nullptr;
  bool copy_recorded = false;
  // A caller's stream's work so far, which this context's work waits for
  // (ComputePRDevice; created on first use).
  cudaEvent_t caller_ready = nullptr;
  // What the last enqueued chunk left in `down`, for Collect.
  size_t pending = 0;    // matrices; 0 when nothing is pending
  size_t first = 0;      // batch index of the chunk's first matrix
  std::vector<size_t> order;  // down's slot s holds chunk matrix order[s]
  std::vector<MatrixView> device_views;  // the chunk's device views
  FusedCall fused;  // the last fused call, on `descriptors`

  absl::Status EnsureDevice(DeviceBuffer& b, uint64_t bytes) {
    if (b.size >= bytes) return absl::OkStatus();
    const uint64_t want = (bytes + (1u << 16) - 1) / (1u << 16) * (1u << 16);
    RVD_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
    if (b.ptr != nullptr) {
      RVD_CUDA_RETURN_IF_ERROR(cudaFree(b.ptr));
      engine->Uncharge(b.size);
      b = DeviceBuffer{};
    }
    absl::Status s = engine->Charge(want);
    if (!s.ok()) return s;
    cudaError_t e = cudaMalloc(&b.ptr, want);
    if (e != cudaSuccess) {
      engine->Uncharge(want);
      b = DeviceBuffer{};
      RVD_CUDA_RETURN_IF_ERROR(e);
    }
    b.size = want;
    return absl::OkStatus();
  }

  absl::Status EnsureTickets() {
    if (tickets.ptr != nullptr) return absl::OkStatus();
    absl::Status s = EnsureDevice(tickets, kFusedV4TicketInts * sizeof(int32_t));
    if (!s.ok()) return s;
    RVD_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(tickets.ptr, 0, tickets.size, stream));
    return absl::OkStatus();
  }

  absl::Status EnsurePinned(PinnedBuffer& b, uint64_t bytes) {
    if (b.size >= bytes) return absl::OkStatus();
    const uint64_t want = (bytes + (1u << 20) - 1) / (1u << 20) * (1u << 20);
    RVD_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
    if (b.ptr != nullptr) RVD_CUDA_RETURN_IF_ERROR(cudaFreeHost(b.ptr));
    b = PinnedBuffer{};
    RVD_CUDA_RETURN_IF_ERROR(cudaHostAlloc(&b.ptr, want, cudaHostAllocDefault));
    b.size = want;
    return absl::OkStatus();
  }

  absl::Status RecordCopy(bool begin) {
    if (copy_begin == nullptr) {
      RVD_CUDA_RETURN_IF_ERROR(cudaEventCreate(&copy_begin));
      RVD_CUDA_RETURN_IF_ERROR(cudaEventCreate(&copy_end));
    }
    RVD_CUDA_RETURN_IF_ERROR(cudaEventRecord(begin ? copy_begin : copy_end, stream));
    copy_recorded = !begin;
    return absl::OkStatus();
  }

  // After the stream is synchronized: adds the recorded copies' time.
  void TakeCopyTime() {
    if (!copy_recorded) return;
    copy_recorded = false;
    float ms = 0.0f;
    if (cudaEventElapsedTime(&ms, copy_begin, copy_end) == cudaSuccess) {
      engine->AddCopyTime(ms);
    }
  }

  absl::Status Cublas() {
    if (cublas != nullptr) return absl::OkStatus();
    RVD_CUDA_RETURN_IF_ERROR(cublasCreate(&cublas));
    RVD_CUDA_RETURN_IF_ERROR(cublasSetStream(cublas, stream));
    // Pedantic-free default math: f32 GEMMs stay IEEE (no TF32).
    RVD_CUDA_RETURN_IF_ERROR(cublasSetMathMode(cublas, CUBLAS_DEFAULT_MATH));
    return absl::OkStatus();
  }

  absl::Status Cusolver() {
    if (cusolver != nullptr) return absl::OkStatus();
    RVD_CUDA_RETURN_IF_ERROR(cusolverDnCreate(&cusolver));
    RVD_CUDA_RETURN_IF_ERROR(cusolverDnSetStream(cusolver, stream));
    return absl::OkStatus();
  }

  void Destroy() {
    if (stream != nullptr) cudaStreamSynchronize(stream);
    if (cublas != nullptr) cublasDestroy(cublas);
    if (cusolver != nullptr) cusolverDnDestroy(cusolver);
    for (DeviceBuffer* b : {&input, &shared, &descriptors, &work, &tickets}) {
      if (b->ptr != nullptr) {
        cudaFree(b->ptr);
        engine->Uncharge(b->size);
      }
      *b = DeviceBuffer{};
    }
    for (PinnedBuffer* b : {&staging, &up, &down}) {
      if (b->ptr != nullptr) cudaFreeHost(b->ptr);
      *b = PinnedBuffer{};
    }
    for (cudaEvent_t* e : {&copy_begin, &copy_end, &caller_ready}) {
      if (*e != nullptr) cudaEventDestroy(*e);
      *e = nullptr;
    }
    if (stream != nullptr) cudaStreamDestroy(stream);
    stream = nullptr;
  }
};

namespace {

// Offsets of the pieces of one buffer, each 256-byte aligned.
class Layout {
 public:
  uint64_t Add(uint64_t bytes) {
    const uint64_t at = size_;
    size_ += (bytes + 255) / 256 * 256;
    return at;
  }
  uint64_t size() const { return size_; }

 private:
  uint64_t size_ = 0;
};

// A call's results as the device writes them and ctx.down receives them:
// m PRs (double), then m statuses (int32).
uint64_t ResultsBytes(size_t m) { return m * (sizeof(double) + sizeof(int32_t)); }

template <typename T>
T* At(void* base, uint64_t offset) {
  return reinterpret_cast<T*>(static_cast<unsigned char*>(base) + offset);
}

absl::Status NonFiniteError(size_t index) {
  return absl::InvalidArgumentError(
      absl::StrCat("batch[", index, "]: matrix contains NaN or Inf"));
}

absl::Status ValidateView(const MatrixView& v, size_t index) {
  if (v.data == nullptr || v.rows <= 0 || v.cols <= 0 || v.ld < v.cols) {
    return absl::InvalidArgumentError(absl::StrCat(
        "batch[", index, "]: bad matrix view (data ",
        v.data == nullptr ? "null" : "set", ", rows ", v.rows, ", cols ",
        v.cols, ", ld ", v.ld, ")"));
  }
  if (v.rows > INT32_MAX || v.cols > INT32_MAX || v.ld > INT32_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch[", index, "]: dimensions exceed 2^31"));
  }
  if (reinterpret_cast<uintptr_t>(v.data) % DTypeSize(v.dtype) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "batch[", index, "]: data not aligned to its element size"));
  }
  return absl::OkStatus();
}

enum class Kind { kFused, kAlgebraic, kNaive, kPowerIter, kSketch };


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

cudaDataType CudaType(DType d) {
  switch (d) {
    case DType::kF32: return CUDA_R_32F;
    case DType::kF16: return CUDA_R_16F;
    case DType::kBF16: return CUDA_R_16BF;
  }
  return CUDA_R_32F;
}

}  // namespace

// ---------------------------------------------------------------------------
// One call's work on one context: enqueue a chunk, collect its results.
class Runner {
 public:
  Runner(CudaEngine* engine, const VariantSpec& spec, Kind kind,
         bool use_mutant)
      : engine_(engine), spec_(spec), kind_(kind), use_mutant_(use_mutant) {}

  // Budget of device bytes for one context's work buffer or input chunk.
  uint64_t Budget() const {
    const uint64_t per = engine_->options_.max_device_bytes /
                         std::max(1, engine_->options_.streams);
    return std::max<uint64_t>(per / 2, 1u << 16);
  }

  // Queues (or, for the estimators and naive, runs) the variant on `views`
  // (device pointers), chunk matrices [first, first + views.size()) of the
  // batch. Fused and algebraic results land in ctx.down; others in results_.
  absl::Status Enqueue(Context& ctx, absl::Span<const MatrixView> views,
                       size_t first) {
    ctx.first = first;
    ctx.device_views.assign(views.begin(), views.end());
    ctx.pending = views.size();
    switch (kind_) {
      case Kind::kFused: return EnqueueFused(ctx);
      case Kind::kAlgebraic: return EnqueueAlgebraic(ctx);
      case Kind::kNaive: return RunNaive(ctx);
      case Kind::kPowerIter:
      case Kind::kSketch: return RunEstimator(ctx);
    }
    return absl::InternalError("unknown kind");
  }

  // Waits for ctx's pending chunk and writes its PRs to out[first + i].
  // `host_batch` (may be empty) is the caller's host views, for fallbacks.
  absl::Status Collect(Context& ctx, absl::Span<const MatrixView> host_batch,
                       absl::Span<double> out) {
    if (ctx.pending == 0) return absl::OkStatus();
    const size_t count = ctx.pending;
    ctx.pending = 0;
    RVD_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(ctx.stream));
    if (kind_ != Kind::kFused && kind_ != Kind::kAlgebraic) {
      for (size_t i = 0; i < count; ++i) out[ctx.first + i] = results_[i];
      return absl::OkStatus();
    }
    const double* pr = At<double>(ctx.down.ptr, 0);
    const int32_t* status = At<int32_t>(ctx.down.ptr, count * sizeof(double));
    int64_t fallbacks = 0;
    for (size_t s = 0; s < count; ++s) {
      const size_t i = ctx.order[s];
      const size_t global = ctx.first + i;
      if (status[s] == kStatusNonFinite) return NonFiniteError(global);
      if (status[s] == kStatusOk) {
        out[global] = pr[s];
        continue;
      }
      // Untrusted f32 range: the float64 oracle on the host.
      absl::StatusOr<double> exact =
          host_batch.empty() ? OracleFromDevice(ctx, ctx.device_views[i])
                             : OraclePR(host_batch[global]);
      if (!exact.ok()) {  // e.g. Inf, which f32 Gram entries cannot tell from overflow
        return absl::Status(exact.status().code(),
                            absl::StrCat("batch[", global, "]: ", exact.status().message()));
      }
      out[global] = *exact;
      ++fallbacks;
    }
    if (fallbacks > 0) engine_->Count("oracle_fallback", fallbacks);
    return absl::OkStatus();
  }

  // The served-count key of a fused policy, e.g. "fused/fused-v3-...".
  std::string FusedCountKey(const LaunchPolicy& p) const {
    return absl::StrCat("fused/", use_mutant_ ? "MUTANT-" : "", p.name);
  }

  // Matrices served per key by this call (`n` in all): fused counts per
  // policy that served them; the other variants one key.
  std::map<std::string, int64_t> Served(int64_t n) const {
    if (kind_ == Kind::kFused) return fused_served_;
    return {{CountKey(), n}};
  }

  std::string CountKey() const {
    switch (kind_) {
      case Kind::kFused:
        return FusedCountKey(kFusedPolicyV3Sm90);
      case Kind::kAlgebraic: return "algebraic/cublas-gemm-batched-32f-splitk128";
      case Kind::kNaive: return "naive/cusolver-dgesvd";
      case Kind::kPowerIter:
        return spec_.hutch_plus_plus ? "power_iter/cublas-hutch++"
                                     : "power_iter/cublas-hutchinson";
      case Kind::kSketch: return "sketch/cublas-gaussian";
    }
    return "?";
  }

 private:
  absl::StatusOr<double> OracleFromDevice(Context& ctx, const MatrixView& v) {
    const size_t es = DTypeSize(v.dtype);
    std::vector<unsigned char> host(static_cast<size_t>(v.rows * v.cols) * es);
    RVD_CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(
        host.data(), v.cols * es, v.data, v.ld * es, v.cols * es, v.rows,
        cudaMemcpyDeviceToHost, ctx.stream));
    RVD_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(ctx.stream));
    MatrixView h = v;
    h.data = host.data();
    h.ld = v.cols;
    return OraclePR(h);
  }

  // Fused: descriptors (and v4's tensor maps) and jobs up, one launch per
  // (dtype, kernel), finalize, results down. Matrices are ordered by dtype,
  // then kernel (v4, v3 wide, v1 tall), stably, so that each launch's jobs
  // are contiguous; ctx.order maps result slots back. Job indices (g2,
  // trace, maxabs) run over all kinds of job in matrix order, so the
  // finalize sums each matrix's jobs in order. Which kernel serves a matrix
  // depends only on the matrix and the device, and a launch's schedule
  // (FusedV4Plan) only on its job count: the same call gives the same bits.
  // (A matrix whose job an f32 launch cut into pieces gets other bits than
  // alone, within the same error.)
  //
  // A call whose views are the context's previous fused call's (a model's
  // live weights, or the context's own input buffer, measured again)
  // launches that call's plan again: its descriptors are still on the
  // device, so no planning, no tensor-map encoding and no upload.
  absl::Status EnqueueFused(Context& ctx) {
    FusedCall& call = ctx.fused;
    if (call.views != ctx.device_views) {
      const auto start = std::chrono::steady_clock::now();
      call = FusedCall{};
      absl::Status s = PlanFused(ctx, call);
      if (!s.ok()) return s;  // call.views stays empty: no reuse
      call.views = ctx.device_views;
      engine_->AddPlanTime(
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
              .count());
    } else {
      engine_->Count("fused_plan_reused", static_cast<int64_t>(call.views.size()));
    }
    ctx.order = call.order;
    return LaunchFusedCall(ctx, call);
  }

  // The host half of a fused call: jobs, schedules and descriptors into
  // `call`, uploaded to ctx.descriptors.
  absl::Status PlanFused(Context& ctx, FusedCall& call) {
    const auto& views = ctx.device_views;
    const size_t m = views.size();
    std::vector<MatrixDesc> by_index(m);
    std::vector<FusedKernel> kernel(m);
    for (size_t i = 0; i < m; ++i) {
      by_index[i] = MakeDesc(views[i]);
      kernel[i] = ChooseFusedKernel(engine_->sm_major_, engine_->sm_minor_, views[i].dtype,
                                    views[i].rows, views[i].cols, by_index[i].aligned != 0);
    }
    auto key = [&](size_t i) {  // (dtype, kernel)
      return 256 * static_cast<int>(views[i].dtype) + static_cast<int>(kernel[i]);
    };
    std::vector<size_t>& order = call.order;
    order.resize(m);
    std::iota(order.begin(), order.end(), size_t{0});
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return key(a) < key(b); });
    std::vector<MatrixDesc> descs(m);
    std::vector<FusedJob> jobs;       // v1 (tall matrices)
    std::vector<FusedJobV2> jobs2;    // v3 and v4 (wide matrices)
    std::vector<int32_t> job_begin(1, 0);
    std::vector<int32_t> list_begin(m + 1, 0);  // offset in jobs or jobs2
    bool any_v4 = false;
    for (size_t s = 0; s < m; ++s) {
      descs[s] = by_index[order[s]];
      const FusedKernel k = kernel[order[s]];
      const int64_t side[1] = {descs[s].n};
      if (k == FusedKernel::kV1Tall) {
        list_begin[s] = static_cast<int32_t>(jobs.size());
        std::vector<FusedJob> one;
        std::vector<int32_t> jb;
        EnumerateFusedJobs(side, kFusedPolicySm90.block_tile, &one, &jb);
        for (FusedJob j : one) {
          j.matrix = static_cast<int32_t>(s);
          jobs.push_back(j);
        }
        job_begin.push_back(job_begin.back() + static_cast<int32_t>(one.size()));
      } else {
        any_v4 |= IsFusedV4(k);
        list_begin[s] = static_cast<int32_t>(jobs2.size());
        AppendFusedJobsV2(static_cast<int32_t>(s), side[0], FusedPolicyOf(k), &jobs2);
        job_begin.push_back(static_cast<int32_t>(jobs.size() + jobs2.size()));
      }
    }
    // One launch per run of matrices with the same (dtype, kernel); v4's
    // with its schedule, whose partial Grams (a cut plan's) share one region
    // of the work buffer: the launches run in stream order.
    int64_t partial_bytes = 0;
    for (size_t s0 = 0; s0 < m;) {
      FusedCall::Launch l;
      l.kernel = kernel[order[s0]];
      l.dtype = views[order[s0]].dtype;
      size_t s1 = s0;
      int min_slices = std::numeric_limits<int>::max();
      for (; s1 < m && key(order[s1]) == key(order[s0]); ++s1) {
        min_slices = std::min(min_slices, FusedV4Slices(descs[s1].cols));
      }
      l.matrices = static_cast<int64_t>(s1 - s0);
      l.j0 = job_begin[s0];
      l.jobs = job_begin[s1] - l.j0;
      l.list0 = list_begin[s0];
      for (int j = 0; j < l.jobs; ++j) {
        l.offdiag |= !(l.kernel == FusedKernel::kV1Tall ? jobs[l.list0 + j].diagonal
                                                         : jobs2[l.list0 + j].diagonal);
      }
      if (IsFusedV4(l.kernel)) {
        l.plan = PlanFusedV4(l.jobs, engine_->sms_, min_slices,
                             FusedV4TailPieces(l.kernel, l.dtype));
        partial_bytes = std::max(partial_bytes, FusedV4PartialBytes(l.plan));
      }
      call.launches.push_back(l);
      s0 = s1;
    }
    // A call whose matrices fused v4 finishes in the kernel needs no
    // finalize.
    for (size_t s = 0; s < m; ++s) {
      call.finished &= FusedV4FinishesMatrix(kernel[order[s]], descs[s].n);
    }
    const size_t nj = jobs.size() + jobs2.size();
    Layout up;
    call.o_desc = up.Add(m * sizeof(MatrixDesc));
    call.o_jobs = up.Add(jobs.size() * sizeof(FusedJob));
    call.o_jobs2 = up.Add(jobs2.size() * sizeof(FusedJobV2));
    call.o_jb = up.Add((m + 1) * sizeof(int32_t));
    call.o_maps = up.Add(any_v4 ? m * kTensorMapBytes : 0);  // 256-aligned
    Layout work;
    call.o_g2 = work.Add(nj * sizeof(double));
    call.o_tr = work.Add(nj * sizeof(double));
    call.o_mx = work.Add(nj * sizeof(float));
    call.o_pr = work.Add(ResultsBytes(m));
    call.o_st = call.o_pr + m * sizeof(double);
    call.o_part = work.Add(partial_bytes);
    absl::Status s = ctx.EnsurePinned(ctx.up, up.size());
    if (s.ok()) s = ctx.EnsurePinned(ctx.down, ResultsBytes(m));
    if (s.ok()) s = ctx.EnsureDevice(ctx.descriptors, up.size());
    if (s.ok()) s = ctx.EnsureDevice(ctx.work, work.size());
    if (s.ok() && partial_bytes > 0) s = ctx.EnsureTickets();
    if (!s.ok()) return s;
    std::memcpy(At<void>(ctx.up.ptr, call.o_desc), descs.data(), m * sizeof(MatrixDesc));
    if (!jobs.empty()) {
      std::memcpy(At<void>(ctx.up.ptr, call.o_jobs), jobs.data(), jobs.size() * sizeof(FusedJob));
    }
    if (!jobs2.empty()) {
      std::memcpy(At<void>(ctx.up.ptr, call.o_jobs2), jobs2.data(),
                  jobs2.size() * sizeof(FusedJobV2));
    }
    std::memcpy(At<void>(ctx.up.ptr, call.o_jb), job_begin.data(), (m + 1) * sizeof(int32_t));
    for (size_t i = 0; any_v4 && i < m; ++i) {
      if (!IsFusedV4(kernel[order[i]])) continue;
      RVD_CUDA_RETURN_IF_ERROR(EncodeFusedV4Map(
          views[order[i]].dtype, descs[i],
          At<unsigned char>(ctx.up.ptr, call.o_maps) + i * kTensorMapBytes));
    }
    RVD_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(ctx.descriptors.ptr, ctx.up.ptr, up.size(),
                                             cudaMemcpyHostToDevice, ctx.stream));
    return absl::OkStatus();
  }

  // The device half: `call`'s launches on its descriptors, the finalize,
  // results down.
  absl::Status LaunchFusedCall(Context& ctx, const FusedCall& call) {
    void* const d = ctx.descriptors.ptr;
    void* const w = ctx.work.ptr;
    const auto* d_desc = At<MatrixDesc>(d, call.o_desc);
    const auto* d_jobs = At<FusedJob>(d, call.o_jobs);
    const auto* d_jobs2 = At<FusedJobV2>(d, call.o_jobs2);
    const void* d_maps = At<void>(d, call.o_maps);
    FusedLauncher launch = &LaunchFused;
    FusedV2Launcher launch2 = &LaunchFusedV2;
    FusedV4Launcher launch4 = &LaunchFusedV4;
    if (use_mutant_) {
      if (g_fused_mutant_launcher == nullptr || g_fused_v2_mutant_launcher == nullptr ||
          g_fused_v4_mutant_launcher == nullptr) {
        return absl::FailedPreconditionError("no mutant kernel linked");
      }
      launch = g_fused_mutant_launcher;
      launch2 = g_fused_v2_mutant_launcher;
      launch4 = g_fused_v4_mutant_launcher;
    }
    for (const FusedCall::Launch& l : call.launches) {
      double* g2 = At<double>(w, call.o_g2) + l.j0;
      double* tr = At<double>(w, call.o_tr) + l.j0;
      float* mx = At<float>(w, call.o_mx) + l.j0;
      switch (l.kernel) {
        case FusedKernel::kV1Tall:
          RVD_CUDA_RETURN_IF_ERROR(launch(l.dtype, d_desc, d_jobs + l.list0, l.jobs, l.offdiag,
                                          g2, tr, mx, ctx.stream));
          break;
        case FusedKernel::kV3:
          RVD_CUDA_RETURN_IF_ERROR(launch2(l.dtype, d_desc, d_jobs2 + l.list0, l.jobs,
                                           l.offdiag, g2, tr, mx, ctx.stream));
          break;
        case FusedKernel::kV4:
        case FusedKernel::kV4Triangle: {
          const FusedV4Launch v4{d_maps,
                                 d_desc,
                                 d_jobs2 + l.list0,
                                 l.plan,
                                 At<float>(w, call.o_part),
                                 static_cast<int32_t*>(ctx.tickets.ptr),
                                 l.kernel == FusedKernel::kV4Triangle,
                                 g2,
                                 tr,
                                 mx,
                                 At<double>(w, call.o_pr),
                                 At<int32_t>(w, call.o_st)};
          RVD_CUDA_RETURN_IF_ERROR(launch4(l.dtype, v4, ctx.stream));
          break;
        }
      }
      fused_served_[FusedCountKey(FusedPolicyOf(l.kernel))] += l.matrices;
    }
    const int m = static_cast<int>(call.views.size());
    if (!call.finished) {
      RVD_CUDA_RETURN_IF_ERROR(LaunchFinalize(
          d_desc, At<int32_t>(d, call.o_jb), m, At<double>(w, call.o_g2),
          At<double>(w, call.o_tr), At<float>(w, call.o_mx), At<double>(w, call.o_pr),
          At<int32_t>(w, call.o_st), ctx.stream));
    }
    return Download(ctx, At<void>(w, call.o_pr), m);
  }

  // The results (ResultsBytes: m PRs, then m statuses) into ctx.down, in
  // one copy.
  absl::Status Download(Context& ctx, const void* d_results, size_t m) {
    RVD_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(ctx.down.ptr, d_results, ResultsBytes(m),
                                             cudaMemcpyDeviceToHost, ctx.stream));
    return absl::OkStatus();
  }

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

  absl::Status EnqueueAlgebraic(Context& ctx) {
    const auto& views = ctx.device_views;
    const size_t m = views.size();
    ctx.order.resize(m);
    std::iota(ctx.order.begin(), ctx.order.end(), size_t{0});
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
      p.fit = static_cast<size_t>(std::max<uint64_t>(1, Budget() / p.per_matrix));
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
    absl::Status s = ctx.EnsurePinned(ctx.up, up_bytes);
    if (s.ok()) s = ctx.EnsurePinned(ctx.down, ResultsBytes(m));
    if (s.ok()) s = ctx.Cublas();
    if (s.ok()) s = ctx.EnsureDevice(ctx.work, work.size());
    if (!s.ok()) return s;
    void* w = ctx.work.ptr;
    float* gram = At<float>(w, o_gram);
    std::memcpy(At<void>(ctx.up.ptr, o_desc), descs.data(), m * sizeof(MatrixDesc));
    std::memcpy(At<void>(ctx.up.ptr, o_jb), jb.data(), (m + 1) * sizeof(int32_t));
    // Pointers per sub-batch: the full-K parts of all its members, then the
    // last parts (a different k): two batched GEMMs per sub-batch.
    const void** aptrs = At<const void*>(ctx.up.ptr, o_aptrs);
    void** cptrs = At<void*>(ctx.up.ptr, o_cptrs);
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
    RVD_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(w, ctx.up.ptr, up_bytes,
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
    return Download(ctx, At<void>(w, o_pr), m);
  }

  // ||W||^2 and max |w| for every matrix of the chunk, on the host; fails on
  // NaN/Inf naming the batch index. Leaves the descriptors at work + 0.
  absl::Status HostStats(Context& ctx, std::vector<double>* trace) {
    const auto& views = ctx.device_views;
    const size_t m = views.size();
    Layout l;
    const uint64_t o_desc = l.Add(m * sizeof(MatrixDesc));
    const uint64_t o_tr = l.Add(m * sizeof(double));
    const uint64_t o_mx = l.Add(m * sizeof(float));
    absl::Status s = ctx.EnsurePinned(ctx.up, l.size());
    if (s.ok()) s = ctx.EnsureDevice(ctx.work, l.size() + work_extra_);
    if (!s.ok()) return s;
    auto* descs = At<MatrixDesc>(ctx.up.ptr, o_desc);
    for (size_t i = 0; i < m; ++i) descs[i] = MakeDesc(views[i]);
    void* w = ctx.work.ptr;
    RVD_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(w, ctx.up.ptr, o_tr,
                                             cudaMemcpyHostToDevice, ctx.stream));
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
                                             m * sizeof(double),
                                             cudaMemcpyDeviceToHost, ctx.stream));
    RVD_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(ctx.stream));
    for (size_t i = 0; i < m; ++i) {
      if (!std::isfinite((*trace)[i])) return NonFiniteError(ctx.first + i);
    }
    stats_bytes_ = l.size();
    return absl::OkStatus();
  }

  // Naive: per matrix, a float64 copy in gesvd's layout (m >= n), singular
  // values only, PR from them on the host in float64 (as OraclePR).
  absl::Status RunNaive(Context& ctx) {
    const auto& views = ctx.device_views;
    absl::Status s = ctx.Cusolver();
    if (!s.ok()) return s;
    // Workspace (after the stats) for the largest matrix, queried before
    // anything is queued: the float64 copy, the singular values, gesvd's
    // work and its info.
    std::vector<int> lwork(views.size());
    uint64_t a_bytes = 0, s_bytes = 0, w_bytes = 0;
    for (size_t i = 0; i < views.size(); ++i) {
      const MatrixView& v = views[i];
      const int mr = static_cast<int>(std::max(v.rows, v.cols));
      const int nc = static_cast<int>(std::min(v.rows, v.cols));
      RVD_CUDA_RETURN_IF_ERROR(cusolverDnDgesvd_bufferSize(ctx.cusolver, mr, nc, &lwork[i]));
      a_bytes = std::max<uint64_t>(a_bytes, uint64_t(mr) * nc * sizeof(double));
      s_bytes = std::max<uint64_t>(s_bytes, uint64_t(nc) * sizeof(double));
      w_bytes = std::max<uint64_t>(w_bytes, uint64_t(lwork[i]) * sizeof(double));
    }
    Layout l;
    const uint64_t o_a = l.Add(a_bytes), o_s = l.Add(s_bytes), o_w = l.Add(w_bytes),
                   o_info = l.Add(sizeof(int));
    work_extra_ = l.size();
    std::vector<double> trace;
    s = HostStats(ctx, &trace);
    if (!s.ok()) return s;
    void* const w = At<void>(ctx.work.ptr, stats_bytes_);
    results_.assign(views.size(), 0.0);
    for (size_t i = 0; i < views.size(); ++i) {
      if (trace[i] == 0) continue;  // all zero: PR 0
      const MatrixView& v = views[i];
      const int mr = static_cast<int>(std::max(v.rows, v.cols));
      const int nc = static_cast<int>(std::min(v.rows, v.cols));
      const MatrixDesc d = MakeDesc(v);
      RVD_CUDA_RETURN_IF_ERROR(LaunchToF64ForSvd(v.dtype, d, At<double>(w, o_a), ctx.stream));
      RVD_CUDA_RETURN_IF_ERROR(cusolverDnDgesvd(
          ctx.cusolver, 'N', 'N', mr, nc, At<double>(w, o_a), mr,
          At<double>(w, o_s), nullptr, 1, nullptr, 1, At<double>(w, o_w), lwork[i],
          nullptr, At<int>(w, o_info)));
      std::vector<double> sv(static_cast<size_t>(nc));
      int info = 0;
      RVD_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(sv.data(), At<double>(w, o_s),
                                               nc * sizeof(double),
                                               cudaMemcpyDeviceToHost, ctx.stream));
      RVD_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(&info, At<int>(w, o_info), sizeof(int),
                                               cudaMemcpyDeviceToHost, ctx.stream));
      RVD_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(ctx.stream));
      if (info != 0) {
        return absl::InternalError(absl::StrCat("batch[", ctx.first + i,
                                                "]: cusolverDnDgesvd info ", info));
      }
      const double smax = *std::max_element(sv.begin(), sv.end());
      if (smax == 0) continue;
      double sum2 = 0, sum4 = 0;
      for (double x : sv) {
        const double t = x / smax, t2 = t * t;
        sum2 += t2;
        sum4 += t2 * t2;
      }
      results_[i] = sum2 * sum2 / sum4;
    }
    return absl::OkStatus();
  }

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
  absl::Status RunEstimator(Context& ctx) {
    const auto& views = ctx.device_views;
    absl::Status s = ctx.Cublas();
    if (!s.ok()) return s;
    // Workspace (after the stats): f32 copy, probes/sketch, tmp, out, each
    // sized for the largest matrix, then one sum per matrix.
    const int64_t kp = spec_.probes, r = spec_.sketch_rank;
    const int64_t wdt = kind_ == Kind::kSketch ? r : kp;
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
    work_extra_ = l.size();
    std::vector<double> trace;
    s = HostStats(ctx, &trace);
    if (!s.ok()) return s;
    void* w = At<void>(ctx.work.ptr, stats_bytes_);
    EstimatorWork ew{At<float>(w, o_x), At<float>(w, o_z), At<float>(w, o_tmp),
                     At<float>(w, o_out), At<double>(w, o_sums)};
    std::vector<double> offset(views.size(), 0.0), scale(views.size(), 0.0);
    for (size_t i = 0; i < views.size(); ++i) {
      if (trace[i] == 0) continue;
      const MatrixView& v = views[i];
      const bool tall = v.rows > v.cols;
      const int64_t n = std::min(v.rows, v.cols), len = std::max(v.rows, v.cols);
      RVD_CUDA_RETURN_IF_ERROR(LaunchToF32(v.dtype, MakeDesc(v), ew.x, ctx.stream));
      s = kind_ == Kind::kSketch
              ? Sketch(ctx, tall, n, len, trace[i], &ew, i, &offset[i], &scale[i])
              : Hutch(ctx, tall, n, len, &ew, i, &offset[i], &scale[i]);
      if (!s.ok()) return s;
    }
    std::vector<double> sums(views.size());
    RVD_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(sums.data(), ew.sums, sums.size() * sizeof(double),
                                             cudaMemcpyDeviceToHost, ctx.stream));
    RVD_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(ctx.stream));
    results_.assign(views.size(), 0.0);
    for (size_t i = 0; i < views.size(); ++i) {
      if (trace[i] == 0) continue;
      const double g2 = offset[i] + scale[i] * sums[i];
      if (!std::isfinite(g2)) return NonFiniteError(ctx.first + i);
      results_[i] = ClampedPR(trace[i], g2, std::min(views[i].rows, views[i].cols));
    }
    return absl::OkStatus();
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

  CudaEngine* engine_;
  VariantSpec spec_;
  Kind kind_;
  bool use_mutant_;
  std::map<std::string, int64_t> fused_served_;  // policy key -> matrices
  std::vector<double> results_;  // naive and estimators, chunk order
  uint64_t work_extra_ = 0;
  uint64_t stats_bytes_ = 0;
};

// ---------------------------------------------------------------------------
// The engine.

CudaEngine::CudaEngine(const CudaEngineOptions& options) : options_(options) {}

CudaEngine::~CudaEngine() {
  cudaSetDevice(options_.device);
  std::vector<std::unique_ptr<Context>> contexts;
  {
    absl::MutexLock lock(&mu_);
    contexts.swap(contexts_);
    free_.clear();
  }
  for (auto& c : contexts) c->Destroy();  // takes mu_ to uncharge
}

absl::StatusOr<std::unique_ptr<CudaEngine>> CudaEngine::Create(
    const CudaEngineOptions& options) {
  if (options.streams < 1) {
    return absl::InvalidArgumentError("CUDA engine needs streams >= 1");
  }
  std::unique_ptr<CudaEngine> e(new CudaEngine(options));
  absl::Status s = e->Init();
  if (!s.ok()) return s;
  return e;
}

absl::Status CudaEngine::Init() {
  int count = 0;
  RVD_CUDA_RETURN_IF_ERROR(cudaGetDeviceCount(&count));
  if (options_.device < 0 || options_.device >= count) {
    return absl::UnavailableError(absl::StrCat(
        "CUDA device ", options_.device, " requested; ", count, " present"));
  }
  RVD_CUDA_RETURN_IF_ERROR(cudaSetDevice(options_.device));
  cudaDeviceProp prop;
  RVD_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, options_.device));
  sm_major_ = prop.major;
  sm_minor_ = prop.minor;
  sms_ = prop.multiProcessorCount;
  if (sm_major_ < 8) {
    return absl::UnavailableError(absl::StrCat(
        "CUDA device ", prop.name, " is sm_", sm_major_, sm_minor_,
        "; the fused kernel needs sm_80 or newer"));
  }
  version_ = KernelVersion(sm_major_, sm_minor_);
  int least = 0, greatest = 0;
  RVD_CUDA_RETURN_IF_ERROR(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  absl::MutexLock lock(&mu_);
  for (int i = 0; i < options_.streams; ++i) {
    auto ctx = std::make_unique<Context>();
    ctx->engine = this;
    // `least` is the lowest priority: a trainer's kernels come first.
    RVD_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithPriority(
        &ctx->stream, cudaStreamNonBlocking, least));
    free_.push_back(ctx.get());
    contexts_.push_back(std::move(ctx));
  }
  return absl::OkStatus();
}

Context* CudaEngine::Acquire(bool wait) {
  absl::MutexLock lock(&mu_);
  if (!wait && free_.empty()) return nullptr;
  mu_.Await(absl::Condition(
      +[](std::vector<Context*>* f) { return !f->empty(); }, &free_));
  Context* c = free_.back();
  free_.pop_back();
  return c;
}

void CudaEngine::Release(Context* ctx) {
  absl::MutexLock lock(&mu_);
  free_.push_back(ctx);
}

void CudaEngine::DrainAndRelease(Context* ctx) {
  cudaStreamSynchronize(ctx->stream);  // its buffers idle before reuse
  ctx->pending = 0;
  Release(ctx);
}

absl::Status CudaEngine::Charge(uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  if (held_bytes_ + bytes > options_.max_device_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "device memory cap: this request needs ", bytes,
        " more bytes; rvd holds ", held_bytes_, " of max_device_bytes ",
        options_.max_device_bytes));
  }
  held_bytes_ += bytes;
  return absl::OkStatus();
}

void CudaEngine::Uncharge(uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  held_bytes_ -= std::min(bytes, held_bytes_);
}

uint64_t CudaEngine::DeviceBytesHeld() const {
  absl::MutexLock lock(&mu_);
  return held_bytes_;
}

void CudaEngine::Count(const std::string& key, int64_t n) {
  absl::MutexLock lock(&mu_);
  served_[key] += n;
}

void CudaEngine::Count(const std::map<std::string, int64_t>& served) {
  absl::MutexLock lock(&mu_);
  for (const auto& [key, n] : served) served_[key] += n;
}

std::map<std::string, int64_t> CudaEngine::ServedCounts() const {
  absl::MutexLock lock(&mu_);
  return served_;
}

void CudaEngine::AddCallTime(double call_ms) {
  absl::MutexLock lock(&mu_);
  call_ms_ += call_ms;
}

void CudaEngine::AddCopyTime(double copy_ms) {
  absl::MutexLock lock(&mu_);
  copy_ms_ += copy_ms;
}

void CudaEngine::AddPlanTime(double plan_ms) {
  absl::MutexLock lock(&mu_);
  plan_ms_ += plan_ms;
}

void* CudaEngine::AllocateHostBuffer(uint64_t bytes) {
  void* p = nullptr;
  if (cudaSetDevice(options_.device) != cudaSuccess ||
      cudaHostAlloc(&p, bytes, cudaHostAllocPortable) != cudaSuccess) {
    cudaGetLastError();  // not sticky; the caller falls back to pageable memory
    return nullptr;
  }
  return p;
}

void CudaEngine::FreeHostBuffer(void* p) { cudaFreeHost(p); }

std::map<std::string, double> CudaEngine::PhaseSeconds() const {
  absl::MutexLock lock(&mu_);
  return {{"h2d", copy_ms_ / 1e3},
          {"plan", plan_ms_ / 1e3},
          {"compute", std::max(0.0, call_ms_ - copy_ms_ - plan_ms_) / 1e3}};
}

namespace {

absl::StatusOr<Kind> ParseVariant(const VariantSpec& v) {
  const std::string name = v.name.empty() ? "fused" : v.name;
  if (name == "fused") return Kind::kFused;
  if (name == "algebraic") return Kind::kAlgebraic;
  if (name == "naive") return Kind::kNaive;
  if (name == "power_iter") {
    if (v.probes < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("power_iter needs probes >= 1, got ", v.probes));
    }
    return Kind::kPowerIter;
  }
  if (name == "sketch") {
    if (v.sketch_rank < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sketch needs sketch_rank >= 1, got ", v.sketch_rank));
    }
    return Kind::kSketch;
  }
  return absl::UnimplementedError(absl::StrCat(
      "unknown variant '", name, "' on the cuda backend (known: ",
      absl::StrJoin(KnownVariants(), ", "), ")"));
}

// The checks every call makes before any work: one result slot per matrix
// (poisoned with NaN, so an unwritten slot cannot pass), a known variant,
// valid views. Returns the variant's kind.
absl::StatusOr<Kind> CheckCall(absl::Span<const MatrixView> batch,
                               const VariantSpec& variant,
                               absl::Span<double> out) {
  if (out.size() != batch.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "out has ", out.size(), " slots for a batch of ", batch.size()));
  }
  std::fill(out.begin(), out.end(), std::numeric_limits<double>::quiet_NaN());
  absl::StatusOr<Kind> kind = ParseVariant(variant);
  if (!kind.ok()) return kind.status();
  for (size_t i = 0; i < batch.size(); ++i) {
    absl::Status s = ValidateView(batch[i], i);
    if (!s.ok()) return s;
  }
  return kind;
}

// The distinct host byte ranges a batch covers, and where each view lands
// when those ranges are copied into one device buffer. Device offsets keep
// each range's host address modulo 256, so row alignment is unchanged.
struct SharedRanges {
  struct Range {
    const unsigned char* lo;
    const unsigned char* hi;
    uint64_t device_offset;
  };
  std::vector<Range> ranges;          // sorted by lo, disjoint
  std::vector<uint64_t> view_offset;  // device offset of each view's data
  uint64_t unique_bytes = 0;          // bytes in `ranges`
  uint64_t view_bytes = 0;            // bytes of all views, counted apart
  uint64_t device_bytes = 0;          // device buffer size needed
};

SharedRanges MergeHostRanges(absl::Span<const MatrixView> batch) {
  SharedRanges r;
  auto lo = [&](size_t i) {
    return static_cast<const unsigned char*>(batch[i].data);
  };
  auto hi = [&](size_t i) {
    const MatrixView& v = batch[i];
    return lo(i) + ((v.rows - 1) * v.ld + v.cols) * DTypeSize(v.dtype);
  };
  std::vector<size_t> order(batch.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return lo(a) < lo(b); });
  std::vector<size_t> range_of(batch.size());
  for (size_t i : order) {
    r.view_bytes += static_cast<uint64_t>(hi(i) - lo(i));
    if (r.ranges.empty() || lo(i) > r.ranges.back().hi) {
      r.ranges.push_back({lo(i), hi(i), 0});
    } else {
      r.ranges.back().hi = std::max(r.ranges.back().hi, hi(i));
    }
    range_of[i] = r.ranges.size() - 1;
  }
  for (SharedRanges::Range& range : r.ranges) {
    const uint64_t shift = reinterpret_cast<uintptr_t>(range.lo) % 256;
    range.device_offset = (r.device_bytes + 255) / 256 * 256 + shift;
    r.device_bytes = range.device_offset + (range.hi - range.lo);
    r.unique_bytes += range.hi - range.lo;
  }
  r.view_offset.resize(batch.size());
  for (size_t i = 0; i < batch.size(); ++i) {
    const SharedRanges::Range& range = r.ranges[range_of[i]];
    r.view_offset[i] = range.device_offset + (lo(i) - range.lo);
  }
  return r;
}


// Copies views that are not 16-byte aligned (base or row pitch) into
// ctx.input with padded rows, device to device, and points them there.
absl::Status RepackUnaligned(Context& ctx, std::vector<MatrixView>& views) {
  std::vector<uint64_t> offset(views.size(), UINT64_MAX);
  std::vector<int64_t> lds(views.size());
  uint64_t total = 0;
  for (size_t i = 0; i < views.size(); ++i) {
    if (MakeDesc(views[i]).aligned) continue;
    offset[i] = total;
    total += PackedBytes(views[i], &lds[i]);
  }
  if (total == 0) return absl::OkStatus();
  absl::Status s = ctx.EnsureDevice(ctx.input, total);
  if (!s.ok()) return s;
  for (size_t i = 0; i < views.size(); ++i) {
    if (offset[i] == UINT64_MAX) continue;
    MatrixView& v = views[i];
    const size_t es = DTypeSize(v.dtype);
    void* dst = At<unsigned char>(ctx.input.ptr, offset[i]);
    RVD_CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(dst, lds[i] * es, v.data, v.ld * es,
                                               v.cols * es, v.rows,
                                               cudaMemcpyDeviceToDevice, ctx.stream));
    v.data = dst;
    v.ld = lds[i];
  }
  return absl::OkStatus();
}

// Runs `views` (device pointers) on ctx and waits for `out`.
absl::Status EnqueueAndCollect(Context& ctx, Runner& runner, Kind kind,
                               std::vector<MatrixView>& views,
                               absl::Span<double> out) {
  // cuBLAS's batched GEMMs misread views whose base or rows are not
  // 16-byte aligned (run 2: 4% off for bf16 at a 2-byte offset): the
  // algebraic variant gets aligned device copies of those.
  if (kind == Kind::kAlgebraic) {
    absl::Status s = RepackUnaligned(ctx, views);
    if (!s.ok()) return s;
  }
  absl::Status s = runner.Enqueue(ctx, views, 0);
  if (s.ok()) s = runner.Collect(ctx, {}, out);
  return s;
}

}  // namespace

absl::Status CudaEngine::ComputeShared(absl::Span<const MatrixView> batch,
                                       const VariantSpec& variant,
                                       absl::Span<double> out, bool* used) {
  *used = false;
  absl::StatusOr<Kind> kind = ParseVariant(variant);
  if (!kind.ok()) return kind.status();
  const SharedRanges r = MergeHostRanges(batch);
  Runner runner(this, variant, *kind, use_mutant_.load());
  // Worth it when sharing saves a fifth of the bytes and the ranges fit one
  // context's budget; else the chunked, packed path.
  if (r.unique_bytes * 5 > r.view_bytes * 4 ||
      r.device_bytes > runner.Budget()) {
    return absl::OkStatus();
  }
  *used = true;
  Context* ctx = Acquire(true);
  absl::Status status;
  {
    auto release = absl::MakeCleanup([&] { DrainAndRelease(ctx); });
    status = ctx->EnsureDevice(ctx->shared, r.device_bytes);
    if (status.code() == absl::StatusCode::kResourceExhausted) {
      // Other contexts hold the cap now: the packed path needs less.
      *used = false;
      return absl::OkStatus();
    }
    status = ctx->RecordCopy(true);
    for (size_t k = 0; status.ok() && k < r.ranges.size(); ++k) {
      const SharedRanges::Range& range = r.ranges[k];
      status = cuda_internal::ToStatus(
          cudaMemcpyAsync(
              At<unsigned char>(ctx->shared.ptr, range.device_offset),
              range.lo, range.hi - range.lo, cudaMemcpyHostToDevice,
              ctx->stream),
          "cudaMemcpyAsync(shared)", __FILE__, __LINE__);
    }
    if (status.ok()) status = ctx->RecordCopy(false);
    if (!status.ok()) return status;
    std::vector<MatrixView> views(batch.begin(), batch.end());
    for (size_t i = 0; i < views.size(); ++i) {
      views[i].data = At<unsigned char>(ctx->shared.ptr, r.view_offset[i]);
    }
    status = EnqueueAndCollect(*ctx, runner, *kind, views, out);
    ctx->TakeCopyTime();  // Collect synchronized the stream
  }
  if (status.ok()) Count(runner.Served(static_cast<int64_t>(batch.size())));
  return status;
}

absl::Status CudaEngine::ComputePR(absl::Span<const MatrixView> batch,
                                   const VariantSpec& variant,
                                   absl::Span<double> out) {
  absl::StatusOr<Kind> kind = CheckCall(batch, variant, out);
  if (!kind.ok()) return kind.status();
  if (batch.empty()) return absl::OkStatus();
  const auto start = std::chrono::steady_clock::now();
  auto timed = absl::MakeCleanup([&] {
    AddCallTime(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() -
                                                          start)
                    .count());
  });
  RVD_CUDA_RETURN_IF_ERROR(cudaSetDevice(options_.device));
  bool shared = false;
  absl::Status shared_status = ComputeShared(batch, variant, out, &shared);
  if (shared) return shared_status;

  Runner runner(this, variant, *kind, use_mutant_.load());
  std::vector<uint64_t> sizes(batch.size());
  std::vector<int64_t> lds(batch.size());
  for (size_t i = 0; i < batch.size(); ++i) {
    sizes[i] = PackedBytes(batch[i], &lds[i]);
    if (sizes[i] > options_.max_device_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "batch[", i, "] needs ", sizes[i], " device bytes; max_device_bytes is ",
          options_.max_device_bytes));
    }
  }
  const std::vector<size_t> bounds = ChunkByBytes(sizes, runner.Budget());

  // Two contexts when the batch has two chunks and a second is free.
  std::vector<Context*> ctxs = {Acquire(true)};
  if (bounds.size() > 2) {
    if (Context* c = Acquire(false)) ctxs.push_back(c);
  }
  absl::Status status;
  auto finish = absl::MakeCleanup([&] {
    for (Context* c : ctxs) {
      if (status.ok()) {
        status = runner.Collect(*c, batch, out);
      } else {
        cudaStreamSynchronize(c->stream);  // buffers idle before reuse
        c->pending = 0;
      }
      c->TakeCopyTime();
      Release(c);
    }
  });
  for (size_t ci = 0; ci + 1 < bounds.size(); ++ci) {
    Context& ctx = *ctxs[ci % ctxs.size()];
    status = runner.Collect(ctx, batch, out);  // syncs: staging is free
    if (!status.ok()) return status;
    ctx.TakeCopyTime();
    const size_t b = bounds[ci], e = bounds[ci + 1];
    uint64_t total = 0;
    for (size_t i = b; i < e; ++i) total += sizes[i];
    status = ctx.EnsurePinned(ctx.staging, total);
    if (status.ok()) status = ctx.EnsureDevice(ctx.input, total);
    if (!status.ok()) return status;
    std::vector<MatrixView> dev(e - b);
    uint64_t off = 0;
    for (size_t i = b; i < e; ++i) {
      const MatrixView& v = batch[i];
      const size_t es = DTypeSize(v.dtype);
      auto* dst = At<unsigned char>(ctx.staging.ptr, off);
      const auto* src = static_cast<const unsigned char*>(v.data);
      if (v.ld == lds[i]) {
        std::memcpy(dst, src, static_cast<size_t>(v.rows * v.ld) * es);
      } else {
        for (int64_t r = 0; r < v.rows; ++r) {
          std::memcpy(dst + r * lds[i] * es, src + r * v.ld * es, v.cols * es);
        }
      }
      dev[i - b] = MatrixView{At<unsigned char>(ctx.input.ptr, off), v.rows,
                              v.cols, lds[i], v.dtype};
      off += sizes[i];
    }
    status = ctx.RecordCopy(true);
    if (status.ok()) {
      status = cuda_internal::ToStatus(cudaMemcpyAsync(ctx.input.ptr, ctx.staging.ptr, total,
                                                       cudaMemcpyHostToDevice, ctx.stream),
                                       "cudaMemcpyAsync(input)", __FILE__, __LINE__);
    }
    if (status.ok()) status = ctx.RecordCopy(false);
    if (status.ok()) status = runner.Enqueue(ctx, dev, b);
    if (!status.ok()) return status;
  }
  std::move(finish).Invoke();
  if (status.ok()) Count(runner.Served(static_cast<int64_t>(batch.size())));
  return status;
}

absl::Status CudaEngine::ComputePRDevice(
    absl::Span<const MatrixView> device_batch, const VariantSpec& variant,
    absl::Span<double> out, cudaStream_t stream) {
  absl::StatusOr<Kind> kind = CheckCall(device_batch, variant, out);
  if (!kind.ok()) return kind.status();
  if (device_batch.empty()) return absl::OkStatus();
  RVD_CUDA_RETURN_IF_ERROR(cudaSetDevice(options_.device));
  Runner runner(this, variant, *kind, use_mutant_.load());
  Context* ctx = Acquire(true);
  absl::Status status;
  {
    auto release = absl::MakeCleanup([&] { DrainAndRelease(ctx); });
    if (ctx->caller_ready == nullptr) {
      status = cuda_internal::ToStatus(
          cudaEventCreateWithFlags(&ctx->caller_ready, cudaEventDisableTiming),
          "cudaEventCreateWithFlags", __FILE__, __LINE__);
      if (!status.ok()) return status;
    }
    status = cuda_internal::ToStatus(cudaEventRecord(ctx->caller_ready, stream),
                                     "cudaEventRecord", __FILE__, __LINE__);
    if (status.ok()) {
      status = cuda_internal::ToStatus(cudaStreamWaitEvent(ctx->stream, ctx->caller_ready, 0),
                                       "cudaStreamWaitEvent", __FILE__, __LINE__);
    }
    std::vector<MatrixView> views(device_batch.begin(), device_batch.end());
    if (status.ok()) status = EnqueueAndCollect(*ctx, runner, *kind, views, out);
  }
  if (status.ok()) {
    Count(runner.Served(static_cast<int64_t>(device_batch.size())));
  }
  return status;
}

}  // namespace rvd::cuda

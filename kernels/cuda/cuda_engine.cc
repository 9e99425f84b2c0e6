// The CUDA engine (cuda_engine.h): the context pool, the memory cap, and the
// transfer pipeline that brings host batches to the device; the variants
// themselves are in variant_*.cc, fused planning in fused_plan.cc.
//
// A host batch whose views share bytes (a layer's V and the row blocks of its
// heads, as the daemon sends them) is uploaded once per distinct byte range,
// straight from the caller's memory, and computed on device views. Other host
// batches are packed into pinned staging (rows padded to 16 bytes), copied in
// chunks of at most Budget() bytes, two contexts ping-ponging so that chunk
// i+1 is packed and copied while chunk i computes. When the cap cannot hold
// two contexts' buffers, the call goes on with one (slower, not fatal).
// Matrices whose f32 Gram could over- or underflow (|w| beyond ~1e15 or below
// ~1e-15), flagged by the finalize kernel, are recomputed with the float64
// SVD oracle.
//
// A device batch may hold blocked views (a V interleaved with Q and K in a
// device tensor, v_layout.h ViewV): they are gathered on the engine's stream
// into a buffer of the context (gather.cu), after the caller's event, and
// computed there; plain views, per-head ones included, are read in place.
//
// A call's cancellation flag (CallOptions::cancel) is looked at before the
// call starts, before each chunk is staged and before each variant launch
// (Enqueue, and per matrix inside the variants that launch per matrix): a
// cancelled call drains what its streams have queued, serves nothing and
// answers CANCELLED.
#include "kernels/cuda/cuda_engine.h"

#include <cuda_runtime_api.h>

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
#include "kernels/call_contract.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_context.h"
#include "kernels/cuda/fused_plan.h"
#include "kernels/cuda/gather.h"
#include "kernels/cuda/kernel_registry.h"
#include "kernels/cuda/kernels.h"
#include "kernels/cuda/launch_policy.h"
#include "kernels/cuda/variant.h"
#include "kernels/engine.h"

namespace rvd::cuda {
namespace {


// The call contract (call_contract.h) with this backend's name and default.
absl::StatusOr<VariantKind> CheckCudaCall(absl::Span<const MatrixView> batch,
                                          const VariantSpec& variant, absl::Span<double> out) {
  return CheckCall(batch, variant, out, "cuda", "fused");
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
  absl::Status s = ctx.input.Reserve(ctx.cap, total, ctx.stream);
  if (!s.ok()) return s;
  for (size_t i = 0; i < views.size(); ++i) {
    if (offset[i] == UINT64_MAX) continue;
    MatrixView& v = views[i];
    const size_t es = DTypeSize(v.dtype);
    void* dst = At<unsigned char>(ctx.input.data(), offset[i]);
    RVD_CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(dst, lds[i] * es, v.data, v.ld * es,
                                               v.cols * es, v.rows,
                                               cudaMemcpyDeviceToDevice, ctx.stream));
    v.data = dst;
    v.ld = lds[i];
  }
  return absl::OkStatus();
}

// Gathers the blocked views (MatrixView::block_rows: a V interleaved with Q
// and K) among `views` into ctx.shared, rows padded to 16 bytes (the fused
// kernel's fast loads), on ctx.stream, and points them there: afterwards
// every view is one strided matrix. Other views are left where they are.
// Returns how many were gathered in *gathered.
absl::Status GatherBlocked(Context& ctx, std::vector<MatrixView>& views, int64_t* gathered) {
  *gathered = 0;
  std::vector<uint64_t> offset(views.size(), UINT64_MAX);
  std::vector<int64_t> lds(views.size());
  uint64_t total = 0;
  for (size_t i = 0; i < views.size(); ++i) {
    if (views[i].block_rows == 0) continue;
    offset[i] = total;
    total += PackedBytes(views[i], &lds[i]);  // a multiple of 256
  }
  if (total == 0) return absl::OkStatus();
  if (absl::Status s = ctx.shared.Reserve(ctx.cap, total, ctx.stream); !s.ok()) return s;
  for (size_t i = 0; i < views.size(); ++i) {
    if (offset[i] == UINT64_MAX) continue;
    MatrixView& v = views[i];
    const int64_t es = static_cast<int64_t>(DTypeSize(v.dtype));
    BlockedRowsCopy copy;
    copy.src = v.data;
    copy.dst = At<unsigned char>(ctx.shared.data(), offset[i]);
    copy.rows = v.rows;
    copy.row_bytes = v.cols * es;
    copy.block_rows = v.block_rows;
    copy.src_pitch = v.ld * es;
    copy.block_stride_bytes = v.block_stride * es;
    copy.dst_pitch = lds[i] * es;
    RVD_CUDA_RETURN_IF_ERROR(LaunchGatherBlockedRows(copy, ctx.stream));
    v = MatrixView{copy.dst, v.rows, v.cols, lds[i], v.dtype};
    ++*gathered;
  }
  return absl::OkStatus();
}

absl::Status DeviceLost() {
  const cuda_internal::DeviceErrorSnapshot e = cuda_internal::DeviceErrors();
  if (!e.lost) return absl::OkStatus();
  return absl::UnavailableError(
      absl::StrCat("the CUDA device is lost (", e.lost_reason, "); restart rvd"));
}

absl::StatusOr<double> OracleFromDevice(Context& ctx, const MatrixView& v) {
  const size_t es = DTypeSize(v.dtype);
  std::vector<unsigned char> host(static_cast<size_t>(v.rows * v.cols) * es);
  RVD_CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(host.data(), v.cols * es, v.data, v.ld * es,
                                             v.cols * es, v.rows, cudaMemcpyDeviceToHost,
                                             ctx.stream));
  RVD_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(ctx.stream));
  MatrixView h = v;
  h.data = host.data();
  h.ld = v.cols;
  return OraclePR(h);
}

// Waits for ctx's pending chunk and writes its PRs to out[first + i].
// `host_batch` (may be empty) is the caller's host views, for the fallback.
absl::Status Collect(Context& ctx, absl::Span<const MatrixView> host_batch,
                     absl::Span<double> out) {
  PendingChunk& chunk = ctx.pending;
  if (chunk.count == 0) return absl::OkStatus();
  const size_t count = chunk.count;
  chunk.count = 0;
  RVD_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(ctx.stream));
  const double* pr = At<double>(ctx.down.data(), 0);
  const int32_t* status = At<int32_t>(ctx.down.data(), count * sizeof(double));
  int64_t fallbacks = 0;
  for (size_t s = 0; s < count; ++s) {
    const size_t i = chunk.order[s];
    const size_t global = chunk.first + i;
    if (status[s] == kStatusNonFinite) return NonFiniteError(global);
    if (status[s] == kStatusOk) {
      out[global] = pr[s];
      continue;
    }
    // Untrusted f32 range: the float64 oracle on the host.
    absl::StatusOr<double> exact = host_batch.empty()
                                       ? OracleFromDevice(ctx, chunk.device_views[i])
                                       : OraclePR(host_batch[global]);
    if (!exact.ok()) {  // e.g. Inf, which f32 Gram entries cannot tell from overflow
      return absl::Status(exact.status().code(),
                          absl::StrCat("batch[", global, "]: ", exact.status().message()));
    }
    out[global] = *exact;
    ++fallbacks;
  }
  if (fallbacks > 0) ctx.counters.Event("oracle_fallback", fallbacks);
  return absl::OkStatus();
}

// Queues `variant` on `views` (device pointers), matrices [first, first +
// views.size()) of the batch.
absl::Status Enqueue(Context& ctx, Variant& variant, absl::Span<const MatrixView> views,
                     size_t first) {
  if (variant.Cancelled()) return CallCancelled();
  ctx.pending.first = first;
  ctx.pending.device_views.assign(views.begin(), views.end());
  ctx.pending.count = views.size();
  absl::Status s = variant.Enqueue(ctx);
  if (!s.ok()) ctx.pending.count = 0;
  return s;
}

// Runs `views` (device pointers) on ctx and waits for `out`.
absl::Status EnqueueAndCollect(Context& ctx, Variant& variant, VariantKind kind,
                               std::vector<MatrixView>& views, absl::Span<double> out) {
  // cuBLAS's batched GEMMs misread views whose base or rows are not 16-byte
  // aligned (4% off for bf16 at a 2-byte offset): the algebraic variant gets
  // aligned device copies of those.
  if (kind == VariantKind::kAlgebraic) {
    if (absl::Status s = RepackUnaligned(ctx, views); !s.ok()) return s;
  }
  absl::Status s = Enqueue(ctx, variant, views, 0);
  if (s.ok()) s = Collect(ctx, {}, out);
  return s;
}

// Packs host matrices [b, e) of `batch` into ctx's staging, copies them to
// ctx.input and queues `variant` on them.
absl::Status StageChunk(Context& ctx, Variant& variant, absl::Span<const MatrixView> batch,
                        absl::Span<const uint64_t> sizes, absl::Span<const int64_t> lds,
                        size_t b, size_t e) {
  uint64_t total = 0;
  for (size_t i = b; i < e; ++i) total += sizes[i];
  absl::Status status = ctx.staging.Reserve(ctx.counters, total, ctx.stream);
  if (status.ok()) status = ctx.input.Reserve(ctx.cap, total, ctx.stream);
  if (!status.ok()) return status;
  std::vector<MatrixView> dev(e - b);
  uint64_t off = 0;
  for (size_t i = b; i < e; ++i) {
    const MatrixView& v = batch[i];
    const size_t es = DTypeSize(v.dtype);
    auto* dst = At<unsigned char>(ctx.staging.data(), off);
    const auto* src = static_cast<const unsigned char*>(v.data);
    if (v.ld == lds[i]) {
      std::memcpy(dst, src, static_cast<size_t>(v.rows * v.ld) * es);
    } else {
      for (int64_t r = 0; r < v.rows; ++r) {
        std::memcpy(dst + r * lds[i] * es, src + r * v.ld * es, v.cols * es);
      }
    }
    dev[i - b] = MatrixView{At<unsigned char>(ctx.input.data(), off), v.rows, v.cols, lds[i],
                            v.dtype};
    off += sizes[i];
  }
  status = ctx.RecordCopy(true);
  if (status.ok()) {
    status = cuda_internal::ToStatus(cudaMemcpyAsync(ctx.input.data(), ctx.staging.data(), total,
                                                     cudaMemcpyHostToDevice, ctx.stream),
                                     "cudaMemcpyAsync(input)", __FILE__, __LINE__);
  }
  if (status.ok()) status = ctx.RecordCopy(false);
  if (status.ok()) status = Enqueue(ctx, variant, dev, b);
  return status;
}

}  // namespace

// ---------------------------------------------------------------------------
// The engine.

CudaEngine::CudaEngine(const CudaEngineOptions& options)
    : options_(options),
      cap_(std::make_unique<MemoryCap>(options.max_device_bytes)),
      counters_(std::make_unique<EngineCounters>()) {}

CudaEngine::~CudaEngine() {
  cudaSetDevice(options_.device);
  std::vector<std::unique_ptr<Context>> contexts;
  {
    absl::MutexLock lock(&mu_);
    contexts.swap(contexts_);
    free_.clear();
  }
  contexts.clear();  // each synchronizes its stream and frees its buffers
}

absl::StatusOr<std::unique_ptr<CudaEngine>> CudaEngine::Create(
    const CudaEngineOptions& options) {
  if (options.streams < 1) {
    return absl::InvalidArgumentError("CUDA engine needs streams >= 1");
  }
  if (options.max_sms < 0) {
    return absl::InvalidArgumentError("CUDA engine needs max_sms >= 0 (0: every SM)");
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
  device_sms_ = prop.multiProcessorCount;
  if (sm_major_ < 8) {
    return absl::UnavailableError(absl::StrCat(
        "CUDA device ", prop.name, " is sm_", sm_major_, sm_minor_,
        "; rvd's kernels need sm_80 or newer"));
  }
  version_ = KernelVersion(sm_major_, sm_minor_);
  kernels_ = std::make_unique<KernelRegistry>(sm_major_, sm_minor_);
  int least = 0, greatest = 0;
  RVD_CUDA_RETURN_IF_ERROR(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  absl::MutexLock lock(&mu_);
  for (int i = 0; i < options_.streams; ++i) {
    auto ctx = std::make_unique<Context>(*cap_, *counters_);
    // `least` is the lowest priority: a trainer's kernels come first.
    if (absl::Status s = ctx->Create(least); !s.ok()) return s;
    free_.push_back(ctx.get());
    contexts_.push_back(std::move(ctx));
  }
  return absl::OkStatus();
}

uint64_t CudaEngine::Budget() const {
  const uint64_t per = options_.max_device_bytes / std::max(1, options_.streams);
  return std::max<uint64_t>(per / 2, 1u << 16);
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
  ctx->pending.count = 0;
  Release(ctx);
}

bool CudaEngine::TrimIdleContexts() {
  std::vector<Context*> idle;
  {
    absl::MutexLock lock(&mu_);
    idle.swap(free_);
  }
  bool freed = false;
  for (Context* c : idle) {
    // Idle contexts were drained when released: their streams have finished.
    freed |= c->input.size() + c->shared.size() + c->descriptors.size() + c->work.size() +
                 c->tickets.size() >
             0;
    c->ReleaseDeviceBuffers();
  }
  absl::MutexLock lock(&mu_);
  free_.insert(free_.end(), idle.begin(), idle.end());
  return freed;
}

uint64_t CudaEngine::DeviceBytesHeld() const { return cap_->held(); }

void CudaEngine::UseFusedMutantForTest(const FusedLaunchers* mutant) {
  if (mutant == nullptr) {
    kernels_->Reset();
    return;
  }
  kernels_->Reset();
  const std::shared_ptr<const KernelTable> product = kernels_->Snapshot();
  for (DType dt : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (FusedKernel k : {FusedKernel::kV4, FusedKernel::kV4Triangle, FusedKernel::kV3,
                          FusedKernel::kV1Tall}) {
      KernelEntry e = product->Find(dt, k);
      e.technique = absl::StrCat("MUTANT-", e.technique);
      e.launchers = *mutant;
      kernels_->Swap(dt, k, e);
    }
  }
}

EngineStats CudaEngine::Stats() const {
  EngineStats s;
  counters_->Snapshot(&s);
  s.kernel_policies = KernelPolicies(sm_major_, sm_minor_);
  s.device_bytes_held = cap_->held();
  return s;
}

void* CudaEngine::AllocateHostBuffer(uint64_t bytes) {
  void* p = nullptr;
  if (cudaSetDevice(options_.device) != cudaSuccess ||
      cudaHostAlloc(&p, bytes, cudaHostAllocPortable) != cudaSuccess) {
    cudaGetLastError();  // not sticky; the caller falls back to pageable memory
    return nullptr;
  }
  counters_->AddPinnedBytes(static_cast<int64_t>(bytes));
  absl::MutexLock lock(&mu_);
  host_buffers_[p] = bytes;
  return p;
}

void CudaEngine::FreeHostBuffer(void* p) {
  if (p == nullptr) return;
  uint64_t bytes = 0;
  {
    absl::MutexLock lock(&mu_);
    auto it = host_buffers_.find(p);
    if (it != host_buffers_.end()) {
      bytes = it->second;
      host_buffers_.erase(it);
    }
  }
  cudaFreeHost(p);
  counters_->AddPinnedBytes(-static_cast<int64_t>(bytes));
}

absl::Status CudaEngine::ComputeShared(absl::Span<const MatrixView> batch, VariantKind kind,
                                       const VariantSpec& variant, absl::Span<double> out,
                                       const CallOptions& call, bool* used) {
  *used = false;
  const SharedRanges r = MergeHostRanges(batch);
  // Worth it when sharing saves a fifth of the bytes and the ranges fit one
  // context's budget; else the chunked, packed path.
  if (r.unique_bytes * 5 > r.view_bytes * 4 || r.device_bytes > Budget()) {
    return absl::OkStatus();
  }
  *used = true;
  std::unique_ptr<Variant> v = NewVariant(kind, variant, Env(call));
  if (v->Cancelled()) return CallCancelled();
  Context* ctx = Acquire(true);
  absl::Status status;
  {
    auto release = absl::MakeCleanup([&] { DrainAndRelease(ctx); });
    status = ctx->shared.Reserve(*cap_, r.device_bytes, ctx->stream);
    if (status.code() == absl::StatusCode::kResourceExhausted) {
      // Other contexts hold the cap now: the packed path needs less.
      *used = false;
      return absl::OkStatus();
    }
    if (status.ok()) status = ctx->RecordCopy(true);
    for (size_t k = 0; status.ok() && k < r.ranges.size(); ++k) {
      const SharedRanges::Range& range = r.ranges[k];
      status = cuda_internal::ToStatus(
          cudaMemcpyAsync(At<unsigned char>(ctx->shared.data(), range.device_offset), range.lo,
                          range.hi - range.lo, cudaMemcpyHostToDevice, ctx->stream),
          "cudaMemcpyAsync(shared)", __FILE__, __LINE__);
    }
    if (status.ok()) status = ctx->RecordCopy(false);
    if (!status.ok()) return status;
    std::vector<MatrixView> views(batch.begin(), batch.end());
    for (size_t i = 0; i < views.size(); ++i) {
      views[i].data = At<unsigned char>(ctx->shared.data(), r.view_offset[i]);
    }
    status = EnqueueAndCollect(*ctx, *v, kind, views, out);
    counters_->AddMs("h2d", ctx->TakeCopyMs());  // Collect synchronized the stream
  }
  if (status.ok()) counters_->Served(v->served());
  return status;
}

absl::Status CudaEngine::ComputeChunked(absl::Span<const MatrixView> batch, VariantKind kind,
                                        const VariantSpec& variant, absl::Span<double> out,
                                        const CallOptions& call) {
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
  const std::vector<size_t> bounds = ChunkByBytes(sizes, Budget());
  const size_t chunks = bounds.size() - 1;
  std::unique_ptr<Variant> v = NewVariant(kind, variant, Env(call));

  // Two contexts when the batch has two chunks and a second is free.
  std::vector<Context*> ctxs = {Acquire(true)};
  if (chunks > 1) {
    if (Context* c = Acquire(false)) ctxs.push_back(c);
  }
  absl::Status status;
  auto finish = absl::MakeCleanup([&] {
    for (Context* c : ctxs) {
      if (status.ok()) {
        status = Collect(*c, batch, out);
      } else {
        cudaStreamSynchronize(c->stream);  // buffers idle before reuse
        c->pending.count = 0;
      }
      counters_->AddMs("h2d", c->TakeCopyMs());
      Release(c);
    }
  });
  bool trimmed = false;
  size_t turn = 0;  // the context of the next chunk: ctxs[turn % ctxs.size()]
  for (size_t ci = 0; ci < chunks;) {
    // Between chunks: a cancelled call stages nothing more (what is queued
    // is drained by `finish`).
    if (CancelRequested(call)) {
      status = CallCancelled();
      return status;
    }
    Context& ctx = *ctxs[turn % ctxs.size()];
    status = Collect(ctx, batch, out);  // syncs: staging is free
    if (!status.ok()) return status;
    counters_->AddMs("h2d", ctx.TakeCopyMs());
    status = StageChunk(ctx, *v, batch, sizes, lds, bounds[ci], bounds[ci + 1]);
    if (status.ok()) {
      ++ci;
      ++turn;
      continue;
    }
    if (!absl::IsResourceExhausted(status)) return status;
    // The cap cannot hold what this chunk needs beside the rest: first go on
    // with one context, then free the idle contexts' buffers and this
    // context's own, once; a chunk that still does not fit is the answer.
    cudaStreamSynchronize(ctx.stream);
    ctx.pending.count = 0;
    if (ctxs.size() > 1) {
      ctx.ReleaseDeviceBuffers();
      Release(&ctx);
      ctxs.erase(std::find(ctxs.begin(), ctxs.end(), &ctx));
      counters_->Event("chunked_single_context", 1);
      status = absl::OkStatus();
      continue;
    }
    if (trimmed) return status;
    trimmed = true;
    TrimIdleContexts();
    ctx.ReleaseDeviceBuffers();
    status = absl::OkStatus();
  }
  std::move(finish).Invoke();
  if (status.ok()) {
    counters_->Served(v->served());
    if (chunks > 1) counters_->Event("host_chunks", static_cast<int64_t>(chunks));
  }
  return status;
}

VariantEnv CudaEngine::Env(const CallOptions& call) const {
  VariantEnv env;
  env.cancel = call.cancel;
  env.counters = counters_.get();
  env.device = PlanningDevice(sm_major_, sm_minor_, device_sms_, options_.max_sms);
  env.budget = Budget();
  env.kernels = kernels_.get();
  return env;
}

absl::Status CudaEngine::ComputePR(absl::Span<const MatrixView> batch,
                                   const VariantSpec& variant, absl::Span<double> out,
                                   const CallOptions& call) {
  absl::StatusOr<VariantKind> kind = CheckCudaCall(batch, variant, out);
  if (!kind.ok()) return kind.status();
  if (absl::Status lost = DeviceLost(); !lost.ok()) return lost;
  if (CancelRequested(call)) return CallCancelled();
  if (batch.empty()) return absl::OkStatus();
  const auto start = std::chrono::steady_clock::now();
  auto timed = absl::MakeCleanup([&] {
    counters_->AddMs("call", std::chrono::duration<double, std::milli>(
                                 std::chrono::steady_clock::now() - start)
                                 .count());
  });
  RVD_CUDA_RETURN_IF_ERROR(cudaSetDevice(options_.device));
  bool shared = false;
  absl::Status shared_status = ComputeShared(batch, *kind, variant, out, call, &shared);
  if (shared) return shared_status;
  return ComputeChunked(batch, *kind, variant, out, call);
}

absl::Status CudaEngine::ComputePRDevice(absl::Span<const MatrixView> device_batch,
                                         const VariantSpec& variant, absl::Span<double> out,
                                         void* ready, const CallOptions& call) {
  // A blocked view goes through the contract as the plain matrix it is
  // gathered into, then its blocking is checked.
  std::vector<MatrixView> views(device_batch.begin(), device_batch.end());
  std::vector<MatrixView> plain = views;
  for (MatrixView& v : plain) v.block_rows = v.block_stride = 0;
  absl::StatusOr<VariantKind> kind = CheckCudaCall(plain, variant, out);
  if (!kind.ok()) return kind.status();
  for (size_t i = 0; i < views.size(); ++i) {
    if (views[i].block_rows == 0) continue;
    if (absl::Status s = ValidateBlockedView(views[i], i); !s.ok()) return s;
  }
  if (absl::Status lost = DeviceLost(); !lost.ok()) return lost;
  if (CancelRequested(call)) return CallCancelled();
  if (device_batch.empty()) return absl::OkStatus();
  RVD_CUDA_RETURN_IF_ERROR(cudaSetDevice(options_.device));
  std::unique_ptr<Variant> v = NewVariant(*kind, variant, Env(call));
  Context* ctx = Acquire(true);
  absl::Status status;
  int64_t gathered = 0;
  {
    auto release = absl::MakeCleanup([&] { DrainAndRelease(ctx); });
    if (ready != nullptr) {
      status = cuda_internal::ToStatus(
          cudaStreamWaitEvent(ctx->stream, static_cast<cudaEvent_t>(ready), 0),
                                       "cudaStreamWaitEvent", __FILE__, __LINE__);
    }
    // After the caller's event: the gather reads what the producer wrote.
    if (status.ok() && v->Cancelled()) status = CallCancelled();
    if (status.ok()) status = GatherBlocked(*ctx, views, &gathered);
    if (status.ok()) status = EnqueueAndCollect(*ctx, *v, *kind, views, out);
  }
  if (status.ok() && gathered > 0) counters_->Event("device_gather", gathered);
  if (status.ok()) counters_->Served(v->served());
  return status;
}

}  // namespace rvd::cuda

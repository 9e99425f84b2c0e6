// The PR engine: computes the participation ratio of a batch of matrices.
//
//   PR(W) = (sum s_i^2)^2 / sum s_i^4 = ||W||_F^4 / ||G||_F^2,
//   G = W W^T when rows <= cols, else W^T W (the Gram on the smaller side).
//
// Every backend (CPU on OpenBLAS here; CUDA as a module loaded at run time)
// implements Engine. An Engine is thread-safe: several callers may call
// ComputePR at once; each call uses the engine's own workers.
// This header knows nothing of gRPC or of model files.
#ifndef RVD_KERNELS_ENGINE_H_
#define RVD_KERNELS_ENGINE_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"

namespace rvd {

class LiveDevice;  // kernels/live_device.h
class TuneDevice;  // kernels/tune_device.h

enum class DType { kF32, kF16, kBF16 };

// Bytes per element of `dtype`.
size_t DTypeSize(DType dtype);
// "f32", "f16", "bf16".
const char* DTypeName(DType dtype);

// A row-major matrix in memory the caller owns: element (i, j) is at
// data + (i * ld + j) * DTypeSize(dtype). Requires ld >= cols.
//
// Blocked (block_rows > 0): the rows come in blocks of block_rows rows, the
// starts of consecutive blocks block_stride elements apart, so element
// (i, j) is at data + ((i / block_rows) * block_stride + (i % block_rows) *
// ld + j) * DTypeSize(dtype). That is a V which is not one strided matrix
// in its tensor (gpt_neox's heads, each d rows between its Q and K rows:
// v_layout.h ViewV). Only ComputePRDevice takes a blocked view (the CUDA
// engine gathers it into a buffer of its own, on the device); host calls
// refuse it, their caller gathers (SliceV).
struct MatrixView {
  const void* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t ld = 0;  // elements between the starts of consecutive rows
  DType dtype = DType::kF32;
  int64_t block_rows = 0;    // 0: one strided matrix; else divides rows
  int64_t block_stride = 0;  // elements between block starts (blocked only)
};

// The same matrix in the same place.
inline bool operator==(const MatrixView& a, const MatrixView& b) {
  return a.data == b.data && a.rows == b.rows && a.cols == b.cols && a.ld == b.ld &&
         a.dtype == b.dtype && a.block_rows == b.block_rows &&
         a.block_stride == b.block_stride;
}

// Which estimator to run, and its parameters.
struct VariantSpec {
  std::string name;           // empty: the backend's default
  int probes = 64;            // power_iter: Hutchinson probes K
  int sketch_rank = 64;       // sketch: Gaussian sketch rank r
  uint64_t seed = 0;          // power_iter, sketch
  bool hutch_plus_plus = false;  // power_iter: Hutch++ instead of Hutchinson
};

// How a caller may stop one call early.
struct CallOptions {
  // When non-null and set (by any thread) while the call runs, the engine
  // stops at its next checkpoint (CPU: before each matrix, tile and part;
  // CUDA: before each chunk and each launch) and returns CANCELLED; `out`
  // then holds nothing to use, and the call counts nothing as served.
  // The flag must outlive the call. Set before the call: CANCELLED at once.
  const std::atomic<bool>* cancel = nullptr;
};

// The variant names every backend knows, in a fixed order.
// Exact: algebraic, naive, fused. Estimates: power_iter, sketch.
const std::vector<std::string>& KnownVariants();
bool IsExactVariant(const std::string& name);

// A snapshot of an engine's counters (Engine::Stats). Counters are
// cumulative since the engine was created; the rest is the state now.
struct EngineStats {
  // Matrices served per kernel path ("variant/kernel"): each matrix counted
  // once, by the kernel that served it (rvd_engine_matrices_total).
  std::map<std::string, int64_t> served;
  // Events that are not a kernel serving a matrix, e.g. "plan_reused",
  // "oracle_fallback" (rvd_engine_events_total).
  std::map<std::string, int64_t> events;
  // Seconds per phase of ComputePR (rvd_engine_seconds_total).
  std::map<std::string, double> phase_seconds;
  // Failed device calls by error name, e.g. "cudaErrorMemoryAllocation"
  // (rvd_engine_errors_total).
  std::map<std::string, int64_t> device_errors;
  // Each kernel technique's tuning knobs, e.g. "tma-wgmma-square" ->
  // "fused-v4-tma-wgmma-bt128s6c8w16d3p8" (for the log and rvd_kernel_info:
  // a retune changes these, never the technique names the counts use).
  std::map<std::string, std::string> kernel_policies;
  uint64_t device_bytes_held = 0;  // device memory in the engine's pools now
  uint64_t pinned_bytes_held = 0;  // page-locked host memory held now
  // False once the device is lost (a sticky CUDA error): every later call
  // fails until the engine is recreated. `unhealthy_reason` says why.
  bool healthy = true;
  std::string unhealthy_reason;
};

class Engine {
 public:
  virtual ~Engine() = default;

  // "cpu" or "cuda".
  virtual std::string Backend() const = 0;
  // Identifies the code that served a measurement, e.g. "cpu-openblas-1".
  virtual std::string Version() const = 0;
  // The variant used when VariantSpec::name is empty.
  virtual std::string DefaultVariant() const = 0;

  // Writes PR(batch[i]) to out[i] (out.size() == batch.size()).
  // A matrix whose entries are all zero has no spectrum: its PR is 0.
  // Errors: INVALID_ARGUMENT for a bad view or NaN/Inf in a matrix (the
  // message names the batch index), UNIMPLEMENTED for a variant this
  // backend does not have (the message names the backend), CANCELLED once
  // call.cancel is set (CallOptions). The overload without `call` cannot be
  // cancelled.
  virtual absl::Status ComputePR(absl::Span<const MatrixView> batch,
                                 const VariantSpec& variant, absl::Span<double> out,
                                 const CallOptions& call) = 0;
  absl::Status ComputePR(absl::Span<const MatrixView> batch, const VariantSpec& variant,
                         absl::Span<double> out) {
    return ComputePR(batch, variant, out, CallOptions());
  }

  // The same for matrices in device memory of this process (allocated
  // here, or another process's memory mapped here through CUDA IPC): the
  // engine's work waits for `ready`, a cudaEvent_t the producer recorded
  // after writing them (possibly an interprocess event), or nothing when
  // null. The bytes never pass through the host. Backends without a device
  // answer UNIMPLEMENTED.
  virtual absl::Status ComputePRDevice(absl::Span<const MatrixView> batch,
                                       const VariantSpec& variant, absl::Span<double> out,
                                       void* ready, const CallOptions& call) {
    (void)batch, (void)variant, (void)out, (void)ready, (void)call;
    return absl::UnimplementedError(
        absl::StrCat("the ", Backend(), " backend takes host memory only"));
  }
  absl::Status ComputePRDevice(absl::Span<const MatrixView> batch, const VariantSpec& variant,
                               absl::Span<double> out, void* ready) {
    return ComputePRDevice(batch, variant, out, ready, CallOptions());
  }

  // For activation statistics: the eigenvalues of the Gram of m's smaller
  // side (m m^T when rows <= cols, else m^T m), which are the squared
  // singular values of m: min(rows, cols) of them, ascending, into out.
  // Computed in float64 (a float64 Gram, then a symmetric eigensolver), so
  // rounding may leave values near 0 slightly negative (|x| within a few
  // max(rows, cols) * 2^-52 * max). m is host memory; the Gram is held whole
  // (min(rows, cols)^2 doubles: the caller bounds the side). Errors:
  // INVALID_ARGUMENT for a bad view, out.size() != min(rows, cols) or NaN/Inf
  // in m; RESOURCE_EXHAUSTED when the scratch cannot be had; CANCELLED once
  // call.cancel is set; UNIMPLEMENTED for a backend without it.
  virtual absl::Status GramEigenvalues(const MatrixView& m, absl::Span<double> out,
                                       const CallOptions& call) {
    (void)m, (void)out, (void)call;
    return absl::UnimplementedError(
        absl::StrCat("the ", Backend(), " backend has no Gram eigenvalues"));
  }

  // Everything an operator needs to see of the engine, cumulative counters
  // and the state now (EngineStats): which kernel served each matrix (the
  // proof of the path that ran), events, phase times, device errors,
  // memory held, health. Read at scrape time by server/metrics.cc's
  // collector, by the log line of each measurement and by the benchmarks.
  virtual EngineStats Stats() const = 0;

  // Host memory this engine copies from fastest, for the daemon's pooled
  // receive buffers (CUDA: page-locked); nullptr when it has none or the
  // allocation fails (ordinary memory serves then). Release with
  // FreeHostBuffer, before the engine is destroyed.
  virtual void* AllocateHostBuffer(uint64_t /*bytes*/) { return nullptr; }
  virtual void FreeHostBuffer(void* /*p*/) {}

  // The device side of live models (kernels/live_device.h): mapping a
  // trainer's CUDA IPC segments, snapshots of its weights. nullptr for a
  // backend without a device (the CPU engine) or a module without it.
  // Owned by the engine; valid while it lives.
  virtual LiveDevice* Live() { return nullptr; }

  // The device side of kernel tuning (kernels/tune_device.h): compiling a
  // candidate and running it under rvd's harness. nullptr for a backend
  // without a device or a module without the tuning table. Owned by the
  // engine; valid while it lives.
  virtual TuneDevice* Tune() { return nullptr; }
};

// The CPU engine on OpenBLAS. threads <= 0: one per core.
std::unique_ptr<Engine> NewCpuEngine(int threads);

// Settings of the CUDA engine, which lives in a module (librvd_cuda.so)
// that rvd loads at run time (kernels/cuda_module.h, server/backend.h).
struct CudaEngineOptions {
  int device = 0;                        // CUDA device ordinal
  int streams = 4;                       // stream pool size (low priority)
  uint64_t max_device_bytes = 4ull << 30;  // cap on device memory rvd holds
  // Most SMs the fused variant's kernels occupy, so that a trainer on the
  // same GPU keeps the rest; 0: every SM. Every fused launch (v4's
  // persistent grid, v1/v3 and the finalize taking their jobs round-robin)
  // has at most max_sms blocks (fused_plan.h, ProductGrid). The vendor
  // libraries' kernels (cuBLAS, cuSOLVER: algebraic, naive, estimators) are
  // not capped.
  int max_sms = 0;
};

// The float64 SVD reference: PR from the singular values of the matrix
// converted to double, with LAPACK's dgesdd. Slow; for tests and benchmarks.
absl::StatusOr<double> OraclePR(const MatrixView& m);

}  // namespace rvd

#endif  // RVD_KERNELS_ENGINE_H_

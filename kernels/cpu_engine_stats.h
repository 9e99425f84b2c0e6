// The CPU engine's internals that kernels/, its tests and the benchmark see
// (private to rvd; the daemon uses NewCpuEngine in engine.h):
//   - which path served the `algebraic` variant: the proof that the fast
//     path ran, and the way a test sees a silent float64 fallback (a Gram
//     kernel bug that corrupts the diagonal would otherwise hide behind the
//     correct fallback);
//   - the Gram scratch memory: held now, the peak, and the bound the engine
//     plans within, so that a test can assert a large layer stays bounded;
//   - an engine with its Gram kernel chosen explicitly, so that one test
//     binary runs both the AVX-512 and the OpenBLAS path on a machine that
//     has AVX-512.
//
// Thread-safe: process-wide relaxed atomic counters, summed over engines.
#ifndef RVD_KERNELS_CPU_ENGINE_STATS_H_
#define RVD_KERNELS_CPU_ENGINE_STATS_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "kernels/engine.h"

namespace rvd {

struct CpuEngineCounters {
  int64_t avx512_grams = 0;       // matrices whose Gram ran on our kernels
  int64_t openblas_grams = 0;     // ... on OpenBLAS ssyrk/sgemm
  int64_t float64_fallbacks = 0;  // matrices redone in float64 (dsyrk)
  // Bytes of the engines' scratch buffers (Grams, their tiles, converted
  // rows, estimator blocks) allocated now, and the most ever allocated at
  // once since the last ResetCpuScratchPeak().
  int64_t scratch_bytes_now = 0;
  int64_t scratch_bytes_peak = 0;
};

CpuEngineCounters GetCpuEngineCounters();
// Sets the peak to the bytes held now (start of a measured section).
void ResetCpuScratchPeak();

// The Gram kernel of the algebraic variant.
enum class CpuGramKernel {
  kAuto,      // AVX-512 when the CPU has it, unless RVD_CPU_GRAM=openblas
  kAvx512,    // our AVX-512 kernels (cpu-avx512-1)
  kOpenBlas,  // OpenBLAS ssyrk/sgemm (cpu-openblas-1): the portable path
};

// The Gram scratch a call may hold for its per-part partial tiles (split
// path), summed over the call's matrices; per-thread tile buffers come on
// top (CpuGramScratchBound).
inline constexpr uint64_t kDefaultGramScratchBudget = uint64_t{256} << 20;

struct CpuEngineOptions {
  int threads = 0;  // <= 0: one per core
  CpuGramKernel gram = CpuGramKernel::kAuto;
  uint64_t gram_scratch_budget = kDefaultGramScratchBudget;
  // A deliberate Gram kernel bug (each tile's last column dropped), so that
  // a test can show its checks catch a wrong kernel. Never in the daemon.
  bool gram_mutant_for_test = false;
};

// FAILED_PRECONDITION for kAvx512 on a CPU without AVX-512F.
absl::StatusOr<std::unique_ptr<Engine>> NewCpuEngineWithOptions(
    const CpuEngineOptions& options);

// Whether this CPU has AVX-512F (what kAuto checks).
bool CpuHasAvx512();

// How the algebraic variant computes one matrix's Gram, and the scratch
// bytes that costs at most: the Gram (n x n on the smaller side) is cut into
// square tiles of side `tile` (blocks x blocks, the upper triangle's
// blocks (blocks + 1) / 2 computed), each over `parts` ranges of the long
// side. parts > 1 holds every part's partial tiles until they are summed
// (held_bytes <= the budget); parts == 1 reduces each tile as soon as it is
// done, in the worker's own buffer.
struct CpuGramPlan {
  int64_t tile = 0;
  int64_t blocks = 0;
  int64_t parts = 1;
  uint64_t held_bytes = 0;        // partial tiles held at once
  uint64_t per_thread_bytes = 0;  // one worker's tile and conversion buffers
  uint64_t bound_bytes = 0;       // held + per_thread * min(threads, items)
};

// The plan for `v` alone in a call on `threads` threads (a batch smaller
// than the pool; threads == 1: a batch at least as large as the pool, one
// matrix per thread) within `budget`.
CpuGramPlan PlanCpuGram(const MatrixView& v, int threads, bool avx512,
                        uint64_t budget);

}  // namespace rvd

#endif  // RVD_KERNELS_CPU_ENGINE_STATS_H_

// Which path served the CPU engine's `algebraic` variant (private to
// kernels/, its tests and the benchmark): the proof that the fast path ran,
// and the way a test sees a silent float64 fallback (a Gram kernel bug that
// corrupts the diagonal would otherwise hide behind the correct fallback).
//
// Thread-safe: process-wide relaxed atomic counters, summed over engines.
#ifndef RVD_KERNELS_CPU_ENGINE_STATS_H_
#define RVD_KERNELS_CPU_ENGINE_STATS_H_

#include <cstdint>

namespace rvd {

struct CpuEngineCounters {
  int64_t avx512_grams = 0;       // matrices whose Gram ran on our kernels
  int64_t openblas_grams = 0;     // ... on OpenBLAS ssyrk
  int64_t float64_fallbacks = 0;  // matrices redone in float64 (dsyrk)
};

CpuEngineCounters GetCpuEngineCounters();

}  // namespace rvd

#endif  // RVD_KERNELS_CPU_ENGINE_STATS_H_

// The CPU engine on OpenBLAS (NewCpuEngine in engine.h).
//
// Variants, in the llm.c order (each names what differs):
//   algebraic  (exact, default) the Gram on the smaller side, upper
//              triangle, and its diagonal (= row sums of squares, so also
//              ||W||_F^2) in float64; ||G||_F^2 = sum diag^2 +
//              2 sum strict-upper^2 in float64. Gram kernel, by CPU:
//                cpu-avx512-1: our AVX-512 kernels (wide W: 4x4 blocks of
//                  dot products; tall W: 8x32 outer-product blocks; f32
//                  FMAs over K chunks, each chunk added in float64; the
//                  float64 diagonal fused in), ~1.3x OpenBLAS here;
//                cpu-openblas-1: cblas_ssyrk (no AVX-512, or
//                  RVD_CPU_GRAM=openblas), diagonal from a float64 pass.
//              Data whose squares leave f32's normal range is redone with
//              dsyrk in float64 (AlgebraicFloat64).
//   naive      (exact) float64 SVD with dgesdd, i.e. OraclePR.
//   power_iter (estimate) Hutchinson / Hutch++ for tr(G^2), G z = W (W^T z).
//   sketch     (estimate) Gaussian sketch Y = Omega W of rank r; the mean of
//              the squared off-diagonal entries of Y Y^T.
//   fused      a GPU kernel: UNIMPLEMENTED here.
//
// Threading: the engine owns a small pool (threads - 1 workers plus the
// calling thread). A batch is spread across matrices with OpenBLAS
// single-threaded inside each call; a batch smaller than the pool splits each
// large matrix along its long side into one Gram part per thread (the parts'
// Grams are summed in float64). OpenBLAS's own threading is switched off
// once, for the whole process, when the first CPU engine is created.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <cblas.h>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "kernels/cpu_engine_stats.h"
#include "kernels/dtype_convert.h"
#include "kernels/engine.h"
#include "kernels/estimator_math.h"
#include "kernels/estimator_rng.h"

namespace rvd {
namespace {

constexpr char kBackend[] = "cpu";
// Version() names the Gram kernel: our AVX-512 one, or OpenBLAS's ssyrk.
constexpr char kVersionAvx512[] = "cpu-avx512-1";
constexpr char kVersionOpenBlas[] = "cpu-openblas-1";
constexpr char kDefaultVariant[] = "algebraic";

// See cpu_engine_stats.h.
std::atomic<int64_t> g_avx512_grams{0};
std::atomic<int64_t> g_openblas_grams{0};
std::atomic<int64_t> g_float64_fallbacks{0};

// A matrix is split across threads only when its Gram costs at least this
// many multiply-adds (n^2 * long / 2); below it the split's overhead wins.
constexpr double kSplitMinFlops = 4.0e6;

// ---------------------------------------------------------------------------
// Sums of squares in float64. The data is f32; the products are exact in
// double (24-bit mantissas), so only the accumulation rounds, at 2^-53.

#if defined(__x86_64__)
__attribute__((target("avx2,fma"))) double SumSquaresAvx2(const float* x,
                                                          int64_t n) {
  __m256d a0 = _mm256_setzero_pd(), a1 = _mm256_setzero_pd();
  __m256d a2 = _mm256_setzero_pd(), a3 = _mm256_setzero_pd();
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) {
    const __m256 v0 = _mm256_loadu_ps(x + j);
    const __m256 v1 = _mm256_loadu_ps(x + j + 8);
    const __m256d d0 = _mm256_cvtps_pd(_mm256_castps256_ps128(v0));
    const __m256d d1 = _mm256_cvtps_pd(_mm256_extractf128_ps(v0, 1));
    const __m256d d2 = _mm256_cvtps_pd(_mm256_castps256_ps128(v1));
    const __m256d d3 = _mm256_cvtps_pd(_mm256_extractf128_ps(v1, 1));
    a0 = _mm256_fmadd_pd(d0, d0, a0);
    a1 = _mm256_fmadd_pd(d1, d1, a1);
    a2 = _mm256_fmadd_pd(d2, d2, a2);
    a3 = _mm256_fmadd_pd(d3, d3, a3);
  }
  const __m256d s = _mm256_add_pd(_mm256_add_pd(a0, a1), _mm256_add_pd(a2, a3));
  alignas(32) double lanes[4];
  _mm256_store_pd(lanes, s);
  double sum = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
  for (; j < n; ++j) sum += static_cast<double>(x[j]) * x[j];
  return sum;
}

__attribute__((target("avx2,fma"))) void AddSquaresAvx2(const float* x,
                                                        int64_t n,
                                                        double* acc) {
  int64_t j = 0;
  for (; j + 4 <= n; j += 4) {
    const __m256d d = _mm256_cvtps_pd(_mm_loadu_ps(x + j));
    _mm256_storeu_pd(acc + j, _mm256_fmadd_pd(d, d, _mm256_loadu_pd(acc + j)));
  }
  for (; j < n; ++j) acc[j] += static_cast<double>(x[j]) * x[j];
}

bool CpuHasAvx2Fma() {
  static const bool has =
      __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return has;
}
#endif

double SumSquares(const float* x, int64_t n) {
#if defined(__x86_64__)
  if (CpuHasAvx2Fma()) return SumSquaresAvx2(x, n);
#endif
  double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  int64_t j = 0;
  for (; j + 4 <= n; j += 4) {
    s0 += static_cast<double>(x[j]) * x[j];
    s1 += static_cast<double>(x[j + 1]) * x[j + 1];
    s2 += static_cast<double>(x[j + 2]) * x[j + 2];
    s3 += static_cast<double>(x[j + 3]) * x[j + 3];
  }
  for (; j < n; ++j) s0 += static_cast<double>(x[j]) * x[j];
  return (s0 + s1) + (s2 + s3);
}

// acc[j] += x[j]^2 for j < n.
void AddSquares(const float* x, int64_t n, double* acc) {
#if defined(__x86_64__)
  if (CpuHasAvx2Fma()) return AddSquaresAvx2(x, n, acc);
#endif
  for (int64_t j = 0; j < n; ++j) acc[j] += static_cast<double>(x[j]) * x[j];
}

// ---------------------------------------------------------------------------
// Per-thread scratch, reused across matrices and calls (no allocation per
// matrix once the buffers have grown to the largest shape seen).
struct Scratch {
  std::vector<float> conv;    // f16/bf16 rows converted to f32
  std::vector<double> gram;   // n x n, upper triangle
  std::vector<float> gram32;  // n x n, ssyrk's output
  std::vector<double> diag;   // n: float64 diagonal of the Gram
  std::vector<float> work_a;  // estimators: probe / sketch blocks
  std::vector<float> work_b;
  std::vector<float> work_c;
  std::vector<double> work_d;
};

Scratch& ThreadScratch() {
  thread_local Scratch scratch;
  return scratch;
}

// A thread keeps at most this much of each scratch buffer between matrices:
// one huge matrix must not pin its Gram in every worker for good.
constexpr size_t kScratchKeepBytes = size_t{64} << 20;

template <typename T>
void Trim(std::vector<T>& v) {
  if (v.capacity() * sizeof(T) > kScratchKeepBytes) std::vector<T>().swap(v);
}

void TrimThreadScratch() {
  Scratch& sc = ThreadScratch();
  Trim(sc.conv);
  Trim(sc.gram);
  Trim(sc.gram32);
  Trim(sc.diag);
  Trim(sc.work_a);
  Trim(sc.work_b);
  Trim(sc.work_c);
  Trim(sc.work_d);
}

template <typename T>
T* Grow(std::vector<T>& v, int64_t n) {
  if (static_cast<int64_t>(v.size()) < n) v.resize(static_cast<size_t>(n));
  return v.data();
}

// The shape facts every variant needs: W is `rows x cols`; the Gram is n x n
// on the smaller side; `len` is the long side (the Gram's inner dimension).
struct Shape {
  bool wide;    // rows <= cols: G = W W^T
  int64_t n;    // min(rows, cols)
  int64_t len;  // max(rows, cols)
};

Shape ShapeOf(const MatrixView& v) {
  const bool wide = v.rows <= v.cols;
  return {wide, wide ? v.rows : v.cols, wide ? v.cols : v.rows};
}

// An f32 block of W: rows [r0, r1) x cols [c0, c1), element (i, j) of the
// block at a[i * lda + j]. An f32 view is used in place; f16/bf16 rows are
// converted into `conv`.
struct F32Block {
  const float* a;
  int64_t lda;
};

F32Block LoadBlock(const MatrixView& v, int64_t r0, int64_t r1, int64_t c0,
                   int64_t c1, std::vector<float>& conv) {
  if (v.dtype == DType::kF32) {
    return {static_cast<const float*>(v.data) + r0 * v.ld + c0, v.ld};
  }
  const int64_t w = c1 - c0;
  float* dst = Grow(conv, (r1 - r0) * w);
  const auto* base = static_cast<const unsigned char*>(v.data);
  const size_t esize = DTypeSize(v.dtype);
  for (int64_t i = r0; i < r1; ++i) {
    ConvertRowToFloat(base + static_cast<size_t>(i * v.ld + c0) * esize,
                      v.dtype, w, dst + (i - r0) * w);
  }
  return {dst, w};
}

#if defined(__x86_64__)
// The wide Gram (rows <= cols) with AVX-512, accumulated into float64:
// g[i * n + j] += <row i, row j> for j >= i (upper triangle; the diagonal
// 4 x 4 blocks also write a few lower entries, which nobody reads).
//
// Why our own kernel: Debian's OpenBLAS 0.3.21 does not know this CPU (AMD
// family 26) and falls back to its AVX2 Haswell kernels; ssyrk then runs at
// ~75 GFLOP/s per core. This kernel is a 4 x 4 block of dot products, 16 zmm
// accumulators, 8 loads per 16 FMAs, over K chunks of kKChunk columns that
// stay in L2 (128 rows x 4 KB = 512 KB). Each chunk's lanes (sums of
// kKChunk / 16 products in f32) are reduced in float64, so the result is
// more accurate than ssyrk's single f32 accumulation over all of K.
constexpr int64_t kKChunk = 1024;

__attribute__((target("avx512f"))) inline double ReduceToDouble(__m512 v) {
  const __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(v));
  const __m512d hi = _mm512_cvtps_pd(
      _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
  return _mm512_reduce_add_pd(_mm512_add_pd(lo, hi));
}

// Adds the float64 squares of x[0..kv) (plus the masked tail) to *acc: the
// exact diagonal, fused into the diagonal blocks so the data is read once.
__attribute__((target("avx512f"))) inline void AddSquaresF64(const float* x,
                                                             int64_t kv,
                                                             __mmask16 tail,
                                                             double* acc) {
  __m512d lo = _mm512_setzero_pd(), hi = _mm512_setzero_pd();
  for (int64_t kk = 0; kk < kv; kk += 16) {
    const __m512 v = _mm512_loadu_ps(x + kk);
    const __m512d a = _mm512_cvtps_pd(_mm512_castps512_ps256(v));
    const __m512d b = _mm512_cvtps_pd(
        _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
    lo = _mm512_fmadd_pd(a, a, lo);
    hi = _mm512_fmadd_pd(b, b, hi);
  }
  if (tail) {
    const __m512 v = _mm512_maskz_loadu_ps(tail, x + kv);
    const __m512d a = _mm512_cvtps_pd(_mm512_castps512_ps256(v));
    const __m512d b = _mm512_cvtps_pd(
        _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
    lo = _mm512_fmadd_pd(a, a, lo);
    hi = _mm512_fmadd_pd(b, b, hi);
  }
  *acc += _mm512_reduce_add_pd(_mm512_add_pd(lo, hi));
}

// diag[i] += float64 sum of squares of row i (diag zeroed by the caller).
__attribute__((target("avx512f"))) void GramWideAvx512(const float* a,
                                                       int64_t lda, int64_t n,
                                                       int64_t k, double* g,
                                                       double* diag) {
  for (int64_t k0 = 0; k0 < k; k0 += kKChunk) {
    const int64_t kc = std::min(kKChunk, k - k0);
    const int64_t kv = kc & ~int64_t{15};
    const __mmask16 tail = static_cast<__mmask16>((1u << (kc - kv)) - 1u);
    for (int64_t i = 0; i < n; i += 4) {
      // Rows past the end repeat the last row; their results are dropped.
      const float* x[4];
      for (int r = 0; r < 4; ++r) x[r] = a + std::min(i + r, n - 1) * lda + k0;
      // While the chunk of rows i..i+3 is in L1: their exact diagonal.
      for (int r = 0; r < 4 && i + r < n; ++r) {
        AddSquaresF64(x[r], kv, tail, &diag[i + r]);
      }
      for (int64_t j = i; j < n; j += 4) {
        const float* y[4];
        for (int r = 0; r < 4; ++r)
          y[r] = a + std::min(j + r, n - 1) * lda + k0;
        __m512 c00 = _mm512_setzero_ps(), c01 = c00, c02 = c00, c03 = c00;
        __m512 c10 = c00, c11 = c00, c12 = c00, c13 = c00;
        __m512 c20 = c00, c21 = c00, c22 = c00, c23 = c00;
        __m512 c30 = c00, c31 = c00, c32 = c00, c33 = c00;
// A lambda would not inherit the function's target attribute: a macro.
#define RVD_GRAM_STEP(LOAD, OFF)                                   \
  do {                                                             \
    const __m512 x0 = LOAD(x[0] + (OFF)), x1 = LOAD(x[1] + (OFF)); \
    const __m512 x2 = LOAD(x[2] + (OFF)), x3 = LOAD(x[3] + (OFF)); \
    __m512 yy = LOAD(y[0] + (OFF));                                \
    c00 = _mm512_fmadd_ps(x0, yy, c00);                            \
    c10 = _mm512_fmadd_ps(x1, yy, c10);                            \
    c20 = _mm512_fmadd_ps(x2, yy, c20);                            \
    c30 = _mm512_fmadd_ps(x3, yy, c30);                            \
    yy = LOAD(y[1] + (OFF));                                       \
    c01 = _mm512_fmadd_ps(x0, yy, c01);                            \
    c11 = _mm512_fmadd_ps(x1, yy, c11);                            \
    c21 = _mm512_fmadd_ps(x2, yy, c21);                            \
    c31 = _mm512_fmadd_ps(x3, yy, c31);                            \
    yy = LOAD(y[2] + (OFF));                                       \
    c02 = _mm512_fmadd_ps(x0, yy, c02);                            \
    c12 = _mm512_fmadd_ps(x1, yy, c12);                            \
    c22 = _mm512_fmadd_ps(x2, yy, c22);                            \
    c32 = _mm512_fmadd_ps(x3, yy, c32);                            \
    yy = LOAD(y[3] + (OFF));                                       \
    c03 = _mm512_fmadd_ps(x0, yy, c03);                            \
    c13 = _mm512_fmadd_ps(x1, yy, c13);                            \
    c23 = _mm512_fmadd_ps(x2, yy, c23);                            \
    c33 = _mm512_fmadd_ps(x3, yy, c33);                            \
  } while (0)
#define RVD_LOAD_FULL(p) _mm512_loadu_ps(p)
#define RVD_LOAD_TAIL(p) _mm512_maskz_loadu_ps(tail, p)
        for (int64_t kk = 0; kk < kv; kk += 16)
          RVD_GRAM_STEP(RVD_LOAD_FULL, kk);
        if (tail) RVD_GRAM_STEP(RVD_LOAD_TAIL, kv);
#undef RVD_LOAD_TAIL
#undef RVD_LOAD_FULL
#undef RVD_GRAM_STEP
        const __m512 c[4][4] = {{c00, c01, c02, c03},
                                {c10, c11, c12, c13},
                                {c20, c21, c22, c23},
                                {c30, c31, c32, c33}};
        for (int r = 0; r < 4 && i + r < n; ++r) {
          for (int q = 0; q < 4 && j + q < n; ++q) {
            g[(i + r) * n + (j + q)] += ReduceToDouble(c[r][q]);
          }
        }
      }
    }
  }
}

// The tall Gram (rows > cols), G = W^T W, with AVX-512, into float64:
// g[i * n + j] += sum_r W[r][i] W[r][j] for j >= i (blocks that straddle the
// diagonal also write lower entries, which nobody reads), and diag[j] +=
// sum_r W[r][j]^2 in float64. A GEMM-style outer-product kernel: an 8 x 32
// block of G in 16 zmm accumulators; per row of W, 8 broadcasts and 2 loads
// feed 16 FMAs. Rows are taken kRowChunk at a time (128 KB for n = 128,
// L2-resident), each chunk's f32 sums added into float64.
constexpr int64_t kRowChunk = 256;

__attribute__((target("avx512f"))) void GramTallAvx512(const float* a,
                                                       int64_t lda, int64_t len,
                                                       int64_t n, double* g,
                                                       double* diag) {
  for (int64_t r0 = 0; r0 < len; r0 += kRowChunk) {
    const int64_t r1 = std::min(len, r0 + kRowChunk);
    for (int64_t r = r0; r < r1; ++r) AddSquares(a + r * lda, n, diag);
    for (int64_t i = 0; i < n; i += 8) {
      int64_t ii[8];  // rows of G; past the end: repeat the last, drop later
      for (int q = 0; q < 8; ++q) ii[q] = std::min(i + q, n - 1);
      for (int64_t j = i / 32 * 32; j < n; j += 32) {
        const int64_t w0 = std::clamp<int64_t>(n - j, 0, 16);
        const int64_t w1 = std::clamp<int64_t>(n - j - 16, 0, 16);
        const __mmask16 m0 = static_cast<__mmask16>((1u << w0) - 1u);
        const __mmask16 m1 = static_cast<__mmask16>((1u << w1) - 1u);
        __m512 c[8][2];
#pragma GCC unroll 8
        for (int q = 0; q < 8; ++q) {
          c[q][0] = _mm512_setzero_ps();
          c[q][1] = _mm512_setzero_ps();
        }
        for (int64_t r = r0; r < r1; ++r) {
          const float* row = a + r * lda;
          const __m512 y0 = _mm512_maskz_loadu_ps(m0, row + j);
          const __m512 y1 = _mm512_maskz_loadu_ps(m1, row + j + 16);
#pragma GCC unroll 8
          for (int q = 0; q < 8; ++q) {
            const __m512 x = _mm512_set1_ps(row[ii[q]]);
            c[q][0] = _mm512_fmadd_ps(x, y0, c[q][0]);
            c[q][1] = _mm512_fmadd_ps(x, y1, c[q][1]);
          }
        }
        // Copied out with constant indices, so that c stays in registers
        // through the loop above (a variable index would pin it to memory).
        __m512 res[8][2];
#pragma GCC unroll 8
        for (int q = 0; q < 8; ++q) {
          res[q][0] = c[q][0];
          res[q][1] = c[q][1];
        }
        for (int q = 0; q < 8 && i + q < n; ++q) {
          double* out = g + (i + q) * n + j;
          for (int h = 0; h < 2; ++h) {
            const __m512 v = res[q][h];
            const __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(v));
            const __m512d hi = _mm512_cvtps_pd(_mm256_castpd_ps(
                _mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
            const unsigned bits = h == 0 ? m0 : m1;
            const __mmask8 mlo = static_cast<__mmask8>(bits & 0xffu);
            const __mmask8 mhi = static_cast<__mmask8>(bits >> 8);
            double* o = out + 16 * h;
            _mm512_mask_storeu_pd(
                o, mlo, _mm512_add_pd(_mm512_maskz_loadu_pd(mlo, o), lo));
            _mm512_mask_storeu_pd(
                o + 8, mhi,
                _mm512_add_pd(_mm512_maskz_loadu_pd(mhi, o + 8), hi));
          }
        }
      }
    }
  }
}

bool CpuHasAvx512() {
  static const bool has = __builtin_cpu_supports("avx512f");
  return has;
}
#endif

// One part of the algebraic variant: the Gram over the long-side range
// [k0, k1) into `gram` (n x n float64, upper triangle), and the float64
// diagonal (row or column sums of squares over the range) into `diag`.
// `f32` is scratch for the ssyrk path.
void GramPart(const MatrixView& v, int64_t k0, int64_t k1, bool avx512,
              std::vector<float>& conv, std::vector<float>& f32, double* gram,
              double* diag) {
  const Shape s = ShapeOf(v);
  const int64_t k = k1 - k0;
  F32Block b;
  if (s.wide) {
#if defined(__x86_64__)
    if (avx512) {
      std::fill(gram, gram + s.n * s.n, 0.0);
      std::fill(diag, diag + s.n, 0.0);
      // f16/bf16 are converted one K chunk at a time, so the converted
      // block stays in L2 while the kernel reads it.
      const int64_t step = v.dtype == DType::kF32 ? k : kKChunk;
      for (int64_t c0 = k0; c0 < k1; c0 += step) {
        const int64_t c1 = std::min(k1, c0 + step);
        b = LoadBlock(v, 0, v.rows, c0, c1, conv);
        GramWideAvx512(b.a, b.lda, s.n, c1 - c0, gram, diag);
      }
      return;
    }
#endif
    b = LoadBlock(v, 0, v.rows, k0, k1, conv);
    for (int64_t i = 0; i < s.n; ++i) diag[i] = SumSquares(b.a + i * b.lda, k);
  } else {
#if defined(__x86_64__)
    if (avx512) {
      std::fill(gram, gram + s.n * s.n, 0.0);
      std::fill(diag, diag + s.n, 0.0);
      const int64_t step = v.dtype == DType::kF32 ? k : kRowChunk;
      for (int64_t r0 = k0; r0 < k1; r0 += step) {
        const int64_t r1 = std::min(k1, r0 + step);
        b = LoadBlock(v, r0, r1, 0, v.cols, conv);
        GramTallAvx512(b.a, b.lda, r1 - r0, s.n, gram, diag);
      }
      return;
    }
#endif
    b = LoadBlock(v, k0, k1, 0, v.cols, conv);
    std::fill(diag, diag + s.n, 0.0);
    for (int64_t r = 0; r < k; ++r) AddSquares(b.a + r * b.lda, s.n, diag);
  }
  float* g32 = Grow(f32, s.n * s.n);
  cblas_ssyrk(CblasRowMajor, CblasUpper, s.wide ? CblasNoTrans : CblasTrans,
              static_cast<int>(s.n), static_cast<int>(k), 1.0f, b.a,
              static_cast<int>(b.lda), 0.0f, g32, static_cast<int>(s.n));
  for (int64_t i = 0; i < s.n; ++i) {
    for (int64_t j = i; j < s.n; ++j) gram[i * s.n + j] = g32[i * s.n + j];
  }
}

// Multiply-adds of the Gram's upper triangle.
double GramFlops(const MatrixView& v) {
  const Shape s = ShapeOf(v);
  return 0.5 * static_cast<double>(s.n) * static_cast<double>(s.n) *
         static_cast<double>(s.len);
}

absl::Status NonFiniteError(size_t index) {
  return absl::InvalidArgumentError(
      absl::StrCat("batch[", index, "]: matrix contains NaN or Inf"));
}

// The float64 Gram fallback: used when the f32 Gram overflowed or underflowed
// (its diagonal disagrees with the float64 one), e.g. entries near 1e20 or
// 1e-25. Slower (dsyrk on a converted copy) but exact to float64 rounding.
double AlgebraicFloat64(const MatrixView& v) {
  g_float64_fallbacks.fetch_add(1, std::memory_order_relaxed);
  const Shape s = ShapeOf(v);
  std::vector<double> a(static_cast<size_t>(v.rows * v.cols));
  std::vector<float> row(static_cast<size_t>(v.cols));
  const auto* base = static_cast<const unsigned char*>(v.data);
  const size_t esize = DTypeSize(v.dtype);
  double scale = 0;
  for (int64_t i = 0; i < v.rows; ++i) {
    ConvertRowToFloat(base + static_cast<size_t>(i * v.ld) * esize, v.dtype,
                      v.cols, row.data());
    for (int64_t j = 0; j < v.cols; ++j) {
      a[i * v.cols + j] = row[j];
      scale = std::max(scale, std::fabs(static_cast<double>(row[j])));
    }
  }
  if (scale == 0) return 0.0;
  // Scale to max |w| = 1 so that no square can under- or overflow in double.
  for (double& x : a) x /= scale;
  std::vector<double> g(static_cast<size_t>(s.n * s.n));
  cblas_dsyrk(CblasRowMajor, CblasUpper, s.wide ? CblasNoTrans : CblasTrans,
              static_cast<int>(s.n), static_cast<int>(s.len), 1.0, a.data(),
              static_cast<int>(v.cols), 0.0, g.data(), static_cast<int>(s.n));
  double trace = 0, g2 = 0, off = 0;
  for (int64_t i = 0; i < s.n; ++i) {
    const double d = g[i * s.n + i];
    trace += d;
    g2 += d * d;
    for (int64_t j = i + 1; j < s.n; ++j)
      off += g[i * s.n + j] * g[i * s.n + j];
  }
  g2 += 2 * off;
  return g2 > 0 ? trace * trace / g2 : 0.0;
}

// PR from the parts of an algebraic Gram. Returns nullopt-like -1 when the
// f32 Gram cannot be trusted (the caller falls back to float64).
constexpr double kUntrusted = -1.0;

double FinishAlgebraic(int64_t n, absl::Span<const double* const> grams,
                       absl::Span<const double* const> diags, bool* finite) {
  double trace = 0, sum_diag2 = 0, max_diag = 0;
  bool trusted = true;
  for (int64_t i = 0; i < n; ++i) {
    double d = 0, gd = 0;
    for (size_t p = 0; p < diags.size(); ++p) {
      d += diags[p][i];
      gd += grams[p][i * n + i];
    }
    trace += d;
    sum_diag2 += d * d;
    max_diag = std::max(max_diag, d);
    // The f32 diagonal must agree with the float64 one (a sanity check: the
    // rounding error alone is far below 1e-3).
    if (!(std::fabs(gd - d) <= 1e-3 * d)) trusted = false;
  }
  *finite = std::isfinite(trace);
  if (!*finite) return 0.0;
  if (trace == 0.0) return 0.0;  // all zero: no spectrum, PR 0
  // f32 products and sums are exact to ~1e-7 only between the denormals and
  // FLT_MAX: every |G_ij| <= max diag, and a product flushed to a denormal
  // errs by ~1e-45 absolute, negligible iff max diag >= 1e-30. Outside that
  // range (e.g. all entries ~1e-21: squares are denormal) use float64.
  if (!(max_diag >= 1e-30 && max_diag <= 1e36)) trusted = false;
  if (!trusted) return kUntrusted;
  double off = 0;
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = i + 1; j < n; ++j) {
      double x = 0;
      for (const double* g : grams) x += g[i * n + j];
      off += x * x;
    }
  }
  const double g2 = sum_diag2 + 2.0 * off;
  if (!std::isfinite(g2) || g2 <= 0) return kUntrusted;
  return trace * trace / g2;
}

absl::StatusOr<double> AlgebraicOne(const MatrixView& v, size_t index,
                                    bool avx512) {
  Scratch& sc = ThreadScratch();
  const Shape s = ShapeOf(v);
  double* gram = Grow(sc.gram, s.n * s.n);
  double* diag = Grow(sc.diag, s.n);
  GramPart(v, 0, s.len, avx512, sc.conv, sc.gram32, gram, diag);
  bool finite = true;
  const double* grams[1] = {gram};
  const double* diags[1] = {diag};
  const double pr = FinishAlgebraic(s.n, grams, diags, &finite);
  if (!finite) return NonFiniteError(index);
  (avx512 ? g_avx512_grams : g_openblas_grams)
      .fetch_add(1, std::memory_order_relaxed);
  if (pr == kUntrusted) return AlgebraicFloat64(v);
  return pr;
}


// The float64 trace of G (= ||W||_F^2) from one pass over an f32 block.
double TraceOf(const F32Block& b, const MatrixView& v) {
  double t = 0;
  for (int64_t i = 0; i < v.rows; ++i) t += SumSquares(b.a + i * b.lda, v.cols);
  return t;
}

// out (n x m, row-major) = G z for the m columns of z (n x m, row-major),
// as W (W^T z) or W^T (W z), without forming G. `tmp` holds len x m.
void GramTimes(const F32Block& b, const Shape& s, const float* z, int64_t m,
               float* tmp, float* out) {
  const int n = static_cast<int>(s.n), len = static_cast<int>(s.len);
  const int mm = static_cast<int>(m), lda = static_cast<int>(b.lda);
  if (s.wide) {  // W is n x len: tmp = W^T z (len x m); out = W tmp.
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, len, mm, n, 1.0f, b.a,
                lda, z, mm, 0.0f, tmp, mm);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, mm, len, 1.0f,
                b.a, lda, tmp, mm, 0.0f, out, mm);
  } else {  // W is len x n: tmp = W z (len x m); out = W^T tmp.
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, len, mm, n, 1.0f,
                b.a, lda, z, mm, 0.0f, tmp, mm);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, mm, len, 1.0f, b.a,
                lda, tmp, mm, 0.0f, out, mm);
  }
}

double FrobeniusSquared(const float* x, int64_t n) { return SumSquares(x, n); }

// Hutchinson: tr(G^2) = E ||G z||^2 for Rademacher z; K probes.
// Hutch++ (Meyer, Musco, Musco, Woodruff 2021) with the same budget of K
// products G x: m = K/3 for the range sketch G S, m for G Q, K - 2m probes
// of the deflated remainder: tr(G^2) = ||G Q||_F^2 + E ||G (I - QQ^T) z||^2.
// The random draws depend only on the seed, so an estimate depends only on
// (matrix, spec), not on its place in the batch or the thread that ran it.
absl::StatusOr<double> PowerIterOne(const MatrixView& v, const VariantSpec& sp,
                                    size_t index) {
  Scratch& sc = ThreadScratch();
  const Shape s = ShapeOf(v);
  const F32Block b = LoadBlock(v, 0, v.rows, 0, v.cols, sc.conv);
  const double trace = TraceOf(b, v);
  if (!std::isfinite(trace)) return NonFiniteError(index);
  if (trace == 0) return 0.0;
  EstimatorRng rng(sp.seed);
  const int64_t k = sp.probes;
  const int64_t m = sp.hutch_plus_plus && k >= 3 ? k / 3 : 0;
  const int64_t probes = k - 2 * m;
  const int64_t width = std::max<int64_t>(probes, m);
  float* z = Grow(sc.work_a, s.n * width);
  float* gz = Grow(sc.work_b, s.n * width);
  float* tmp = Grow(sc.work_c, s.len * width);
  double g2 = 0;
  std::vector<float> q;
  if (m > 0) {
    rng.Rademacher(z, s.n * m);
    q.resize(static_cast<size_t>(s.n * m));
    GramTimes(b, s, z, m, tmp, q.data());
    Orthonormalize(q.data(), s.n, m, sc.work_d);
    GramTimes(b, s, q.data(), m, tmp, gz);
    g2 += FrobeniusSquared(gz, s.n * m);
  }
  rng.Rademacher(z, s.n * probes);
  if (m > 0) {  // z -= Q (Q^T z)
    std::vector<float> qtz(static_cast<size_t>(m * probes));
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, static_cast<int>(m),
                static_cast<int>(probes), static_cast<int>(s.n), 1.0f, q.data(),
                static_cast<int>(m), z, static_cast<int>(probes), 0.0f,
                qtz.data(), static_cast<int>(probes));
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans,
                static_cast<int>(s.n), static_cast<int>(probes),
                static_cast<int>(m), -1.0f, q.data(), static_cast<int>(m),
                qtz.data(), static_cast<int>(probes), 1.0f, z,
                static_cast<int>(probes));
  }
  GramTimes(b, s, z, probes, tmp, gz);
  g2 += FrobeniusSquared(gz, s.n * probes) / static_cast<double>(probes);
  return ClampedPR(trace, g2, s.n);
}

// Gaussian sketch of rank r on the smaller side: Omega is r x n, N(0, 1);
// Y = Omega W (wide) or W Omega^T (tall), and M = Omega G Omega^T (r x r).
// For k != l, E[M_kl^2] = E[w_k^T G w_l w_l^T G w_k] = tr(G^2), so the mean
// of the r(r-1) off-diagonal squares is an unbiased estimate of ||G||_F^2.
// (The diagonal is not used: E[M_kk^2] = tr(G)^2 + 2 tr(G^2) buries tr(G^2)
// under tr(G)^2 when PR is large.) Its relative standard deviation is about
// sqrt(4/r^2 + 8 tr(G^4) / (r tr(G^2)^2)): the second term is a floor set by
// the spectrum (rows of Y are r samples of N(0, W^T W), and 8 tr(G^4)/r is
// the variance any estimator of tr(G^2) from r such samples has). For
// s_i = i^-0.7 that is ~58% at r=16 and ~20% at r=128 (measured: 50%, 15%
// mean absolute); for Gaussian W it is far smaller. For r = 1 there is no
// off-diagonal, and (M_00^2 - tr(G)^2) / 2 is the unbiased (high-variance)
// fallback.
absl::StatusOr<double> SketchOne(const MatrixView& v, const VariantSpec& sp,
                                 size_t index) {
  Scratch& sc = ThreadScratch();
  const Shape s = ShapeOf(v);
  const F32Block b = LoadBlock(v, 0, v.rows, 0, v.cols, sc.conv);
  const double trace = TraceOf(b, v);
  if (!std::isfinite(trace)) return NonFiniteError(index);
  if (trace == 0) return 0.0;
  EstimatorRng rng(sp.seed);
  const int64_t r = sp.sketch_rank;
  float* omega = Grow(sc.work_a, r * s.n);
  float* y = Grow(sc.work_b, r * s.len);
  float* mm = Grow(sc.work_c, r * r);
  rng.Gaussian(omega, r * s.n);
  const int n = static_cast<int>(s.n), len = static_cast<int>(s.len);
  const int ri = static_cast<int>(r), lda = static_cast<int>(b.lda);
  if (s.wide) {  // Y (r x len) = Omega (r x n) W (n x len)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, ri, len, n, 1.0f,
                omega, n, b.a, lda, 0.0f, y, len);
  } else {  // Y^T (r x len) = Omega (r x n) W^T (n x len)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, ri, len, n, 1.0f,
                omega, n, b.a, lda, 0.0f, y, len);
  }
  cblas_ssyrk(CblasRowMajor, CblasUpper, CblasNoTrans, ri, len, 1.0f, y, len,
              0.0f, mm, ri);
  double g2;
  if (r == 1) {
    const double m00 = mm[0];
    g2 = (m00 * m00 - trace * trace) / 2.0;
  } else {
    double off = 0;
    for (int64_t k = 0; k < r; ++k) {
      for (int64_t l = k + 1; l < r; ++l) {
        off += static_cast<double>(mm[k * r + l]) * mm[k * r + l];
      }
    }
    g2 = 2.0 * off / static_cast<double>(r * (r - 1));
  }
  if (!std::isfinite(g2)) return NonFiniteError(index);
  return ClampedPR(trace, g2, s.n);
}

absl::StatusOr<double> NaiveOne(const MatrixView& v, size_t index) {
  absl::StatusOr<double> pr = OraclePR(v);
  if (!pr.ok() && absl::IsInvalidArgument(pr.status())) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch[", index, "]: ", pr.status().message()));
  }
  return pr;
}

// ---------------------------------------------------------------------------
// A fixed pool: threads - 1 workers; the calling thread is the last worker.
// Several callers may run ParallelFor at once; their items interleave.
class WorkerPool {
 public:
  explicit WorkerPool(int threads) {
    for (int i = 1; i < threads; ++i) workers_.emplace_back([this] { Loop(); });
  }
  ~WorkerPool() {
    {
      absl::MutexLock lock(&mu_);
      shutting_down_ = true;
    }
    for (std::thread& t : workers_) t.join();
  }
  int size() const { return static_cast<int>(workers_.size()) + 1; }

  // Runs fn(i) for every i in [0, n); returns when all have returned.
  void ParallelFor(int64_t n, const std::function<void(int64_t)>& fn) {
    if (n <= 0) return;
    auto state = std::make_shared<ForState>();
    state->n = n;
    state->fn = &fn;
    const int64_t helpers = std::min<int64_t>(n - 1, workers_.size());
    if (helpers > 0) {
      absl::MutexLock lock(&mu_);
      for (int64_t h = 0; h < helpers; ++h) queue_.push_back(state);
    }
    RunItems(*state);
    absl::MutexLock lock(&state->mu);
    state->mu.Await(absl::Condition(
        +[](ForState* st) { return st->done == st->n; }, state.get()));
  }

 private:
  struct ForState {
    std::atomic<int64_t> next{0};
    int64_t n = 0;
    const std::function<void(int64_t)>* fn = nullptr;  // valid while done < n
    absl::Mutex mu;
    int64_t done ABSL_GUARDED_BY(mu) = 0;
  };

  static void RunItems(ForState& st) {
    for (int64_t i; (i = st.next.fetch_add(1)) < st.n;) {
      (*st.fn)(i);
      absl::MutexLock lock(&st.mu);
      ++st.done;
    }
  }

  void Loop() {
    for (;;) {
      std::shared_ptr<ForState> st;
      {
        absl::MutexLock lock(&mu_);
        mu_.Await(absl::Condition(
            +[](WorkerPool* p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(p->mu_) {
              return p->shutting_down_ || !p->queue_.empty();
            },
            this));
        if (queue_.empty()) return;  // shutting down with nothing queued
        st = std::move(queue_.front());
        queue_.erase(queue_.begin());
      }
      RunItems(*st);
    }
  }

  absl::Mutex mu_;
  std::vector<std::shared_ptr<ForState>> queue_ ABSL_GUARDED_BY(mu_);
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> workers_;
};

absl::Status ValidateView(const MatrixView& v, size_t index) {
  if (v.data == nullptr || v.rows <= 0 || v.cols <= 0 || v.ld < v.cols) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch[", index, "]: bad matrix view (data ",
                     v.data == nullptr ? "null" : "set", ", rows ", v.rows,
                     ", cols ", v.cols, ", ld ", v.ld, ")"));
  }
  // BLAS takes int dimensions.
  if (v.rows > INT32_MAX || v.cols > INT32_MAX || v.ld > INT32_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch[", index, "]: dimensions exceed 2^31"));
  }
  return absl::OkStatus();
}

class CpuEngine : public Engine {
 public:
  // avx512: the wide Gram runs on GramWideAvx512; otherwise on ssyrk.
  CpuEngine(int threads, bool avx512) : avx512_(avx512), pool_(threads) {}

  std::string Backend() const override { return kBackend; }
  std::string Version() const override {
    return avx512_ ? kVersionAvx512 : kVersionOpenBlas;
  }
  std::string DefaultVariant() const override { return kDefaultVariant; }

  // The algebraic variant's Gram paths (process-wide counters: one engine
  // per daemon). Every path is listed, zeros included.
  std::map<std::string, int64_t> ServedCounts() const override {
    const CpuEngineCounters c = GetCpuEngineCounters();
    return {{"algebraic/cpu-avx512", c.avx512_grams},
            {"algebraic/openblas-ssyrk", c.openblas_grams},
            {"algebraic/float64-fallback", c.float64_fallbacks}};
  }

  absl::Status ComputePR(absl::Span<const MatrixView> batch,
                         const VariantSpec& variant,
                         absl::Span<double> out) override {
    if (out.size() != batch.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "out has ", out.size(), " slots for a batch of ", batch.size()));
    }
    // Poison the output: a slot nobody wrote reads as NaN.
    std::fill(out.begin(), out.end(), std::numeric_limits<double>::quiet_NaN());
    const std::string name =
        variant.name.empty() ? std::string(kDefaultVariant) : variant.name;
    enum class Kind { kAlgebraic, kNaive, kPowerIter, kSketch } kind;
    if (name == "algebraic") {
      kind = Kind::kAlgebraic;
    } else if (name == "naive") {
      kind = Kind::kNaive;
    } else if (name == "power_iter") {
      kind = Kind::kPowerIter;
      if (variant.probes < 1) {
        return absl::InvalidArgumentError(
            absl::StrCat("power_iter needs probes >= 1, got ", variant.probes));
      }
    } else if (name == "sketch") {
      kind = Kind::kSketch;
      if (variant.sketch_rank < 1) {
        return absl::InvalidArgumentError(absl::StrCat(
            "sketch needs sketch_rank >= 1, got ", variant.sketch_rank));
      }
    } else if (name == "fused") {
      return absl::UnimplementedError(
          "variant 'fused' is a GPU kernel; not implemented on the cpu "
          "backend");
    } else {
      return absl::UnimplementedError(absl::StrCat(
          "unknown variant '", name, "' on the cpu backend (known: ",
          absl::StrJoin(KnownVariants(), ", "), ")"));
    }
    for (size_t i = 0; i < batch.size(); ++i) {
      absl::Status s = ValidateView(batch[i], i);
      if (!s.ok()) return s;
    }

    std::vector<absl::Status> errors(batch.size());
    if (kind == Kind::kAlgebraic &&
        static_cast<int>(batch.size()) < pool_.size() &&
        std::any_of(batch.begin(), batch.end(), [](const MatrixView& v) {
          return GramFlops(v) >= kSplitMinFlops;
        })) {
      return SplitAlgebraic(batch, out);
    }
    pool_.ParallelFor(static_cast<int64_t>(batch.size()), [&](int64_t i) {
      const MatrixView& v = batch[i];
      absl::StatusOr<double> pr;
      switch (kind) {
        case Kind::kAlgebraic:
          pr = AlgebraicOne(v, i, avx512_);
          break;
        case Kind::kNaive:
          pr = NaiveOne(v, i);
          break;
        case Kind::kPowerIter:
          pr = PowerIterOne(v, variant, i);
          break;
        case Kind::kSketch:
          pr = SketchOne(v, variant, i);
          break;
      }
      TrimThreadScratch();
      if (pr.ok()) {
        out[i] = *pr;
      } else {
        errors[i] = pr.status();
      }
    });
    for (const absl::Status& s : errors) {
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }

 private:
  // A batch smaller than the pool: each large matrix is cut along its long
  // side into one part per thread; the parts' float64 Grams are summed. Small
  // matrices stay whole.
  absl::Status SplitAlgebraic(absl::Span<const MatrixView> batch,
                              absl::Span<double> out) {
    struct Part {
      size_t matrix;
      int64_t k0, k1;
      std::vector<float> conv, gram32;
      std::vector<double> gram, diag;
    };
    std::vector<Part> parts;
    std::vector<std::pair<size_t, size_t>> ranges(
        batch.size());  // [first, last)
    const int threads = pool_.size();
    for (size_t i = 0; i < batch.size(); ++i) {
      const Shape s = ShapeOf(batch[i]);
      int64_t pieces = GramFlops(batch[i]) >= kSplitMinFlops ? threads : 1;
      pieces = std::min<int64_t>(pieces, s.len);
      ranges[i].first = parts.size();
      for (int64_t p = 0; p < pieces; ++p) {
        Part part;
        part.matrix = i;
        part.k0 = s.len * p / pieces;
        part.k1 = s.len * (p + 1) / pieces;
        parts.push_back(std::move(part));
      }
      ranges[i].second = parts.size();
    }
    pool_.ParallelFor(static_cast<int64_t>(parts.size()), [&](int64_t j) {
      Part& p = parts[j];
      const MatrixView& v = batch[p.matrix];
      const int64_t n = ShapeOf(v).n;
      p.gram.resize(static_cast<size_t>(n * n));
      p.diag.resize(static_cast<size_t>(n));
      GramPart(v, p.k0, p.k1, avx512_, p.conv, p.gram32, p.gram.data(),
               p.diag.data());
    });
    for (size_t i = 0; i < batch.size(); ++i) {
      std::vector<const double*> grams;
      std::vector<const double*> diags;
      for (size_t j = ranges[i].first; j < ranges[i].second; ++j) {
        grams.push_back(parts[j].gram.data());
        diags.push_back(parts[j].diag.data());
      }
      bool finite = true;
      const double pr =
          FinishAlgebraic(ShapeOf(batch[i]).n, grams, diags, &finite);
      if (!finite) return NonFiniteError(i);
      (avx512_ ? g_avx512_grams : g_openblas_grams)
          .fetch_add(1, std::memory_order_relaxed);
      out[i] = pr == kUntrusted ? AlgebraicFloat64(batch[i]) : pr;
    }
    return absl::OkStatus();
  }

  const bool avx512_;  // Gram kernel choice, fixed at construction
  WorkerPool pool_;
};

}  // namespace

CpuEngineCounters GetCpuEngineCounters() {
  CpuEngineCounters c;
  c.avx512_grams = g_avx512_grams.load(std::memory_order_relaxed);
  c.openblas_grams = g_openblas_grams.load(std::memory_order_relaxed);
  c.float64_fallbacks = g_float64_fallbacks.load(std::memory_order_relaxed);
  return c;
}

std::unique_ptr<Engine> NewCpuEngine(int threads) {
  if (threads <= 0) {
    threads =
        static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  }
  // Our pool is the parallelism; OpenBLAS runs in the calling thread. This is
  // process-wide (OpenBLAS 0.3.21 has no per-thread setting).
  static std::once_flag once;
  std::call_once(once, [] { openblas_set_num_threads(1); });
  // RVD_CPU_GRAM=openblas forces ssyrk (for A-B comparisons in one binary).
  const char* gram = std::getenv("RVD_CPU_GRAM");
  bool avx512 = gram == nullptr || std::string(gram) != "openblas";
#if defined(__x86_64__)
  avx512 = avx512 && CpuHasAvx512();
#else
  avx512 = false;
#endif
  return std::make_unique<CpuEngine>(threads, avx512);
}

}  // namespace rvd

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
//                  float64 diagonal fused in), ~1.3x OpenBLAS;
//                cpu-openblas-1: OpenBLAS ssyrk/sgemm (no AVX-512,
//                  RVD_CPU_GRAM=openblas, or CpuGramKernel::kOpenBlas),
//                  diagonal from a float64 pass.
//              Data whose squares leave f32's normal range is redone with
//              dsyrk/dgemm in float64 (AlgebraicFloat64).
//   naive      (exact) float64 SVD with dgesdd: the oracle's code (SvdPR).
//   power_iter (estimate) Hutchinson / Hutch++ for tr(G^2), G z = W (W^T z).
//   sketch     (estimate) Gaussian sketch Y = Omega W of rank r; the mean of
//              the squared off-diagonal entries of Y Y^T.
//   fused      a GPU kernel: UNIMPLEMENTED here.
//
// Memory: the Gram is never held whole when it is large. It is cut into
// square tiles of side kGramTile (a matrix with n <= kGramTile is one tile)
// and only the upper triangle's tiles are computed; a tile's sums (its
// squares, its diagonal) are taken as soon as it is complete. So a worker
// holds one tile, never n x n, and a call's scratch is bounded by the
// budget below plus one tile per worker (PlanCpuGram), whatever n is.
//
// Threading: the engine owns a small pool (threads - 1 workers plus the
// calling thread). A batch is spread across matrices with OpenBLAS
// single-threaded inside each call. A batch smaller than the pool spreads
// each large matrix's tiles across the threads, and when there are fewer
// tiles than threads also cuts the long side into parts whose partial
// tiles are summed in float64 before they are squared; the parts' buffers
// are held at once, so their number is capped by the call's scratch budget.
// OpenBLAS's own threading is switched off once, for the whole process,
// when the first CPU engine is created.
//
// Cancellation (CallOptions::cancel): every matrix, every tile of the
// algebraic variant and every part of a split matrix starts by looking at
// the flag, so a cancelled call ends within one tile's work per thread
// (a BLAS or LAPACK call in progress is never interrupted).
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
#include <new>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#if defined(__x86_64__)
// GCC 12's AVX-512 intrinsics trip -Wmaybe-uninitialized on their own
// placeholder operands (`__m512d __Y = __Y;`, GCC bug 105593, fixed in 13).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#endif

#include <cblas.h>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "kernels/call_contract.h"
#include "kernels/cpu_engine_stats.h"
#include "kernels/dtype_convert.h"
#include "kernels/engine.h"
#include "kernels/estimator_math.h"
#include "kernels/estimator_rng.h"
#include "kernels/gram_eigen.h"
#include "kernels/oracle_svd.h"

namespace rvd {
namespace {

constexpr char kBackend[] = "cpu";
// Version() names the Gram kernel: our AVX-512 one, or OpenBLAS's.
constexpr char kVersionAvx512[] = "cpu-avx512-1";
constexpr char kVersionOpenBlas[] = "cpu-openblas-1";
constexpr char kDefaultVariant[] = "algebraic";

// See cpu_engine_stats.h.
std::atomic<int64_t> g_avx512_grams{0};
std::atomic<int64_t> g_openblas_grams{0};
std::atomic<int64_t> g_float64_fallbacks{0};
std::atomic<int64_t> g_scratch_now{0};
std::atomic<int64_t> g_scratch_peak{0};

// A matrix is split across threads only when its Gram costs at least this
// many multiply-adds (n^2 * long / 2); below it the split's overhead wins.
constexpr double kSplitMinFlops = 4.0e6;

// The Gram's tile side. A tile is 2 MiB of float64 (plus 1 MiB of f32 on
// the OpenBLAS path). Every shape with n <= 512 (the per-head and most
// per-layer V blocks) is one tile: computed exactly as an untiled Gram.
constexpr int64_t kGramTile = 512;

void CountScratch(int64_t delta) {
  const int64_t now =
      g_scratch_now.fetch_add(delta, std::memory_order_relaxed) + delta;
  int64_t peak = g_scratch_peak.load(std::memory_order_relaxed);
  while (now > peak && !g_scratch_peak.compare_exchange_weak(
                           peak, now, std::memory_order_relaxed)) {
  }
}

// A growable buffer whose capacity is counted in the scratch counters.
// Grow may throw std::bad_alloc; ComputePR turns that into
// RESOURCE_EXHAUSTED.
template <typename T>
class ScratchBuffer {
 public:
  ScratchBuffer() = default;
  ScratchBuffer(ScratchBuffer&& other) noexcept
      : v_(std::move(other.v_)), counted_(other.counted_) {
    other.counted_ = 0;
  }
  ScratchBuffer& operator=(ScratchBuffer&&) = delete;
  ~ScratchBuffer() { Release(); }

  // At least n elements (contents kept up to the old size).
  T* Grow(int64_t n) {
    if (static_cast<int64_t>(v_.size()) < n) {
      v_.resize(static_cast<size_t>(n));
      Recount();
    }
    return v_.data();
  }
  T* data() { return v_.data(); }
  void Release() {
    std::vector<T>().swap(v_);
    Recount();
  }
  // A thread keeps at most `keep` bytes between matrices: one huge matrix
  // must not pin its buffers in every worker for good.
  void Trim(size_t keep) {
    if (v_.capacity() * sizeof(T) > keep) Release();
  }

 private:
  void Recount() {
    const int64_t bytes = static_cast<int64_t>(v_.capacity() * sizeof(T));
    if (bytes != counted_) CountScratch(bytes - counted_);
    counted_ = bytes;
  }
  std::vector<T> v_;
  int64_t counted_ = 0;
};

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
  ScratchBuffer<float> conv_x;  // f16/bf16 rows converted to f32
  ScratchBuffer<float> conv_y;  // ... the second operand of a tile
  ScratchBuffer<double> gram;   // one tile, float64
  ScratchBuffer<float> gram32;  // one tile, OpenBLAS's f32 output
  ScratchBuffer<double> diag;   // one tile's float64 diagonal
  ScratchBuffer<double> f64_x;  // float64 fallback: scaled operand blocks
  ScratchBuffer<double> f64_y;
  ScratchBuffer<float> work_a;  // estimators: probe / sketch blocks
  ScratchBuffer<float> work_b;
  ScratchBuffer<float> work_c;
  std::vector<double> work_d;  // power_iter: Orthonormalize's float64 copy
};

Scratch& ThreadScratch() {
  thread_local Scratch scratch;
  return scratch;
}

constexpr size_t kScratchKeepBytes = size_t{64} << 20;

void TrimThreadScratch() {
  Scratch& sc = ThreadScratch();
  sc.conv_x.Trim(kScratchKeepBytes);
  sc.conv_y.Trim(kScratchKeepBytes);
  sc.gram.Trim(kScratchKeepBytes);
  sc.gram32.Trim(kScratchKeepBytes);
  sc.diag.Trim(kScratchKeepBytes);
  sc.f64_x.Trim(kScratchKeepBytes);
  sc.f64_y.Trim(kScratchKeepBytes);
  sc.work_a.Trim(kScratchKeepBytes);
  sc.work_b.Trim(kScratchKeepBytes);
  sc.work_c.Trim(kScratchKeepBytes);
  if (sc.work_d.capacity() * sizeof(double) > kScratchKeepBytes) {
    std::vector<double>().swap(sc.work_d);
  }
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
                   int64_t c1, ScratchBuffer<float>& conv) {
  if (v.dtype == DType::kF32) {
    return {static_cast<const float*>(v.data) + r0 * v.ld + c0, v.ld};
  }
  const int64_t w = c1 - c0;
  float* dst = conv.Grow((r1 - r0) * w);
  const auto* base = static_cast<const unsigned char*>(v.data);
  const size_t esize = DTypeSize(v.dtype);
  for (int64_t i = r0; i < r1; ++i) {
    ConvertRowToFloat(base + static_cast<size_t>(i * v.ld + c0) * esize,
                      v.dtype, w, dst + (i - r0) * w);
  }
  return {dst, w};
}

#if defined(__x86_64__)
// GCC 12 reports the _mm512_undefined_* operands inside its own intrinsic
// headers as maybe-uninitialized once these kernels are inlined (a false
// positive: those operands are never read).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
// A tile of the wide Gram (rows <= cols) with AVX-512, accumulated into
// float64: g[i * ldg + j] += <x row i, y row j> over k columns, for i < nx,
// j < ny. A diagonal tile (y == x) computes j >= i only (its diagonal 4 x 4
// blocks also write a few lower entries, which nobody reads) and adds the
// float64 squares of x's rows to diag (zeroed by the caller).
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
__attribute__((target("avx512f"))) void GramWideAvx512(
    const float* xa, int64_t ldx, const float* ya, int64_t ldy, int64_t nx,
    int64_t ny, int64_t k, bool diagonal, double* g, int64_t ldg,
    double* diag) {
  for (int64_t k0 = 0; k0 < k; k0 += kKChunk) {
    const int64_t kc = std::min(kKChunk, k - k0);
    const int64_t kv = kc & ~int64_t{15};
    const __mmask16 tail = static_cast<__mmask16>((1u << (kc - kv)) - 1u);
    for (int64_t i = 0; i < nx; i += 4) {
      // Rows past the end repeat the last row; their results are dropped.
      const float* x[4];
      for (int r = 0; r < 4; ++r) x[r] = xa + std::min(i + r, nx - 1) * ldx + k0;
      // While the chunk of rows i..i+3 is in L1: their exact diagonal.
      if (diagonal) {
        for (int r = 0; r < 4 && i + r < nx; ++r) {
          AddSquaresF64(x[r], kv, tail, &diag[i + r]);
        }
      }
      for (int64_t j = diagonal ? i : 0; j < ny; j += 4) {
        const float* y[4];
        for (int r = 0; r < 4; ++r)
          y[r] = ya + std::min(j + r, ny - 1) * ldy + k0;
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
        for (int r = 0; r < 4 && i + r < nx; ++r) {
          for (int q = 0; q < 4 && j + q < ny; ++q) {
            g[(i + r) * ldg + (j + q)] += ReduceToDouble(c[r][q]);
          }
        }
      }
    }
  }
}


// A tile of the tall Gram (rows > cols), G = W^T W, with AVX-512, into
// float64: g[i * ldg + j] += sum_r X[r][i] Y[r][j] over len rows, for
// i < nx, j < ny, where X[r][i] = xa[r * ldx + i] and Y[r][j] =
// ya[r * ldy + j]. A diagonal tile (ya == xa) computes the blocks that
// reach j >= i only (blocks that straddle the diagonal also write lower
// entries, which nobody reads) and adds sum_r X[r][i]^2 in float64 to
// diag[i]. A GEMM-style outer-product kernel: an 8 x 32
// block of G in 16 zmm accumulators; per row of W, 8 broadcasts and 2 loads
// feed 16 FMAs. Rows are taken kRowChunk at a time (128 KB for n = 128,
// L2-resident), each chunk's f32 sums added into float64.
constexpr int64_t kRowChunk = 256;

__attribute__((target("avx512f"))) void GramTallAvx512(
    const float* xa, int64_t ldx, const float* ya, int64_t ldy, int64_t len,
    int64_t nx, int64_t ny, bool diagonal, double* g, int64_t ldg,
    double* diag) {
  for (int64_t r0 = 0; r0 < len; r0 += kRowChunk) {
    const int64_t r1 = std::min(len, r0 + kRowChunk);
    if (diagonal) {
      for (int64_t r = r0; r < r1; ++r) AddSquares(xa + r * ldx, nx, diag);
    }
    for (int64_t i = 0; i < nx; i += 8) {
      int64_t ii[8];  // rows of G; past the end: repeat the last, drop later
      for (int q = 0; q < 8; ++q) ii[q] = std::min(i + q, nx - 1);
      for (int64_t j = diagonal ? i / 32 * 32 : 0; j < ny; j += 32) {
        const int64_t w0 = std::clamp<int64_t>(ny - j, 0, 16);
        const int64_t w1 = std::clamp<int64_t>(ny - j - 16, 0, 16);
        const __mmask16 m0 = static_cast<__mmask16>((1u << w0) - 1u);
        const __mmask16 m1 = static_cast<__mmask16>((1u << w1) - 1u);
        __m512 c[8][2];
#pragma GCC unroll 8
        for (int q = 0; q < 8; ++q) {
          c[q][0] = _mm512_setzero_ps();
          c[q][1] = _mm512_setzero_ps();
        }
        for (int64_t r = r0; r < r1; ++r) {
          const float* xrow = xa + r * ldx;
          const float* yrow = ya + r * ldy;
          const __m512 y0 = _mm512_maskz_loadu_ps(m0, yrow + j);
          const __m512 y1 = _mm512_maskz_loadu_ps(m1, yrow + j + 16);
#pragma GCC unroll 8
          for (int q = 0; q < 8; ++q) {
            const __m512 x = _mm512_set1_ps(xrow[ii[q]]);
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
        for (int q = 0; q < 8 && i + q < nx; ++q) {
          double* out = g + (i + q) * ldg + j;
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

#pragma GCC diagnostic pop
#endif  // __x86_64__

// Where one tile of the Gram sits: Gram rows [i0, i0 + ni) x cols
// [j0, j0 + nj); diagonal when i0 == j0 (then ni == nj).
struct Tile {
  int64_t i0, ni, j0, nj;
  bool diagonal() const { return i0 == j0; }
};

// The tiles of the upper triangle of an n x n Gram cut into `side` x `side`
// squares (the last row and column of tiles may be narrower), row by row.
std::vector<Tile> UpperTiles(int64_t n, int64_t side) {
  std::vector<Tile> tiles;
  for (int64_t i0 = 0; i0 < n; i0 += side) {
    for (int64_t j0 = i0; j0 < n; j0 += side) {
      tiles.push_back({i0, std::min(side, n - i0), j0, std::min(side, n - j0)});
    }
  }
  return tiles;
}

// The operand of a tile that yields Gram rows [i0, i0 + ni) over the
// long-side range [c0, c1): wide W, rows i0.. (ni x (c1 - c0)); tall W,
// columns i0.. ((c1 - c0) x ni).
F32Block LoadOperand(const MatrixView& v, const Shape& s, int64_t i0,
                     int64_t ni, int64_t c0, int64_t c1,
                     ScratchBuffer<float>& conv) {
  return s.wide ? LoadBlock(v, i0, i0 + ni, c0, c1, conv)
                : LoadBlock(v, c0, c1, i0, i0 + ni, conv);
}

// Tile t of the Gram over the long-side range [k0, k1) into g (t.ni x t.nj,
// row-major, float64) and, for a diagonal tile, the float64 diagonal
// (row or column sums of squares over the range) into diag (t.ni). g holds
// the upper triangle of a diagonal tile and all of any other. mutant: the
// deliberate bug the tests must catch (CpuEngineOptions): the tile's last
// column is dropped (its diagonal entry kept).
void GramTile(const MatrixView& v, const Tile& t, int64_t k0, int64_t k1,
              bool avx512, bool mutant, Scratch& sc, double* g, double* diag) {
  const Shape s = ShapeOf(v);
  const bool dg = t.diagonal();
  std::fill(g, g + t.ni * t.nj, 0.0);
  if (dg) std::fill(diag, diag + t.ni, 0.0);
  // f16/bf16 are converted one chunk of the long side at a time, so the
  // converted block stays in L2 while the kernel reads it; f32 is read in
  // place over the whole range.
#if defined(__x86_64__)
  const int64_t chunk = s.wide ? kKChunk : kRowChunk;
#else
  const int64_t chunk = 1024;
#endif
  const int64_t step = v.dtype == DType::kF32 ? k1 - k0 : chunk;
  for (int64_t c0 = k0; c0 < k1; c0 += step) {
    const int64_t c1 = std::min(k1, c0 + step), kc = c1 - c0;
    const F32Block x = LoadOperand(v, s, t.i0, t.ni, c0, c1, sc.conv_x);
    const F32Block y =
        dg ? x : LoadOperand(v, s, t.j0, t.nj, c0, c1, sc.conv_y);
#if defined(__x86_64__)
    if (avx512) {
      if (s.wide) {
        GramWideAvx512(x.a, x.lda, y.a, y.lda, t.ni, t.nj, kc, dg, g, t.nj,
                       diag);
      } else {
        GramTallAvx512(x.a, x.lda, y.a, y.lda, kc, t.ni, t.nj, dg, g, t.nj,
                       diag);
      }
      continue;
    }
#endif
    (void)avx512;
    float* g32 = sc.gram32.Grow(t.ni * t.nj);
    const int ni = static_cast<int>(t.ni), nj = static_cast<int>(t.nj);
    const int k = static_cast<int>(kc);
    if (dg) {
      cblas_ssyrk(CblasRowMajor, CblasUpper, s.wide ? CblasNoTrans : CblasTrans,
                  ni, k, 1.0f, x.a, static_cast<int>(x.lda), 0.0f, g32, nj);
      if (s.wide) {
        for (int64_t i = 0; i < t.ni; ++i) {
          diag[i] += SumSquares(x.a + i * x.lda, kc);
        }
      } else {
        for (int64_t r = 0; r < kc; ++r) AddSquares(x.a + r * x.lda, t.ni, diag);
      }
      for (int64_t i = 0; i < t.ni; ++i) {
        for (int64_t j = i; j < t.nj; ++j) g[i * t.nj + j] += g32[i * t.nj + j];
      }
    } else {
      if (s.wide) {  // X (ni x k) Y^T
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, ni, nj, k, 1.0f,
                    x.a, static_cast<int>(x.lda), y.a, static_cast<int>(y.lda),
                    0.0f, g32, nj);
      } else {  // X^T (ni x k) Y
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, ni, nj, k, 1.0f,
                    x.a, static_cast<int>(x.lda), y.a, static_cast<int>(y.lda),
                    0.0f, g32, nj);
      }
      for (int64_t i = 0; i < t.ni * t.nj; ++i) g[i] += g32[i];
    }
  }
  if (mutant) {
    for (int64_t i = 0; i < t.ni; ++i) {
      if (!(dg && i == t.nj - 1)) g[i * t.nj + t.nj - 1] = 0;
    }
  }
}

// Multiply-adds of the Gram's upper triangle.
double GramFlops(const MatrixView& v) {
  const Shape s = ShapeOf(v);
  return 0.5 * static_cast<double>(s.n) * static_cast<double>(s.n) *
         static_cast<double>(s.len);
}

// Float64 elements of a tiling's tiles: what one part's partial tiles hold.
int64_t TileElements(absl::Span<const Tile> tiles) {
  int64_t e = 0;
  for (const Tile& t : tiles) e += t.ni * t.nj;
  return e;
}

// One worker's buffers for a tile of side `side` (see Scratch).
uint64_t PerThreadTileBytes(int64_t side, bool avx512, DType dtype) {
  uint64_t b = static_cast<uint64_t>(side * side) * sizeof(double) +
               static_cast<uint64_t>(side) * sizeof(double);
  if (!avx512) b += static_cast<uint64_t>(side * side) * sizeof(float);
#if defined(__x86_64__)
  const int64_t chunk = std::max(kKChunk, kRowChunk);
#else
  const int64_t chunk = 1024;
#endif
  if (dtype != DType::kF32) {
    b += 2 * static_cast<uint64_t>(side * chunk) * sizeof(float);
  }
  return b;
}

CpuGramPlan MakePlan(const MatrixView& v, int64_t threads, bool avx512,
                     uint64_t budget) {
  const Shape s = ShapeOf(v);
  CpuGramPlan p;
  p.tile = std::min(s.n, kGramTile);
  p.blocks = (s.n + p.tile - 1) / p.tile;
  const std::vector<Tile> tiles = UpperTiles(s.n, p.tile);
  const int64_t ntiles = static_cast<int64_t>(tiles.size());
  const uint64_t per_part =
      static_cast<uint64_t>(TileElements(tiles) + s.n) * sizeof(double);
  if (threads > 1) {
    int64_t parts = (threads + ntiles - 1) / ntiles;
    parts = std::min<int64_t>(parts, s.len);
    parts = std::min<int64_t>(parts, static_cast<int64_t>(budget / per_part));
    p.parts = std::max<int64_t>(parts, 1);
  }
  p.held_bytes = p.parts > 1 ? per_part * p.parts : 0;
  p.per_thread_bytes = PerThreadTileBytes(p.tile, avx512, v.dtype);
  const int64_t items = ntiles * p.parts;
  p.bound_bytes = p.held_bytes + p.per_thread_bytes *
                                     static_cast<uint64_t>(std::min<int64_t>(
                                         std::max<int64_t>(threads, 1), items));
  return p;
}

// A tile's contribution: the sum of its parts' partial tiles (gs, and for a
// diagonal tile ds) reduced to the sum of squares of its strict-upper
// entries; a diagonal tile also writes the float64 diagonal to d and the
// kernel's own diagonal to gd (t.ni each).
double ReduceTile(const Tile& t, absl::Span<const double* const> gs,
                  absl::Span<const double* const> ds, double* d, double* gd) {
  const bool dg = t.diagonal();
  double off = 0;
  for (int64_t i = 0; i < t.ni; ++i) {
    if (dg) {
      double dd = 0, gg = 0;
      for (size_t p = 0; p < gs.size(); ++p) {
        dd += ds[p][i];
        gg += gs[p][i * t.nj + i];
      }
      d[i] = dd;
      gd[i] = gg;
    }
    if (gs.size() == 1) {
      const double* row = gs[0] + i * t.nj;
      for (int64_t j = dg ? i + 1 : 0; j < t.nj; ++j) off += row[j] * row[j];
    } else {
      for (int64_t j = dg ? i + 1 : 0; j < t.nj; ++j) {
        double x = 0;
        for (const double* g : gs) x += g[i * t.nj + j];
        off += x * x;
      }
    }
  }
  return off;
}

// PR from the Gram's float64 diagonal d, the kernel's diagonal gd and the
// sum of squares of its strict upper triangle. Returns kUntrusted when the
// f32 Gram cannot be trusted (the caller falls back to float64); *finite
// is false when the data holds NaN or Inf.
constexpr double kUntrusted = -1.0;

double FinishAlgebraic(int64_t n, const double* d, const double* gd,
                       double off, bool* finite) {
  double trace = 0, sum_diag2 = 0, max_diag = 0;
  bool trusted = true;
  for (int64_t i = 0; i < n; ++i) {
    trace += d[i];
    sum_diag2 += d[i] * d[i];
    max_diag = std::max(max_diag, d[i]);
    // The f32 diagonal must agree with the float64 one (a sanity check: the
    // rounding error alone is far below 1e-3).
    if (!(std::fabs(gd[i] - d[i]) <= 1e-3 * d[i])) trusted = false;
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
  const double g2 = sum_diag2 + 2.0 * off;
  if (!std::isfinite(g2) || g2 <= 0) return kUntrusted;
  return trace * trace / g2;
}

// The float64 Gram fallback: used when the f32 Gram overflowed or underflowed
// (its diagonal disagrees with the float64 one), e.g. entries near 1e20 or
// 1e-25. Slower (dsyrk/dgemm on scaled float64 copies of operand blocks)
// but exact to float64 rounding. Tiled like the f32 path, over chunks of
// the long side, so it holds one tile and two operand blocks at a time.
constexpr int64_t kFloat64Chunk = 1024;

double AlgebraicFloat64(const MatrixView& v) {
  g_float64_fallbacks.fetch_add(1, std::memory_order_relaxed);
  Scratch& sc = ThreadScratch();
  const Shape s = ShapeOf(v);
  const auto* base = static_cast<const unsigned char*>(v.data);
  const size_t esize = DTypeSize(v.dtype);
  float* row = sc.conv_x.Grow(v.cols);
  double scale = 0;
  for (int64_t i = 0; i < v.rows; ++i) {
    ConvertRowToFloat(base + static_cast<size_t>(i * v.ld) * esize, v.dtype,
                      v.cols, row);
    for (int64_t j = 0; j < v.cols; ++j) {
      scale = std::max(scale, std::fabs(static_cast<double>(row[j])));
    }
  }
  if (scale == 0) return 0.0;
  // Scale to max |w| = 1 so that no square can under- or overflow in double.
  const double inv = 1.0 / scale;
  // Operand rows [i0, i0 + ni) of the Gram over [c0, c1), scaled, as a
  // row-major block: wide ni x kc, tall kc x ni.
  auto load = [&](int64_t i0, int64_t ni, int64_t c0, int64_t c1,
                  ScratchBuffer<double>& buf) {
    const int64_t kc = c1 - c0;
    double* dst = buf.Grow(ni * kc);
    const int64_t r0 = s.wide ? i0 : c0, r1 = s.wide ? i0 + ni : c1;
    const int64_t col0 = s.wide ? c0 : i0, w = s.wide ? kc : ni;
    float* tmp = sc.conv_x.Grow(w);
    for (int64_t r = r0; r < r1; ++r) {
      ConvertRowToFloat(base + static_cast<size_t>(r * v.ld + col0) * esize,
                        v.dtype, w, tmp);
      for (int64_t j = 0; j < w; ++j) dst[(r - r0) * w + j] = tmp[j] * inv;
    }
    return dst;
  };
  const int64_t side = std::min(s.n, kGramTile);
  double trace = 0, g2 = 0;
  for (const Tile& t : UpperTiles(s.n, side)) {
    double* g = sc.gram.Grow(t.ni * t.nj);
    const int ni = static_cast<int>(t.ni), nj = static_cast<int>(t.nj);
    for (int64_t c0 = 0; c0 < s.len; c0 += kFloat64Chunk) {
      const int64_t c1 = std::min(s.len, c0 + kFloat64Chunk);
      const int k = static_cast<int>(c1 - c0);
      const double beta = c0 == 0 ? 0.0 : 1.0;
      const double* x = load(t.i0, t.ni, c0, c1, sc.f64_x);
      const int ldx = s.wide ? k : ni;
      if (t.diagonal()) {
        cblas_dsyrk(CblasRowMajor, CblasUpper,
                    s.wide ? CblasNoTrans : CblasTrans, ni, k, 1.0, x, ldx,
                    beta, g, nj);
      } else {
        const double* y = load(t.j0, t.nj, c0, c1, sc.f64_y);
        const int ldy = s.wide ? k : nj;
        cblas_dgemm(CblasRowMajor, s.wide ? CblasNoTrans : CblasTrans,
                    s.wide ? CblasTrans : CblasNoTrans, ni, nj, k, 1.0, x, ldx,
                    y, ldy, beta, g, nj);
      }
    }
    double off = 0;
    for (int64_t i = 0; i < t.ni; ++i) {
      if (t.diagonal()) {
        const double d = g[i * t.nj + i];
        trace += d;
        g2 += d * d;
      }
      for (int64_t j = t.diagonal() ? i + 1 : 0; j < t.nj; ++j) {
        off += g[i * t.nj + j] * g[i * t.nj + j];
      }
    }
    g2 += 2 * off;
  }
  return g2 > 0 ? trace * trace / g2 : 0.0;
}

// The algebraic variant on one thread: tile after tile over the whole long
// side, each reduced as soon as it is done (one tile of scratch).
absl::StatusOr<double> AlgebraicOne(const MatrixView& v, size_t index,
                                    bool avx512, bool mutant,
                                    const CallOptions& call) {
  Scratch& sc = ThreadScratch();
  const Shape s = ShapeOf(v);
  const int64_t side = std::min(s.n, kGramTile);
  double* d = sc.diag.Grow(2 * s.n);
  double* gd = d + s.n;
  double off = 0;
  for (const Tile& t : UpperTiles(s.n, side)) {
    if (CancelRequested(call)) return CallCancelled();
    double* g = sc.gram.Grow(t.ni * t.nj);
    GramTile(v, t, 0, s.len, avx512, mutant, sc, g, d + t.i0);
    const double* gs[1] = {g};
    const double* ds[1] = {d + t.i0};
    // ReduceTile reads ds[0] before it writes d (the same slots).
    off += ReduceTile(t, gs, ds, d + t.i0, gd + t.i0);
  }
  bool finite = true;
  const double pr = FinishAlgebraic(s.n, d, gd, off, &finite);
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
  const F32Block b = LoadBlock(v, 0, v.rows, 0, v.cols, sc.conv_x);
  const double trace = TraceOf(b, v);
  if (!std::isfinite(trace)) return NonFiniteError(index);
  if (trace == 0) return 0.0;
  EstimatorRng rng(sp.seed);
  const int64_t k = sp.probes;
  const int64_t m = sp.hutch_plus_plus && k >= 3 ? k / 3 : 0;
  const int64_t probes = k - 2 * m;
  const int64_t width = std::max<int64_t>(probes, m);
  float* z = sc.work_a.Grow(s.n * width);
  float* gz = sc.work_b.Grow(s.n * width);
  float* tmp = sc.work_c.Grow(s.len * width);
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
  const F32Block b = LoadBlock(v, 0, v.rows, 0, v.cols, sc.conv_x);
  const double trace = TraceOf(b, v);
  if (!std::isfinite(trace)) return NonFiniteError(index);
  if (trace == 0) return 0.0;
  EstimatorRng rng(sp.seed);
  const int64_t r = sp.sketch_rank;
  float* omega = sc.work_a.Grow(r * s.n);
  float* y = sc.work_b.Grow(r * s.len);
  float* mm = sc.work_c.Grow(r * r);
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


absl::Status OutOfMemory(size_t index) {
  return absl::ResourceExhaustedError(absl::StrCat(
      "batch[", index, "]: out of memory for the cpu engine's scratch"));
}

absl::StatusOr<double> NaiveOne(const MatrixView& v, size_t index) {
  return SvdPR(v, index);
}

class CpuEngine : public Engine {
 public:
  // avx512: the Gram runs on our AVX-512 kernels; otherwise on OpenBLAS.
  // budget: the held partial tiles of one call (see cpu_engine_stats.h).
  // mutant: GramTile's deliberate bug, for the tests' gates.
  CpuEngine(int threads, bool avx512, uint64_t budget, bool mutant)
      : avx512_(avx512), budget_(budget), mutant_(mutant), pool_(threads) {}

  std::string Backend() const override { return kBackend; }
  std::string Version() const override {
    return avx512_ ? kVersionAvx512 : kVersionOpenBlas;
  }
  std::string DefaultVariant() const override { return kDefaultVariant; }

  // The algebraic variant's Gram paths (process-wide counters: one engine
  // per daemon). Every path is listed, zeros included.
  EngineStats Stats() const override {
    const CpuEngineCounters c = GetCpuEngineCounters();
    EngineStats s;
    s.served = {{"algebraic/cpu-avx512", c.avx512_grams},
                {"algebraic/openblas-ssyrk", c.openblas_grams},
                {"algebraic/float64-fallback", c.float64_fallbacks}};
    return s;
  }

  using Engine::ComputePR;
  absl::Status ComputePR(absl::Span<const MatrixView> batch,
                         const VariantSpec& variant, absl::Span<double> out,
                         const CallOptions& call) override {
    absl::StatusOr<VariantKind> kind =
        CheckCall(batch, variant, out, kBackend, kDefaultVariant);
    if (!kind.ok()) return kind.status();
    if (CancelRequested(call)) return CallCancelled();
    if (*kind == VariantKind::kFused) {
      return absl::UnimplementedError(
          "variant 'fused' is a GPU kernel; not implemented on the cpu "
          "backend");
    }
    if (*kind == VariantKind::kAlgebraic &&
        static_cast<int>(batch.size()) < pool_.size() &&
        std::any_of(batch.begin(), batch.end(), [](const MatrixView& v) {
          return GramFlops(v) >= kSplitMinFlops;
        })) {
      return SplitAlgebraic(batch, out, call);
    }
    std::vector<absl::Status> errors(batch.size());
    pool_.ParallelFor(static_cast<int64_t>(batch.size()), [&](int64_t i) {
      if (CancelRequested(call)) {
        errors[i] = CallCancelled();
        return;
      }
      const MatrixView& v = batch[i];
      absl::StatusOr<double> pr;
      try {
        switch (*kind) {
          case VariantKind::kAlgebraic:
            pr = AlgebraicOne(v, i, avx512_, mutant_, call);
            break;
          case VariantKind::kNaive:
            pr = NaiveOne(v, i);
            break;
          case VariantKind::kPowerIter:
            pr = PowerIterOne(v, variant, i);
            break;
          case VariantKind::kSketch:
            pr = SketchOne(v, variant, i);
            break;
          case VariantKind::kFused:
            break;  // refused above
        }
        TrimThreadScratch();
      } catch (const std::bad_alloc&) {
        TrimThreadScratch();
        pr = OutOfMemory(i);
      }
      if (pr.ok()) {
        out[i] = *pr;
      } else {
        errors[i] = pr.status();
      }
    });
    // A cancelled call answers CANCELLED, whatever else a matrix met.
    for (const absl::Status& s : errors) {
      if (absl::IsCancelled(s)) return s;
    }
    for (const absl::Status& s : errors) {
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }

  // gram_eigen.h: split along the long side across the pool like a large
  // algebraic Gram, the extra partial Grams within the same budget.
  absl::Status GramEigenvalues(const MatrixView& m, absl::Span<double> out,
                               const CallOptions& call) override {
    return CpuGramEigenvalues(
        m, out, call,
        [this](int64_t n, const std::function<void(int64_t)>& fn) { pool_.ParallelFor(n, fn); },
        pool_.size(), budget_, kSplitMinFlops);
  }

 private:
  // A batch smaller than the pool. Each large matrix's Gram tiles (and,
  // with fewer tiles than threads, parts of the long side: MakePlan) are
  // spread across the threads; small matrices stay whole. Partial tiles of
  // a matrix cut into parts are held until all its parts are done, then
  // summed in float64 and reduced; a matrix in one part has each tile
  // reduced by the worker that computed it.
  absl::Status SplitAlgebraic(absl::Span<const MatrixView> batch,
                              absl::Span<double> out, const CallOptions& call) {
    struct Work {
      CpuGramPlan plan;
      std::vector<Tile> tiles;
      std::vector<double> off;  // per tile: its strict-upper sum of squares
      std::vector<double> d, gd;  // the float64 and the kernel's diagonal
      size_t first_item = 0;
    };
    struct Item {
      size_t matrix;
      size_t tile;
      int64_t part;
      ScratchBuffer<double> gram, diag;  // held partial tile (parts > 1)
    };
    const int threads = pool_.size();
    const auto large = [](const MatrixView& v) {
      return GramFlops(v) >= kSplitMinFlops;
    };
    const uint64_t budget =
        budget_ / std::max<uint64_t>(
                      1, std::count_if(batch.begin(), batch.end(), large));
    std::vector<Work> work(batch.size());
    size_t total = 0;
    for (size_t i = 0; i < batch.size(); ++i) {
      Work& w = work[i];
      const Shape s = ShapeOf(batch[i]);
      w.plan = MakePlan(batch[i], large(batch[i]) ? threads : 1, avx512_,
                        budget);
      w.tiles = UpperTiles(s.n, w.plan.tile);
      w.off.assign(w.tiles.size(), 0.0);
      w.d.assign(static_cast<size_t>(s.n), 0.0);
      w.gd.assign(static_cast<size_t>(s.n), 0.0);
      w.first_item = total;
      total += w.tiles.size() * static_cast<size_t>(w.plan.parts);
    }
    std::vector<Item> items;
    items.reserve(total);
    for (size_t i = 0; i < batch.size(); ++i) {
      for (size_t t = 0; t < work[i].tiles.size(); ++t) {
        for (int64_t p = 0; p < work[i].plan.parts; ++p) {
          items.push_back(Item{i, t, p, {}, {}});
        }
      }
    }
    std::vector<char> failed(items.size(), 0);
    pool_.ParallelFor(static_cast<int64_t>(items.size()), [&](int64_t j) {
      if (CancelRequested(call)) return;  // answered below
      Item& it = items[j];
      Work& w = work[it.matrix];
      const MatrixView& v = batch[it.matrix];
      const Tile& t = w.tiles[it.tile];
      const int64_t len = ShapeOf(v).len, parts = w.plan.parts;
      const int64_t k0 = len * it.part / parts;
      const int64_t k1 = len * (it.part + 1) / parts;
      Scratch& sc = ThreadScratch();
      try {
        if (parts == 1) {
          double* g = sc.gram.Grow(t.ni * t.nj);
          double* dg = sc.diag.Grow(t.ni);
          GramTile(v, t, k0, k1, avx512_, mutant_, sc, g, dg);
          const double* gs[1] = {g};
          const double* ds[1] = {dg};
          w.off[it.tile] =
              ReduceTile(t, gs, ds, &w.d[t.i0], &w.gd[t.i0]);
        } else {
          GramTile(v, t, k0, k1, avx512_, mutant_, sc,
                   it.gram.Grow(t.ni * t.nj), it.diag.Grow(t.ni));
        }
      } catch (const std::bad_alloc&) {
        failed[j] = 1;
      }
      TrimThreadScratch();
    });
    // Items skipped for the flag left their tiles unsummed: no result.
    if (CancelRequested(call)) return CallCancelled();
    // The held parts, summed and reduced tile by tile, across the threads.
    std::vector<std::pair<size_t, size_t>> held;  // (matrix, tile)
    for (size_t i = 0; i < batch.size(); ++i) {
      if (work[i].plan.parts == 1) continue;
      for (size_t t = 0; t < work[i].tiles.size(); ++t) held.push_back({i, t});
    }
    pool_.ParallelFor(static_cast<int64_t>(held.size()), [&](int64_t h) {
      if (CancelRequested(call)) return;  // answered below
      const auto [i, t] = held[h];
      Work& w = work[i];
      const size_t parts = static_cast<size_t>(w.plan.parts);
      const size_t first = w.first_item + t * parts;
      std::vector<const double*> gs(parts), ds(parts);
      for (size_t p = 0; p < parts; ++p) {
        if (failed[first + p]) return;
        gs[p] = items[first + p].gram.data();
        ds[p] = items[first + p].diag.data();
      }
      const Tile& tile = w.tiles[t];
      w.off[t] = ReduceTile(tile, gs, ds, &w.d[tile.i0], &w.gd[tile.i0]);
      for (size_t p = 0; p < parts; ++p) {
        items[first + p].gram.Release();
        items[first + p].diag.Release();
      }
    });
    if (CancelRequested(call)) return CallCancelled();
    for (size_t j = 0; j < items.size(); ++j) {
      if (failed[j]) return OutOfMemory(items[j].matrix);
    }
    items.clear();
    for (size_t i = 0; i < batch.size(); ++i) {
      Work& w = work[i];
      double off = 0;
      for (double o : w.off) off += o;
      bool finite = true;
      const double pr = FinishAlgebraic(static_cast<int64_t>(w.d.size()),
                                        w.d.data(), w.gd.data(), off, &finite);
      if (!finite) return NonFiniteError(i);
      (avx512_ ? g_avx512_grams : g_openblas_grams)
          .fetch_add(1, std::memory_order_relaxed);
      if (pr != kUntrusted) {
        out[i] = pr;
        continue;
      }
      if (CancelRequested(call)) return CallCancelled();
      try {
        out[i] = AlgebraicFloat64(batch[i]);
      } catch (const std::bad_alloc&) {
        TrimThreadScratch();
        return OutOfMemory(i);
      }
      TrimThreadScratch();
    }
    return absl::OkStatus();
  }

  const bool avx512_;      // Gram kernel choice, fixed at construction
  const uint64_t budget_;  // held partial tiles per call
  const bool mutant_;      // GramTile's deliberate bug (tests only)
  WorkerPool pool_;
};

}  // namespace

CpuEngineCounters GetCpuEngineCounters() {
  CpuEngineCounters c;
  c.avx512_grams = g_avx512_grams.load(std::memory_order_relaxed);
  c.openblas_grams = g_openblas_grams.load(std::memory_order_relaxed);
  c.float64_fallbacks = g_float64_fallbacks.load(std::memory_order_relaxed);
  c.scratch_bytes_now = g_scratch_now.load(std::memory_order_relaxed);
  c.scratch_bytes_peak = g_scratch_peak.load(std::memory_order_relaxed);
  return c;
}

void ResetCpuScratchPeak() {
  g_scratch_peak.store(g_scratch_now.load(std::memory_order_relaxed),
                       std::memory_order_relaxed);
}

bool CpuHasAvx512() {
#if defined(__x86_64__)
  static const bool has = __builtin_cpu_supports("avx512f");
  return has;
#else
  return false;
#endif
}

CpuGramPlan PlanCpuGram(const MatrixView& v, int threads, bool avx512,
                        uint64_t budget) {
  return MakePlan(v, threads, avx512, budget);
}

absl::StatusOr<std::unique_ptr<Engine>> NewCpuEngineWithOptions(
    const CpuEngineOptions& options) {
  int threads = options.threads;
  if (threads <= 0) {
    threads =
        static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  }
  bool avx512 = false;
  switch (options.gram) {
    case CpuGramKernel::kAuto: {
      // RVD_CPU_GRAM=openblas forces OpenBLAS (A-B comparisons in one
      // binary, and the portable path on an AVX-512 host).
      const char* gram = std::getenv("RVD_CPU_GRAM");
      avx512 = CpuHasAvx512() &&
               (gram == nullptr || std::string(gram) != "openblas");
      break;
    }
    case CpuGramKernel::kAvx512:
      if (!CpuHasAvx512()) {
        return absl::FailedPreconditionError(
            "the AVX-512 Gram kernel needs a CPU with AVX-512F");
      }
      avx512 = true;
      break;
    case CpuGramKernel::kOpenBlas:
      avx512 = false;
      break;
  }
  // Our pool is the parallelism; OpenBLAS runs in the calling thread. This is
  // process-wide (OpenBLAS 0.3.21 has no per-thread setting).
  static std::once_flag once;
  std::call_once(once, [] { openblas_set_num_threads(1); });
  return std::make_unique<CpuEngine>(threads, avx512,
                                     options.gram_scratch_budget,
                                     options.gram_mutant_for_test);
}

std::unique_ptr<Engine> NewCpuEngine(int threads) {
  CpuEngineOptions options;
  options.threads = threads;
  // kAuto cannot fail.
  return *NewCpuEngineWithOptions(options);
}

}  // namespace rvd

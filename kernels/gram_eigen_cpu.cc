// Engine::GramEigenvalues's contract and the CPU engine's implementation
// (gram_eigen.h).
//
// Why float64 throughout: the eigenvalues are the squared singular values,
// so an f32 Gram (relative error ~1e-7 of the largest) would bury every
// singular value below ~3e-4 of the largest. Products of f32 values are
// exact in double; only the accumulation rounds (2^-53 per addition).
//
// Memory: the n x n float64 Gram (n = min(rows, cols)) is held whole for
// the eigensolver, plus one converted chunk of the long side per part
// (kChunkElements doubles at most), plus the split's extra partial Grams.
#include "kernels/gram_eigen.h"

#include <cblas.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <new>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/call_contract.h"
#include "kernels/dtype_convert.h"

extern "C" void dsyevd_(const char* jobz, const char* uplo, const int* n, double* a,
                        const int* lda, double* w, double* work, const int* lwork, int* iwork,
                        const int* liwork, int* info);

namespace rvd {
namespace {

// One converted chunk of the long side holds at most this many doubles
// (8 MiB), and at least 64 columns of it when the short side allows.
constexpr int64_t kChunkElements = int64_t{1} << 20;

int64_t ChunkLength(int64_t n, int64_t len) {
  return std::clamp<int64_t>(kChunkElements / n, std::min<int64_t>(64, len), len);
}

// Adds the Gram of the long-side range [k0, k1) of v to g (n x n,
// row-major, upper triangle): wide v (rows <= cols) G += X X^T with X the
// columns [k0, k1), tall v G += X^T X with X the rows [k0, k1). Returns
// false when the range holds NaN or Inf (g is then meaningless).
bool AddPartialGram(const MatrixView& v, int64_t k0, int64_t k1, const CallOptions& call,
                    double* g, std::atomic<bool>* cancelled) {
  const bool wide = v.rows <= v.cols;
  const int64_t n = wide ? v.rows : v.cols;
  const int64_t chunk = ChunkLength(n, wide ? v.cols : v.rows);
  const auto* base = static_cast<const unsigned char*>(v.data);
  const size_t esize = DTypeSize(v.dtype);
  std::vector<double> x(static_cast<size_t>(n * chunk));
  std::vector<float> row(static_cast<size_t>(wide ? chunk : n));
  bool finite = true;
  for (int64_t c0 = k0; c0 < k1; c0 += chunk) {
    if (CancelRequested(call)) {
      cancelled->store(true);
      return true;
    }
    const int64_t c1 = std::min(k1, c0 + chunk), kc = c1 - c0;
    // X row-major as it lies in v: wide n x kc, tall kc x n.
    const int64_t xr = wide ? n : kc, xc = wide ? kc : n;
    for (int64_t r = 0; r < xr; ++r) {
      const int64_t vr = wide ? r : c0 + r, vc = wide ? c0 : 0;
      ConvertRowToFloat(base + static_cast<size_t>(vr * v.ld + vc) * esize, v.dtype, xc,
                        row.data());
      double* dst = x.data() + r * xc;
      for (int64_t j = 0; j < xc; ++j) {
        dst[j] = row[j];
        finite &= std::isfinite(row[j]);
      }
    }
    if (!finite) return false;
    cblas_dsyrk(CblasRowMajor, CblasUpper, wide ? CblasNoTrans : CblasTrans,
                static_cast<int>(n), static_cast<int>(kc), 1.0, x.data(),
                static_cast<int>(xc), 1.0, g, static_cast<int>(n));
  }
  return true;
}

}  // namespace

absl::Status CheckGramEigenvaluesCall(const MatrixView& m, absl::Span<double> out) {
  std::fill(out.begin(), out.end(), std::numeric_limits<double>::quiet_NaN());
  if (absl::Status s = ValidateView(m, 0); !s.ok()) return s;
  const int64_t n = std::min(m.rows, m.cols);
  if (static_cast<int64_t>(out.size()) != n) {
    return absl::InvalidArgumentError(absl::StrCat("out has ", out.size(),
                                                   " slots for the ", n, " eigenvalues of a ",
                                                   m.rows, " x ", m.cols, " matrix's Gram"));
  }
  return absl::OkStatus();
}

absl::Status CpuGramEigenvalues(const MatrixView& m, absl::Span<double> out,
                                const CallOptions& call, const ParallelForFn& parallel_for,
                                int threads, uint64_t budget, double split_min_flops) {
  if (absl::Status s = CheckGramEigenvaluesCall(m, out); !s.ok()) return s;
  if (CancelRequested(call)) return CallCancelled();
  const int64_t n = std::min(m.rows, m.cols), len = std::max(m.rows, m.cols);
  const uint64_t gram_bytes = static_cast<uint64_t>(n * n) * sizeof(double);
  int64_t parts = 1;
  if (0.5 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(len) >=
      split_min_flops) {
    parts = std::min<int64_t>({std::max(threads, 1), len / ChunkLength(n, len),
                               1 + static_cast<int64_t>(budget / gram_bytes)});
    parts = std::max<int64_t>(parts, 1);
  }
  std::vector<std::vector<double>> grams;
  try {
    grams.resize(static_cast<size_t>(parts));
    for (auto& g : grams) g.assign(static_cast<size_t>(n * n), 0.0);
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "no memory for the float64 Gram of a ", m.rows, " x ", m.cols, " matrix (",
        parts, " x ", gram_bytes, " bytes)"));
  }
  std::vector<char> ok(static_cast<size_t>(parts), 0), nonfinite(static_cast<size_t>(parts), 0);
  std::atomic<bool> cancelled{false};
  parallel_for(parts, [&](int64_t p) {
    try {
      nonfinite[p] = !AddPartialGram(m, len * p / parts, len * (p + 1) / parts, call,
                                     grams[p].data(), &cancelled);
      ok[p] = 1;
    } catch (const std::bad_alloc&) {
      // ok[p] stays 0: RESOURCE_EXHAUSTED below.
    }
  });
  if (cancelled.load() || CancelRequested(call)) return CallCancelled();
  for (int64_t p = 0; p < parts; ++p) {
    if (nonfinite[p]) return NonFiniteError(0);
  }
  for (int64_t p = 0; p < parts; ++p) {
    if (!ok[p]) {
      return absl::ResourceExhaustedError("no memory for a converted chunk of the matrix");
    }
  }
  std::vector<double>& g = grams[0];
  for (int64_t p = 1; p < parts; ++p) {
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = i; j < n; ++j) g[i * n + j] += grams[p][i * n + j];
    }
    std::vector<double>().swap(grams[p]);
  }

  // Row-major upper is column-major lower: LAPACK reads uplo 'L'.
  const int ni = static_cast<int>(n);
  int lwork = -1, liwork = -1, info = 0, iwsize = 0;
  double wsize = 0;
  dsyevd_("N", "L", &ni, g.data(), &ni, out.data(), &wsize, &lwork, &iwsize, &liwork, &info);
  if (info != 0) {
    return absl::InternalError(absl::StrCat("dsyevd workspace query: info=", info));
  }
  lwork = static_cast<int>(wsize) + 1;
  liwork = std::max(iwsize, 1);
  std::vector<double> work;
  std::vector<int> iwork;
  try {
    work.resize(static_cast<size_t>(lwork));
    iwork.resize(static_cast<size_t>(liwork));
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError("no memory for dsyevd's workspace");
  }
  dsyevd_("N", "L", &ni, g.data(), &ni, out.data(), work.data(), &lwork, iwork.data(), &liwork,
          &info);
  if (info != 0) {
    std::fill(out.begin(), out.end(), std::numeric_limits<double>::quiet_NaN());
    return absl::InternalError(absl::StrCat("dsyevd failed: info=", info));
  }
  return absl::OkStatus();
}

}  // namespace rvd

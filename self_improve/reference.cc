#include "self_improve/reference.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include <cblas.h>

#include "kernels/dtype_convert.h"

namespace rvd::tune {
namespace {

// A matrix in its stored layout as dense row-major float64 (every dtype
// converts to f32 exactly, and f32 to float64), with each Gram row's
// operand maxabs and whether it holds a NaN.
struct Dense {
  std::vector<double> d;  // rows x cols, leading dimension cols
  int64_t rows = 0, cols = 0;
  bool tall = false;           // G = W^T W: Gram row r is stored column r
  std::vector<double> maxabs;  // per Gram row
  std::vector<char> nan;       // per Gram row
};

Dense ToDense(const MatrixView& w) {
  Dense m;
  m.rows = w.rows;
  m.cols = w.cols;
  m.tall = w.rows > w.cols;
  const int64_t n = m.tall ? w.cols : w.rows;
  m.d.resize(static_cast<size_t>(w.rows * w.cols));
  m.maxabs.assign(static_cast<size_t>(n), 0.0);
  m.nan.assign(static_cast<size_t>(n), 0);
  std::vector<float> f(static_cast<size_t>(w.cols));
  for (int64_t i = 0; i < w.rows; ++i) {
    const auto* row = static_cast<const uint8_t*>(w.data) +
                      static_cast<size_t>(i * w.ld) * DTypeSize(w.dtype);
    ConvertRowToFloat(row, w.dtype, w.cols, f.data());
    double* out = m.d.data() + i * w.cols;
    for (int64_t j = 0; j < w.cols; ++j) {
      const double x = f[static_cast<size_t>(j)];
      out[j] = x;
      const size_t r = static_cast<size_t>(m.tall ? j : i);
      m.nan[r] |= static_cast<char>(std::isnan(x));
      m.maxabs[r] = std::max(m.maxabs[r], std::fabs(x));
    }
  }
  return m;
}

// C (m x n, leading dimension ldc) = the Gram rows [r0, r0 + m) against
// [c0, c0 + n): each entry one float64 dot product of operand rows.
void GramBlock(const Dense& w, int64_t r0, int64_t m, int64_t c0, int64_t n, double* c,
               int64_t ldc) {
  const int64_t k = w.tall ? w.rows : w.cols;
  const int ld = static_cast<int>(w.cols);
  if (w.tall) {
    cblas_dgemm(CblasRowMajor, CblasTrans, CblasNoTrans, static_cast<int>(m), static_cast<int>(n),
                static_cast<int>(k), 1.0, w.d.data() + r0, ld, w.d.data() + c0, ld, 0.0, c,
                static_cast<int>(ldc));
  } else {
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(m), static_cast<int>(n),
                static_cast<int>(k), 1.0, w.d.data() + r0 * w.cols, ld, w.d.data() + c0 * w.cols,
                ld, 0.0, c, static_cast<int>(ldc));
  }
}

// The upper triangle (col >= row) of the Gram's diagonal block [r0, r0 + m)^2.
void GramDiagonalBlock(const Dense& w, int64_t r0, int64_t m, double* c, int64_t ldc) {
  const int64_t k = w.tall ? w.rows : w.cols;
  const int ld = static_cast<int>(w.cols);
  cblas_dsyrk(CblasRowMajor, CblasUpper, w.tall ? CblasTrans : CblasNoTrans, static_cast<int>(m),
              static_cast<int>(k), 1.0, w.d.data() + (w.tall ? r0 : r0 * w.cols), ld, 0.0, c,
              static_cast<int>(ldc));
}

JobSums SumsOf(const Dense& w, const TuneJob& job) {
  constexpr int64_t kBandDoubles = int64_t{1} << 20;  // 8 MiB of G held at a time
  JobSums s;
  bool nan = false;
  for (const auto& [first, count] : {std::pair<int64_t, int64_t>{job.row0, job.rows},
                                    std::pair<int64_t, int64_t>{job.col0, job.cols}}) {
    for (int64_t r = first; r < first + count; ++r) {
      nan |= w.nan[static_cast<size_t>(r)] != 0;
      s.maxabs = std::max(s.maxabs, w.maxabs[static_cast<size_t>(r)]);
    }
  }
  if (nan) s.maxabs = std::numeric_limits<double>::quiet_NaN();
  if (job.rows <= 0 || job.cols <= 0) return s;
  const int64_t band = std::max<int64_t>(1, std::min<int64_t>(job.rows, kBandDoubles / job.cols));
  std::vector<double> c(static_cast<size_t>(band * job.cols));
  for (int64_t i = 0; i < job.rows; i += band) {
    const int64_t m = std::min(band, job.rows - i);
    const int64_t r_first = job.row0 + i;
    // Columns left of the band's first row are below the diagonal for all of it.
    const int64_t jlo = std::clamp<int64_t>(r_first - job.col0, 0, job.cols);
    const int64_t width = job.cols - jlo;
    if (width == 0) continue;
    double* out = c.data();
    if (r_first == job.col0 + jlo && m <= width) {
      // The band's square on the diagonal by dsyrk, the rest right of it by dgemm.
      GramDiagonalBlock(w, r_first, m, out, width);
      if (width > m) GramBlock(w, r_first, m, job.col0 + jlo + m, width - m, out + m, width);
    } else {
      GramBlock(w, r_first, m, job.col0 + jlo, width, out, width);
    }
    for (int64_t ii = 0; ii < m; ++ii) {
      const int64_t r = r_first + ii;
      for (int64_t jj = 0; jj < width; ++jj) {
        const int64_t col = job.col0 + jlo + jj;
        if (col < r) continue;
        const double g = out[ii * width + jj];
        s.g2 += (col == r ? 1.0 : 2.0) * g * g;
        if (col == r) s.trace += g;
      }
    }
  }
  return s;
}

}  // namespace

std::vector<JobSums> ReferenceMatrixSums(const MatrixView& w, absl::Span<const TuneJob> jobs) {
  const Dense dense = ToDense(w);
  std::vector<JobSums> sums;
  sums.reserve(jobs.size());
  for (const TuneJob& job : jobs) sums.push_back(SumsOf(dense, job));
  return sums;
}

JobSums ReferenceJobSums(const MatrixView& w, const TuneJob& job) {
  return ReferenceMatrixSums(w, {job})[0];
}

double PrFromJobSums(absl::Span<const JobSums> sums) {
  double g = 0, t = 0, mx = 0;
  for (const JobSums& s : sums) {
    g += s.g2;
    t += s.trace;
    mx = std::isnan(s.maxabs) ? s.maxabs : std::max(mx, s.maxabs);
  }
  if (!std::isfinite(g) || !std::isfinite(t) || std::isnan(mx)) {
    return std::numeric_limits<double>::quiet_NaN();
  }
  if (t == 0) return 0;
  return t * t / g;
}

}  // namespace rvd::tune

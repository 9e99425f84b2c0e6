// The float64 SVD reference (OraclePR in engine.h): the matrix converted to
// double, singular values from LAPACK's dgesdd (jobz = 'N'), PR from them.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "kernels/dtype_convert.h"
#include "kernels/engine.h"

extern "C" void dgesdd_(const char* jobz, const int* m, const int* n, double* a,
                        const int* lda, double* s, double* u, const int* ldu,
                        double* vt, const int* ldvt, double* work,
                        const int* lwork, int* iwork, int* info);

namespace rvd {

absl::StatusOr<double> OraclePR(const MatrixView& m) {
  if (m.data == nullptr || m.rows <= 0 || m.cols <= 0 || m.ld < m.cols) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bad matrix view: data=", m.data == nullptr ? "null" : "set",
        " rows=", m.rows, " cols=", m.cols, " ld=", m.ld));
  }
  if (m.rows > INT32_MAX || m.cols > INT32_MAX ||
      m.rows * m.cols > (int64_t{1} << 31)) {
    return absl::InvalidArgumentError("matrix too large for the LAPACK oracle");
  }
  // Row-major rows x cols is column-major cols x rows: the same singular
  // values, so LAPACK gets the transpose for free.
  const int64_t rows = m.rows, cols = m.cols;
  std::vector<double> a(static_cast<size_t>(rows * cols));
  std::vector<float> row(static_cast<size_t>(cols));
  const auto* base = static_cast<const unsigned char*>(m.data);
  const size_t esize = DTypeSize(m.dtype);
  bool any_nonzero = false;
  for (int64_t i = 0; i < rows; ++i) {
    ConvertRowToFloat(base + static_cast<size_t>(i * m.ld) * esize, m.dtype,
                      cols, row.data());
    for (int64_t j = 0; j < cols; ++j) {
      const double x = row[j];
      if (!std::isfinite(x)) {
        return absl::InvalidArgumentError("matrix contains NaN or Inf");
      }
      any_nonzero |= (x != 0.0);
      a[i * cols + j] = x;
    }
  }
  if (!any_nonzero) return 0.0;

  const int lm = static_cast<int>(cols), ln = static_cast<int>(rows);
  const int lda = lm, one = 1;
  std::vector<double> s(static_cast<size_t>(std::min(lm, ln)));
  std::vector<int> iwork(8 * static_cast<size_t>(std::min(lm, ln)));
  double dummy = 0, wsize = 0;
  int lwork = -1, info = 0;
  dgesdd_("N", &lm, &ln, a.data(), &lda, s.data(), &dummy, &one, &dummy, &one,
          &wsize, &lwork, iwork.data(), &info);
  if (info != 0) {
    return absl::InternalError(absl::StrCat("dgesdd workspace query: ", info));
  }
  lwork = static_cast<int>(wsize) + 1;
  std::vector<double> work(static_cast<size_t>(lwork));
  dgesdd_("N", &lm, &ln, a.data(), &lda, s.data(), &dummy, &one, &dummy, &one,
          work.data(), &lwork, iwork.data(), &info);
  if (info != 0) {
    return absl::InternalError(absl::StrCat("dgesdd failed: info=", info));
  }
  // Scale by the largest singular value so that s^4 cannot overflow.
  const double smax = *std::max_element(s.begin(), s.end());
  if (smax == 0.0) return 0.0;
  double sum2 = 0, sum4 = 0;
  for (double v : s) {
    const double t = v / smax, t2 = t * t;
    sum2 += t2;
    sum4 += t2 * t2;
  }
  return sum2 * sum2 / sum4;
}

}  // namespace rvd

// The float64 SVD reference (OraclePR in engine.h): the matrix converted to
// double, singular values from LAPACK's dgesdd (jobz = 'N'), PR from them
// (PRFromSingularValues).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <new>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "kernels/call_contract.h"
#include "kernels/dtype_convert.h"
#include "kernels/engine.h"
#include "kernels/oracle_svd.h"

extern "C" void dgesdd_(const char* jobz, const int* m, const int* n, double* a,
                        const int* lda, double* s, double* u, const int* ldu,
                        double* vt, const int* ldvt, double* work,
                        const int* lwork, int* iwork, int* info);

namespace rvd {

absl::StatusOr<std::vector<double>> SvdSingularValues(const MatrixView& m, size_t index) {
  if (m.rows * m.cols > (int64_t{1} << 31)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "batch[", index, "]: matrix too large for the LAPACK SVD (", m.rows,
        " x ", m.cols, " > 2^31 elements)"));
  }
  // Row-major rows x cols is column-major cols x rows: the same singular
  // values, so LAPACK gets the transpose for free.
  const int64_t rows = m.rows, cols = m.cols;
  const int lm = static_cast<int>(cols), ln = static_cast<int>(rows);
  std::vector<double> a, s, work;
  std::vector<float> row;
  std::vector<int> iwork;
  try {
    a.resize(static_cast<size_t>(rows * cols));
    row.resize(static_cast<size_t>(cols));
    s.resize(static_cast<size_t>(std::min(lm, ln)));
    iwork.resize(8 * static_cast<size_t>(std::min(lm, ln)));
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "batch[", index, "]: no memory for the float64 copy of a ", rows, " x ",
        cols, " matrix"));
  }
  const auto* base = static_cast<const unsigned char*>(m.data);
  const size_t esize = DTypeSize(m.dtype);
  bool any_nonzero = false;
  for (int64_t i = 0; i < rows; ++i) {
    ConvertRowToFloat(base + static_cast<size_t>(i * m.ld) * esize, m.dtype,
                      cols, row.data());
    for (int64_t j = 0; j < cols; ++j) {
      const double x = row[j];
      if (!std::isfinite(x)) return NonFiniteError(index);
      any_nonzero |= (x != 0.0);
      a[i * cols + j] = x;
    }
  }
  if (!any_nonzero) return std::vector<double>(s.size(), 0.0);

  const int lda = lm, one = 1;
  double dummy = 0, wsize = 0;
  int lwork = -1, info = 0;
  dgesdd_("N", &lm, &ln, a.data(), &lda, s.data(), &dummy, &one, &dummy, &one,
          &wsize, &lwork, iwork.data(), &info);
  if (info != 0) {
    return absl::InternalError(
        absl::StrCat("batch[", index, "]: dgesdd workspace query: ", info));
  }
  lwork = static_cast<int>(wsize) + 1;
  try {
    work.resize(static_cast<size_t>(lwork));
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(
        absl::StrCat("batch[", index, "]: no memory for dgesdd's workspace"));
  }
  dgesdd_("N", &lm, &ln, a.data(), &lda, s.data(), &dummy, &one, &dummy, &one,
          work.data(), &lwork, iwork.data(), &info);
  if (info != 0) {
    return absl::InternalError(
        absl::StrCat("batch[", index, "]: dgesdd failed: info=", info));
  }
  return s;
}

absl::StatusOr<double> SvdPR(const MatrixView& m, size_t index) {
  absl::StatusOr<std::vector<double>> s = SvdSingularValues(m, index);
  if (!s.ok()) return s.status();
  return PRFromSingularValues(*s);
}

absl::StatusOr<double> OraclePR(const MatrixView& m) {
  if (absl::Status s = ValidateView(m, 0); !s.ok()) return s;
  return SvdPR(m, 0);
}

}  // namespace rvd

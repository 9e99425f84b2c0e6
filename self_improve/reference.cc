#include "self_improve/reference.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "kernels/dtype_convert.h"

namespace rvd::tune {
namespace {

double Element(const MatrixView& w, int64_t i, int64_t j) {
  const int64_t at = i * w.ld + j;
  switch (w.dtype) {
    case DType::kF32: return static_cast<const float*>(w.data)[at];
    case DType::kF16: return HalfToFloat(static_cast<const uint16_t*>(w.data)[at]);
    case DType::kBF16: return BFloat16ToFloat(static_cast<const uint16_t*>(w.data)[at]);
  }
  return 0;
}

}  // namespace

JobSums ReferenceJobSums(const MatrixView& w, const TuneJob& job) {
  const bool tall = w.rows > w.cols;
  const int64_t k = tall ? w.rows : w.cols;
  // Gram row r's operand at position p.
  const auto op = [&](int64_t r, int64_t p) { return tall ? Element(w, p, r) : Element(w, r, p); };
  // The job's operand rows, converted once.
  const auto rows_of = [&](int32_t first, int32_t count) {
    std::vector<double> v(static_cast<size_t>(count) * k);
    for (int32_t r = 0; r < count; ++r)
      for (int64_t p = 0; p < k; ++p) v[r * k + p] = op(first + r, p);
    return v;
  };
  const std::vector<double> a = rows_of(job.row0, job.rows);
  const std::vector<double> b = rows_of(job.col0, job.cols);
  JobSums s;
  bool nan = false;
  for (double x : a) {
    nan |= std::isnan(x);
    s.maxabs = std::max(s.maxabs, std::fabs(x));
  }
  for (double x : b) {
    nan |= std::isnan(x);
    s.maxabs = std::max(s.maxabs, std::fabs(x));
  }
  if (nan) s.maxabs = std::numeric_limits<double>::quiet_NaN();
  for (int32_t i = 0; i < job.rows; ++i) {
    for (int32_t j = 0; j < job.cols; ++j) {
      const int32_t r = job.row0 + i, c = job.col0 + j;
      if (c < r) continue;
      double g = 0;
      for (int64_t p = 0; p < k; ++p) g += a[i * k + p] * b[j * k + p];
      s.g2 += (c == r ? 1.0 : 2.0) * g * g;
      if (c == r) s.trace += g;
    }
  }
  return s;
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

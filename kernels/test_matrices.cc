#include "kernels/test_matrices.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "kernels/dtype_convert.h"

namespace rvd {
namespace {

// Rows of a (k x d, row-major) made orthonormal by modified Gram-Schmidt,
// run twice for stability. k <= d.
void OrthonormalizeRows(std::vector<double>& a, int64_t k, int64_t d) {
  for (int64_t r = 0; r < k; ++r) {
    double* x = &a[r * d];
    for (int pass = 0; pass < 2; ++pass) {
      for (int64_t p = 0; p < r; ++p) {
        const double* y = &a[p * d];
        double dot = 0;
        for (int64_t i = 0; i < d; ++i) dot += x[i] * y[i];
        for (int64_t i = 0; i < d; ++i) x[i] -= dot * y[i];
      }
    }
    double nn = 0;
    for (int64_t i = 0; i < d; ++i) nn += x[i] * x[i];
    nn = std::sqrt(nn);
    for (int64_t i = 0; i < d; ++i) x[i] /= nn;
  }
}

}  // namespace

const char* SpectrumName(Spectrum s) {
  switch (s) {
    case Spectrum::kFlat: return "flat";
    case Spectrum::kPowerLaw: return "powerlaw";
    case Spectrum::kRankOne: return "rank1";
    case Spectrum::kGaussian: return "gaussian";
  }
  return "?";
}

std::vector<double> MakeMatrix(std::mt19937_64& rng, int64_t rows, int64_t cols,
                               Spectrum spec) {
  std::normal_distribution<double> normal;
  const double scale =
      std::exp(std::uniform_real_distribution<double>(-2, 2)(rng));
  std::vector<double> w(static_cast<size_t>(rows * cols));
  if (spec == Spectrum::kGaussian) {
    for (double& x : w) x = scale * normal(rng);
    return w;
  }
  if (spec == Spectrum::kRankOne) {
    std::vector<double> u(rows), v(cols);
    for (double& x : u) x = normal(rng);
    for (double& x : v) x = normal(rng);
    for (int64_t i = 0; i < rows; ++i) {
      for (int64_t j = 0; j < cols; ++j) w[i * cols + j] = scale * u[i] * v[j];
    }
    return w;
  }
  const int64_t n = std::min(rows, cols);
  const int64_t q = std::min<int64_t>(n, 96);
  std::vector<double> u(static_cast<size_t>(q * rows)),
      v(static_cast<size_t>(q * cols));
  for (double& x : u) x = normal(rng);
  for (double& x : v) x = normal(rng);
  OrthonormalizeRows(u, q, rows);
  OrthonormalizeRows(v, q, cols);
  // Entries of an orthonormal factor are ~ 1/sqrt(dim): scale back to O(1).
  const double amp = scale * std::sqrt(static_cast<double>(std::max(rows, cols)));
  auto sv = [&](int64_t c) {
    return spec == Spectrum::kFlat ? 1.0 : std::pow(static_cast<double>(c + 1), -0.7);
  };
  const double floor =
      q < n ? sv(q) / std::sqrt(static_cast<double>(std::max(rows, cols))) : 0.0;
  for (int64_t c = 0; c < q; ++c) {
    const double s = amp * sv(c);
    for (int64_t i = 0; i < rows; ++i) {
      const double us = s * u[c * rows + i];
      double* wr = &w[i * cols];
      const double* vc = &v[c * cols];
      for (int64_t j = 0; j < cols; ++j) wr[j] += us * vc[j];
    }
  }
  if (floor > 0) {
    for (double& x : w) x += amp * floor * normal(rng);
  }
  return w;
}

StoredMatrix Store(const std::vector<double>& w, int64_t rows, int64_t cols,
                   DType dtype, int64_t pad, const std::string& label) {
  StoredMatrix st;
  const int64_t ld = cols + pad;
  const size_t es = DTypeSize(dtype);
  st.bytes.resize(static_cast<size_t>(rows * ld) * es);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < ld; ++j) {
      const float f = j < cols ? static_cast<float>(w[i * cols + j]) : nan;
      uint8_t* p = st.bytes.data() + static_cast<size_t>(i * ld + j) * es;
      if (dtype == DType::kF32) {
        std::memcpy(p, &f, 4);
      } else {
        const uint16_t h =
            dtype == DType::kF16 ? FloatToHalf(f) : FloatToBFloat16(f);
        std::memcpy(p, &h, 2);
      }
    }
  }
  st.view = MatrixView{st.bytes.data(), rows, cols, ld, dtype};
  st.label = absl::StrCat(label, " ", rows, "x", cols, " ld=", ld, " ",
                          DTypeName(dtype));
  return st;
}

}  // namespace rvd

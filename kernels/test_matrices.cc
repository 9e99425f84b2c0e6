#include "kernels/test_matrices.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "kernels/dtype_convert.h"

extern "C" void dgeqrf_(const int* m, const int* n, double* a, const int* lda,
                        double* tau, double* work, const int* lwork, int* info);
extern "C" void dorgqr_(const int* m, const int* n, const int* k, double* a,
                        const int* lda, const double* tau, double* work,
                        const int* lwork, int* info);

namespace rvd {
namespace {

// A dim x k matrix (column-major, ld = dim) with orthonormal columns: the Q
// of a Householder QR of a Gaussian matrix. k <= dim.
std::vector<double> RandomOrthonormal(std::mt19937_64& rng, int64_t dim,
                                      int64_t k) {
  std::normal_distribution<double> normal;
  std::vector<double> q(static_cast<size_t>(dim * k));
  for (double& x : q) x = normal(rng);
  const int m = static_cast<int>(dim), n = static_cast<int>(k);
  std::vector<double> tau(static_cast<size_t>(k));
  double wsize = 0;
  int lwork = -1, info = 0;
  dgeqrf_(&m, &n, q.data(), &m, tau.data(), &wsize, &lwork, &info);
  std::vector<double> work(static_cast<size_t>(wsize) + 1);
  lwork = static_cast<int>(work.size());
  dgeqrf_(&m, &n, q.data(), &m, tau.data(), work.data(), &lwork, &info);
  lwork = -1;
  dorgqr_(&m, &n, &n, q.data(), &m, tau.data(), &wsize, &lwork, &info);
  work.resize(static_cast<size_t>(wsize) + 1);
  lwork = static_cast<int>(work.size());
  dorgqr_(&m, &n, &n, q.data(), &m, tau.data(), work.data(), &lwork, &info);
  if (info != 0) std::abort();  // LAPACK rejected its own workspace: a bug
  return q;
}

// w (row-major rows x cols) += U diag(s) V^T, U rows x k and V cols x k
// column-major with orthonormal columns.
void AddLowRank(std::mt19937_64& rng, int64_t rows, int64_t cols,
                absl::Span<const double> s, std::vector<double>& w) {
  const int64_t k = static_cast<int64_t>(s.size());
  const std::vector<double> u = RandomOrthonormal(rng, rows, k);
  std::vector<double> v = RandomOrthonormal(rng, cols, k);
  for (int64_t c = 0; c < k; ++c) {
    for (int64_t j = 0; j < cols; ++j) v[c * cols + j] *= s[c];
  }
  // Row-major W (rows x cols) is column-major W^T (cols x rows):
  // W^T = (V diag s) U^T.
  cblas_dgemm(CblasColMajor, CblasNoTrans, CblasTrans, static_cast<int>(cols),
              static_cast<int>(rows), static_cast<int>(k), 1.0, v.data(),
              static_cast<int>(cols), u.data(), static_cast<int>(rows), 1.0,
              w.data(), static_cast<int>(cols));
}

}  // namespace

const char* SpectrumName(Spectrum s) {
  switch (s) {
    case Spectrum::kFlat: return "flat";
    case Spectrum::kPowerLaw: return "powerlaw";
    case Spectrum::kRankOne: return "rank1";
    case Spectrum::kGaussian: return "gaussian";
    case Spectrum::kRankDeficient: return "rankdef";
  }
  return "?";
}

uint64_t TestSeed() {
  static const uint64_t seed = [] {
    uint64_t s = 0;
    const char* env = std::getenv("RVD_TEST_SEED");
    if (env != nullptr && *env != '\0') {
      s = std::strtoull(env, nullptr, 0);
    } else {
      std::random_device rd;
      s = (static_cast<uint64_t>(rd()) << 32) ^ rd();
    }
    std::fprintf(stderr,
                 "random inputs: RVD_TEST_SEED=%llu (set it to replay them)\n",
                 static_cast<unsigned long long>(s));
    return s;
  }();
  return seed;
}

std::mt19937_64 SeededRng(std::string_view name) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a: stable across builds
  for (char c : name) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001b3ull;
  }
  return std::mt19937_64(TestSeed() ^ h);
}

std::vector<double> MakeMatrix(std::mt19937_64& rng, int64_t rows, int64_t cols,
                               Spectrum spec, double scale) {
  std::normal_distribution<double> normal;
  if (scale <= 0) {
    scale = std::exp(std::uniform_real_distribution<double>(-2, 2)(rng));
  }
  std::vector<double> w(static_cast<size_t>(rows * cols), 0.0);
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
  const int64_t q = spec == Spectrum::kRankDeficient
                        ? std::max<int64_t>(1, std::min<int64_t>(n / 2, 96))
                        : std::min<int64_t>(n, 96);
  // Entries of an orthonormal factor are ~ 1/sqrt(dim): scale back to O(1).
  const double amp = scale * std::sqrt(static_cast<double>(std::max(rows, cols)));
  auto sv = [&](int64_t c) {
    return spec == Spectrum::kFlat ? 1.0
                                   : std::pow(static_cast<double>(c + 1), -0.7);
  };
  std::vector<double> s(static_cast<size_t>(q));
  for (int64_t c = 0; c < q; ++c) s[c] = amp * sv(c);
  AddLowRank(rng, rows, cols, s, w);
  if (spec != Spectrum::kRankDeficient && q < n) {
    const double floor =
        sv(q) / std::sqrt(static_cast<double>(std::max(rows, cols)));
    for (double& x : w) x += amp * floor * normal(rng);
  }
  return w;
}

std::vector<double> MakeMatrixWithSingularValues(std::mt19937_64& rng,
                                                 int64_t rows, int64_t cols,
                                                 absl::Span<const double> s) {
  std::vector<double> w(static_cast<size_t>(rows * cols), 0.0);
  AddLowRank(rng, rows, cols, s, w);
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

std::vector<double> StoredValues(const StoredMatrix& m) {
  const MatrixView& v = m.view;
  std::vector<double> out(static_cast<size_t>(v.rows * v.cols));
  std::vector<float> row(static_cast<size_t>(v.cols));
  const auto* base = static_cast<const unsigned char*>(v.data);
  for (int64_t i = 0; i < v.rows; ++i) {
    ConvertRowToFloat(base + static_cast<size_t>(i * v.ld) * DTypeSize(v.dtype),
                      v.dtype, v.cols, row.data());
    for (int64_t j = 0; j < v.cols; ++j) out[i * v.cols + j] = row[j];
  }
  return out;
}

}  // namespace rvd

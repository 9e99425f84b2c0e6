// The one generator of random matrices for rvd's tests and benchmarks (every
// backend's engine tests, rvd_bench_cpu, rvd_bench_gpu): matrices with a
// chosen spectrum, stored in any dtype and view form, and the seed that
// replays them.
//
// Seeds: TestSeed() is RVD_TEST_SEED when set, else random; it is printed
// once to stderr. SeededRng(name) derives a generator from it and a name
// (the test's), so a test draws the same inputs whichever tests ran before
// it: rerun with RVD_TEST_SEED=<printed seed> and --gtest_filter=<test>.
//
// Test-only (library rvd_test_matrices); thread-compatible, except TestSeed
// which is thread-safe.
#ifndef RVD_KERNELS_TEST_MATRICES_H_
#define RVD_KERNELS_TEST_MATRICES_H_

#include <cstdint>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "absl/types/span.h"
#include "kernels/engine.h"

namespace rvd {

// Singular value profiles (n = min(rows, cols)):
//   kFlat          s_i = 1 for the first q = min(n, 96), plus a floor
//   kPowerLaw      s_i = i^-0.7 for the first q, plus a floor
//   kRankOne       u v^T
//   kGaussian      i.i.d. N(0, 1) entries (Marchenko-Pastur)
//   kRankDeficient exactly rank max(1, min(n / 2, 96)), power law, no floor
// The floor (when q < n) is Gaussian noise at the level of s_q, so that
// large shapes stay cheap to build.
enum class Spectrum { kFlat, kPowerLaw, kRankOne, kGaussian, kRankDeficient };
inline constexpr Spectrum kAllSpectra[] = {
    Spectrum::kFlat, Spectrum::kPowerLaw, Spectrum::kRankOne,
    Spectrum::kGaussian, Spectrum::kRankDeficient};

// "flat", "powerlaw", "rank1", "gaussian", "rankdef".
const char* SpectrumName(Spectrum s);

// The seed of this process's random inputs (see above).
uint64_t TestSeed();
// A generator seeded from TestSeed() and `name`.
std::mt19937_64 SeededRng(std::string_view name);

// A rows x cols matrix (row-major, double) with spectrum `spec`, entries of
// order `scale` (scale <= 0: a random overall scale in [e^-2, e^2]). Never
// all zeros. Flat, power-law and rank-deficient are U diag(s) V^T with
// orthonormal factors (Householder QR of Gaussian matrices).
std::vector<double> MakeMatrix(std::mt19937_64& rng, int64_t rows,
                               int64_t cols, Spectrum spec, double scale = 0);

// Exactly U diag(s) V^T (row-major rows x cols, double) with U (rows x k)
// and V (cols x k) random with orthonormal columns, k = s.size() <=
// min(rows, cols): its singular values are s (to float64 rounding), so its
// PR is PRFromSingularValues(s) in closed form.
std::vector<double> MakeMatrixWithSingularValues(std::mt19937_64& rng,
                                                 int64_t rows, int64_t cols,
                                                 absl::Span<const double> s);

// Entry magnitudes at the edges of what f32 holds: squares that overflow
// f32 (kHugeScale) or fall below its normal range (kTinyScale) make an
// f32 Gram untrustworthy; kPlainScale is far from both.
inline constexpr double kHugeScale = 1e19;
inline constexpr double kTinyScale = 1e-20;
inline constexpr double kPlainScale = 1e-6;

// A matrix stored in a dtype (rounded to nearest even) with ld = cols + pad;
// the padding between rows is NaN, so an engine that reads it fails loudly.
struct StoredMatrix {
  std::vector<uint8_t> bytes;
  MatrixView view;    // into `bytes`
  std::string label;  // e.g. "powerlaw 128x4096 ld=4096 bf16"
};
StoredMatrix Store(const std::vector<double>& w, int64_t rows, int64_t cols,
                   DType dtype, int64_t pad, const std::string& label);

// The values a stored matrix holds, as double (row-major rows x cols).
std::vector<double> StoredValues(const StoredMatrix& m);

}  // namespace rvd

#endif  // RVD_KERNELS_TEST_MATRICES_H_

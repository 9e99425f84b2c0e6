// Random matrices with a chosen spectrum, for the engine tests of every
// backend: the inputs each exact path is checked on against the float64
// SVD oracle. Never zeros; a random overall scale in [e^-2, e^2].
// Test-only (library rvd_test_matrices); thread-compatible.
#ifndef RVD_KERNELS_TEST_MATRICES_H_
#define RVD_KERNELS_TEST_MATRICES_H_

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "kernels/engine.h"

namespace rvd {

enum class Spectrum { kFlat, kPowerLaw, kRankOne, kGaussian };
inline constexpr Spectrum kAllSpectra[] = {Spectrum::kFlat, Spectrum::kPowerLaw,
                                           Spectrum::kRankOne, Spectrum::kGaussian};

// "flat", "powerlaw", "rank1", "gaussian".
const char* SpectrumName(Spectrum s);

// A rows x cols matrix (row-major, double). Flat and power-law
// (s_i = i^-0.7): U diag(s) V^T with orthonormal factors of rank
// q = min(rows, cols, 96), plus, when q < min(rows, cols), a Gaussian floor
// at the level of s_q so that large shapes stay cheap to build. Rank-1:
// u v^T. Gaussian: i.i.d. entries.
std::vector<double> MakeMatrix(std::mt19937_64& rng, int64_t rows, int64_t cols,
                               Spectrum spec);

// A matrix stored in a dtype (rounded to nearest even) with ld = cols + pad;
// the padding between rows is NaN, so an engine that reads it fails loudly.
struct StoredMatrix {
  std::vector<uint8_t> bytes;
  MatrixView view;    // into `bytes`
  std::string label;  // e.g. "powerlaw 128x4096 ld=4096 bf16"
};
StoredMatrix Store(const std::vector<double>& w, int64_t rows, int64_t cols,
                   DType dtype, int64_t pad, const std::string& label);

}  // namespace rvd

#endif  // RVD_KERNELS_TEST_MATRICES_H_

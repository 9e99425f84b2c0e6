// Random numbers for the estimators (power_iter, sketch) of every backend:
// SplitMix64, deterministic and portable (std::normal_distribution differs
// across standard libraries), so that the CPU and CUDA engines draw the
// same probes for the same seed. Private to kernels/; thread-compatible.
#ifndef RVD_KERNELS_ESTIMATOR_RNG_H_
#define RVD_KERNELS_ESTIMATOR_RNG_H_

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace rvd {

class EstimatorRng {
 public:
  explicit EstimatorRng(uint64_t seed) : state_(seed ^ 0x6a09e667f3bcc909ull) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Fills x[0..n) with independent +-1.
  void Rademacher(float* x, int64_t n) {
    for (int64_t i = 0; i < n; i += 64) {
      uint64_t bits = Next();
      for (int64_t j = i; j < std::min(n, i + 64); ++j, bits >>= 1) {
        x[j] = (bits & 1) ? 1.0f : -1.0f;
      }
    }
  }
  // Fills x[0..n) with independent N(0, 1) (Box-Muller).
  void Gaussian(float* x, int64_t n) {
    for (int64_t i = 0; i < n; i += 2) {
      const double u1 = (static_cast<double>(Next() >> 11) + 1.0) * 0x1p-53;
      const double u2 = static_cast<double>(Next() >> 11) * 0x1p-53;
      const double r = std::sqrt(-2.0 * std::log(u1));
      x[i] = static_cast<float>(r * std::cos(2.0 * M_PI * u2));
      if (i + 1 < n) {
        x[i + 1] = static_cast<float>(r * std::sin(2.0 * M_PI * u2));
      }
    }
  }

 private:
  uint64_t state_;
};

}  // namespace rvd

#endif  // RVD_KERNELS_ESTIMATOR_RNG_H_

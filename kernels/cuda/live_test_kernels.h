// Test-only device work for cuda_live_test (live_test.cc): a kernel that
// keeps a stream busy for a while (a slow weight update, a late reader),
// and a hash fill whose values the host recomputes.
#ifndef RVD_KERNELS_CUDA_LIVE_TEST_KERNELS_H_
#define RVD_KERNELS_CUDA_LIVE_TEST_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace rvd::cuda::live_test {

// One thread spins on the GPU's global timer for `ms` milliseconds.
cudaError_t LaunchSpin(double ms, cudaStream_t stream);

// Element i of a hash-filled bf16 tensor: a finite value in [-1, 1).
__host__ __device__ inline uint16_t HashBf16(uint64_t seed, uint64_t i) {
  uint64_t z = seed + 0x9e3779b97f4a7c15ull * (i + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  // 1 <= f < 2 from 23 random mantissa bits, minus 1.5: [-0.5, 0.5); the
  // top 16 bits of an f32 are its bf16 (truncation keeps it finite).
  const uint32_t bits = 0x3f800000u | static_cast<uint32_t>(z >> 41);
  float f;
  __builtin_memcpy(&f, &bits, sizeof(f));
  f -= 1.5f;
  uint32_t out;
  __builtin_memcpy(&out, &f, sizeof(out));
  return static_cast<uint16_t>(out >> 16);
}

// p[0..n) = HashBf16(seed, first + i).
cudaError_t LaunchHashFill(uint16_t* p, uint64_t n, uint64_t seed, uint64_t first,
                           cudaStream_t stream);

}  // namespace rvd::cuda::live_test

#endif  // RVD_KERNELS_CUDA_LIVE_TEST_KERNELS_H_

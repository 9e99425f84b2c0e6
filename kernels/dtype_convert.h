// Bit-exact conversions between f32 and the 16-bit float formats (private to
// kernels/). Header-only so that any kernel file may include it.
//
//   HalfToFloat / BFloat16ToFloat: exact (every f16/bf16 value is an f32
//     value), subnormals and infinities kept; a NaN stays a NaN with its
//     payload and the quiet bit set (what the F16C instruction does).
//   FloatToHalf / FloatToBFloat16: round to nearest, ties to even; overflow
//     goes to infinity, NaN stays NaN.
//   ConvertRowToFloat: n elements of `dtype` to f32, using F16C when the CPU
//     has it (and AVX2 for bf16).
//
// Thread-safe: pure functions.
#ifndef RVD_KERNELS_DTYPE_CONVERT_H_
#define RVD_KERNELS_DTYPE_CONVERT_H_

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

#include "kernels/engine.h"

namespace rvd {

inline float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    // Zero or subnormal: mant * 2^-24, exact in f32.
    const float mag = static_cast<float>(mant) * 0x1p-24f;
    return std::bit_cast<float>(sign | std::bit_cast<uint32_t>(mag));
  }
  if (exp == 31) {
    const uint32_t quiet = mant != 0 ? 0x00400000u : 0u;
    return std::bit_cast<float>(sign | 0x7f800000u | quiet | (mant << 13));
  }
  return std::bit_cast<float>(sign | ((exp + 112u) << 23) | (mant << 13));
}

inline float BFloat16ToFloat(uint16_t b) {
  return std::bit_cast<float>(static_cast<uint32_t>(b) << 16);
}

inline uint16_t FloatToHalf(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) {  // Inf or NaN.
    if (ax == 0x7f800000u) return static_cast<uint16_t>(sign | 0x7c00u);
    return static_cast<uint16_t>(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));
  }
  if (ax >= 0x477ff000u) {  // >= 65520 rounds to infinity.
    return static_cast<uint16_t>(sign | 0x7c00u);
  }
  if (ax < 0x38800000u) {  // Below 2^-14: a half subnormal (or zero).
    // In units of 2^-24; the scaling is exact, nearbyint rounds to even under
    // the default rounding mode. 0x400 (rounded up) encodes 2^-14 correctly.
    const float scaled = std::bit_cast<float>(ax) * 0x1p24f;
    return static_cast<uint16_t>(sign |
                                 static_cast<uint32_t>(std::nearbyint(scaled)));
  }
  // Normal: rebias the exponent, round the 13 dropped bits to even; a carry
  // out of the mantissa bumps the exponent, which is the right result.
  const uint32_t rounded = ax + 0xfffu + ((ax >> 13) & 1u) - (112u << 23);
  return static_cast<uint16_t>(sign | (rounded >> 13));
}

inline uint16_t FloatToBFloat16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) {  // NaN: keep it quiet.
    return static_cast<uint16_t>((x >> 16) | 0x40u);
  }
  return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

namespace dtype_internal {

#if defined(__x86_64__)
__attribute__((target("avx,f16c"))) inline void HalfRowToFloatF16C(
    const uint16_t* src, int64_t n, float* dst) {
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m128i h =
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + j));
    _mm256_storeu_ps(dst + j, _mm256_cvtph_ps(h));
  }
  for (; j < n; ++j) dst[j] = HalfToFloat(src[j]);
}

__attribute__((target("avx2"))) inline void BFloat16RowToFloatAvx2(
    const uint16_t* src, int64_t n, float* dst) {
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m128i b =
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + j));
    const __m256i w = _mm256_slli_epi32(_mm256_cvtepu16_epi32(b), 16);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + j), w);
  }
  for (; j < n; ++j) dst[j] = BFloat16ToFloat(src[j]);
}

inline bool CpuHasAvx2() {
  static const bool has = __builtin_cpu_supports("avx2");
  return has;
}

// CPUID leaf 1, ECX bit 29: clang 14's __builtin_cpu_supports has no "f16c".
inline bool CpuHasF16C() {
  static const bool has = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    return __builtin_cpu_supports("avx") && __get_cpuid(1, &a, &b, &c, &d) &&
           (c & bit_F16C) != 0;
  }();
  return has;
}
#endif

}  // namespace dtype_internal

// Converts n consecutive elements of `dtype` at `src` to f32 at `dst`.
inline void ConvertRowToFloat(const void* src, DType dtype, int64_t n,
                              float* dst) {
  switch (dtype) {
    case DType::kF32:
      std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
      return;
    case DType::kF16: {
      const auto* h = static_cast<const uint16_t*>(src);
#if defined(__x86_64__)
      if (dtype_internal::CpuHasF16C()) {
        dtype_internal::HalfRowToFloatF16C(h, n, dst);
        return;
      }
#endif
      for (int64_t j = 0; j < n; ++j) dst[j] = HalfToFloat(h[j]);
      return;
    }
    case DType::kBF16: {
      const auto* b = static_cast<const uint16_t*>(src);
#if defined(__x86_64__)
      if (dtype_internal::CpuHasAvx2()) {
        dtype_internal::BFloat16RowToFloatAvx2(b, n, dst);
        return;
      }
#endif
      for (int64_t j = 0; j < n; ++j) dst[j] = BFloat16ToFloat(b[j]);
      return;
    }
  }
}

}  // namespace rvd

#endif  // RVD_KERNELS_DTYPE_CONVERT_H_

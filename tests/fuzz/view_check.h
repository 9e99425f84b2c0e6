// ViewWithin: whether every element a MatrixView addresses lies inside
// [base, base + bytes). SliceV promises its views point into the tensor or
// into VSlices::gathered; the fuzz targets check that promise with this
// rather than by reading the memory, which ASan cannot watch when it is a
// file mapping.
#ifndef RVD_TESTS_FUZZ_VIEW_CHECK_H_
#define RVD_TESTS_FUZZ_VIEW_CHECK_H_

#include <cstddef>
#include <cstdint>

#include "kernels/engine.h"

namespace rvd_fuzz {

inline bool ViewWithin(const rvd::MatrixView& v, const void* base,
                       size_t bytes) {
  if (v.rows <= 0 || v.cols <= 0 || v.ld < v.cols) return false;
  const auto* lo = static_cast<const uint8_t*>(base);
  const auto* p = static_cast<const uint8_t*>(v.data);
  if (p < lo || p > lo + bytes) return false;
  // Elements from the first to the last: (rows - 1) * ld + cols.
  int64_t span = 0;
  if (__builtin_mul_overflow(v.rows - 1, v.ld, &span) ||
      __builtin_add_overflow(span, v.cols, &span) ||
      __builtin_mul_overflow(span, static_cast<int64_t>(rvd::DTypeSize(v.dtype)),
                             &span)) {
    return false;
  }
  return static_cast<uint64_t>(span) <= static_cast<uint64_t>(lo + bytes - p);
}

}  // namespace rvd_fuzz

#endif  // RVD_TESTS_FUZZ_VIEW_CHECK_H_

// The shared call contract. See call_contract.h.
#include "kernels/call_contract.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace rvd {

absl::StatusOr<VariantKind> ParseVariant(const VariantSpec& v,
                                         std::string_view backend,
                                         std::string_view default_variant) {
  const std::string_view name =
      v.name.empty() ? default_variant : std::string_view(v.name);
  if (name == "fused") return VariantKind::kFused;
  if (name == "algebraic") return VariantKind::kAlgebraic;
  if (name == "naive") return VariantKind::kNaive;
  if (name == "power_iter") {
    if (v.probes < 1 || v.probes > kMaxProbes) {
      return absl::InvalidArgumentError(
          absl::StrCat("power_iter needs probes in [1, ", kMaxProbes, "], got ",
                       v.probes));
    }
    return VariantKind::kPowerIter;
  }
  if (name == "sketch") {
    if (v.sketch_rank < 1 || v.sketch_rank > kMaxSketchRank) {
      return absl::InvalidArgumentError(
          absl::StrCat("sketch needs sketch_rank in [1, ", kMaxSketchRank,
                       "], got ", v.sketch_rank));
    }
    return VariantKind::kSketch;
  }
  return absl::UnimplementedError(absl::StrCat(
      "unknown variant '", std::string(name), "' on the ", std::string(backend),
      " backend (known: ",
      absl::StrJoin(KnownVariants(), ", "), ")"));
}

absl::Status ValidateView(const MatrixView& v, size_t index) {
  if (v.data == nullptr || v.rows <= 0 || v.cols <= 0 || v.ld < v.cols) {
    return absl::InvalidArgumentError(absl::StrCat(
        "batch[", index, "]: bad matrix view (data ",
        v.data == nullptr ? "null" : "set", ", rows ", v.rows, ", cols ",
        v.cols, ", ld ", v.ld, ")"));
  }
  if (v.rows > INT32_MAX || v.cols > INT32_MAX || v.ld > INT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat(
        "batch[", index, "]: dimensions exceed 2^31 (rows ", v.rows, ", cols ",
        v.cols, ", ld ", v.ld, ")"));
  }
  // The last element's byte offset: (rows - 1) * ld + cols elements. Each
  // factor is below 2^31, so only the byte count can overflow.
  int64_t elems = 0, bytes = 0;
  if (__builtin_mul_overflow(v.rows - 1, v.ld, &elems) ||
      __builtin_add_overflow(elems, v.cols, &elems) ||
      __builtin_mul_overflow(elems, static_cast<int64_t>(DTypeSize(v.dtype)),
                             &bytes)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "batch[", index, "]: the view spans more than 2^63 bytes"));
  }
  if (reinterpret_cast<uintptr_t>(v.data) % DTypeSize(v.dtype) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch[", index, "]: data not aligned to its element size (",
                     DTypeSize(v.dtype), " bytes for ", DTypeName(v.dtype), ")"));
  }
  if (v.block_rows != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "batch[", index, "]: a blocked view (block_rows ", v.block_rows,
        ") is taken by device calls only; gather its rows first (SliceV)"));
  }
  return absl::OkStatus();
}

absl::Status ValidateBlockedView(const MatrixView& v, size_t index) {
  if (v.block_rows <= 0 || v.rows % v.block_rows != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "batch[", index, "]: block_rows ", v.block_rows, " must divide rows ", v.rows));
  }
  MatrixView block = v;
  block.rows = v.block_rows;
  block.block_rows = 0;
  block.block_stride = 0;
  if (absl::Status s = ValidateView(block, index); !s.ok()) return s;
  if (v.rows > INT32_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch[", index, "]: dimensions exceed 2^31 (rows ", v.rows, ")"));
  }
  // block_stride >= block_rows * ld: each block ends before the next starts.
  int64_t block_elems = 0;
  if (__builtin_mul_overflow(v.block_rows, v.ld, &block_elems) ||
      v.block_stride < block_elems) {
    return absl::InvalidArgumentError(absl::StrCat(
        "batch[", index, "]: block_stride ", v.block_stride,
        " overlaps its blocks (block_rows ", v.block_rows, " x ld ", v.ld, ")"));
  }
  // The last element: (blocks - 1) * block_stride + (block_rows - 1) * ld
  // + cols elements from data.
  int64_t elems = 0, bytes = 0;
  if (__builtin_mul_overflow(v.rows / v.block_rows - 1, v.block_stride, &elems) ||
      __builtin_add_overflow(elems, block_elems - v.ld + v.cols, &elems) ||
      __builtin_mul_overflow(elems, static_cast<int64_t>(DTypeSize(v.dtype)), &bytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch[", index, "]: the view spans more than 2^63 bytes"));
  }
  return absl::OkStatus();
}

absl::Status NonFiniteError(size_t index) {
  return absl::InvalidArgumentError(
      absl::StrCat("batch[", index, "]: matrix contains NaN or Inf"));
}

absl::Status CallCancelled() {
  return absl::CancelledError("the caller cancelled the call; no result");
}

absl::StatusOr<VariantKind> CheckCall(absl::Span<const MatrixView> batch,
                                      const VariantSpec& variant,
                                      absl::Span<double> out,
                                      std::string_view backend,
                                      std::string_view default_variant) {
  if (out.size() != batch.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "out has ", out.size(), " slots for a batch of ", batch.size()));
  }
  std::fill(out.begin(), out.end(), std::numeric_limits<double>::quiet_NaN());
  absl::StatusOr<VariantKind> kind =
      ParseVariant(variant, backend, default_variant);
  if (!kind.ok()) return kind.status();
  for (size_t i = 0; i < batch.size(); ++i) {
    if (absl::Status s = ValidateView(batch[i], i); !s.ok()) return s;
  }
  return kind;
}

double PRFromSingularValues(absl::Span<const double> sv) {
  double smax = 0;
  for (double s : sv) smax = std::max(smax, std::fabs(s));
  if (smax == 0) return 0.0;
  double sum2 = 0, sum4 = 0;
  for (double s : sv) {
    const double t = s / smax, t2 = t * t;
    sum2 += t2;
    sum4 += t2 * t2;
  }
  return sum2 * sum2 / sum4;
}

}  // namespace rvd

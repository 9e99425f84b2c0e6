// Host planning of a snapshot (snapshot.h): validation, tiles, descriptors.
#include <algorithm>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/call_contract.h"
#include "kernels/cuda/snapshot.h"
#include "kernels/engine.h"

namespace rvd::cuda {
namespace {

bool Aligned(const void* p, int64_t unit) {
  return reinterpret_cast<uintptr_t>(p) % static_cast<uintptr_t>(unit) == 0;
}

absl::Status ItemError(size_t i, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("snapshot items[", i, "]: ", what));
}

}  // namespace

absl::StatusOr<SnapshotPlan> PlanSnapshot(absl::Span<const rvd_snapshot_item> items) {
  if (items.size() > kMaxSnapshotItems) {
    return absl::InvalidArgumentError(absl::StrCat("a snapshot of ", items.size(),
                                                   " items; at most ", kMaxSnapshotItems));
  }
  SnapshotPlan plan;
  plan.items.reserve(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    const rvd_snapshot_item& it = items[i];
    const rvd_matrix& m = it.src;
    if (m.memory != RVD_MEMORY_DEVICE) return ItemError(i, "the source is not device memory");
    if (m.dtype < RVD_DTYPE_F32 || m.dtype > RVD_DTYPE_BF16) {
      return ItemError(i, absl::StrCat("unknown dtype ", m.dtype));
    }
    const MatrixView v{m.data, m.rows, m.cols, m.ld, static_cast<DType>(m.dtype),
                       m.block_rows, m.block_stride};
    // The call contract's checks (their messages name batch[i]).
    const absl::Status valid = v.block_rows == 0 ? ValidateView(v, i) : ValidateBlockedView(v, i);
    if (!valid.ok()) return ItemError(i, std::string(valid.message()));
    const int64_t es = static_cast<int64_t>(DTypeSize(v.dtype));
    if (it.dst == nullptr) return ItemError(i, "dst is null");
    if (!Aligned(it.dst, es) || (it.last != nullptr && !Aligned(it.last, es))) {
      return ItemError(i, absl::StrCat("dst or last not aligned to the element size (", es,
                                       " bytes)"));
    }
    SnapshotDesc d{};
    d.src = static_cast<const unsigned char*>(m.data);
    d.dst = static_cast<unsigned char*>(it.dst);
    d.last = static_cast<const unsigned char*>(it.last);
    d.dtype = m.dtype;
    // ValidateView bounds rows, cols and ld below 2^31 and the extent in
    // int64 bytes, so none of these products overflows.
    const int64_t row_bytes = v.cols * es;
    const bool contiguous =
        v.ld == v.cols && (v.block_rows == 0 || v.block_stride == v.block_rows * v.ld);
    if (contiguous) {
      d.flags = kSnapshotFlat;
      d.rows = 1;
      d.row_bytes = v.rows * row_bytes;
      d.src_pitch = d.row_bytes;
      d.block_rows = 1;
      d.block_stride = d.row_bytes;
      d.tile_rows = 1;
      d.tile_bytes = kSnapshotTileBytes;
      d.tiles = (d.row_bytes + kSnapshotTileBytes - 1) / kSnapshotTileBytes;
      if (Aligned(d.src, 16) && Aligned(d.dst, 16) && (d.last == nullptr || Aligned(d.last, 16))) {
        d.flags |= kSnapshotVector;
      }
    } else {
      d.rows = v.rows;
      d.row_bytes = row_bytes;
      d.src_pitch = v.ld * es;
      d.block_rows = v.block_rows == 0 ? v.rows : v.block_rows;
      d.block_stride = v.block_rows == 0 ? v.rows * d.src_pitch : v.block_stride * es;
      d.tile_rows = std::max<int64_t>(1, kSnapshotTileBytes / row_bytes);
      d.tile_bytes = 0;
      d.tiles = (v.rows + d.tile_rows - 1) / d.tile_rows;
      if (Aligned(d.src, 16) && Aligned(d.dst, 16) && (d.last == nullptr || Aligned(d.last, 16)) &&
          d.src_pitch % 16 == 0 && d.block_stride % 16 == 0 && row_bytes % 16 == 0) {
        d.flags |= kSnapshotVector;
      }
    }
    d.first_tile = plan.tiles;
    plan.tiles += d.tiles;
    if (plan.tiles > kMaxSnapshotTiles) {
      return absl::InvalidArgumentError(absl::StrCat(
          "a snapshot of more than ", kMaxSnapshotTiles, " tiles (", kSnapshotTileBytes,
          " bytes each) at items[", i, "]"));
    }
    plan.src_bytes += static_cast<uint64_t>(v.rows * row_bytes);
    plan.items.push_back(d);
  }
  return plan;
}

}  // namespace rvd::cuda

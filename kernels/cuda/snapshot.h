// Snapshots of live weights (private to kernels/cuda/): one pass per
// snapshot copies every item's source (a device view: strided or blocked,
// possibly another process's memory mapped here) into a dense buffer and,
// when the item has the previous snapshot (`last`), sums ||src - last||^2
// and ||last||^2 in float64 in the same read.
//
// The work is cut into tiles (about kSnapshotTileBytes of source each); one
// block computes a tile and writes its two partial sums to the tile's slot,
// then a warp per item adds its tiles' partials in a fixed order. No float
// atomics: the same inputs give the same bits.
//
// Host planning (PlanSnapshot: validation, tiles, the descriptors) is plain
// C++ and runs without a GPU; the launchers are in snapshot.cu. None
// synchronizes.
#ifndef RVD_KERNELS_CUDA_SNAPSHOT_H_
#define RVD_KERNELS_CUDA_SNAPSHOT_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/cuda_module.h"

namespace rvd::cuda {

// Source bytes per tile: 32 KiB is 2048 16-byte loads, 8 per thread of a
// 256-thread block, and 8192 tiles for a 7B V set (32 x 1024x4096 bf16),
// about 8 waves of blocks on 132 SMs (a small tail).
inline constexpr int64_t kSnapshotTileBytes = 32 << 10;
// Bounds that keep every index of the launch in range.
inline constexpr size_t kMaxSnapshotItems = 1u << 20;
inline constexpr int64_t kMaxSnapshotTiles = int64_t{1} << 30;

// SnapshotDesc::flags.
enum SnapshotFlags : int32_t {
  // The source is one contiguous byte range (ld == cols, and blocks that
  // follow each other): the item is copied as one row of row_bytes, cut
  // into tiles of tile_bytes.
  kSnapshotFlat = 1,
  // Every address, pitch and row length is a multiple of 16 bytes: 16-byte
  // loads and stores (flat items: the three base addresses; the tail of
  // the range, if any, goes element by element).
  kSnapshotVector = 2,
};

// One item as the kernels read it (plain data, copied to the device). All
// sizes in bytes.
struct SnapshotDesc {
  const unsigned char* src;
  unsigned char* dst;         // dense: row r at dst + r * row_bytes
  const unsigned char* last;  // dense as dst, or null (no sums)
  int64_t rows;               // flat: 1
  int64_t row_bytes;          // flat: the whole item
  int64_t src_pitch;          // between consecutive rows of a block
  int64_t block_rows;         // rows per block (rows when not blocked)
  int64_t block_stride;       // between block starts
  int64_t tile_rows;          // rows per tile (flat: 1)
  int64_t tile_bytes;         // bytes per tile (flat only; a multiple of 16)
  int64_t first_tile;         // the item's first tile in the launch
  int64_t tiles;              // how many tiles the item has
  int32_t dtype;              // enum rvd_dtype
  int32_t flags;              // SnapshotFlags
};

struct SnapshotPlan {
  std::vector<SnapshotDesc> items;  // in the caller's order
  int64_t tiles = 0;                // over all items
  uint64_t src_bytes = 0;           // bytes the items' sources hold
};

// Validates the items and cuts them into tiles. INVALID_ARGUMENT, naming
// items[i], for: a source that is not device memory or not a valid view
// (call_contract.h: ValidateView, ValidateBlockedView), a null dst, a dst
// or last not aligned to the element size, more than kMaxSnapshotItems
// items or kMaxSnapshotTiles tiles.
absl::StatusOr<SnapshotPlan> PlanSnapshot(absl::Span<const rvd_snapshot_item> items);

// Queues the copy of a plan on `stream`: items[0..n) (device copies of
// plan.items), tiles as in the plan; writes partials[2 * t], [2 * t + 1] =
// the tile's ||src - last||^2 and ||last||^2 (0 for items without last).
// max_sms > 0: at most that many blocks (taking the tiles round-robin), so
// the copy occupies at most max_sms SMs; the sums are the same either way.
cudaError_t LaunchSnapshotCopy(const SnapshotDesc* items, int n, int64_t tiles,
                               double* partials, int max_sms, cudaStream_t stream);
// Queues the sums: sums[2 * i], [2 * i + 1] = item i's tiles' partials,
// added in a fixed order (lane l of the item's warp: tiles l, l + 32, ...;
// then the lanes by the xor tree).
cudaError_t LaunchSnapshotSums(const SnapshotDesc* items, int n, const double* partials,
                               double* sums, cudaStream_t stream);

}  // namespace rvd::cuda

#endif  // RVD_KERNELS_CUDA_SNAPSHOT_H_

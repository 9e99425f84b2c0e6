// The snapshot kernels (snapshot.h): copy + deltas in one pass, then the
// per-item sums.
//
//   SnapshotCopyKernel  a block per tile (grid-stride over tiles): finds its
//                       item (binary search over first_tile), copies the
//                       tile's bytes (16-byte units when kSnapshotVector,
//                       else element by element) and, with `last`, sums
//                       (src - last)^2 and last^2 in float64 per thread,
//                       then over the block in a fixed order into the
//                       tile's partials slot.
//   SnapshotSumKernel   a warp per item adds its tiles' partials in a fixed
//                       order (lanes over the tiles, then the xor tree).
// Loads of src and last are streaming (__ldcs: each byte is read once).
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "kernels/cuda/snapshot.h"

namespace rvd::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kUnroll = 4;  // 16-byte loads in flight per thread (x2 with last)

template <int kDType>
__device__ __forceinline__ float Element(uint32_t bits) {
  if constexpr (kDType == RVD_DTYPE_F32) {
    return __uint_as_float(bits);
  } else if constexpr (kDType == RVD_DTYPE_BF16) {
    return __uint_as_float(bits << 16);
  } else {
    return __half2float(__ushort_as_half(static_cast<unsigned short>(bits)));
  }
}

__device__ __forceinline__ void AddPair(float s, float l, double& d2, double& l2) {
  const double d = static_cast<double>(s) - static_cast<double>(l);
  d2 = fma(d, d, d2);
  l2 = fma(static_cast<double>(l), static_cast<double>(l), l2);
}

// The 32-bit word's one f32 or two 16-bit elements.
template <int kDType>
__device__ __forceinline__ void AddWord(uint32_t s, uint32_t l, double& d2, double& l2) {
  if constexpr (kDType == RVD_DTYPE_F32) {
    AddPair(__uint_as_float(s), __uint_as_float(l), d2, l2);
  } else {
    AddPair(Element<kDType>(s & 0xffffu), Element<kDType>(l & 0xffffu), d2, l2);
    AddPair(Element<kDType>(s >> 16), Element<kDType>(l >> 16), d2, l2);
  }
}

template <int kDType>
__device__ __forceinline__ void AddUnit(const uint4& s, const uint4& l, double& d2, double& l2) {
  AddWord<kDType>(s.x, l.x, d2, l2);
  AddWord<kDType>(s.y, l.y, d2, l2);
  AddWord<kDType>(s.z, l.z, d2, l2);
  AddWord<kDType>(s.w, l.w, d2, l2);
}

// Element-sized units: 4 bytes for f32, 2 for f16/bf16.
template <int kDType>
using Scalar = typename std::conditional<kDType == RVD_DTYPE_F32, uint32_t, uint16_t>::type;

template <int kDType, bool kLast>
__device__ __forceinline__ void CopyScalar(const unsigned char* s, unsigned char* d,
                                           const unsigned char* l, double& d2, double& l2) {
  using T = Scalar<kDType>;
  const T v = __ldcs(reinterpret_cast<const T*>(s));
  *reinterpret_cast<T*>(d) = v;
  if constexpr (kLast) {
    const T w = __ldcs(reinterpret_cast<const T*>(l));
    AddPair(Element<kDType>(v), Element<kDType>(w), d2, l2);
  }
}

// Bytes [begin, end) of a flat item, begin a multiple of 16.
template <int kDType, bool kLast>
__device__ void CopyFlat(const SnapshotDesc& it, int64_t begin, int64_t end, bool vector,
                         double& d2, double& l2) {
  int64_t scalar_begin = begin;
  if (vector) {
    const int64_t units = (end - begin) / 16;
    const uint4* s = reinterpret_cast<const uint4*>(it.src + begin);
    uint4* d = reinterpret_cast<uint4*>(it.dst + begin);
    const uint4* l = reinterpret_cast<const uint4*>(kLast ? it.last + begin : nullptr);
    for (int64_t u0 = threadIdx.x; u0 < units; u0 += kUnroll * kThreads) {
      uint4 sv[kUnroll], lv[kUnroll];
#pragma unroll
      for (int k = 0; k < kUnroll; ++k) {
        const int64_t u = u0 + k * kThreads;
        if (u < units) {
          sv[k] = __ldcs(s + u);
          if constexpr (kLast) lv[k] = __ldcs(l + u);
        }
      }
#pragma unroll
      for (int k = 0; k < kUnroll; ++k) {
        const int64_t u = u0 + k * kThreads;
        if (u < units) {
          d[u] = sv[k];
          if constexpr (kLast) AddUnit<kDType>(sv[k], lv[k], d2, l2);
        }
      }
    }
    scalar_begin = begin + units * 16;
  }
  constexpr int64_t es = sizeof(Scalar<kDType>);
  const int64_t n = (end - scalar_begin) / es;
  for (int64_t e = threadIdx.x; e < n; e += kThreads) {
    const int64_t off = scalar_begin + e * es;
    CopyScalar<kDType, kLast>(it.src + off, it.dst + off, kLast ? it.last + off : nullptr, d2, l2);
  }
}

// Rows [r0, r1) of a strided or blocked item.
template <int kDType, bool kLast>
__device__ void CopyRows(const SnapshotDesc& it, int64_t r0, int64_t r1, bool vector,
                         double& d2, double& l2) {
  const uint32_t unit = vector ? 16u : static_cast<uint32_t>(sizeof(Scalar<kDType>));
  const uint32_t per_row = static_cast<uint32_t>(it.row_bytes / unit);
  // tile_rows * row_bytes <= kSnapshotTileBytes, or one row: below 2^31 units.
  const uint32_t total = static_cast<uint32_t>(r1 - r0) * per_row;
  for (uint32_t i = threadIdx.x; i < total; i += kThreads) {
    const uint32_t row_in_tile = i / per_row;
    const uint32_t u = i - row_in_tile * per_row;
    const int64_t r = r0 + row_in_tile;
    const int64_t src_off =
        (r / it.block_rows) * it.block_stride + (r % it.block_rows) * it.src_pitch +
        static_cast<int64_t>(u) * unit;
    const int64_t dst_off = r * it.row_bytes + static_cast<int64_t>(u) * unit;
    if (vector) {
      const uint4 v = __ldcs(reinterpret_cast<const uint4*>(it.src + src_off));
      *reinterpret_cast<uint4*>(it.dst + dst_off) = v;
      if constexpr (kLast) {
        AddUnit<kDType>(v, __ldcs(reinterpret_cast<const uint4*>(it.last + dst_off)), d2, l2);
      }
    } else {
      CopyScalar<kDType, kLast>(it.src + src_off, it.dst + dst_off,
                                kLast ? it.last + dst_off : nullptr, d2, l2);
    }
  }
}

template <int kDType, bool kLast>
__device__ void CopyTile(const SnapshotDesc& it, int64_t t, double& d2, double& l2) {
  const bool vector = (it.flags & kSnapshotVector) != 0;
  if (it.flags & kSnapshotFlat) {
    const int64_t begin = t * it.tile_bytes;
    const int64_t end = begin + it.tile_bytes < it.row_bytes ? begin + it.tile_bytes : it.row_bytes;
    CopyFlat<kDType, kLast>(it, begin, end, vector, d2, l2);
  } else {
    const int64_t r0 = t * it.tile_rows;
    const int64_t r1 = r0 + it.tile_rows < it.rows ? r0 + it.tile_rows : it.rows;
    CopyRows<kDType, kLast>(it, r0, r1, vector, d2, l2);
  }
}

template <int kDType>
__device__ void CopyTileOf(const SnapshotDesc& it, int64_t t, double& d2, double& l2) {
  if (it.last != nullptr) {
    CopyTile<kDType, true>(it, t, d2, l2);
  } else {
    CopyTile<kDType, false>(it, t, d2, l2);
  }
}

__global__ void __launch_bounds__(kThreads)
    SnapshotCopyKernel(const SnapshotDesc* __restrict__ items, int n, int64_t tiles,
                       double* __restrict__ partials) {
  __shared__ int item_of_tile;
  __shared__ double red_d2[kThreads / 32], red_l2[kThreads / 32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    if (threadIdx.x == 0) {
      // The last item whose first tile is <= tile (items are in tile order).
      int lo = 0, hi = n - 1;
      while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (items[mid].first_tile <= tile) {
          lo = mid;
        } else {
          hi = mid - 1;
        }
      }
      item_of_tile = lo;
    }
    __syncthreads();
    const SnapshotDesc it = items[item_of_tile];
    double d2 = 0.0, l2 = 0.0;
    const int64_t t = tile - it.first_tile;
    switch (it.dtype) {
      case RVD_DTYPE_F32:
        CopyTileOf<RVD_DTYPE_F32>(it, t, d2, l2);
        break;
      case RVD_DTYPE_F16:
        CopyTileOf<RVD_DTYPE_F16>(it, t, d2, l2);
        break;
      default:
        CopyTileOf<RVD_DTYPE_BF16>(it, t, d2, l2);
        break;
    }
    // Fixed order: lanes by the xor tree, then warps in order.
#pragma unroll
    for (int off = 16; off > 0; off /= 2) {
      d2 += __shfl_xor_sync(0xffffffffu, d2, off);
      l2 += __shfl_xor_sync(0xffffffffu, l2, off);
    }
    if (lane == 0) {
      red_d2[warp] = d2;
      red_l2[warp] = l2;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      double bd = 0.0, bl = 0.0;
      for (int w = 0; w < kThreads / 32; ++w) {
        bd += red_d2[w];
        bl += red_l2[w];
      }
      partials[2 * tile] = bd;
      partials[2 * tile + 1] = bl;
    }
    // item_of_tile and red_* are rewritten by the next tile.
    __syncthreads();
  }
}

// A warp per item: lane l adds tiles l, l + 32, ... in order, then the
// lanes' sums meet by the xor tree (a fixed order: the same bits every run).
// A 7B layer has 256 tiles: 8 loads per lane instead of 256 in a row.
__global__ void SnapshotSumKernel(const SnapshotDesc* __restrict__ items, int n,
                                  const double* __restrict__ partials, double* __restrict__ sums) {
  const int i = static_cast<int>((blockIdx.x * blockDim.x + threadIdx.x) / 32);
  const int lane = threadIdx.x % 32;
  if (i >= n) return;  // whole warps leave together
  const int64_t first = items[i].first_tile, end = first + items[i].tiles;
  double d2 = 0.0, l2 = 0.0;
  for (int64_t t = first + lane; t < end; t += 32) {
    d2 += partials[2 * t];
    l2 += partials[2 * t + 1];
  }
#pragma unroll
  for (int off = 16; off > 0; off /= 2) {
    d2 += __shfl_xor_sync(0xffffffffu, d2, off);
    l2 += __shfl_xor_sync(0xffffffffu, l2, off);
  }
  if (lane == 0) {
    sums[2 * i] = d2;
    sums[2 * i + 1] = l2;
  }
}

}  // namespace

cudaError_t LaunchSnapshotCopy(const SnapshotDesc* items, int n, int64_t tiles,
                               double* partials, int max_sms, cudaStream_t stream) {
  if (n <= 0 || tiles <= 0) return cudaSuccess;
  // A block per tile up to 2^20 blocks (or the SM cap); beyond, blocks
  // take several tiles. A tile's partials do not depend on which block
  // computed it.
  const int64_t limit = max_sms > 0 ? max_sms : (int64_t{1} << 20);
  const int64_t grid = tiles < limit ? tiles : limit;
  SnapshotCopyKernel<<<static_cast<unsigned>(grid), kThreads, 0, stream>>>(items, n, tiles,
                                                                            partials);
  return cudaGetLastError();
}

cudaError_t LaunchSnapshotSums(const SnapshotDesc* items, int n, const double* partials,
                               double* sums, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  constexpr int kSumThreads = 128;  // 4 items per block
  constexpr int kItemsPerBlock = kSumThreads / 32;
  SnapshotSumKernel<<<static_cast<unsigned>((n + kItemsPerBlock - 1) / kItemsPerBlock),
                      kSumThreads, 0, stream>>>(items, n, partials, sums);
  return cudaGetLastError();
}

}  // namespace rvd::cuda

// The device gather of blocked views (gather.h).
#include "kernels/cuda/gather.h"

#include <cuda_runtime.h>

namespace rvd::cuda {
namespace {

// One thread per unit of a row (grid-stride over rows and units): the rows
// of a gpt_neox layer are a few KiB each, so a row is one or a few blocks'
// worth of coalesced units.
template <typename Unit>
__global__ void GatherBlockedRowsKernel(const unsigned char* __restrict__ src,
                                        unsigned char* __restrict__ dst, int64_t rows,
                                        int64_t row_units, int64_t block_rows, int64_t src_pitch,
                                        int64_t block_stride_bytes, int64_t dst_pitch) {
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    const unsigned char* s =
        src + (r / block_rows) * block_stride_bytes + (r % block_rows) * src_pitch;
    unsigned char* d = dst + r * dst_pitch;
    for (int64_t u = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; u < row_units;
         u += static_cast<int64_t>(gridDim.x) * blockDim.x) {
      reinterpret_cast<Unit*>(d)[u] = reinterpret_cast<const Unit*>(s)[u];
    }
  }
}

template <typename Unit>
cudaError_t Launch(const BlockedRowsCopy& c, cudaStream_t stream) {
  constexpr int kThreads = 256;
  const int64_t units = c.row_bytes / static_cast<int64_t>(sizeof(Unit));
  const int64_t x = (units + kThreads - 1) / kThreads;
  const dim3 grid(static_cast<unsigned>(x < 64 ? x : 64),
                  static_cast<unsigned>(c.rows < 65535 ? c.rows : 65535));
  GatherBlockedRowsKernel<Unit><<<grid, kThreads, 0, stream>>>(
      static_cast<const unsigned char*>(c.src), static_cast<unsigned char*>(c.dst), c.rows, units,
      c.block_rows, c.src_pitch, c.block_stride_bytes, c.dst_pitch);
  return cudaGetLastError();
}

// Whether every address and size of the copy is a multiple of `unit`.
bool AllMultiplesOf(const BlockedRowsCopy& c, int64_t unit) {
  const auto a = [unit](const void* p) { return reinterpret_cast<uintptr_t>(p) % unit == 0; };
  return a(c.src) && a(c.dst) && c.row_bytes % unit == 0 && c.src_pitch % unit == 0 &&
         c.block_stride_bytes % unit == 0 && c.dst_pitch % unit == 0;
}

}  // namespace

cudaError_t LaunchGatherBlockedRows(const BlockedRowsCopy& c, cudaStream_t stream) {
  if (c.rows <= 0 || c.row_bytes <= 0) return cudaSuccess;
  if (AllMultiplesOf(c, 16)) return Launch<uint4>(c, stream);
  if (AllMultiplesOf(c, 4)) return Launch<uint32_t>(c, stream);
  return Launch<uint16_t>(c, stream);  // every dtype is a multiple of 2 bytes
}

}  // namespace rvd::cuda

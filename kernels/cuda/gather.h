// The device gather of a blocked view (MatrixView::block_rows, engine.h):
// copies its rows, block after block, into a contiguous buffer on a stream,
// so that a V interleaved with Q and K in a device tensor (gpt_neox) is
// computed on like any other matrix without passing through the host.
// Includes CUDA headers only (no absl, no STL containers), like the kernel
// headers, so that it builds under nvcc and NVRTC alike.
#ifndef RVD_KERNELS_CUDA_GATHER_H_
#define RVD_KERNELS_CUDA_GATHER_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace rvd::cuda {

// Row r of the source starts at src + (r / block_rows) * block_stride_bytes
// + (r % block_rows) * src_pitch; it lands at dst + r * dst_pitch. Each row
// is row_bytes long. All sizes are bytes; every value is positive.
struct BlockedRowsCopy {
  const void* src = nullptr;
  void* dst = nullptr;
  int64_t rows = 0;
  int64_t row_bytes = 0;
  int64_t block_rows = 0;
  int64_t src_pitch = 0;
  int64_t block_stride_bytes = 0;
  int64_t dst_pitch = 0;
};

// Queues the copy on `stream` (16-byte units when every address and size
// allows it, else 4- or 2-byte units). Returns the launch's error.
cudaError_t LaunchGatherBlockedRows(const BlockedRowsCopy& copy, cudaStream_t stream);

}  // namespace rvd::cuda

#endif  // RVD_KERNELS_CUDA_GATHER_H_

// Test-only device work for cuda_live_test (live_test_kernels.h).
#include <cuda_runtime.h>

#include "kernels/cuda/live_test_kernels.h"

namespace rvd::cuda::live_test {
namespace {

__device__ uint64_t GlobalTimerNs() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void SpinKernel(uint64_t ns) {
  const uint64_t start = GlobalTimerNs();
  while (GlobalTimerNs() - start < ns) {
  }
}

__global__ void HashFillKernel(uint16_t* p, uint64_t n, uint64_t seed, uint64_t first) {
  for (uint64_t i = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
    p[i] = HashBf16(seed, first + i);
  }
}

}  // namespace

cudaError_t LaunchSpin(double ms, cudaStream_t stream) {
  SpinKernel<<<1, 1, 0, stream>>>(static_cast<uint64_t>(ms * 1e6));
  return cudaGetLastError();
}

cudaError_t LaunchHashFill(uint16_t* p, uint64_t n, uint64_t seed, uint64_t first,
                           cudaStream_t stream) {
  HashFillKernel<<<1024, 256, 0, stream>>>(p, n, seed, first);
  return cudaGetLastError();
}

}  // namespace rvd::cuda::live_test

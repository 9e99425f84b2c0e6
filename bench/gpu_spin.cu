// rvd_bench_gpu's gate (--sustain): a kernel that keeps the GPU busy for a
// while without touching memory, queued ahead of a timed launch so that the
// GPU reaches the start event only after the host has queued the launch.
// (A memset did the same but left dirty L2 lines that the timed kernel then
// wrote back: +10-20 us, run s6-4.)
#include <cuda_runtime.h>

#include <cstdint>

namespace rvd::cuda {
namespace {

__global__ void SpinKernel(uint64_t ns) {
  uint64_t start = 0, now = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < ns);
}

}  // namespace

cudaError_t LaunchSpin(uint64_t ns, cudaStream_t stream) {
  SpinKernel<<<1, 1, 0, stream>>>(ns);
  return cudaGetLastError();
}

}  // namespace rvd::cuda

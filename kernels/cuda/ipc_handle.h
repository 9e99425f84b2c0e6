// The byte formats of live-weight sharing (private to kernels/cuda/): the
// body of PyTorch's expandable-segment handle (type 'e') and the device UUID
// as nvidia-smi prints it. Plain C++: tested without a GPU.
//
// PyTorch's 'e' handle (c10/cuda/CUDACachingAllocator.cpp,
// ExpandableSegment::share and fromShared; the same in torch 2.x through
// today's main): after the 2-byte prefix (version 2, type 'e', which the
// caller strips), the raw bytes of
//     struct ShareHeader { pid_t pid; size_t segment_size; size_t num_handles; };
// on x86-64/aarch64 Linux: pid (int32) at 0, 4 bytes of padding (zeroed by
// recent versions, not by older ones: never read), segment_size (uint64) at
// 8, num_handles (uint64) at 16: 24 bytes. Then num_handles handles, each
// the producer's POSIX file descriptor number (int32) of one physical
// allocation of segment_size bytes (cuMemExportToShareableHandle), or, when
// the producer's allocator uses fabric handles (multi-node NVLink systems),
// a 64-byte CUmemFabricHandle each. The pages are consecutive: page i maps
// at i * segment_size from the shared range's start, which is where the
// storage offset PyTorch reports (storage_offset_bytes) counts from. The
// receiver takes each fd with pidfd_open(pid) + pidfd_getfd, imports it
// (cuMemImportFromShareableHandle) and maps the pages in order into one
// reserved range. The torch 2.11 handle of one 20 MiB page, measured on the
// H200 host, is 30 bytes: 2 + 24 + 4.
#ifndef RVD_KERNELS_CUDA_IPC_HANDLE_H_
#define RVD_KERNELS_CUDA_IPC_HANDLE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace rvd::cuda {

inline constexpr size_t kExpandableHeaderBytes = 24;
inline constexpr size_t kFabricHandleBytes = 64;
// More pages than any GPU holds (141 GB in 2 MiB pages is 67k): a header
// beyond it is garbage.
inline constexpr uint64_t kMaxExpandablePages = 1u << 20;

struct ExpandableShare {
  int32_t pid = 0;            // the producer, in its pid namespace
  uint64_t segment_size = 0;  // bytes per page (one physical allocation)
  uint64_t pages = 0;         // num_handles
  std::vector<int32_t> fds;   // the producer's descriptor of each page, in order
  bool fabric = false;        // fabric handles instead of fds (fds empty)
  uint64_t bytes() const { return segment_size * pages; }
};

// Parses the body of an 'e' handle (the bytes after the 2-byte prefix).
// INVALID_ARGUMENT, saying what is wrong, for: fewer than 24 bytes, a pid
// <= 0, segment_size 0, no pages or more than kMaxExpandablePages, a total
// size beyond 2^63, a byte count matching neither fds nor fabric handles
// for that many pages, a negative fd. (Whether segment_size suits the
// device's granularity is the mapping's check.)
absl::StatusOr<ExpandableShare> ParseExpandableShare(absl::Span<const uint8_t> body);

// The body PyTorch's share() writes for these fds (padding zeroed), for
// producers in tests and tools.
std::vector<uint8_t> SerializeExpandableShare(int32_t pid, uint64_t segment_size,
                                              absl::Span<const int32_t> fds);

// "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" (lower-case hex of the 16
// bytes in order), as nvidia-smi -L and NVIDIA_VISIBLE_DEVICES print it.
std::string FormatGpuUuid(const unsigned char bytes[16]);

}  // namespace rvd::cuda

#endif  // RVD_KERNELS_CUDA_IPC_HANDLE_H_

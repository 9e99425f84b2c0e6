// The device side of live models: what rvd needs from a GPU to read a
// trainer's weights in place (CUDA IPC), reached as Engine::Live().
//
// A trainer on rvd's GPU shares its memory segments once; rvd maps each
// (OpenSegment) and on a step notification copies the V set into device
// memory of its own (StartSnapshot), ordered after the trainer's
// interprocess event and followed by an event of rvd's own that the trainer
// waits on before its next weight update; the same pass sums the weight
// delta against the previous snapshot. FinishSnapshot waits for the copy and
// hands the sums back. The engine then computes PR from the copy
// (Engine::ComputePRDevice).
//
// The CUDA engine implements it over the module's table (kernels/
// cuda_module.h, rvd_cuda_live; server/backend.cc); the CPU engine has none
// (Engine::Live() is nullptr). Tests substitute a host-memory fake
// (server/fake_live_device.h).
//
// Thread-safe: every member may be called from any thread. Handles (Segment,
// Snapshot, events) are the implementation's; each is released exactly once
// by the matching call.
#ifndef RVD_KERNELS_LIVE_DEVICE_H_
#define RVD_KERNELS_LIVE_DEVICE_H_

#include <array>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/engine.h"

namespace rvd {

// How a producer shared a memory segment (rvd_ipc_kind, same numbering).
enum class IpcKind {
  kCudaMalloc = 0,  // a 64-byte cudaIpcMemHandle_t of a cudaMalloc'ed block
  kExpandable = 1,  // PyTorch's expandable segment (the bytes after 'e')
};

// The bytes of a CUDA IPC event or memory handle.
inline constexpr size_t kIpcHandleBytes = 64;
using IpcHandle = std::array<uint8_t, kIpcHandleBytes>;

class LiveDevice {
 public:
  struct Segment;   // opaque: one mapping of a producer's segment
  struct Snapshot;  // opaque: one snapshot in flight

  // A producer's segment mapped here.
  struct MappedSegment {
    Segment* segment = nullptr;  // for CloseSegment
    void* base = nullptr;        // device address of the segment's byte 0
    uint64_t bytes = 0;          // bytes mapped from base
  };

  // An interprocess event of rvd's own and the handle a producer opens.
  struct OwnEvent {
    void* event = nullptr;  // for StartSnapshot's `done` and DestroyEvent
    IpcHandle handle{};
  };

  // One matrix of a snapshot: `src` (device memory, possibly a mapped
  // segment, possibly blocked) is copied into `dst` (dense: src.rows x
  // src.cols, ld = cols, the same dtype). With `last` (dense, the same
  // shape: an earlier snapshot) the same pass sums ||src - last||_F^2 and
  // ||last||_F^2. `dst` and `last` must not overlap.
  struct SnapshotItem {
    MatrixView src;
    void* dst = nullptr;
    const void* last = nullptr;  // null: no delta (both sums 0)
  };

  virtual ~LiveDevice() = default;

  // Maps a producer's segment. `handle` is the kind's payload (64 bytes for
  // kCudaMalloc). Errors: INVALID_ARGUMENT (a handle that does not open),
  // PERMISSION_DENIED (an expandable segment's descriptors may not be
  // taken; the message names the permission), NOT_FOUND (the producer is
  // gone), FAILED_PRECONDITION (a segment of another device).
  virtual absl::StatusOr<MappedSegment> OpenSegment(IpcKind kind,
                                                    absl::Span<const uint8_t> handle,
                                                    int32_t producer_pid,
                                                    uint64_t segment_bytes) = 0;
  // Unmaps it. Nothing of it may be in use: every snapshot reading it has
  // been finished.
  virtual void CloseSegment(Segment* segment) = 0;

  // The device's UUID as nvidia-smi prints it ("GPU-8f0c...").
  virtual absl::StatusOr<std::string> DeviceUuid() = 0;

  // A producer's interprocess event opened here (an opaque event), for
  // StartSnapshot's `wait`; release with DestroyEvent.
  virtual absl::StatusOr<void*> OpenEvent(const IpcHandle& handle) = 0;
  // An interprocess event of rvd's own (timing disabled) and its handle.
  virtual absl::StatusOr<OwnEvent> CreateEvent() = 0;
  // Releases an event from OpenEvent or CreateEvent.
  virtual void DestroyEvent(void* event) = 0;

  // Device memory of rvd's own, charged to the engine's device memory cap
  // (over it: RESOURCE_EXHAUSTED), and its release.
  virtual absl::StatusOr<void*> AllocDevice(uint64_t bytes) = 0;
  virtual void FreeDevice(void* p) = 0;

  // Enqueues a snapshot and returns without waiting for the device: after
  // `wait` (an opened event, or null), copies every item, then records
  // `done` (an own event, or null). On failure nothing is enqueued. Every
  // snapshot started is finished exactly once.
  virtual absl::StatusOr<Snapshot*> StartSnapshot(absl::Span<const SnapshotItem> items,
                                                  void* wait, void* done) = 0;
  // Waits for it, writes delta_sq[i] = ||src_i - last_i||_F^2 and
  // last_sq[i] = ||last_i||_F^2 in float64 (0 for items without last;
  // both spans as long as the items), and releases it, also on error.
  // `call.cancel` stops the wait (CANCELLED).
  virtual absl::Status FinishSnapshot(Snapshot* snapshot, absl::Span<double> delta_sq,
                                      absl::Span<double> last_sq,
                                      const CallOptions& call) = 0;
};

}  // namespace rvd

#endif  // RVD_KERNELS_LIVE_DEVICE_H_

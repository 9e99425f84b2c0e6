// Live weights on the module's side (private to kernels/cuda/): the
// rvd_cuda_live table of kernels/cuda_module.h (ABI 4) over one engine's
// device, memory cap and counters.
//
//   segments   a producer's cudaMalloc block (RVD_IPC_CUDA_MALLOC:
//              cudaIpcOpenMemHandle, peer access enabled lazily) or PyTorch's
//              expandable segment (RVD_IPC_EXPANDABLE: the producer's file
//              descriptors taken with pidfd_open + pidfd_getfd, imported and
//              mapped with the driver's virtual memory calls; ipc_handle.h
//              has the byte format). Mapped once per call; the caller
//              dedups (a cudaMalloc handle opens once per process). A
//              segment on another device than the engine's is refused.
//   events     a producer's interprocess event opened here, or one of
//              rvd's own (disable-timing, interprocess) and its handle.
//   memory     rvd's device buffers, charged to the engine's MemoryCap.
//   snapshots  snapshot_start takes a slot (its own lowest-priority stream,
//              pinned and device scratch, a completion event), queues: the
//              descriptors' upload, a wait on the producer's event, the
//              copy + delta pass (snapshot.cu), `done`, the per-item sums
//              and their download, the slot's event; it never waits for
//              the GPU (except while a slot's scratch grows, on its own idle
//              stream). snapshot_finish polls the slot's event (and the
//              cancel flag), reads the sums and gives the slot back. A slot
//              is reused only once its event has completed, so a cancelled
//              snapshot's work in flight never meets the next one's. That
//              work may still be queued behind `wait` after the cancelled
//              finish returns: the caller frees its dst and last buffers
//              and closes the segments it reads only once it has ended
//              (rvd's `done` event has completed), as for any buffer in use.
//
// Every failed CUDA call becomes a Status by cuda_check.h's rules (counted,
// sticky errors mark the device lost), except that the failure of opening a
// producer's handle marks the device lost only when the context is
// confirmed broken (driver_api.h: ContextBroken): a garbage handle is the
// producer's error, not a lost GPU.
//
// Thread-safe: every function may be called from any thread.
#ifndef RVD_KERNELS_CUDA_LIVE_H_
#define RVD_KERNELS_CUDA_LIVE_H_

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "kernels/cuda_module.h"

namespace rvd::cuda {

class MemoryCap;       // device_context.h
class EngineCounters;  // device_context.h
class DeviceBuffer;    // device_context.h

// What "served" counts a snapshot's items under (Engine::Stats, /metrics).
inline constexpr char kSnapshotServedKey[] = "snapshot/copy-delta";
// At most this many snapshots in flight at once (started, not finished).
inline constexpr size_t kMaxSnapshotSlots = 64;

class Live {
 public:
  // `cap` and `counters` are the engine's and outlive this object;
  // max_sms is the engine's SM cap (0: every SM), which the snapshot's copy
  // keeps to as the fused kernels do (its grid, fused_plan.h ProductGrid).
  Live(int device, int max_sms, MemoryCap& cap, EngineCounters& counters);
  // Releases whatever the caller left open (segments, events, buffers) and
  // the slots' streams, synchronizing them first.
  ~Live();
  Live(const Live&) = delete;
  Live& operator=(const Live&) = delete;

  struct Mapping {
    rvd_ipc_segment* segment;  // opaque, for CloseSegment
    void* base;
    uint64_t bytes;
  };
  absl::StatusOr<Mapping> OpenSegment(const rvd_ipc_segment_desc& desc);
  void CloseSegment(rvd_ipc_segment* segment);

  absl::StatusOr<std::string> DeviceUuid();

  absl::StatusOr<cudaEvent_t> OpenEvent(const uint8_t handle[64]);
  absl::StatusOr<cudaEvent_t> CreateEvent(uint8_t handle_out[64]);
  void DestroyEvent(cudaEvent_t event);

  absl::StatusOr<void*> AllocDevice(uint64_t bytes);
  void FreeDevice(void* p);

  absl::StatusOr<rvd_snapshot*> StartSnapshot(absl::Span<const rvd_snapshot_item> items,
                                              cudaEvent_t wait, cudaEvent_t done);
  // delta_sq and last_sq have the snapshot's item count (either may be
  // empty: not written).
  absl::Status FinishSnapshot(rvd_snapshot* snapshot, absl::Span<double> delta_sq,
                              absl::Span<double> last_sq, const std::atomic<bool>* cancel);

 private:
  absl::StatusOr<Mapping> OpenCudaMalloc(const rvd_ipc_segment_desc& desc);
  absl::StatusOr<Mapping> OpenExpandable(const rvd_ipc_segment_desc& desc);
  // A free slot whose last work has ended, or a new one.
  absl::StatusOr<rvd_snapshot*> AcquireSlot();
  void ReleaseSlot(rvd_snapshot* slot);

  const int device_;
  const int max_sms_;
  MemoryCap& cap_;
  EngineCounters& counters_;

  absl::Mutex mu_;
  std::set<rvd_ipc_segment*> segments_ ABSL_GUARDED_BY(mu_);
  std::set<cudaEvent_t> events_ ABSL_GUARDED_BY(mu_);
  std::map<void*, std::unique_ptr<DeviceBuffer>> buffers_ ABSL_GUARDED_BY(mu_);
  // Snapshot slots (rvd_snapshot is defined in live.cc): all, and those
  // not in flight.
  std::vector<std::unique_ptr<rvd_snapshot>> slots_ ABSL_GUARDED_BY(mu_);
  std::vector<rvd_snapshot*> free_slots_ ABSL_GUARDED_BY(mu_);
};

// The module's table (cuda_module.h) over LiveOf(engine).
extern const rvd_cuda_live kLiveTable;

}  // namespace rvd::cuda

// The engine's Live, defined where rvd_cuda_engine is (module.cc).
rvd::cuda::Live* LiveOf(rvd_cuda_engine* engine);

#endif  // RVD_KERNELS_CUDA_LIVE_H_

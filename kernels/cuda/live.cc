// Live weights on the module's side (live.h): IPC segments and events,
// rvd's device buffers, snapshots; and the rvd_cuda_live table over them.
#include "kernels/cuda/live.h"

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "kernels/call_contract.h"
#include "kernels/cuda/abi_status.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_context.h"
#include "kernels/cuda/driver_api.h"
#include "kernels/cuda/ipc_handle.h"
#include "kernels/cuda/snapshot.h"

// One mapping of a producer's segment.
struct rvd_ipc_segment {
  int32_t kind = RVD_IPC_CUDA_MALLOC;
  void* base = nullptr;  // what the caller reads from
  uint64_t bytes = 0;    // how much of it
  // RVD_IPC_EXPANDABLE: the reserved range the pages are mapped into, one
  // mapping per page (unmapped one by one: cuMemUnmap takes whole mappings).
  CUdeviceptr va = 0;
  uint64_t va_bytes = 0;
  uint64_t page_bytes = 0;
};

// A snapshot slot: what one snapshot in flight uses, kept for the next.
struct rvd_snapshot {
  cudaStream_t stream = nullptr;   // lowest priority: a trainer's kernels come first
  cudaEvent_t finished = nullptr;  // recorded after the sums' download
  bool recorded = false;           // `finished` recorded at least once
  rvd::cuda::DeviceBuffer device;  // descriptors | tile partials | sums
  rvd::cuda::PinnedBuffer host;    // descriptors | sums
  uint64_t host_sums = 0;          // the sums' offset in `host`
  size_t items = 0;                // of the snapshot in flight
};

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif
#ifndef SYS_pidfd_getfd
#define SYS_pidfd_getfd 438
#endif

namespace rvd::cuda {
namespace {

uint64_t Align256(uint64_t n) { return (n + 255) / 256 * 256; }

// A failed runtime call, by cuda_check.h's rules; the thread's last error is
// cleared (a non-sticky failure would otherwise be reported again by the
// next launch check on this thread).
absl::Status Runtime(cudaError_t e, const char* expr, const char* file, int line) {
  if (e == cudaSuccess) return absl::OkStatus();
  cudaGetLastError();
  return cuda_internal::ToStatus(e, expr, file, line);
}
#define RVD_LIVE_RETURN_IF_ERROR(expr)                                      \
  do {                                                                      \
    absl::Status rvd_live_status_ = Runtime((expr), #expr, __FILE__, __LINE__); \
    if (!rvd_live_status_.ok()) return rvd_live_status_;                    \
  } while (0)

// A producer's handle that did not open: INVALID_ARGUMENT (the producer's
// error), unless the context is confirmed broken (then the device is lost).
absl::Status HandleError(cudaError_t e, const char* call, const std::string& what) {
  cudaGetLastError();
  const bool lost = cuda_internal::IsSticky(e) && ContextBroken();
  const std::string msg = absl::StrCat(what, ": ", call, ": ", cudaGetErrorName(e), " (",
                                       cudaGetErrorString(e), ")");
  cuda_internal::NoteDeviceError(cudaGetErrorName(e), lost, msg);
  if (lost) return absl::UnavailableError(msg);
  if (e == cudaErrorMemoryAllocation) return absl::ResourceExhaustedError(msg);
  return absl::InvalidArgumentError(msg);
}

absl::Status DeviceLost() {
  const cuda_internal::DeviceErrorSnapshot e = cuda_internal::DeviceErrors();
  if (!e.lost) return absl::OkStatus();
  return absl::UnavailableError(
      absl::StrCat("the CUDA device is lost (", e.lost_reason, "); restart rvd"));
}

std::string PidNote(int32_t pid) {
  return absl::StrCat("producer pid ", pid,
                      " does not exist in rvd's pid namespace (it exited, or runs in another "
                      "pid namespace: a trainer and rvd in different containers need a shared "
                      "one, e.g. shareProcessNamespace: true in a pod)");
}

// The status of a failed pidfd_open / pidfd_getfd (errno `err`).
absl::Status PidfdError(int err, const char* call, int32_t pid, uint64_t page, int32_t fd) {
  const std::string what = absl::StrCat(call, " (producer pid ", pid, ", page ", page, ", fd ",
                                        fd, "): ", std::strerror(err));
  switch (err) {
    case ENOSYS:
      return absl::FailedPreconditionError(absl::StrCat(
          what, ": this kernel lacks the pidfd calls (Linux 5.6) that taking PyTorch's "
                "expandable segments needs; run the trainer with "
                "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False (cudaMalloc handles)"));
    case ESRCH:
      return absl::NotFoundError(absl::StrCat(what, ": ", PidNote(pid)));
    case EPERM:
    case EACCES:
      return absl::PermissionDeniedError(absl::StrCat(
          what, ": rvd may not take the producer's file descriptors: pidfd_getfd needs ptrace "
                "access to the producer (the same user, and kernel.yama.ptrace_scope 0 or the "
                "trainer allowing rvd with prctl(PR_SET_PTRACER, rvd's pid)) or "
                "CAP_SYS_PTRACE, in the same pid namespace; or run the trainer with "
                "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False (cudaMalloc handles need "
                "no such permission)"));
    case EBADF:
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": the producer has no such file descriptor (not the handle's producer, or "
                "it freed the segment)"));
    case EMFILE:
    case ENFILE:
      return absl::ResourceExhaustedError(what);
    default:
      return absl::InternalError(what);
  }
}

}  // namespace

Live::Live(int device, int max_sms, MemoryCap& cap, EngineCounters& counters)
    : device_(device), max_sms_(max_sms), cap_(cap), counters_(counters) {}

Live::~Live() {
  cudaSetDevice(device_);
  std::vector<rvd_ipc_segment*> segments;
  std::vector<cudaEvent_t> events;
  bool in_flight = false;  // a snapshot still queued: its sources stay mapped
  {
    absl::MutexLock lock(&mu_);
    segments.assign(segments_.begin(), segments_.end());
    events.assign(events_.begin(), events_.end());
    // A slot still waiting (on a producer's event that may never come: a
    // trainer that died mid-step) is left as it is, its memory leaked
    // rather than freed under work in flight; the others are released.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    for (std::unique_ptr<rvd_snapshot>& slot : slots_) {
      bool idle = !slot->recorded;
      while (!idle) {
        const cudaError_t q = cudaEventQuery(slot->finished);
        idle = q != cudaErrorNotReady;  // done, or an error: nothing will run
        if (idle || std::chrono::steady_clock::now() > deadline) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      cudaGetLastError();
      if (!idle) {
        slot.release();  // deliberately leaked, see above
        in_flight = true;
        continue;
      }
      slot->device.Release();
      slot->host.Release();
      cudaEventDestroy(slot->finished);
      cudaStreamDestroy(slot->stream);
    }
    slots_.clear();
    free_slots_.clear();
    if (in_flight) {
      for (auto& [p, buffer] : buffers_) buffer.release();  // a snapshot may still write them
    }
    buffers_.clear();  // each frees its memory and uncharges the cap
  }
  if (in_flight) return;  // segments, events and buffers leaked with the slot
  for (rvd_ipc_segment* s : segments) CloseSegment(s);
  for (cudaEvent_t e : events) DestroyEvent(e);
}

// ---------------------------------------------------------------------------
// Segments.

absl::StatusOr<Live::Mapping> Live::OpenSegment(const rvd_ipc_segment_desc& desc) {
  if (absl::Status lost = DeviceLost(); !lost.ok()) return lost;
  if (desc.handle == nullptr) return absl::InvalidArgumentError("ipc_open: no handle bytes");
  RVD_LIVE_RETURN_IF_ERROR(cudaSetDevice(device_));
  absl::StatusOr<Mapping> m;
  switch (desc.kind) {
    case RVD_IPC_CUDA_MALLOC:
      m = OpenCudaMalloc(desc);
      break;
    case RVD_IPC_EXPANDABLE:
      m = OpenExpandable(desc);
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("ipc_open: unknown segment kind ", desc.kind));
  }
  if (!m.ok()) return m.status();
  if (desc.segment_bytes > m->bytes) {
    CloseSegment(m->segment);
    return absl::InvalidArgumentError(absl::StrCat(
        "ipc_open: the producer says the segment holds ", desc.segment_bytes,
        " bytes; the mapping holds ", m->bytes));
  }
  counters_.Event(desc.kind == RVD_IPC_CUDA_MALLOC ? "ipc_open_cuda_malloc" : "ipc_open_expandable",
                  1);
  return m;
}

absl::StatusOr<Live::Mapping> Live::OpenCudaMalloc(const rvd_ipc_segment_desc& desc) {
  if (desc.handle_bytes != sizeof(cudaIpcMemHandle_t)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ipc_open: a cudaMalloc handle is ", sizeof(cudaIpcMemHandle_t), " bytes, not ",
        desc.handle_bytes, " (PyTorch's 'c' handle: pass the bytes after its 2-byte prefix)"));
  }
  // A producer that is gone took its memory with it: say so plainly (the
  // open would fail with a driver error that names nothing).
  if (desc.producer_pid > 0 && kill(desc.producer_pid, 0) != 0 && errno == ESRCH) {
    return absl::NotFoundError(absl::StrCat("ipc_open: ", PidNote(desc.producer_pid)));
  }
  cudaIpcMemHandle_t handle;
  std::memcpy(&handle, desc.handle, sizeof(handle));
  void* p = nullptr;
  if (cudaError_t e = cudaIpcOpenMemHandle(&p, handle, cudaIpcMemLazyEnablePeerAccess);
      e != cudaSuccess) {
    return HandleError(e, "cudaIpcOpenMemHandle",
                       "ipc_open: the cudaMalloc handle does not open (not a live handle of a "
                       "process on this host's GPUs, or already open in rvd)");
  }
  auto close = absl::MakeCleanup([p] { cudaIpcCloseMemHandle(p); });
  cudaPointerAttributes attr{};
  RVD_LIVE_RETURN_IF_ERROR(cudaPointerGetAttributes(&attr, p));
  if (attr.device != device_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "ipc_open: the segment is on CUDA device ", attr.device, "; this rvd serves device ",
        device_, " (register with the device's UUID that rvd reports)"));
  }
  // How much the mapping holds: the allocation's range from the driver,
  // else what the producer says.
  uint64_t bytes = desc.segment_bytes;
  absl::StatusOr<const DriverApi*> api = GetDriverApi();
  if (api.ok()) {
    CUdeviceptr base = 0;
    size_t size = 0;
    if ((*api)->cuMemGetAddressRange(&base, &size, reinterpret_cast<CUdeviceptr>(p)) ==
        CUDA_SUCCESS) {
      bytes = size - (reinterpret_cast<CUdeviceptr>(p) - base);
    }
  }
  std::move(close).Cancel();
  auto* s = new rvd_ipc_segment;
  s->kind = RVD_IPC_CUDA_MALLOC;
  s->base = p;
  s->bytes = bytes;
  absl::MutexLock lock(&mu_);
  segments_.insert(s);
  return Mapping{s, p, bytes};
}

absl::StatusOr<Live::Mapping> Live::OpenExpandable(const rvd_ipc_segment_desc& desc) {
  absl::StatusOr<ExpandableShare> share =
      ParseExpandableShare(absl::MakeConstSpan(desc.handle, desc.handle_bytes));
  if (!share.ok()) return share.status();
  if (share->fabric) {
    return absl::UnimplementedError(
        "ipc_open: an expandable segment shared by fabric handles (multi-node NVLink); rvd "
        "takes POSIX file descriptors only: run the trainer with "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False (cudaMalloc handles)");
  }
  if (desc.producer_pid > 0 && desc.producer_pid != share->pid) {
    return absl::InvalidArgumentError(absl::StrCat("ipc_open: the handle names producer pid ",
                                                   share->pid, ", the registration pid ",
                                                   desc.producer_pid));
  }
  absl::StatusOr<const DriverApi*> loaded = GetDriverApi();
  if (!loaded.ok()) return loaded.status();
  const DriverApi& api = **loaded;
  constexpr absl::StatusCode kBad = absl::StatusCode::kInvalidArgument;

  const long pidfd = syscall(SYS_pidfd_open, share->pid, 0);
  if (pidfd < 0) return PidfdError(errno, "pidfd_open", share->pid, 0, share->fds[0]);
  auto close_pidfd = absl::MakeCleanup([pidfd] { close(static_cast<int>(pidfd)); });

  // The pages, imported; released once mapped (the mapping keeps them) or
  // on failure.
  std::vector<CUmemGenericAllocationHandle> pages;
  auto release_pages = absl::MakeCleanup([&] {
    for (CUmemGenericAllocationHandle h : pages) api.cuMemRelease(h);
  });
  CUmemAllocationProp prop{};
  for (uint64_t i = 0; i < share->pages; ++i) {
    const int32_t fd = share->fds[i];
    const long mine = syscall(SYS_pidfd_getfd, static_cast<int>(pidfd), fd, 0);
    if (mine < 0) return PidfdError(errno, "pidfd_getfd", share->pid, i, fd);
    CUmemGenericAllocationHandle h = 0;
    const CUresult r = api.cuMemImportFromShareableHandle(
        &h, reinterpret_cast<void*>(static_cast<uintptr_t>(mine)),
        CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    close(static_cast<int>(mine));  // the imported handle holds the memory
    if (r != CUDA_SUCCESS) {
      absl::Status s = DriverStatus(api, r, "cuMemImportFromShareableHandle", __FILE__, __LINE__,
                                    kBad);
      return absl::Status(s.code(), absl::StrCat("ipc_open: page ", i, " (the producer's fd ",
                                                 fd, ") is not CUDA memory: ", s.message()));
    }
    pages.push_back(h);
    CUmemAllocationProp p{};
    RVD_CU_RETURN_IF_ERROR(api, api.cuMemGetAllocationPropertiesFromHandle(&p, h), kBad);
    if (p.location.type != CU_MEM_LOCATION_TYPE_DEVICE || p.location.id != device_) {
      return absl::FailedPreconditionError(absl::StrCat(
          "ipc_open: page ", i, " of the segment is on CUDA device ", p.location.id,
          "; this rvd serves device ", device_,
          " (register with the device's UUID that rvd reports)"));
    }
    if (i == 0) prop = p;
  }
  size_t granularity = 0;
  RVD_CU_RETURN_IF_ERROR(api,
                         api.cuMemGetAllocationGranularity(&granularity, &prop,
                                                           CU_MEM_ALLOC_GRANULARITY_MINIMUM),
                         absl::StatusCode::kInternal);
  if (granularity == 0 || share->segment_size % granularity != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ipc_open: segment_size ", share->segment_size,
        " is not a multiple of the device's allocation granularity ", granularity));
  }
  const uint64_t total = share->bytes();
  CUdeviceptr va = 0;
  RVD_CU_RETURN_IF_ERROR(api, api.cuMemAddressReserve(&va, total, granularity, 0, 0),
                         absl::StatusCode::kResourceExhausted);
  uint64_t mapped = 0;  // pages mapped so far
  auto unmap = absl::MakeCleanup([&] {
    for (uint64_t i = 0; i < mapped; ++i) {
      api.cuMemUnmap(va + i * share->segment_size, share->segment_size);
    }
    api.cuMemAddressFree(va, total);
  });
  for (; mapped < share->pages; ++mapped) {
    // A page smaller than segment_size fails here: the handle is not the
    // header's.
    RVD_CU_RETURN_IF_ERROR(
        api, api.cuMemMap(va + mapped * share->segment_size, share->segment_size, 0,
                          pages[mapped], 0),
        kBad);
  }
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = device_;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  RVD_CU_RETURN_IF_ERROR(api, api.cuMemSetAccess(va, total, &access, 1),
                         absl::StatusCode::kInternal);
  std::move(unmap).Cancel();
  auto* s = new rvd_ipc_segment;
  s->kind = RVD_IPC_EXPANDABLE;
  s->base = reinterpret_cast<void*>(va);
  s->bytes = total;
  s->va = va;
  s->va_bytes = total;
  s->page_bytes = share->segment_size;
  absl::MutexLock lock(&mu_);
  segments_.insert(s);
  return Mapping{s, s->base, total};
}

void Live::CloseSegment(rvd_ipc_segment* s) {
  if (s == nullptr) return;
  {
    absl::MutexLock lock(&mu_);
    if (segments_.erase(s) == 0) return;  // not ours, or closed already
  }
  cudaSetDevice(device_);
  if (s->kind == RVD_IPC_CUDA_MALLOC) {
    Runtime(cudaIpcCloseMemHandle(s->base), "cudaIpcCloseMemHandle", __FILE__, __LINE__)
        .IgnoreError();  // counted; nothing else to do
  } else if (absl::StatusOr<const DriverApi*> api = GetDriverApi(); api.ok()) {
    const DriverApi& d = **api;
    for (uint64_t off = 0; off < s->va_bytes; off += s->page_bytes) {
      if (CUresult r = d.cuMemUnmap(s->va + off, s->page_bytes); r != CUDA_SUCCESS) {
        DriverStatus(d, r, "cuMemUnmap", __FILE__, __LINE__, absl::StatusCode::kInternal)
            .IgnoreError();
      }
    }
    if (CUresult r = d.cuMemAddressFree(s->va, s->va_bytes); r != CUDA_SUCCESS) {
      DriverStatus(d, r, "cuMemAddressFree", __FILE__, __LINE__, absl::StatusCode::kInternal)
          .IgnoreError();
    }
  }
  delete s;
}

absl::StatusOr<std::string> Live::DeviceUuid() {
  cudaDeviceProp prop;
  RVD_LIVE_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, device_));
  return FormatGpuUuid(reinterpret_cast<const unsigned char*>(prop.uuid.bytes));
}

// ---------------------------------------------------------------------------
// Events and memory.

absl::StatusOr<cudaEvent_t> Live::OpenEvent(const uint8_t handle[64]) {
  if (handle == nullptr) return absl::InvalidArgumentError("ipc_open_event: no handle");
  if (absl::Status lost = DeviceLost(); !lost.ok()) return lost;
  RVD_LIVE_RETURN_IF_ERROR(cudaSetDevice(device_));
  static_assert(sizeof(cudaIpcEventHandle_t) == 64, "cudaIpcEventHandle_t is 64 bytes");
  cudaIpcEventHandle_t h;
  std::memcpy(&h, handle, sizeof(h));
  cudaEvent_t e = nullptr;
  if (cudaError_t r = cudaIpcOpenEventHandle(&e, h); r != cudaSuccess) {
    return HandleError(r, "cudaIpcOpenEventHandle",
                       "ipc_open_event: the event handle does not open (not a live "
                       "interprocess event of a process on this GPU)");
  }
  absl::MutexLock lock(&mu_);
  events_.insert(e);
  return e;
}

absl::StatusOr<cudaEvent_t> Live::CreateEvent(uint8_t handle_out[64]) {
  if (handle_out == nullptr) return absl::InvalidArgumentError("ipc_create_event: no output");
  if (absl::Status lost = DeviceLost(); !lost.ok()) return lost;
  RVD_LIVE_RETURN_IF_ERROR(cudaSetDevice(device_));
  cudaEvent_t e = nullptr;
  RVD_LIVE_RETURN_IF_ERROR(
      cudaEventCreateWithFlags(&e, cudaEventDisableTiming | cudaEventInterprocess));
  cudaIpcEventHandle_t h;
  if (absl::Status s = Runtime(cudaIpcGetEventHandle(&h, e), "cudaIpcGetEventHandle", __FILE__,
                               __LINE__);
      !s.ok()) {
    cudaEventDestroy(e);
    return s;
  }
  std::memcpy(handle_out, &h, sizeof(h));
  absl::MutexLock lock(&mu_);
  events_.insert(e);
  return e;
}

void Live::DestroyEvent(cudaEvent_t e) {
  if (e == nullptr) return;
  {
    absl::MutexLock lock(&mu_);
    if (events_.erase(e) == 0) return;
  }
  cudaSetDevice(device_);
  Runtime(cudaEventDestroy(e), "cudaEventDestroy", __FILE__, __LINE__).IgnoreError();
}

absl::StatusOr<void*> Live::AllocDevice(uint64_t bytes) {
  if (bytes == 0) return absl::InvalidArgumentError("alloc_device: 0 bytes");
  if (absl::Status lost = DeviceLost(); !lost.ok()) return lost;
  RVD_LIVE_RETURN_IF_ERROR(cudaSetDevice(device_));
  auto buffer = std::make_unique<DeviceBuffer>();
  // A new buffer: Reserve neither synchronizes nor frees (no stream needed).
  if (absl::Status s = buffer->Reserve(cap_, bytes, nullptr); !s.ok()) {
    cudaGetLastError();
    return s;
  }
  void* p = buffer->data();
  absl::MutexLock lock(&mu_);
  buffers_[p] = std::move(buffer);
  return p;
}

void Live::FreeDevice(void* p) {
  if (p == nullptr) return;
  std::unique_ptr<DeviceBuffer> buffer;
  {
    absl::MutexLock lock(&mu_);
    auto it = buffers_.find(p);
    if (it == buffers_.end()) return;
    buffer = std::move(it->second);
    buffers_.erase(it);
  }
  cudaSetDevice(device_);
  buffer.reset();  // frees and uncharges
}

// ---------------------------------------------------------------------------
// Snapshots.

absl::StatusOr<rvd_snapshot*> Live::AcquireSlot() {
  absl::MutexLock lock(&mu_);
  for (size_t i = 0; i < free_slots_.size(); ++i) {
    rvd_snapshot* s = free_slots_[i];
    // A slot given back before its work ended (a cancelled finish) waits
    // for its event: its buffers may still be in use.
    if (s->recorded) {
      const cudaError_t q = cudaEventQuery(s->finished);
      if (q == cudaErrorNotReady) {
        cudaGetLastError();
        continue;
      }
      RVD_LIVE_RETURN_IF_ERROR(q);
    }
    free_slots_.erase(free_slots_.begin() + static_cast<std::ptrdiff_t>(i));
    return s;
  }
  if (slots_.size() >= kMaxSnapshotSlots) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "snapshot_start: ", kMaxSnapshotSlots, " snapshots in flight (started, not finished)"));
  }
  auto slot = std::make_unique<rvd_snapshot>();
  int least = 0, greatest = 0;
  RVD_LIVE_RETURN_IF_ERROR(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  RVD_LIVE_RETURN_IF_ERROR(
      cudaStreamCreateWithPriority(&slot->stream, cudaStreamNonBlocking, least));
  if (absl::Status s = Runtime(cudaEventCreateWithFlags(&slot->finished, cudaEventDisableTiming),
                               "cudaEventCreateWithFlags", __FILE__, __LINE__);
      !s.ok()) {
    cudaStreamDestroy(slot->stream);
    return s;
  }
  slots_.push_back(std::move(slot));
  return slots_.back().get();
}

void Live::ReleaseSlot(rvd_snapshot* slot) {
  absl::MutexLock lock(&mu_);
  free_slots_.push_back(slot);
}

absl::StatusOr<rvd_snapshot*> Live::StartSnapshot(absl::Span<const rvd_snapshot_item> items,
                                                  cudaEvent_t wait, cudaEvent_t done) {
  absl::StatusOr<SnapshotPlan> plan = PlanSnapshot(items);
  if (!plan.ok()) return plan.status();
  if (absl::Status lost = DeviceLost(); !lost.ok()) return lost;
  RVD_LIVE_RETURN_IF_ERROR(cudaSetDevice(device_));
  absl::StatusOr<rvd_snapshot*> acquired = AcquireSlot();
  if (!acquired.ok()) return acquired.status();
  rvd_snapshot* slot = *acquired;

  const size_t n = plan->items.size();
  const uint64_t desc_bytes = Align256(n * sizeof(SnapshotDesc));
  const uint64_t partial_bytes = Align256(static_cast<uint64_t>(plan->tiles) * 2 * sizeof(double));
  const uint64_t sum_bytes = Align256(n * 2 * sizeof(double));
  // Growing a slot's scratch synchronizes its stream, which is idle (the
  // slot's last event has completed): this never waits for other work.
  absl::Status status = slot->device.Reserve(cap_, desc_bytes + partial_bytes + sum_bytes,
                                             slot->stream);
  if (status.ok()) status = slot->host.Reserve(counters_, desc_bytes + sum_bytes, slot->stream);
  if (!status.ok()) {
    cudaGetLastError();
    ReleaseSlot(slot);
    return status;
  }
  auto* host = static_cast<unsigned char*>(slot->host.data());
  auto* dev = static_cast<unsigned char*>(slot->device.data());
  auto* dev_items = reinterpret_cast<SnapshotDesc*>(dev);
  auto* dev_partials = reinterpret_cast<double*>(dev + desc_bytes);
  auto* dev_sums = reinterpret_cast<double*>(dev + desc_bytes + partial_bytes);
  slot->host_sums = desc_bytes;
  if (n > 0) std::memcpy(host, plan->items.data(), n * sizeof(SnapshotDesc));

  cudaGetLastError();  // a launch check below reports this snapshot's errors only
  const int count = static_cast<int>(n);
  auto enqueue = [&]() -> absl::Status {
    if (n > 0) {
      RVD_LIVE_RETURN_IF_ERROR(cudaMemcpyAsync(dev_items, host, n * sizeof(SnapshotDesc),
                                               cudaMemcpyHostToDevice, slot->stream));
    }
    // The descriptors' upload does not wait for the producer; the copy does.
    if (wait != nullptr) RVD_LIVE_RETURN_IF_ERROR(cudaStreamWaitEvent(slot->stream, wait, 0));
    RVD_LIVE_RETURN_IF_ERROR(
        LaunchSnapshotCopy(dev_items, count, plan->tiles, dev_partials, max_sms_, slot->stream));
    // The producer may write its weights again once the copy is done; the
    // sums need nothing of the source.
    if (done != nullptr) RVD_LIVE_RETURN_IF_ERROR(cudaEventRecord(done, slot->stream));
    RVD_LIVE_RETURN_IF_ERROR(
        LaunchSnapshotSums(dev_items, count, dev_partials, dev_sums, slot->stream));
    if (n > 0) {
      RVD_LIVE_RETURN_IF_ERROR(cudaMemcpyAsync(host + desc_bytes, dev_sums,
                                               n * 2 * sizeof(double), cudaMemcpyDeviceToHost,
                                               slot->stream));
    }
    RVD_LIVE_RETURN_IF_ERROR(cudaEventRecord(slot->finished, slot->stream));
    return absl::OkStatus();
  };
  status = enqueue();
  if (!status.ok()) {
    // Whatever was queued must end before the slot serves again: mark its
    // end, or wait for it when even that fails.
    if (cudaEventRecord(slot->finished, slot->stream) == cudaSuccess) {
      slot->recorded = true;
    } else {
      cudaGetLastError();
      cudaStreamSynchronize(slot->stream);
      cudaGetLastError();
      slot->recorded = false;
    }
    ReleaseSlot(slot);
    return status;
  }
  slot->recorded = true;
  slot->items = n;
  return slot;
}

absl::Status Live::FinishSnapshot(rvd_snapshot* slot, absl::Span<double> delta_sq,
                                  absl::Span<double> last_sq, const std::atomic<bool>* cancel) {
  if (slot == nullptr) return absl::InvalidArgumentError("snapshot_finish: no snapshot");
  // Every path gives the slot back (finished exactly once).
  auto release = absl::MakeCleanup([&] { ReleaseSlot(slot); });
  if ((!delta_sq.empty() && delta_sq.size() != slot->items) ||
      (!last_sq.empty() && last_sq.size() != slot->items)) {
    return absl::InvalidArgumentError("snapshot_finish: outputs of the wrong size");
  }
  RVD_LIVE_RETURN_IF_ERROR(cudaSetDevice(device_));
  // Poll (the cancel flag in between): spin briefly, since a snapshot takes
  // well under a millisecond on an idle GPU, then sleep in short steps.
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    const cudaError_t q = cudaEventQuery(slot->finished);
    if (q == cudaSuccess) break;
    if (q != cudaErrorNotReady) RVD_LIVE_RETURN_IF_ERROR(q);
    cudaGetLastError();
    if (cancel != nullptr && cancel->load(std::memory_order_relaxed)) return CallCancelled();
    if (std::chrono::steady_clock::now() - start < std::chrono::microseconds(200)) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
  const auto* sums =
      reinterpret_cast<const double*>(static_cast<unsigned char*>(slot->host.data()) +
                                      slot->host_sums);
  for (size_t i = 0; i < slot->items; ++i) {
    if (!delta_sq.empty()) delta_sq[i] = sums[2 * i];
    if (!last_sq.empty()) last_sq[i] = sums[2 * i + 1];
  }
  counters_.Served({{kSnapshotServedKey, static_cast<int64_t>(slot->items)}});
  counters_.Event("live_snapshot", 1);
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// The table.

namespace {

using ::rvd::cuda_internal::SetAbiStatus;


rvd_ipc_segment* IpcOpen(rvd_cuda_engine* engine, const rvd_ipc_segment_desc* desc, void** base,
                         uint64_t* bytes, rvd_status* status) {
  if (desc == nullptr) {
    SetAbiStatus(absl::InvalidArgumentError("ipc_open: no descriptor"), status);
    return nullptr;
  }
  absl::StatusOr<Live::Mapping> m = LiveOf(engine)->OpenSegment(*desc);
  SetAbiStatus(m.status(), status);
  if (!m.ok()) return nullptr;
  if (base != nullptr) *base = m->base;
  if (bytes != nullptr) *bytes = m->bytes;
  return m->segment;
}

void IpcClose(rvd_cuda_engine* engine, rvd_ipc_segment* segment) {
  LiveOf(engine)->CloseSegment(segment);
}

int32_t DeviceUuid(rvd_cuda_engine* engine, char out[64], rvd_status* status) {
  absl::StatusOr<std::string> uuid = LiveOf(engine)->DeviceUuid();
  if (uuid.ok() && out != nullptr) {
    const size_t n = std::min<size_t>(uuid->size(), 63);
    std::memcpy(out, uuid->data(), n);
    out[n] = '\0';
  }
  return SetAbiStatus(uuid.status(), status);
}

void* IpcOpenEvent(rvd_cuda_engine* engine, const uint8_t handle[64], rvd_status* status) {
  absl::StatusOr<cudaEvent_t> e = LiveOf(engine)->OpenEvent(handle);
  SetAbiStatus(e.status(), status);
  return e.ok() ? static_cast<void*>(*e) : nullptr;
}

void* IpcCreateEvent(rvd_cuda_engine* engine, uint8_t handle_out[64], rvd_status* status) {
  absl::StatusOr<cudaEvent_t> e = LiveOf(engine)->CreateEvent(handle_out);
  SetAbiStatus(e.status(), status);
  return e.ok() ? static_cast<void*>(*e) : nullptr;
}

void EventDestroy(rvd_cuda_engine* engine, void* event) {
  LiveOf(engine)->DestroyEvent(static_cast<cudaEvent_t>(event));
}

void* AllocDevice(rvd_cuda_engine* engine, uint64_t bytes, rvd_status* status) {
  absl::StatusOr<void*> p = LiveOf(engine)->AllocDevice(bytes);
  SetAbiStatus(p.status(), status);
  return p.ok() ? *p : nullptr;
}

void FreeDevice(rvd_cuda_engine* engine, void* p) { LiveOf(engine)->FreeDevice(p); }

rvd_snapshot* SnapshotStart(rvd_cuda_engine* engine, const rvd_snapshot_item* items, size_t n,
                            void* wait, void* done, rvd_status* status) {
  if (items == nullptr && n > 0) {
    SetAbiStatus(absl::InvalidArgumentError("snapshot_start: no items"), status);
    return nullptr;
  }
  absl::StatusOr<rvd_snapshot*> s =
      LiveOf(engine)->StartSnapshot(absl::MakeConstSpan(items, n), static_cast<cudaEvent_t>(wait),
                                    static_cast<cudaEvent_t>(done));
  SetAbiStatus(s.status(), status);
  return s.ok() ? *s : nullptr;
}

int32_t SnapshotFinish(rvd_cuda_engine* engine, rvd_snapshot* snapshot, double* delta_sq,
                       double* last_sq, const rvd_call* call, rvd_status* status) {
  const size_t n = snapshot != nullptr ? snapshot->items : 0;
  const auto* cancel =
      call != nullptr ? static_cast<const std::atomic<bool>*>(call->cancel) : nullptr;
  return SetAbiStatus(
      LiveOf(engine)->FinishSnapshot(snapshot,
                                     absl::MakeSpan(delta_sq, delta_sq != nullptr ? n : 0),
                                     absl::MakeSpan(last_sq, last_sq != nullptr ? n : 0), cancel),
      status);
}

}  // namespace

const rvd_cuda_live kLiveTable = {&IpcOpen,        &IpcClose,     &DeviceUuid,    &IpcOpenEvent,
                                  &IpcCreateEvent, &EventDestroy, &AllocDevice,   &FreeDevice,
                                  &SnapshotStart,  &SnapshotFinish};

}  // namespace rvd::cuda

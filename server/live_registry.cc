// Live models: registration, notifications, snapshots, release. See
// live_registry.h for the contract and the buffer rule.
#include "server/live_registry.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <optional>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "google/protobuf/util/time_util.h"
#include "kernels/v_layout.h"
#include "server/live_trigger.h"
#include "server/log_text.h"
#include "server/measure.h"
#include "spdlog/spdlog.h"

namespace rvd {
namespace {

using rvd::v1::LiveTensor;
using rvd::v1::MeasureHeader;
using rvd::v1::Measurement;
using rvd::v1::NotifyStepRequest;
using rvd::v1::NotifyStepResponse;
using rvd::v1::RegisterLiveModelRequest;
using rvd::v1::RegisterLiveModelResponse;
using rvd::v1::TensorSpec;
using google::protobuf::util::TimeUtil;

// Each V copy in a snapshot buffer starts at a multiple of this (the
// device's widest loads; a row of the copy is read as a dense matrix).
constexpr uint64_t kBufferAlign = 256;
// Released model ids remembered for NotifyStep's NOT_FOUND message.
constexpr size_t kMaxReleasedKept = 1024;
// The buckets (upper bounds, seconds) of rvd_live_snapshot_seconds and
// rvd_live_measurement_seconds: a 7B V set copies in about 0.25 ms on the
// H200 and is measured about 0.2 ms later; a queued worker adds its wait.
const prometheus::Histogram::BucketBoundaries& LatencyBounds() {
  static const auto* const kBounds = new prometheus::Histogram::BucketBoundaries{
      1e-4, 2.5e-4, 5e-4, 7.5e-4, 1e-3, 1.5e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 0.1, 1.0};
  return *kBounds;
}
// ViewV's views of a tensor are computed against this stand-in base before
// anything is mapped, then moved to the mapping (offsets only).
const uint8_t* const kPlaceholderBase = reinterpret_cast<const uint8_t*>(uintptr_t{1} << 20);

// kill(pid, 0): the process exists (EPERM: it exists, owned by another user).
bool ProcessAlive(int32_t pid) { return kill(pid, 0) == 0 || errno == EPERM; }

// A pidfd of `pid` (readable once it exits), or -1 (an older kernel, or
// no such process).
int PidfdOpen(int32_t pid) {
#ifdef SYS_pidfd_open
  return static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
#else
  (void)pid;
  errno = ENOSYS;
  return -1;
#endif
}

// "GPU-8F0C..." and "8f0c..." name one device: compare without the prefix
// and case.
std::string NormalizeUuid(const std::string& uuid) {
  std::string s = uuid;
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (s.rfind("gpu-", 0) == 0) s = s.substr(4);
  return s;
}

absl::Status ForTensor(const TensorSpec& spec, const absl::Status& s) {
  return absl::Status(s.code(), absl::StrCat("tensor '", spec.name(), "' (layer ",
                                             spec.layer(), "): ", s.message()));
}

// One tensor of a request, checked and planned before anything is mapped.
struct TensorPlan {
  IpcKind kind = IpcKind::kCudaMalloc;
  std::string payload;  // the handle bytes the module takes
  std::string key;      // the mapping's key: producer, kind, payload
  uint64_t offset = 0;  // of element (0, 0) from the segment's base
  uint64_t end = 0;     // one past the tensor's last byte, from the base
  // V's layer view against kPlaceholderBase + offset (strides applied).
  MatrixView layer;
  bool columns = false;  // gpt2: heads are column blocks of V
  int64_t heads = 0;     // kv heads
  int64_t head_dim = 0;
};

struct Plan {
  MeasureHeader header;  // the request's, with the tensors' specs
  std::vector<TensorPlan> tensors;
  std::map<std::string, uint64_t> segment_bytes;  // key -> largest declared
  TriggerConfig trigger;
  absl::Duration lease;
};

// The handle as the module takes it (kind and payload).
absl::Status ParseHandle(const LiveTensor& t, TensorPlan* plan) {
  const std::string& h = t.handle();
  switch (t.handle_kind()) {
    case rvd::v1::IPC_HANDLE_KIND_TORCH: {
      if (h.size() < 2) {
        return absl::InvalidArgumentError(absl::StrCat(
            "a TORCH handle starts with a version and a type byte; got ", h.size(), " bytes"));
      }
      if (static_cast<uint8_t>(h[0]) != 2) {
        return absl::InvalidArgumentError(
            absl::StrCat("TORCH handle of version ", static_cast<int>(static_cast<uint8_t>(h[0])),
                         "; rvd reads version 2"));
      }
      plan->payload = h.substr(2);
      if (h[1] == 'c') {
        if (plan->payload.size() != kIpcHandleBytes) {
          return absl::InvalidArgumentError(
              absl::StrCat("TORCH handle of type 'c' carries ", plan->payload.size(),
                           " bytes after its prefix; a cudaIpcMemHandle_t has ",
                           kIpcHandleBytes));
        }
        plan->kind = IpcKind::kCudaMalloc;
      } else if (h[1] == 'e') {
        if (plan->payload.empty()) {
          return absl::InvalidArgumentError("TORCH handle of type 'e' carries no header");
        }
        plan->kind = IpcKind::kExpandable;
      } else {
        return absl::InvalidArgumentError(
            absl::StrCat("TORCH handle of type ", static_cast<int>(static_cast<uint8_t>(h[1])),
                         "; rvd reads 'c' (cudaMalloc) and 'e' (expandable segment)"));
      }
      return absl::OkStatus();
    }
    case rvd::v1::IPC_HANDLE_KIND_CUDA_IPC:
      if (h.size() != kIpcHandleBytes) {
        return absl::InvalidArgumentError(absl::StrCat(
            "a CUDA_IPC handle is a cudaIpcMemHandle_t of ", kIpcHandleBytes, " bytes; got ",
            h.size()));
      }
      plan->kind = IpcKind::kCudaMalloc;
      plan->payload = h;
      return absl::OkStatus();
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("handle_kind ", static_cast<int>(t.handle_kind()),
                       ": give TORCH or CUDA_IPC"));
  }
}

// The tensor's V views against kPlaceholderBase, with the tensor's row
// stride `ld` in place of ViewV's contiguous one. ViewV's views have
// ld = the tensor's columns and offsets of whole rows (row layouts) or of
// columns in row 0 (gpt2), so an offset of e elements is row e / cols,
// column e % cols.
MatrixView Restride(MatrixView v, int64_t cols, int64_t ld) {
  const size_t elem = DTypeSize(v.dtype);
  const int64_t e = (static_cast<const uint8_t*>(v.data) - kPlaceholderBase) /
                    static_cast<int64_t>(elem);
  v.data = kPlaceholderBase + static_cast<size_t>((e / cols) * ld + e % cols) * elem;
  v.ld = ld;
  if (v.block_rows > 0) v.block_stride = v.block_stride / cols * ld;
  return v;
}

absl::StatusOr<Plan> CheckRequest(const RegisterLiveModelRequest& request,
                                  const LiveOptions& options) {
  Plan plan;
  if (request.header().tensors_size() > 0) {
    return absl::InvalidArgumentError(
        "header.tensors must be empty: a live model's tensors are given in `tensors`");
  }
  plan.header = request.header();
  for (const LiveTensor& t : request.tensors()) *plan.header.add_tensors() = t.spec();
  // The header rules of every measurement (model id, counts, names, heads,
  // layers, variant, bytes), before anything of the tensors is looked at.
  if (absl::StatusOr<uint64_t> total = ValidateHeader(plan.header, options.max_request_bytes);
      !total.ok()) {
    return total.status();
  }
  if (request.producer_pid() <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("producer_pid ", request.producer_pid(), ": give the trainer's pid"));
  }
  absl::StatusOr<TriggerConfig> trigger = TriggerConfigFromProto(request.policy());
  if (!trigger.ok()) return trigger.status();
  plan.trigger = *trigger;
  plan.lease = request.lease_seconds() > 0 ? absl::Seconds(request.lease_seconds())
                                           : options.default_lease;

  for (const LiveTensor& t : request.tensors()) {
    const TensorSpec& spec = t.spec();
    TensorPlan tp;
    if (absl::Status s = ParseHandle(t, &tp); !s.ok()) return ForTensor(spec, s);
    tp.key = absl::StrCat(request.producer_pid(), ":", static_cast<int>(tp.kind), ":", tp.payload);
    const DType dtype = *ToDType(spec.dtype());  // ValidateHeader checked it
    const int64_t rows = spec.shape(0), cols = spec.shape(1);
    if (t.strides_size() != 2 || t.strides(1) != 1 || t.strides(0) < cols) {
      return ForTensor(spec, absl::InvalidArgumentError(absl::StrCat(
                                 "strides [", absl::StrJoin(t.strides(), ", "),
                                 "]: rvd takes row-major tensors, strides (ld, 1) with ld >= ",
                                 cols)));
    }
    const int64_t ld = t.strides(0);
    // The tensor's bytes: ((rows - 1) * ld + cols) elements from its start;
    // rows and cols are below 2^40 (TensorByteSize), ld is checked here.
    const uint64_t elem = DTypeSize(dtype);
    uint64_t extent = 0, end = 0;
    if (__builtin_mul_overflow(static_cast<uint64_t>(rows - 1), static_cast<uint64_t>(ld),
                               &extent) ||
        __builtin_add_overflow(extent, static_cast<uint64_t>(cols), &extent) ||
        __builtin_mul_overflow(extent, elem, &extent) ||
        __builtin_add_overflow(extent, t.offset_bytes(), &end)) {
      return ForTensor(spec, absl::InvalidArgumentError("offset and strides overflow"));
    }
    if (t.segment_bytes() == 0) {
      return ForTensor(spec, absl::InvalidArgumentError("segment_bytes must be > 0"));
    }
    if (end > t.segment_bytes()) {
      return ForTensor(spec, absl::InvalidArgumentError(absl::StrCat(
                                 "lies outside its segment: bytes [", t.offset_bytes(), ", ",
                                 end, ") of a segment of ", t.segment_bytes(), " bytes")));
    }
    if (t.offset_bytes() % elem != 0) {
      return ForTensor(spec, absl::InvalidArgumentError(absl::StrCat(
                                 "offset_bytes ", t.offset_bytes(),
                                 " is not a multiple of the element size ", elem)));
    }
    tp.offset = t.offset_bytes();
    tp.end = end;
    const VLayout layout = *ToVLayout(spec.layout());
    const HeadGeometry g{spec.geometry().num_heads(), spec.geometry().num_kv_heads(),
                         spec.geometry().head_dim()};
    absl::StatusOr<VViews> views =
        ViewV(TensorView{kPlaceholderBase, rows, cols, dtype}, layout, g);
    if (!views.ok()) return ForTensor(spec, views.status());
    tp.layer = Restride(views->layer, cols, ld);
    tp.columns = layout == VLayout::kGpt2Conv1D;
    tp.heads = g.num_kv_heads;
    tp.head_dim = g.head_dim;
    uint64_t& declared = plan.segment_bytes[tp.key];
    declared = std::max<uint64_t>(declared, t.segment_bytes());
    plan.tensors.push_back(std::move(tp));
  }
  return plan;
}

int64_t Millis(absl::Duration d) { return absl::ToInt64Milliseconds(d); }

}  // namespace

struct LiveRegistry::Producer {
  explicit Producer(int32_t p) : pid(p), pidfd(PidfdOpen(p)) {}
  ~Producer() {
    if (pidfd >= 0) close(pidfd);
  }
  Producer(const Producer&) = delete;
  Producer& operator=(const Producer&) = delete;

  const int32_t pid;
  const int pidfd;  // -1: watched by kill(pid, 0)
  int models = 0;   // guarded by the registry's mu_
};

struct LiveRegistry::Taken {
  int64_t step = 0;
  std::string reason;
  bool check = false;  // an adaptive check: decided when finished
  LiveDevice::Snapshot* handle = nullptr;  // null once finished
  int dst = -1;  // buffer written
  int ref = -1;  // buffer compared against (checks), or -1
  absl::Time notified;  // rvd's receipt of the notification (or registration)
  absl::Time queued;    // the snapshot enqueued on the device
  bool resolved = false;  // finished and decided
  bool measure = false;   // to be measured (decided)
  double snapshot_ms = 0;  // notified -> finished
  double delta = 0;        // a check's relative delta
};

// One registered model: what registration fixed, and under mu the trigger,
// the buffers and the snapshot in question.
class LiveRegistry::Model {
 public:
  struct Tensor {
    MatrixView src;       // V in the mapped segment (possibly blocked)
    uint64_t offset = 0;  // of its copy in a snapshot buffer
    bool columns = false;
    int64_t heads = 0;
    int64_t head_dim = 0;
  };

  Model(LiveRegistry* registry, std::string id, int32_t pid, MeasureHeader header,
        VariantSpec variant, TriggerConfig trigger, absl::Duration lease)
      : registry(registry),
        live(registry->live_),
        id(std::move(id)),
        pid(pid),
        header(std::move(header)),
        variant(std::move(variant)),
        lease(lease),
        trigger_(trigger) {}

  // Nothing reads the model any more: every snapshot was finished (the
  // dispatcher finishes or abandons each), so buffers, events and mappings
  // go.
  ~Model() {
    // A snapshot whose finish was cancelled (shutdown) may still have its
    // copy queued on the device: its buffers and segments are left to the
    // engine, which releases them after synchronizing (kernels/cuda/live.h).
    const bool in_flight = cancelled_;
    if (!in_flight) {
      for (const Buffer& b : buffers_) live->FreeDevice(b.p);
    }
    for (const auto& [unused, event] : events_) live->DestroyEvent(event);
    if (own_event.event != nullptr) live->DestroyEvent(own_event.event);
    registry->DropMappings(mapping_keys, /*close=*/!in_flight);
  }

  LiveRegistry* const registry;
  LiveDevice* const live;
  const std::string id;
  const int32_t pid;
  const MeasureHeader header;  // the request's, with the tensor specs
  const VariantSpec variant;
  const absl::Duration lease;
  // Set during registration, before the model is shared.
  std::vector<Tensor> tensors;
  uint64_t set_bytes = 0;  // one snapshot buffer
  std::vector<std::string> mapping_keys;
  LiveDevice::OwnEvent own_event;

  // Allocates the buffers registration holds (RESOURCE_EXHAUSTED past the
  // device cap); the caller frees nothing on error (the destructor does).
  absl::Status Reserve(int n) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    while (static_cast<int>(buffers_.size()) < n) {
      absl::StatusOr<void*> p = live->AllocDevice(set_bytes);
      if (!p.ok()) return p.status();
      buffers_.push_back(Buffer{*p, 0});
    }
    return absl::OkStatus();
  }

  uint64_t HeldBytes() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return buffers_.size() * set_bytes;
  }
  bool inference() const { return trigger_.config().inference; }

  // Starts a snapshot of the registered weights (registration's
  // measurement; the producer's writes are complete, so nothing to wait
  // on) and returns it decided: measured.
  absl::StatusOr<std::shared_ptr<Taken>> TakeNow(int64_t step, const char* reason)
      ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    auto t = std::make_shared<Taken>();
    t->notified = absl::Now();
    t->step = step;
    t->reason = reason;
    t->measure = true;
    if (absl::Status s = StartLocked(*t, nullptr); !s.ok()) return s;
    return t;
  }

  absl::StatusOr<NotifyStepResponse> Notify(const NotifyStepRequest& request,
                                            std::shared_ptr<Taken>* taken)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Finishes `t` if it is not (a check is decided then) and says whether
  // it is to be measured; on yes, `t.dst` stays held for the measurement
  // and `*buffer` is its memory.
  bool Prepare(Taken& t, void** buffer) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    if (!t.resolved) ResolveLocked(t);
    if (!t.measure) return false;
    *buffer = buffers_[t.dst].p;
    return true;
  }
  // The measurement of `t` is over (recorded or not): its buffer is free
  // unless it is the reference.
  void Done(Taken& t, uint64_t sequence) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    if (sequence > 0) last_sequence_ = std::max(last_sequence_, sequence);
    if (t.measure) {
      t.measure = false;
      Unhold(t.dst);
    }
    if (inference()) Trim();
  }

  // The views of a snapshot in `buffer` (dense copies of each V): per
  // tensor the layer, then (per_head) its heads, row blocks of the copy
  // (gpt2: column blocks).
  std::vector<MatrixView> Views(const void* buffer, std::vector<TensorResults>* where) const {
    std::vector<MatrixView> views;
    const auto* base = static_cast<const uint8_t*>(buffer);
    for (const Tensor& t : tensors) {
      MatrixView layer = t.src;
      layer.data = base + t.offset;
      layer.ld = layer.cols;
      layer.block_rows = 0;
      layer.block_stride = 0;
      where->push_back(TensorResults{views.size(), header.per_head() ? size_t(t.heads) : 0});
      views.push_back(layer);
      if (!header.per_head()) continue;
      const size_t elem = DTypeSize(layer.dtype);
      for (int64_t h = 0; h < t.heads; ++h) {
        MatrixView v = layer;
        if (t.columns) {
          v.data = base + t.offset + static_cast<size_t>(h * t.head_dim) * elem;
          v.cols = t.head_dim;
        } else {
          v.data = base + t.offset + static_cast<size_t>(h * t.head_dim * layer.cols) * elem;
          v.rows = t.head_dim;
        }
        views.push_back(v);
      }
    }
    return views;
  }

  void MarkReleased() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    released_ = true;
  }
  // Lock-free, so that the watcher never waits behind a model whose lock
  // is held across a snapshot's finish.
  bool Expired(absl::Time now) const { return absl::ToUnixNanos(now) >= expiry_ns_.load(); }
  void Renew() { expiry_ns_.store(absl::ToUnixNanos(absl::Now() + lease)); }
  uint64_t last_sequence() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return last_sequence_;
  }

 private:
  struct Buffer {
    void* p = nullptr;
    // Who needs its bytes: the reference (1), a snapshot writing it or
    // waiting to be measured from it, a snapshot comparing against it.
    int holds = 0;
  };

  void Hold(int b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { ++buffers_[b].holds; }
  void Unhold(int b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { --buffers_[b].holds; }
  void SetReference(int b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (last_ >= 0) Unhold(last_);
    last_ = b;
    if (b >= 0) Hold(b);
  }
  // Frees the buffers nothing holds (an inference model keeps none).
  void Trim() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    // Indices are kept by snapshots in flight: only a free tail goes.
    while (!buffers_.empty() && buffers_.back().holds == 0) {
      live->FreeDevice(buffers_.back().p);
      buffers_.pop_back();
    }
  }

  // A buffer nothing holds, allocated when none is and the model holds
  // fewer than kMaxSnapshotBuffers; -1 when all are in use.
  absl::StatusOr<int> FreeBuffer() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (size_t b = 0; b < buffers_.size(); ++b) {
      if (buffers_[b].holds == 0) return static_cast<int>(b);
    }
    if (static_cast<int>(buffers_.size()) >= kMaxSnapshotBuffers) return -1;
    absl::StatusOr<void*> p = live->AllocDevice(set_bytes);
    if (!p.ok()) return p.status();
    buffers_.push_back(Buffer{*p, 0});
    return static_cast<int>(buffers_.size()) - 1;
  }

  // Enqueues `t` (its dst chosen here, its ref set by the caller or -1)
  // after `wait`. On error nothing is held.
  absl::Status StartLocked(Taken& t, void* wait) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    absl::StatusOr<int> dst = FreeBuffer();
    if (!dst.ok()) return dst.status();
    if (*dst < 0) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "all ", kMaxSnapshotBuffers, " snapshot buffers of model '", id, "' are in use"));
    }
    std::vector<LiveDevice::SnapshotItem> items;
    auto* base = static_cast<uint8_t*>(buffers_[*dst].p);
    const uint8_t* ref =
        t.ref >= 0 ? static_cast<const uint8_t*>(buffers_[t.ref].p) : nullptr;
    for (const Tensor& tensor : tensors) {
      items.push_back(LiveDevice::SnapshotItem{tensor.src, base + tensor.offset,
                                               ref == nullptr ? nullptr : ref + tensor.offset});
    }
    absl::StatusOr<LiveDevice::Snapshot*> s =
        live->StartSnapshot(items, wait, own_event.event);
    if (!s.ok()) return s.status();
    t.queued = absl::Now();
    t.handle = *s;
    t.dst = *dst;
    Hold(t.dst);
    if (t.ref >= 0) Hold(t.ref);
    return absl::OkStatus();
  }

  // Finishes `t`, decides a check, and lets go of what it no longer needs.
  void ResolveLocked(Taken& t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (t.resolved) return;
    std::vector<double> delta(tensors.size()), ref(tensors.size());
    CallOptions call;
    call.cancel = &registry->stopping_;
    const absl::Status s = live->FinishSnapshot(t.handle, absl::MakeSpan(delta),
                                                absl::MakeSpan(ref), call);
    t.handle = nullptr;
    t.resolved = true;
    if (pending_.get() == &t) pending_.reset();
    const absl::Duration took = absl::Now() - t.notified;
    t.snapshot_ms = absl::ToDoubleMilliseconds(took);
    registry->CountSnapshot(absl::ToDoubleSeconds(took));
    if (t.ref >= 0) Unhold(t.ref);
    if (s.code() == absl::StatusCode::kCancelled) cancelled_ = true;
    if (!s.ok()) {
      spdlog::warn("live model={} step={}: the snapshot failed: {}", LogEscape(id), t.step,
                   LogEscape(s.ToString()));
      registry->CountNotification("error");
      if (last_ == t.dst) {
        // A measured snapshot became the reference at notification; it
        // holds nothing usable, so the next notification starts over.
        SetReference(-1);
        trigger_.Reset();
      }
      t.measure = false;
      Unhold(t.dst);
      return;
    }
    if (!t.check) return;  // decided at notification: measured
    double d = 0, r = 0;
    for (size_t i = 0; i < tensors.size(); ++i) {
      d += delta[i];
      r += ref[i];
    }
    t.delta = r > 0 ? std::sqrt(d) / std::sqrt(r) : (d > 0 ? INFINITY : 0);
    if (trigger_.Exceeds(d, r)) {
      t.measure = true;
      trigger_.Measured(t.step);
      SetReference(t.dst);
    } else {
      Unhold(t.dst);
    }
  }

  // The producer's event for `handle` (empty: none), opened once.
  absl::StatusOr<void*> ProducerEvent(const std::string& handle)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (handle.empty()) return nullptr;
    for (const auto& [bytes, event] : events_) {
      if (bytes == handle) return event;
    }
    IpcHandle h;
    std::memcpy(h.data(), handle.data(), h.size());
    absl::StatusOr<void*> event = live->OpenEvent(h);
    if (!event.ok()) {
      return absl::Status(event.status().code(),
                          absl::StrCat("producer_event_handle does not open: ",
                                       event.status().message()));
    }
    if (events_.size() >= kMaxProducerEvents) {
      // A snapshot enqueued its wait already; the device keeps what it
      // needs of a destroyed event.
      live->DestroyEvent(events_.front().second);
      events_.pop_front();
    }
    events_.emplace_back(handle, *event);
    return *event;
  }

  mutable absl::Mutex mu_;
  Trigger trigger_ ABSL_GUARDED_BY(mu_);
  std::optional<int64_t> last_step_ ABSL_GUARDED_BY(mu_);  // last notified
  std::vector<Buffer> buffers_ ABSL_GUARDED_BY(mu_);
  int last_ ABSL_GUARDED_BY(mu_) = -1;  // the last measured snapshot's buffer
  // The adaptive check not decided yet (at most one: the next notification
  // decides it first).
  std::shared_ptr<Taken> pending_ ABSL_GUARDED_BY(mu_);
  std::deque<std::pair<std::string, void*>> events_ ABSL_GUARDED_BY(mu_);
  std::atomic<int64_t> expiry_ns_{INT64_MAX};  // Unix ns; renewed by Notify
  bool released_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t last_sequence_ ABSL_GUARDED_BY(mu_) = 0;
  // A finish was cancelled: its copy may still be queued (see ~Model).
  bool cancelled_ = false;  // written under mu_, read by the destructor alone
};

absl::StatusOr<NotifyStepResponse> LiveRegistry::Model::Notify(const NotifyStepRequest& request,
                                                               std::shared_ptr<Taken>* taken) {
  const absl::Time notified = absl::Now();
  absl::MutexLock lock(&mu_);
  const std::string& event = request.producer_event_handle();
  if (!event.empty() && event.size() != kIpcHandleBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "producer_event_handle has ", event.size(), " bytes; a cudaIpcEventHandle_t has ",
        kIpcHandleBytes, " (or give none)"));
  }
  Renew();
  NotifyStepResponse response;
  TriggerDecision decision;
  for (int attempt = 0;; ++attempt) {
    if (released_) {
      return absl::NotFoundError(absl::StrCat("live model '", id, "' was released"));
    }
    if (last_step_.has_value() && request.step() <= *last_step_) {
      return absl::InvalidArgumentError(absl::StrCat(
          "step ", request.step(), " is not above the last notified step ", *last_step_,
          " of model '", id, "'"));
    }
    // The reference must be exact before this step is decided: an earlier
    // check still open is decided now (its copy is usually long done).
    if (pending_ != nullptr) {
      std::shared_ptr<Taken> p = pending_;
      ResolveLocked(*p);
    }
    decision = trigger_.Decide(request.step(), request.force());
    response.set_last_sequence(last_sequence_);
    if (decision.action == TriggerAction::kSkip ||
        decision.action == TriggerAction::kInference) {
      last_step_ = request.step();
      response.set_snapshot(false);
      response.set_reason(decision.reason);
      return response;
    }
    auto room = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      if (static_cast<int>(buffers_.size()) < kMaxSnapshotBuffers) return true;
      for (const Buffer& b : buffers_) {
        if (b.holds == 0) return true;
      }
      return false;
    };
    if (room() || attempt > 0) break;
    // Every buffer is being read (rvd's measurements are behind): this
    // step waits for one, with the lock released, then is looked at anew.
    mu_.AwaitWithTimeout(absl::Condition(&room), registry->options_.busy_wait);
  }
  absl::StatusOr<void*> wait = ProducerEvent(event);
  if (!wait.ok()) return wait.status();
  auto t = std::make_shared<Taken>();
  t->notified = notified;
  t->step = request.step();
  t->reason = decision.reason;
  t->check = decision.action == TriggerAction::kCheck;
  t->ref = t->check ? last_ : -1;
  t->measure = !t->check;
  if (absl::Status s = StartLocked(*t, *wait); !s.ok()) {
    if (s.code() == absl::StatusCode::kResourceExhausted &&
        static_cast<int>(buffers_.size()) >= kMaxSnapshotBuffers) {
      // Every buffer is still being read after busy_wait: this step is not
      // looked at.
      last_step_ = request.step();
      response.set_snapshot(false);
      response.set_reason("busy");
      return response;
    }
    return s;
  }
  last_step_ = request.step();
  if (t->check) {
    pending_ = t;
  } else {
    trigger_.Measured(t->step);
    // Only adaptive checks compare: a model without them keeps no reference.
    if (trigger_.config().adaptive) SetReference(t->dst);
  }
  *taken = t;
  response.set_snapshot(true);
  response.set_reason(decision.reason);
  return response;
}

LiveRegistry::LiveRegistry(Engine& engine, ComputePool& pool, const LiveOptions& options,
                           LiveRecorder record)
    : engine_(engine),
      live_(engine.Live()),
      pool_(pool),
      options_(options),
      record_(std::move(record)),
      snapshot_seconds_(LatencyBounds()),
      measurement_seconds_(LatencyBounds()) {
  if (pipe2(wake_pipe_, O_CLOEXEC | O_NONBLOCK) != 0) {
    wake_pipe_[0] = wake_pipe_[1] = -1;  // the watcher then wakes by its period
  }
  dispatcher_ = std::thread([this] { Dispatch(); });
  watcher_ = std::thread([this] { Watch(); });
}

LiveRegistry::~LiveRegistry() {
  Stop();
  for (int fd : wake_pipe_) {
    if (fd >= 0) close(fd);
  }
}

void LiveRegistry::Stop() {
  {
    absl::MutexLock lock(&stop_mu_);
    if (stopped_) return;
    stopped_ = true;
  }
  stopping_ = true;
  std::vector<std::shared_ptr<Model>> released;
  {
    absl::MutexLock lock(&mu_);
    std::vector<std::string> ids;
    for (const auto& [id, unused] : models_) ids.push_back(id);
    for (const std::string& id : ids) ReleaseLocked(&released, id, "shutdown");
  }
  for (const auto& m : released) m->MarkReleased();
  released.clear();
  {
    absl::MutexLock lock(&queue_mu_);
    queue_stopping_ = true;
  }
  Wake();
  dispatcher_.join();
  watcher_.join();
}

void LiveRegistry::Drain() {
  absl::MutexLock lock(&queue_mu_);
  queue_mu_.Await(absl::Condition(
      +[](int64_t* n) { return *n == 0; }, &queued_or_running_));
}

void LiveRegistry::CountNotification(const std::string& outcome) {
  absl::MutexLock lock(&stats_mu_);
  ++stats_.notifications[outcome];
}

void LiveRegistry::CountSnapshot(double seconds) {
  snapshot_seconds_.Observe(seconds);
  absl::MutexLock lock(&stats_mu_);
  ++stats_.snapshots;
}

void LiveRegistry::CountMeasured(const Measurement& m) {
  const int64_t ns = TimeUtil::TimestampToNanoseconds(m.timestamp()) -
                     TimeUtil::TimestampToNanoseconds(m.notified());
  measurement_seconds_.Observe(static_cast<double>(ns) * 1e-9);
  absl::MutexLock lock(&stats_mu_);
  ++stats_.measured;
}

LiveStats LiveRegistry::Stats() const {
  LiveStats s;
  {
    absl::MutexLock lock(&stats_mu_);
    s = stats_;
  }
  s.snapshot_seconds = snapshot_seconds_.Collect();
  s.measurement_seconds = measurement_seconds_.Collect();
  {
    absl::MutexLock lock(&mu_);
    s.models = models_.size();
  }
  absl::MutexLock lock(&segments_mu_);
  s.segments_mapped = segments_.size();
  return s;
}

void LiveRegistry::DropMappings(const std::vector<std::string>& keys, bool close) {
  absl::MutexLock lock(&segments_mu_);
  for (const std::string& key : keys) {
    auto it = segments_.find(key);
    if (it == segments_.end()) continue;
    if (--it->second.refs == 0) {
      if (close) live_->CloseSegment(it->second.mapped.segment);
      segments_.erase(it);
    }
  }
}

absl::StatusOr<RegisterLiveModelResponse> LiveRegistry::Register(
    const RegisterLiveModelRequest& request, absl::Time deadline) {
  if (live_ == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the ", engine_.Backend(),
        " backend reads no GPU memory: live models need rvd on the trainer's GPU "
        "(backend cuda); send the weights with MeasureStream instead"));
  }
  if (stopping_) return absl::UnavailableError("rvd is shutting down");
  absl::StatusOr<Plan> plan = CheckRequest(request, options_);
  if (!plan.ok()) return plan.status();
  const std::string& id = plan->header.model_id();
  const int32_t pid = request.producer_pid();

  absl::StatusOr<std::string> uuid = live_->DeviceUuid();
  if (!uuid.ok()) return uuid.status();
  if (NormalizeUuid(request.device_uuid()) != NormalizeUuid(*uuid)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "device_uuid '", request.device_uuid().substr(0, 80), "' is not rvd's device (", *uuid,
        "): rvd maps memory of its own GPU only"));
  }
  if (!ProcessAlive(pid)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "producer_pid ", pid,
        " is not a running process in rvd's pid namespace (in a pod: shareProcessNamespace)"));
  }
  // Refusals that depend on the other models, checked again on insertion.
  auto conflict = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> absl::Status {
    auto it = models_.find(id);
    if (it != models_.end() && it->second->pid != pid && ProcessAlive(it->second->pid)) {
      return absl::AlreadyExistsError(absl::StrCat("live model '", id,
                                                   "' is registered by producer ",
                                                   it->second->pid, ", not ", pid));
    }
    if (it == models_.end() && models_.size() >= options_.max_live_models) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "rvd has ", models_.size(), " live models registered (max_live_models)"));
    }
    return absl::OkStatus();
  };
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status s = conflict(); !s.ok()) return s;
  }

  auto model = std::make_shared<Model>(this, id, pid, plan->header,
                                       ResolveVariant(plan->header, options_.default_variant,
                                                      engine_),
                                       plan->trigger, plan->lease);
  RegisterLiveModelResponse response;
  // Map each distinct segment once; one already mapped for this producer
  // is shared. What this request opened is closed again on any error (the
  // model's destructor drops its keys).
  {
    absl::MutexLock lock(&segments_mu_);
    for (const auto& [key, declared] : plan->segment_bytes) {
      auto it = segments_.find(key);
      if (it != segments_.end()) {
        ++it->second.refs;
        model->mapping_keys.push_back(key);
        response.set_segments_reused(response.segments_reused() + 1);
        continue;
      }
      const TensorPlan* first = nullptr;
      for (const TensorPlan& tp : plan->tensors) {
        if (tp.key == key) first = &tp;
      }
      absl::StatusOr<LiveDevice::MappedSegment> mapped = live_->OpenSegment(
          first->kind,
          absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(first->payload.data()),
                              first->payload.size()),
          pid, declared);
      if (!mapped.ok()) {
        // Returning releases this lock before `model`, whose destructor
        // drops the mappings taken so far.
        return absl::Status(mapped.status().code(),
                            absl::StrCat("a segment of the request does not map: ",
                                         mapped.status().message()));
      }
      segments_[key] = Mapping{*mapped, 1};
      model->mapping_keys.push_back(key);
    }
    response.set_segments_mapped(model->mapping_keys.size());
    uint64_t offset = 0;
    for (int i = 0; i < plan->header.tensors_size(); ++i) {
      const TensorPlan& tp = plan->tensors[i];
      const Mapping& m = segments_.at(tp.key);
      if (tp.end > m.mapped.bytes) {
        return ForTensor(plan->header.tensors(i),
                         absl::InvalidArgumentError(absl::StrCat(
                             "lies outside its segment: bytes [", tp.offset, ", ", tp.end,
                             ") of a segment mapped with ", m.mapped.bytes, " bytes")));
      }
      Model::Tensor t;
      t.src = tp.layer;
      t.src.data = static_cast<const uint8_t*>(m.mapped.base) + tp.offset +
                   (static_cast<const uint8_t*>(tp.layer.data) - kPlaceholderBase);
      t.offset = offset;
      t.columns = tp.columns;
      t.heads = tp.heads;
      t.head_dim = tp.head_dim;
      model->tensors.push_back(t);
      const uint64_t bytes = static_cast<uint64_t>(t.src.rows) * t.src.cols * DTypeSize(t.src.dtype);
      offset += (bytes + kBufferAlign - 1) / kBufferAlign * kBufferAlign;
    }
    model->set_bytes = offset;
  }

  absl::StatusOr<LiveDevice::OwnEvent> event = live_->CreateEvent();
  if (!event.ok()) return event.status();
  model->own_event = *event;
  // Training: the reference and one to take; inference: one, for now.
  if (absl::Status s = model->Reserve(model->inference() ? 1 : 2); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("snapshot buffers of ", model->set_bytes,
                                               " bytes each: ", s.message()));
  }
  response.set_snapshot_bytes(model->HeldBytes());
  response.set_lease_seconds(static_cast<uint32_t>(absl::ToInt64Seconds(model->lease)));
  response.set_rvd_event_handle(model->own_event.handle.data(), model->own_event.handle.size());

  if (model->inference()) {
    absl::StatusOr<std::shared_ptr<Taken>> t = model->TakeNow(plan->header.step(), "inference");
    if (!t.ok()) return t.status();
    absl::StatusOr<std::optional<Measurement>> measured = std::nullopt;
    absl::Status queued = pool_.Run([&] { measured = Measure(*model, **t); }, deadline,
                                    [this] { return stopping_.load(); });
    if (!queued.ok()) {
      Abandon(*model, **t);
      return queued;
    }
    if (measured.ok() && !measured->has_value()) {
      measured = absl::InternalError("the registration's snapshot failed (see the log)");
    }
    if (!measured.ok()) {
      model->Done(**t, 0);
      return measured.status();
    }
    absl::StatusOr<MeasurementLog::Entry> stored = record_(**measured);
    if (!stored.ok()) {
      model->Done(**t, 0);
      return stored.status();
    }
    CountMeasured(**stored);
    model->Done(**t, (*stored)->sequence());
    *response.mutable_measurement() = **stored;
    response.set_snapshot_bytes(model->HeldBytes());
  }

  // Insert, unless another registration won meanwhile.
  std::vector<std::shared_ptr<Model>> replaced;
  {
    absl::MutexLock lock(&mu_);
    // Stop released every model already: this one would never be.
    if (stopping_) return absl::UnavailableError("rvd is shutting down");
    if (absl::Status s = conflict(); !s.ok()) return s;
    if (models_.contains(id)) {
      ReleaseLocked(&replaced, id,
                    models_.at(id)->pid == pid ? "replaced" : "producer_exit");
    }
    model->Renew();
    models_[id] = model;
    released_.erase(id);
    std::shared_ptr<Producer>& producer = producers_[pid];
    if (producer == nullptr) producer = std::make_shared<Producer>(pid);
    ++producer->models;
  }
  for (const auto& m : replaced) m->MarkReleased();
  Wake();  // the watcher polls the new producer's pidfd
  return response;
}

absl::Status LiveRegistry::Unregister(const std::string& model_id) {
  if (absl::Status s = ValidateModelId(model_id); !s.ok()) return s;
  std::vector<std::shared_ptr<Model>> released;
  {
    absl::MutexLock lock(&mu_);
    if (!models_.contains(model_id)) {
      return absl::NotFoundError(absl::StrCat("no live model '", model_id, "' is registered"));
    }
    ReleaseLocked(&released, model_id, "unregister");
  }
  for (const auto& m : released) m->MarkReleased();
  return absl::OkStatus();
}

void LiveRegistry::ReleaseLocked(std::vector<std::shared_ptr<Model>>* out,
                                 const std::string& model_id, const char* reason) {
  auto it = models_.find(model_id);
  if (it == models_.end()) return;
  std::shared_ptr<Model> model = it->second;
  models_.erase(it);
  auto p = producers_.find(model->pid);
  if (p != producers_.end() && --p->second->models == 0) producers_.erase(p);
  if (released_.size() >= kMaxReleasedKept) released_.erase(released_.begin());
  released_[model_id] = reason;
  {
    absl::MutexLock lock(&stats_mu_);
    ++stats_.releases[reason];
  }
  spdlog::info("live model={} released ({}), producer {}", LogEscape(model_id), reason,
               model->pid);
  out->push_back(std::move(model));
}

absl::StatusOr<NotifyStepResponse> LiveRegistry::Notify(const NotifyStepRequest& request) {
  std::shared_ptr<Taken> taken;
  std::shared_ptr<Model> model;
  absl::StatusOr<NotifyStepResponse> response = NotifyModel(request, &model, &taken);
  if (!response.ok()) {
    CountNotification("error");
    return response;
  }
  CountNotification(response->reason());
  if (taken != nullptr) Enqueue(std::move(model), std::move(taken));
  return response;
}

absl::StatusOr<NotifyStepResponse> LiveRegistry::NotifyModel(const NotifyStepRequest& request,
                                                             std::shared_ptr<Model>* model,
                                                             std::shared_ptr<Taken>* taken) {
  if (absl::Status s = ValidateModelId(request.model_id()); !s.ok()) return s;
  {
    absl::MutexLock lock(&mu_);
    auto it = models_.find(request.model_id());
    if (it == models_.end()) {
      auto r = released_.find(request.model_id());
      return absl::NotFoundError(absl::StrCat(
          "live model '", request.model_id(), "' is not registered",
          r == released_.end() ? std::string()
                               : absl::StrCat(" (released: ", r->second, ")")));
    }
    *model = it->second;
  }
  return (*model)->Notify(request, taken);
}

void LiveRegistry::Enqueue(std::shared_ptr<Model> model, std::shared_ptr<Taken> taken) {
  absl::MutexLock lock(&queue_mu_);
  ++queued_or_running_;
  queue_.emplace_back(std::move(model), std::move(taken));
}

absl::StatusOr<std::optional<Measurement>> LiveRegistry::Measure(Model& model, Taken& taken) {
  const absl::Time started = absl::Now();
  void* buffer = nullptr;
  if (!model.Prepare(taken, &buffer)) return std::nullopt;
  const absl::Time copied = absl::Now();
  std::vector<TensorResults> where;
  const std::vector<MatrixView> views = model.Views(buffer, &where);
  std::vector<double> pr(views.size());
  CallOptions call;
  call.cancel = &stopping_;
  const auto start = std::chrono::steady_clock::now();
  // The snapshot is finished (Prepare): nothing to wait for on the device.
  absl::Status s =
      engine_.ComputePRDevice(views, model.variant, absl::MakeSpan(pr), nullptr, call);
  if (!s.ok()) return s;
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
          .count();
  Measurement m = AssembleMeasurement(model.header, pr, where, model.variant.name, engine_, ms);
  m.set_step(taken.step);
  m.set_receive_ms(taken.snapshot_ms);
  *m.mutable_notified() = TimeUtil::NanosecondsToTimestamp(absl::ToUnixNanos(taken.notified));
  if (spdlog::should_log(spdlog::level::debug)) {
    auto since = [&taken](absl::Time t) { return absl::ToDoubleMilliseconds(t - taken.notified); };
    spdlog::debug(
        "live model={} step={}: from the notification, snapshot enqueued +{:.3f} ms, "
        "measurement started +{:.3f}, copy finished +{:.3f}, computed +{:.3f}",
        LogEscape(model.id), taken.step, since(taken.queued), since(started), since(copied),
        since(absl::Now()));
  }
  return m;
}

void LiveRegistry::RunJob(Model& model, Taken& taken) {
  absl::StatusOr<std::optional<Measurement>> measured = Measure(model, taken);
  if (measured.ok() && !measured->has_value()) return;  // a check under the threshold, or failed
  absl::Status s = measured.status();
  uint64_t sequence = 0;
  if (s.ok()) {
    absl::StatusOr<MeasurementLog::Entry> stored = record_(**std::move(measured));
    if (stored.ok()) {
      sequence = (*stored)->sequence();
      CountMeasured(**stored);
    } else {
      s = stored.status();
    }
  }
  if (!s.ok()) {
    spdlog::warn("live model={} step={} ({}): not measured: {}", LogEscape(model.id),
                 taken.step, taken.reason, LogEscape(s.ToString()));
    CountNotification("error");
  }
  model.Done(taken, sequence);
}

void LiveRegistry::Abandon(Model& model, Taken& taken) {
  void* buffer = nullptr;
  if (model.Prepare(taken, &buffer)) {
    spdlog::warn("live model={} step={} ({}): dropped unmeasured (rvd stopping)",
                 LogEscape(model.id), taken.step, taken.reason);
  }
  model.Done(taken, 0);
}

void LiveRegistry::Dispatch() {
  while (true) {
    std::pair<std::shared_ptr<Model>, std::shared_ptr<Taken>> item;
    {
      absl::MutexLock lock(&queue_mu_);
      queue_mu_.Await(absl::Condition(
          +[](LiveRegistry* r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(r->queue_mu_) {
            return !r->queue_.empty() || r->queue_stopping_;
          },
          this));
      if (queue_.empty()) return;  // stopping, and nothing left
      item = std::move(queue_.front());
      queue_.pop_front();
    }
    bool ran = false;
    while (!stopping_) {
      // Measured here when a worker is idle: the notification's answer
      // has gone, and this thread waits for the job either way.
      const absl::Status s = pool_.RunHereIfIdle([&] { RunJob(*item.first, *item.second); },
                                                 absl::InfiniteFuture(),
                                                 [this] { return stopping_.load(); });
      if (s.ok()) {
        ran = true;
        break;
      }
      if (s.code() != absl::StatusCode::kResourceExhausted) break;
      // The compute queue is full of requests: the snapshot waits its turn.
      absl::SleepFor(absl::Milliseconds(5));
    }
    if (!ran) Abandon(*item.first, *item.second);
    item = {};  // a released model may go here (outside every lock)
    absl::MutexLock lock(&queue_mu_);
    --queued_or_running_;
  }
}

void LiveRegistry::Wake() {
  if (wake_pipe_[1] < 0) return;
  const char c = 1;
  [[maybe_unused]] ssize_t n = write(wake_pipe_[1], &c, 1);  // full: a wake is pending
}

void LiveRegistry::Watch() {
  while (!stopping_) {
    std::vector<std::shared_ptr<Producer>> producers;
    {
      absl::MutexLock lock(&mu_);
      for (const auto& [pid, p] : producers_) producers.push_back(p);
    }
    std::vector<pollfd> fds;
    fds.push_back(pollfd{wake_pipe_[0], POLLIN, 0});
    for (const auto& p : producers) {
      if (p->pidfd >= 0) fds.push_back(pollfd{p->pidfd, POLLIN, 0});
    }
    poll(fds.data(), fds.size(), static_cast<int>(Millis(options_.watch_period)));
    if (stopping_) return;
    if (fds[0].revents & POLLIN) {
      char buf[64];
      while (read(wake_pipe_[0], buf, sizeof(buf)) > 0) {
      }
    }
    std::set<int32_t> exited;
    size_t f = 1;
    for (const auto& p : producers) {
      if (p->pidfd >= 0) {
        if (fds[f++].revents & (POLLIN | POLLHUP | POLLERR)) exited.insert(p->pid);
      } else if (!ProcessAlive(p->pid)) {
        exited.insert(p->pid);
      }
    }
    std::vector<std::shared_ptr<Model>> released;
    {
      absl::MutexLock lock(&mu_);
      const absl::Time now = absl::Now();
      std::vector<std::pair<std::string, const char*>> go;
      for (const auto& [id, m] : models_) {
        if (exited.contains(m->pid)) {
          go.emplace_back(id, "producer_exit");
        } else if (m->Expired(now)) {
          go.emplace_back(id, "lease");
        }
      }
      for (const auto& [id, reason] : go) ReleaseLocked(&released, id, reason);
    }
    for (const auto& m : released) m->MarkReleased();
  }
}

}  // namespace rvd

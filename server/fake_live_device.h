// Test-only: a LiveDevice on host memory (kernels/live_device.h), and an
// engine that serves it, so that the live registry's whole path runs on the
// CPU (live_registry_test).
//
// Segments are host buffers a test creates and keys by their handle bytes;
// "device" memory is host memory; a snapshot copies at StartSnapshot (the
// moment the device would, after the producer's event) and sums the deltas
// in double on the host. Counters say what is open, so a test can check
// that nothing leaks. HostLiveEngine computes PR of "device" views with the
// CPU engine, and can hold a computation (Block) to test what happens
// while a measurement is still reading its snapshot.
#ifndef RVD_SERVER_FAKE_LIVE_DEVICE_H_
#define RVD_SERVER_FAKE_LIVE_DEVICE_H_

#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "kernels/dtype_convert.h"
#include "kernels/engine.h"
#include "kernels/live_device.h"

namespace rvd {

class FakeLiveDevice final : public LiveDevice {
 public:
  // A segment of `bytes` (zeroed) that opens with `handle`; returns its
  // memory for the test to write.
  uint8_t* AddSegment(const std::string& handle, uint64_t bytes) {
    absl::MutexLock lock(&mu_);
    auto& s = segments_[handle];
    s.bytes.assign(bytes, 0);
    return s.bytes.data();
  }
  // The next OpenSegment of `handle` fails with `status`.
  void FailOpen(const std::string& handle, absl::Status status) {
    absl::MutexLock lock(&mu_);
    open_errors_[handle] = std::move(status);
  }
  void set_uuid(std::string uuid) {
    absl::MutexLock lock(&mu_);
    uuid_ = std::move(uuid);
  }
  void set_max_bytes(uint64_t bytes) {
    absl::MutexLock lock(&mu_);
    max_bytes_ = bytes;
  }

  // What is open now, and what was done.
  struct Counts {
    int segments_open = 0;
    int events_open = 0;
    uint64_t bytes_allocated = 0;
    int snapshots_open = 0;
    int snapshots_started = 0;
    std::map<std::string, int> opens;  // OpenSegment calls per handle
    int event_opens = 0;               // OpenEvent calls
  };
  Counts counts() const {
    absl::MutexLock lock(&mu_);
    return counts_;
  }
  // The last snapshot's wait and done events (null: none).
  std::pair<void*, void*> last_events() const {
    absl::MutexLock lock(&mu_);
    return {last_wait_, last_done_};
  }

  absl::StatusOr<MappedSegment> OpenSegment(IpcKind, absl::Span<const uint8_t> handle, int32_t,
                                            uint64_t) override {
    absl::MutexLock lock(&mu_);
    const std::string key(reinterpret_cast<const char*>(handle.data()), handle.size());
    ++counts_.opens[key];
    if (auto e = open_errors_.find(key); e != open_errors_.end()) {
      absl::Status s = e->second;
      open_errors_.erase(e);
      return s;
    }
    auto it = segments_.find(key);
    if (it == segments_.end()) {
      return absl::InvalidArgumentError("fake: the handle does not open");
    }
    if (open_.contains(key)) {
      return absl::InternalError("fake: the handle is mapped twice in one process");
    }
    open_.insert(key);
    ++counts_.segments_open;
    auto* id = new std::string(key);
    return MappedSegment{reinterpret_cast<Segment*>(id), it->second.bytes.data(),
                         it->second.bytes.size()};
  }
  void CloseSegment(Segment* segment) override {
    absl::MutexLock lock(&mu_);
    auto* id = reinterpret_cast<std::string*>(segment);
    open_.erase(*id);
    delete id;
    --counts_.segments_open;
  }

  absl::StatusOr<std::string> DeviceUuid() override {
    absl::MutexLock lock(&mu_);
    return uuid_;
  }

  absl::StatusOr<void*> OpenEvent(const IpcHandle& handle) override {
    absl::MutexLock lock(&mu_);
    ++counts_.event_opens;
    if (handle[0] == 0xff) return absl::InvalidArgumentError("fake: the event does not open");
    ++counts_.events_open;
    return static_cast<void*>(new int(1));
  }
  absl::StatusOr<OwnEvent> CreateEvent() override {
    absl::MutexLock lock(&mu_);
    ++counts_.events_open;
    OwnEvent e;
    e.event = new int(2);
    e.handle.fill(0xee);
    return e;
  }
  void DestroyEvent(void* event) override {
    absl::MutexLock lock(&mu_);
    delete static_cast<int*>(event);
    --counts_.events_open;
  }

  absl::StatusOr<void*> AllocDevice(uint64_t bytes) override {
    absl::MutexLock lock(&mu_);
    if (counts_.bytes_allocated + bytes > max_bytes_) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "fake: ", bytes, " more device bytes exceed the cap of ", max_bytes_));
    }
    counts_.bytes_allocated += bytes;
    void* p = ::operator new(bytes);
    // Poisoned: a snapshot must overwrite everything it hands on.
    std::memset(p, 0xff, bytes);
    allocations_[p] = bytes;
    return p;
  }
  void FreeDevice(void* p) override {
    absl::MutexLock lock(&mu_);
    counts_.bytes_allocated -= allocations_.at(p);
    allocations_.erase(p);
    ::operator delete(p);
  }

  absl::StatusOr<Snapshot*> StartSnapshot(absl::Span<const SnapshotItem> items, void* wait,
                                          void* done) override {
    auto* s = new Sums;
    for (const SnapshotItem& item : items) {
      const MatrixView& v = item.src;
      const size_t elem = DTypeSize(v.dtype);
      const size_t row_bytes = static_cast<size_t>(v.cols) * elem;
      double d = 0, l = 0;
      for (int64_t r = 0; r < v.rows; ++r) {
        const int64_t at = v.block_rows > 0
                               ? (r / v.block_rows) * v.block_stride + (r % v.block_rows) * v.ld
                               : r * v.ld;
        const auto* src = static_cast<const uint8_t*>(v.data) + static_cast<size_t>(at) * elem;
        auto* dst = static_cast<uint8_t*>(item.dst) + static_cast<size_t>(r) * row_bytes;
        std::memcpy(dst, src, row_bytes);
        if (item.last == nullptr) continue;
        const auto* last = static_cast<const uint8_t*>(item.last) + static_cast<size_t>(r) * row_bytes;
        for (int64_t c = 0; c < v.cols; ++c) {
          const double x = Value(src, c, v.dtype), y = Value(last, c, v.dtype);
          d += (x - y) * (x - y);
          l += y * y;
        }
      }
      s->delta.push_back(d);
      s->last.push_back(l);
    }
    absl::MutexLock lock(&mu_);
    ++counts_.snapshots_open;
    ++counts_.snapshots_started;
    last_wait_ = wait;
    last_done_ = done;
    return reinterpret_cast<Snapshot*>(s);
  }
  absl::Status FinishSnapshot(Snapshot* snapshot, absl::Span<double> delta_sq,
                              absl::Span<double> last_sq, const CallOptions&) override {
    std::unique_ptr<Sums> s(reinterpret_cast<Sums*>(snapshot));
    for (size_t i = 0; i < s->delta.size() && i < delta_sq.size(); ++i) {
      delta_sq[i] = s->delta[i];
      last_sq[i] = s->last[i];
    }
    absl::MutexLock lock(&mu_);
    --counts_.snapshots_open;
    return absl::OkStatus();
  }

 private:
  struct Sums {
    std::vector<double> delta, last;
  };
  struct HostSegment {
    std::vector<uint8_t> bytes;
  };
  static double Value(const uint8_t* row, int64_t c, DType dtype) {
    switch (dtype) {
      case DType::kF32: {
        float f;
        std::memcpy(&f, row + c * 4, 4);
        return f;
      }
      case DType::kF16: {
        uint16_t h;
        std::memcpy(&h, row + c * 2, 2);
        return HalfToFloat(h);
      }
      case DType::kBF16: {
        uint16_t h;
        std::memcpy(&h, row + c * 2, 2);
        return BFloat16ToFloat(h);
      }
    }
    return 0;
  }

  mutable absl::Mutex mu_;
  std::map<std::string, HostSegment> segments_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, absl::Status> open_errors_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> open_ ABSL_GUARDED_BY(mu_);
  std::map<void*, uint64_t> allocations_ ABSL_GUARDED_BY(mu_);
  std::string uuid_ ABSL_GUARDED_BY(mu_) = "GPU-00000000-fake-0000-0000-000000000000";
  uint64_t max_bytes_ ABSL_GUARDED_BY(mu_) = uint64_t{1} << 30;
  Counts counts_ ABSL_GUARDED_BY(mu_);
  void* last_wait_ ABSL_GUARDED_BY(mu_) = nullptr;
  void* last_done_ ABSL_GUARDED_BY(mu_) = nullptr;
};

// The CPU engine, taking FakeLiveDevice's "device" memory (host memory) in
// ComputePRDevice, with Live() the fake.
class HostLiveEngine final : public Engine {
 public:
  HostLiveEngine() : cpu_(NewCpuEngine(2)) {}
  FakeLiveDevice& fake() { return live_; }

  // Holds every ComputePRDevice call until Unblock; entered() counts those
  // that arrived.
  void Block() {
    absl::MutexLock lock(&mu_);
    blocked_ = true;
  }
  void Unblock() {
    absl::MutexLock lock(&mu_);
    blocked_ = false;
  }
  int entered() const {
    absl::MutexLock lock(&mu_);
    return entered_;
  }
  void WaitEntered(int n) const {
    absl::MutexLock lock(&mu_);
    auto arrived = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return entered_ >= n; };
    mu_.Await(absl::Condition(&arrived));
  }

  std::string Backend() const override { return "cpu"; }
  std::string Version() const override { return "host-live-1"; }
  std::string DefaultVariant() const override { return "algebraic"; }
  using Engine::ComputePR;
  absl::Status ComputePR(absl::Span<const MatrixView> batch, const VariantSpec& variant,
                         absl::Span<double> out, const CallOptions& call) override {
    return cpu_->ComputePR(batch, variant, out, call);
  }
  using Engine::ComputePRDevice;
  absl::Status ComputePRDevice(absl::Span<const MatrixView> batch, const VariantSpec& variant,
                               absl::Span<double> out, void*,
                               const CallOptions& call) override {
    {
      absl::MutexLock lock(&mu_);
      ++entered_;
      mu_.Await(absl::Condition(
          +[](bool* blocked) { return !*blocked; }, &blocked_));
    }
    return cpu_->ComputePR(batch, variant, out, call);
  }
  EngineStats Stats() const override { return cpu_->Stats(); }
  LiveDevice* Live() override { return &live_; }

 private:
  std::unique_ptr<Engine> cpu_;
  FakeLiveDevice live_;
  mutable absl::Mutex mu_;
  bool blocked_ ABSL_GUARDED_BY(mu_) = false;
  int entered_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace rvd

#endif  // RVD_SERVER_FAKE_LIVE_DEVICE_H_

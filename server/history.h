// Per-model history of measurements: a bounded ring buffer per model, and
// subscriptions for WatchMeasurements.
//
// History and Subscription are thread-safe: any thread may call any member.
// History::Add appends to the model's ring and pushes to the matching
// subscriptions under one lock, so every watcher sees a model's measurements
// in the same order as GetHistory. Lock order: History::mu_, then
// Subscription::mu_; a Subscription never calls back into History.
#ifndef RVD_SERVER_HISTORY_H_
#define RVD_SERVER_HISTORY_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "rvd/v1/rvd.pb.h"

namespace rvd {

// A fixed-capacity ring of measurements, oldest first. Not thread-safe on its
// own; History guards it.
class MeasurementRing {
 public:
  // A capacity of 0 is taken as 1. Slots are allocated as they fill, so an
  // idle model costs nothing near capacity * sizeof(Measurement).
  explicit MeasurementRing(size_t capacity);
  void Push(rvd::v1::Measurement m);  // drops the oldest when full
  size_t size() const { return size_; }
  size_t capacity() const { return capacity_; }
  // The newest `limit` (0: all), oldest first.
  std::vector<rvd::v1::Measurement> Newest(size_t limit) const;
  // The newest, or nullptr when empty. Valid until the next Push.
  const rvd::v1::Measurement* Latest() const;
  // Measurements ever pushed (size() stops at capacity()).
  uint64_t total_pushed() const { return total_pushed_; }

 private:
  size_t capacity_;                          // most measurements kept
  std::vector<rvd::v1::Measurement> slots_;  // grows to capacity_, then reused
  size_t next_ = 0;                          // slot the next Push writes
  size_t size_ = 0;                          // filled slots
  uint64_t total_pushed_ = 0;                // Push calls so far
};

// A queue a watcher drains; History pushes into it. Thread-safe.
//
// The queue is bounded: when a watcher falls `max_queued` measurements behind,
// Push drops the oldest queued one (and counts it in dropped()), so a slow or
// stuck client cannot grow the daemon's memory without limit.
class Subscription {
 public:
  static constexpr size_t kDefaultMaxQueued = 1024;

  explicit Subscription(std::string model_id,
                        size_t max_queued = kDefaultMaxQueued)
      : model_id_(std::move(model_id)),
        max_queued_(max_queued < 1 ? 1 : max_queued) {}
  const std::string& model_id() const { return model_id_; }
  // Whether this subscription wants measurements of `model_id`.
  bool Matches(const std::string& model_id) const {
    return model_id_.empty() || model_id_ == model_id;
  }
  // Waits up to `timeout` for the next measurement; nullopt on timeout or
  // after Close() (measurements still queued at Close() are discarded).
  // Use closed() to tell the two apart.
  std::optional<rvd::v1::Measurement> Next(absl::Duration timeout);
  // Queues `m` and wakes a waiting Next(); a no-op after Close().
  void Push(const rvd::v1::Measurement& m);
  // Wakes every waiting Next(); later calls of Next() return nullopt at once.
  void Close();
  bool closed() const;
  // Measurements dropped because the queue was full.
  uint64_t dropped() const;

 private:
  const std::string model_id_;  // empty: every model
  const size_t max_queued_;     // longest queue_; Push drops the oldest beyond
  mutable absl::Mutex mu_;
  std::deque<rvd::v1::Measurement> queue_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t dropped_ ABSL_GUARDED_BY(mu_) = 0;  // oldest entries dropped
};

class History {
 public:
  // `capacity_per_model` and `max_models` below 1 are taken as 1.
  History(size_t capacity_per_model, size_t max_models);
  ~History();  // closes every subscription

  History(const History&) = delete;
  History& operator=(const History&) = delete;

  // Appends and pushes `m` to the matching subscriptions. INVALID_ARGUMENT for
  // an empty model_id; RESOURCE_EXHAUSTED when this is a new model and
  // max_models are already kept.
  absl::Status Add(const rvd::v1::Measurement& m);
  std::optional<rvd::v1::Measurement> Latest(const std::string& model_id) const;
  // NOT_FOUND for an unknown model.
  absl::StatusOr<std::vector<rvd::v1::Measurement>> Get(
      const std::string& model_id, size_t limit) const;
  std::vector<rvd::v1::ModelSummary> Models() const;  // sorted by id

  // A watcher of `model_id` ("": every model). It sees measurements added
  // after this call. After CloseAllSubscriptions() the returned subscription
  // is already closed.
  std::shared_ptr<Subscription> Subscribe(const std::string& model_id);
  // Stops pushing to `sub` and closes it. Safe to call twice.
  void Unsubscribe(const std::shared_ptr<Subscription>& sub);
  void CloseAllSubscriptions();  // on shutdown: wakes every watcher
  size_t num_subscriptions() const;

 private:
  const size_t capacity_per_model_;  // ring capacity of each model
  const size_t max_models_;          // most distinct model ids kept
  mutable absl::Mutex mu_;
  std::map<std::string, MeasurementRing> rings_ ABSL_GUARDED_BY(mu_);
  std::vector<std::shared_ptr<Subscription>> subs_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;  // CloseAllSubscriptions() ran
};

}  // namespace rvd

#endif  // RVD_SERVER_HISTORY_H_

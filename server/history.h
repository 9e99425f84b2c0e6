// Per-model history of measurements: a bounded ring buffer per model, and
// subscriptions for WatchMeasurements. Thread-safe.
#ifndef RVD_SERVER_HISTORY_H_
#define RVD_SERVER_HISTORY_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "rvd/v1/rvd.pb.h"

namespace rvd {

// A fixed-capacity ring of measurements, oldest first. Not thread-safe on its
// own; History guards it.
class MeasurementRing {
 public:
  explicit MeasurementRing(size_t capacity);
  void Push(rvd::v1::Measurement m);  // drops the oldest when full
  size_t size() const { return size_; }
  size_t capacity() const { return slots_.size(); }
  // The newest `limit` (0: all), oldest first.
  std::vector<rvd::v1::Measurement> Newest(size_t limit) const;
  const rvd::v1::Measurement* Latest() const;

 private:
  std::vector<rvd::v1::Measurement> slots_;  // capacity slots
  size_t next_ = 0;  // slot the next Push writes
  size_t size_ = 0;  // filled slots
};

// A queue a watcher drains; History pushes into it. Thread-safe.
class Subscription {
 public:
  explicit Subscription(std::string model_id) : model_id_(std::move(model_id)) {}
  const std::string& model_id() const { return model_id_; }
  // Waits up to `timeout` for the next measurement; nullopt on timeout or
  // after Close().
  std::optional<rvd::v1::Measurement> Next(absl::Duration timeout);
  void Push(const rvd::v1::Measurement& m);
  void Close();

 private:
  const std::string model_id_;  // empty: every model
  absl::Mutex mu_;
  std::deque<rvd::v1::Measurement> queue_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

class History {
 public:
  History(size_t capacity_per_model, size_t max_models);

  // Appends; RESOURCE_EXHAUSTED when this is a new model and max_models are
  // already kept.
  absl::Status Add(const rvd::v1::Measurement& m);
  std::optional<rvd::v1::Measurement> Latest(const std::string& model_id) const;
  // NOT_FOUND for an unknown model.
  absl::StatusOr<std::vector<rvd::v1::Measurement>> Get(
      const std::string& model_id, size_t limit) const;
  std::vector<rvd::v1::ModelSummary> Models() const;  // sorted by id

  std::shared_ptr<Subscription> Subscribe(const std::string& model_id);
  void Unsubscribe(const std::shared_ptr<Subscription>& sub);
  void CloseAllSubscriptions();  // on shutdown: wakes every watcher

 private:
  const size_t capacity_per_model_;
  const size_t max_models_;
  mutable absl::Mutex mu_;
  std::map<std::string, MeasurementRing> rings_ ABSL_GUARDED_BY(mu_);
  std::vector<std::shared_ptr<Subscription>> subs_ ABSL_GUARDED_BY(mu_);
};

}  // namespace rvd

#endif  // RVD_SERVER_HISTORY_H_

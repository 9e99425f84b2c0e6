// The event bus: delivers each logged measurement to the watchers that want
// it, through a bounded queue per subscriber, and tells a subscriber what
// it missed instead of dropping silently.
//
// A subscriber that falls max_queued measurements behind stops receiving
// them; the ones it misses are summed into a gap marker (the first and last
// missed sequence numbers and their count) queued in their place, so the
// subscriber's stream reads: measurements, a gap, later measurements. A
// watch client can then resume from the log with the gap's first sequence
// number (WatchRequest.after_sequence).
//
// Threads: Publish is called by one thread at a time (History's append
// lock), in sequence order. Subscribe, Unsubscribe, Close and a
// subscription's Pop may be called from any thread. A subscription's notify
// callback runs on the publishing (or closing) thread, outside the bus's
// lock; it must not block and must not call Unsubscribe. Lock order: the
// bus's mu_, then a subscription's mu_; a subscription's notify_mu_ is
// taken with neither held, and before anything the callback locks.
#ifndef RVD_SERVER_EVENT_BUS_H_
#define RVD_SERVER_EVENT_BUS_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "server/measurement_log.h"

namespace rvd {

// Entries a watcher did not receive: those with sequence numbers in
// [first_sequence, last_sequence] that it wanted.
struct GapMarker {
  enum class Reason {
    kSlowConsumer,  // its queue was full; `missed` of them were not queued
    kNotRetained,   // the log no longer has them (an old resume cursor);
                    // `missed` is 0: unknown how many were of its model
  };
  uint64_t first_sequence = 0;
  uint64_t last_sequence = 0;
  uint64_t missed = 0;
  Reason reason = Reason::kSlowConsumer;

  bool operator==(const GapMarker&) const = default;
};

// One item of a watcher's stream.
using BusEvent = std::variant<MeasurementLog::Entry, GapMarker>;

class BusSubscription {
 public:
  // Use EventBus::Subscribe.
  BusSubscription(std::string model_id, size_t max_queued,
                  std::function<void()> notify);

  BusSubscription(const BusSubscription&) = delete;
  BusSubscription& operator=(const BusSubscription&) = delete;

  const std::string& model_id() const { return model_id_; }
  bool Matches(const std::string& model_id) const {
    return model_id_.empty() || model_id_ == model_id;
  }
  // The oldest queued event; nullopt when none is queued (notify says when
  // one is).
  std::optional<BusEvent> Pop();
  // Closed by EventBus::Close (shutdown) or Unsubscribe; events still queued
  // can be popped.
  bool closed() const;
  // Measurements this subscriber missed so far (the sum of its gaps).
  uint64_t missed() const;
  // Measurements queued now (gap markers not counted); at most max_queued.
  size_t queued() const;

 private:
  friend class EventBus;
  // Queues `e`, or counts it in the trailing gap when the queue is full.
  // Returns false when closed (nothing queued), else whether `e` was
  // missed via *missed.
  bool Push(const MeasurementLog::Entry& e, bool* missed);
  void Close();
  // Calls notify_ unless detached; under notify_mu_, so that Detach can
  // wait for a running callback.
  void Notify();
  // After it returns, notify_ is not running and never runs again.
  void Detach();

  const std::string model_id_;  // empty: every model
  const size_t max_queued_;     // most measurements queued
  mutable absl::Mutex mu_;
  std::deque<BusEvent> queue_ ABSL_GUARDED_BY(mu_);
  size_t queued_ ABSL_GUARDED_BY(mu_) = 0;    // measurements in queue_
  uint64_t missed_ ABSL_GUARDED_BY(mu_) = 0;  // sum of the gaps
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  absl::Mutex notify_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  std::function<void()> notify_ ABSL_GUARDED_BY(notify_mu_);  // empty: detached
};

class EventBus {
 public:
  struct Options {
    size_t max_queued = 1024;    // per subscriber; below 1 taken as 1
    size_t max_subscribers = 64;  // Subscribe refuses beyond (0: none)
  };
  explicit EventBus(const Options& options);
  ~EventBus();  // closes every subscription

  EventBus(const EventBus&) = delete;
  EventBus& operator=(const EventBus&) = delete;

  // A subscriber of `model_id` ("": every model) that receives what is
  // published after this call. RESOURCE_EXHAUSTED beyond max_subscribers,
  // UNAVAILABLE after Close. `notify` (may be empty) is called after each
  // event queued for it and when it is closed.
  absl::StatusOr<std::shared_ptr<BusSubscription>> Subscribe(
      std::string model_id, std::function<void()> notify);
  // Stops delivering to `sub` and closes it; when it returns, `sub`'s notify
  // is not running and never runs again. Safe to call twice.
  void Unsubscribe(const std::shared_ptr<BusSubscription>& sub);
  // Queues `e` for every matching subscriber. Calls come in sequence order.
  void Publish(const MeasurementLog::Entry& e);
  // On shutdown: closes and notifies every subscription; later Subscribe
  // calls fail.
  void Close();

  size_t num_subscribers() const;
  // Measurements that some subscriber missed, over all subscribers ever
  // (rvd_watch_gap_entries_total).
  uint64_t gap_entries_total() const { return gap_entries_total_.load(); }
  const Options& options() const { return options_; }

 private:
  const Options options_;
  mutable absl::Mutex mu_;
  std::vector<std::shared_ptr<BusSubscription>> subs_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<uint64_t> gap_entries_total_{0};
};

}  // namespace rvd

#endif  // RVD_SERVER_EVENT_BUS_H_

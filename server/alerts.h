// The alert engine: evaluates the alert rules (alert_rules.h) on every
// stored measurement, keeps a state per (rule, model), and records every
// state change as an alert event in a bounded, numbered log that
// WatchAlerts streams read (resumable by the event's sequence number).
//
// States of a (rule, model) pair:
//   INACTIVE  never held, or held for fewer than `for` measurements
//   PENDING   held for 1..for-1 consecutive measurements (since the first)
//   FIRING    held for `for` consecutive measurements (since the last)
//   RESOLVED  was firing; clear (past the hysteresis) for `resolve_for`
// An event is logged on every change; a measurement without the rule's
// value (no R_V, the layer not sent) or whose baseline is still forming
// changes nothing. The baselines (drop) and the previous value (change)
// are per pair; an EMA or running maximum takes only values at which the
// pair is neither pending nor firing, so that a drop does not pull its own
// baseline down and resolve itself.
//
// Observe is called in sequence order (History's append hook) and takes
// only the engine's lock: a few comparisons per rule, plus one log line per
// transition. SetRules replaces the rules as a whole: a rule whose
// fingerprint is unchanged keeps its states; a removed or changed rule's
// pending or firing pairs get a closing INACTIVE event. Metrics: the
// rvd_alert_active and rvd_alerts_fired_total series of at most
// max_series / 2 pairs are exported (each pair is two series); pairs beyond
// are still evaluated and streamed, counted in
// rvd_alert_series_dropped_total and logged once.
//
// Thread-safe: any thread may call any member. A watch's notify callback
// runs on the thread that logged the event (or closed the engine), outside
// the engine's lock; it must not block or destroy the watch.
#ifndef RVD_SERVER_ALERTS_H_
#define RVD_SERVER_ALERTS_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "prometheus/metric_family.h"
#include "rvd/v1/rvd.pb.h"
#include "server/alert_rules.h"
#include "server/event_bus.h"

namespace rvd {

class AlertEngine;

// An alert event as stored in the log; shared, never modified.
using AlertEventPtr = std::shared_ptr<const rvd::v1::AlertEvent>;
// One item of a WatchAlerts stream (GapMarker's sequences are alert event
// sequences).
using AlertStreamEvent = std::variant<AlertEventPtr, GapMarker>;

// One WatchAlerts stream's cursor over the engine's event log. Not
// thread-safe: one consumer calls Next; notify may run on other threads.
class AlertWatch {
 public:
  ~AlertWatch();  // detaches: notify is not running once it returns

  AlertWatch(const AlertWatch&) = delete;
  AlertWatch& operator=(const AlertWatch&) = delete;

  // The next event of its model after the cursor, a gap when the log no
  // longer holds some after it, or nullopt when none is there now.
  std::optional<AlertStreamEvent> Next();
  // True once the engine closed its watches (shutdown).
  bool closed() const;
  // The newest alert event sequence this watch has passed.
  uint64_t cursor() const { return cursor_; }
  // After it returns, notify is not running and never runs again.
  void Detach();

 private:
  friend class AlertEngine;
  // The notify callback, shared with the engine so that a publisher holding
  // it may outlive the watch; `fn` is empty once detached.
  struct Notifier {
    absl::Mutex mu;
    std::function<void()> fn ABSL_GUARDED_BY(mu);
    void Call();
  };
  AlertWatch(AlertEngine& engine, std::string model_id, uint64_t cursor,
             uint64_t subscribed_at, std::shared_ptr<Notifier> notifier);

  AlertEngine& engine_;
  const std::string model_id_;  // empty: every model
  uint64_t cursor_;
  // The newest sequence at Subscribe: a gap at or below it was lost before
  // the watch began (kNotRetained), a later one while it read (kSlowConsumer).
  const uint64_t subscribed_at_;
  const std::shared_ptr<Notifier> notifier_;
};

class AlertEngine {
 public:
  struct Options {
    size_t retained_events = 4096;  // alert events kept for resuming
    size_t max_watchers = 64;       // WatchAlerts streams at once
    uint64_t max_series = 100000;   // rvd_alert_* series (2 per pair)
  };
  AlertEngine(const Options& options, std::vector<AlertRule> rules);
  ~AlertEngine();

  AlertEngine(const AlertEngine&) = delete;
  AlertEngine& operator=(const AlertEngine&) = delete;

  // Evaluates every matching rule on a stored measurement. Calls come in
  // sequence order.
  void Observe(const rvd::v1::Measurement& m);
  // Replaces the rules (already validated as a whole; see the file comment).
  void SetRules(std::vector<AlertRule> rules);
  // A reload that was refused (rvd_alert_reload_failures_total).
  void NoteReloadFailure();
  size_t num_rules() const;

  // A watch of `model_id` ("": every model). Without `after_sequence` it
  // sees events logged after this call; with it, first the retained events
  // above it (a kNotRetained gap for those no longer kept). OUT_OF_RANGE
  // when it is above the newest event, RESOURCE_EXHAUSTED beyond
  // max_watchers, UNAVAILABLE after CloseWatches.
  absl::StatusOr<std::unique_ptr<AlertWatch>> Subscribe(
      const std::string& model_id, std::optional<uint64_t> after_sequence,
      std::function<void()> notify);
  // On shutdown: every watch is closed (notified); new ones are refused.
  void CloseWatches();

  // The state of every (rule, model) pair now, by rule then model.
  struct PairState {
    std::string rule;
    std::string model_id;
    rvd::v1::AlertState state = rvd::v1::ALERT_STATE_INACTIVE;
    int64_t since_seconds = 0;  // Unix time the state began (0: never)
    uint64_t fired_total = 0;
  };
  std::vector<PairState> States() const;
  // The newest alert event sequence (0: none yet).
  uint64_t last_sequence() const;

  // rvd_alert_active, rvd_alerts_fired_total, rvd_alert_rules,
  // rvd_alert_series_dropped_total, rvd_alert_reload_failures_total,
  // appended to `out` (metrics.cc).
  void CollectMetrics(std::vector<prometheus::MetricFamily>* out) const;

 private:
  friend class AlertWatch;
  struct Pair;
  struct RuleSlot {
    std::shared_ptr<const AlertRule> rule;
    std::string fingerprint;
    std::map<std::string, std::unique_ptr<Pair>> pairs;  // by model id
  };

  // Evaluates `slot` on `m`; appends the resulting event, if any.
  void Evaluate(RuleSlot& slot, const rvd::v1::Measurement& m,
                std::vector<AlertEventPtr>* events)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Numbers and retains `e`; returns it shared.
  AlertEventPtr Append(rvd::v1::AlertEvent e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Logs the events and wakes every watch; called without mu_.
  void Publish(const std::vector<AlertEventPtr>& events);
  // For AlertWatch::Next: the first retained event after `cursor` of
  // `model_id`, or a gap before it; advances *cursor.
  std::optional<AlertStreamEvent> NextAfter(const std::string& model_id,
                                            uint64_t* cursor,
                                            uint64_t subscribed_at) const;
  void Remove(const std::shared_ptr<AlertWatch::Notifier>& notifier);

  const Options options_;
  mutable absl::Mutex mu_;
  std::vector<RuleSlot> rules_ ABSL_GUARDED_BY(mu_);
  std::deque<AlertEventPtr> log_ ABSL_GUARDED_BY(mu_);  // oldest first
  uint64_t next_sequence_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t exported_pairs_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t series_dropped_total_ ABSL_GUARDED_BY(mu_) = 0;
  bool overflow_logged_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::shared_ptr<AlertWatch::Notifier>> watches_
      ABSL_GUARDED_BY(mu_);
  uint64_t reload_failures_total_ ABSL_GUARDED_BY(mu_) = 0;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace rvd

#endif  // RVD_SERVER_ALERTS_H_

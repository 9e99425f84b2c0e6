// Live models: a trainer on rvd's GPU registers its V tensors once as CUDA
// IPC handles and notifies rvd after each weight update; rvd measures
// snapshots of the weights in place (proto/rvd/v1/rvd.proto, "Live
// weights"; docs/ARCHITECTURE.md, "Live models").
//
//   Register: the whole request is checked before anything is kept (model
//     id and header as ValidateHeader, device UUID, producer alive, handle
//     kinds, strides, each tensor inside its segment, shape against the
//     layout's geometry); segments are mapped once per (producer, handle)
//     and shared, counted, by every model of that producer; rvd's own
//     interprocess event and the snapshot buffers (charged to the engine's
//     device memory cap) are made. Inference mode measures at once.
//   Notify: the model's Trigger decides; a snapshot is enqueued on the
//     device (after the producer's event, before rvd's event) and the call
//     answers without waiting for the device. A compute-pool job finishes
//     it, decides an adaptive check, computes PR per layer and head from
//     the snapshot and records it at the notified step.
//   Release: on Unregister, the producer's exit (watched through a pidfd,
//     else kill(pid, 0)), the lease running out (renewed by Register and
//     Notify) and Stop. The model's history stays.
//
// Buffers: a model holds at most kMaxSnapshotBuffers copies of its V set:
// the last measured snapshot (the adaptive reference), those being
// measured, and the one being taken; a snapshot is only ever written into a
// buffer nothing reads. A notification that finds every buffer in use waits
// for one (LiveOptions::busy_wait, the lock released), then answers
// snapshot=false, reason "busy" (counted): the policy's one exception, when
// rvd's measurements fall that far behind the trainer. An adaptive check is
// decided before the model's next notification is (that notification waits
// for the earlier check's copy if it is still running: the reference must
// be exact), so the history follows the policy step for step.
//
// Thread-safe. Locks: mu_ (models, producers, counters), then a model's
// own; segments_mu_ alone (opening and closing mappings). No lock is held
// across an engine computation; a model's lock is held across a
// snapshot's finish (the copy's wait).
#ifndef RVD_SERVER_LIVE_REGISTRY_H_
#define RVD_SERVER_LIVE_REGISTRY_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "kernels/engine.h"
#include "kernels/live_device.h"
#include "prometheus/client_metric.h"
#include "prometheus/histogram.h"
#include "rvd/v1/rvd.pb.h"
#include "server/compute_pool.h"
#include "server/measurement_log.h"

namespace rvd {

// Copies of its V set a live model holds at most (see the file comment).
inline constexpr int kMaxSnapshotBuffers = 3;
// Distinct producer event handles a model keeps open; an older one is
// closed when a new one arrives.
inline constexpr size_t kMaxProducerEvents = 8;

struct LiveOptions {
  uint32_t max_live_models = 64;                  // registered at once
  absl::Duration default_lease = absl::Seconds(600);  // live_lease_seconds
  uint64_t max_request_bytes = 4ull << 30;       // the header rule's limit
  std::string default_variant;                   // "" : the engine's
  // How long a notification waits for a snapshot buffer when every one is
  // being read (measurements behind the trainer) before it answers "busy".
  absl::Duration busy_wait = absl::Seconds(1);
  // How often the watcher looks at leases and at producers without a pidfd.
  absl::Duration watch_period = absl::Milliseconds(200);
};

// Stores one measurement of a live model (History::Add, /metrics, the log
// line) and returns the stored entry.
using LiveRecorder =
    std::function<absl::StatusOr<MeasurementLog::Entry>(rvd::v1::Measurement)>;

// Cumulative counters and the state now, for /metrics (live_metrics.h).
struct LiveStats {
  int64_t models = 0;           // registered now
  int64_t segments_mapped = 0;  // distinct mappings held now
  // Notifications by outcome: the reasons ("skipped", "inference",
  // "forced", "first", "interval", "adaptive_check"), "busy", "error".
  std::map<std::string, int64_t> notifications;
  int64_t snapshots = 0;  // snapshots taken (registration's included)
  // From rvd's receipt of a notification (or registration), as seen by rvd:
  // to its snapshot's copy finished (rvd_live_snapshot_seconds), and to its
  // measurement computed (rvd_live_measurement_seconds: the measurement's
  // timestamp minus its notified).
  prometheus::ClientMetric snapshot_seconds;
  prometheus::ClientMetric measurement_seconds;
  // Releases by reason: "unregister", "replaced", "producer_exit",
  // "lease", "shutdown".
  std::map<std::string, int64_t> releases;
  int64_t measured = 0;  // measurements recorded
};

class LiveRegistry {
 public:
  // `engine` (and its Live(), possibly null: every registration then fails
  // FAILED_PRECONDITION) and `pool` must outlive the registry.
  LiveRegistry(Engine& engine, ComputePool& pool, const LiveOptions& options,
               LiveRecorder record);
  ~LiveRegistry();  // Stop()

  LiveRegistry(const LiveRegistry&) = delete;
  LiveRegistry& operator=(const LiveRegistry&) = delete;

  // RegisterLiveModel. `deadline` bounds an inference measurement's wait
  // for a compute worker. Errors as the proto says; on any error nothing of
  // the request is kept (and a model it would have replaced is untouched).
  absl::StatusOr<rvd::v1::RegisterLiveModelResponse> Register(
      const rvd::v1::RegisterLiveModelRequest& request,
      absl::Time deadline = absl::InfiniteFuture());
  // UnregisterLiveModel: NOT_FOUND if the model is not registered.
  absl::Status Unregister(const std::string& model_id);
  // NotifyStep: NOT_FOUND (not registered or released: the message says
  // why), INVALID_ARGUMENT (a step not above the last, a bad event handle).
  absl::StatusOr<rvd::v1::NotifyStepResponse> Notify(const rvd::v1::NotifyStepRequest& request);

  // Releases every model (reason "shutdown"), stops the watcher and the
  // dispatcher (a snapshot not yet measured is finished and dropped; a
  // computation in progress is cancelled). Idempotent.
  void Stop();

  // Waits until every snapshot taken so far has been measured or dropped
  // (tests, and a caller that wants its measurements stored).
  void Drain();

  LiveStats Stats() const;

  class Model;     // one registered model (live_registry.cc)
  struct Taken;    // one snapshot taken
  struct Producer;  // a producer's pid and its watch

 private:
  friend class Model;
  struct Mapping {
    LiveDevice::MappedSegment mapped;
    int refs = 0;  // models holding it
  };

  void ReleaseLocked(std::vector<std::shared_ptr<Model>>* out, const std::string& model_id,
                     const char* reason) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Notify without the counting: the model and, when one was taken, the
  // snapshot to measure.
  absl::StatusOr<rvd::v1::NotifyStepResponse> NotifyModel(
      const rvd::v1::NotifyStepRequest& request, std::shared_ptr<Model>* model,
      std::shared_ptr<Taken>* taken) ABSL_LOCKS_EXCLUDED(mu_);
  void Enqueue(std::shared_ptr<Model> model, std::shared_ptr<Taken> taken);
  // Finishes and decides `taken`, then computes its measurement (on a
  // compute worker); nullopt when it is not measured (a check under the
  // threshold, a failed copy).
  absl::StatusOr<std::optional<rvd::v1::Measurement>> Measure(Model& model, Taken& taken);
  // Measures one snapshot and records it.
  void RunJob(Model& model, Taken& taken);
  // Drops one the dispatcher will not measure (finished, nothing recorded).
  void Abandon(Model& model, Taken& taken);
  // Lets go of a model's mappings; the last holder closes one (unless
  // `close` is false: a cancelled copy may still read it, and the engine
  // closes what is left at its end).
  void DropMappings(const std::vector<std::string>& keys, bool close);
  void Dispatch();  // the dispatcher thread
  void Watch();     // the watcher thread
  void Wake();      // interrupts the watcher's poll
  void CountNotification(const std::string& outcome);
  void CountSnapshot(double seconds);
  void CountMeasured(const rvd::v1::Measurement& m);

  Engine& engine_;
  LiveDevice* const live_;  // null: no device
  ComputePool& pool_;
  const LiveOptions options_;
  const LiveRecorder record_;
  std::atomic<bool> stopping_{false};  // also the computations' cancel flag

  mutable absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<Model>> models_ ABSL_GUARDED_BY(mu_);
  std::map<int32_t, std::shared_ptr<Producer>> producers_ ABSL_GUARDED_BY(mu_);
  // Why recently released models went (for NotifyStep's NOT_FOUND).
  std::map<std::string, std::string> released_ ABSL_GUARDED_BY(mu_);

  // A leaf lock: counted from under any other.
  mutable absl::Mutex stats_mu_;
  LiveStats stats_ ABSL_GUARDED_BY(stats_mu_);
  prometheus::Histogram snapshot_seconds_;     // thread-safe itself
  prometheus::Histogram measurement_seconds_;  // thread-safe itself

  // Mappings by (producer, kind, handle bytes), opened and closed under
  // segments_mu_ so that one handle is never mapped twice at once.
  mutable absl::Mutex segments_mu_;
  std::map<std::string, Mapping> segments_ ABSL_GUARDED_BY(segments_mu_);

  // The dispatcher's queue of snapshots to finish and measure.
  absl::Mutex queue_mu_;
  std::deque<std::pair<std::shared_ptr<Model>, std::shared_ptr<Taken>>> queue_
      ABSL_GUARDED_BY(queue_mu_);
  int64_t queued_or_running_ ABSL_GUARDED_BY(queue_mu_) = 0;
  bool queue_stopping_ ABSL_GUARDED_BY(queue_mu_) = false;

  int wake_pipe_[2] = {-1, -1};
  std::thread dispatcher_;
  std::thread watcher_;
  absl::Mutex stop_mu_;
  bool stopped_ ABSL_GUARDED_BY(stop_mu_) = false;
};

}  // namespace rvd

#endif  // RVD_SERVER_LIVE_REGISTRY_H_

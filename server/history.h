// History ties the measurement log, the index and the event bus together:
// it is what the service stores measurements into and watches through.
//
//   Add:   index.Reserve -> log.Append (assigns the sequence number; may be
//          slow) -> index.Insert -> bus.Publish, under append_mu_ only, so
//          that the index and every watcher receive entries in sequence
//          order while readers (GetLatest, GetHistory, ListModels, a
//          scrape) take nothing but the index's short lock.
//   Subscribe: a cursor over the log (entries after a resume point that are
//          still retained) followed by a bus subscription (live entries),
//          joined without a gap or a duplicate.
//
// Thread-safe: any thread may call any member.
#ifndef RVD_SERVER_HISTORY_H_
#define RVD_SERVER_HISTORY_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "server/event_bus.h"
#include "server/measurement_index.h"
#include "server/measurement_log.h"

namespace rvd {

// One watch stream's source of events: first the retained log entries after
// its resume cursor, then what the bus delivers live. Not thread-safe: one
// consumer (a watch stream) calls Next; the notify callback given to
// History::Subscribe may run on other threads meanwhile.
class Watch {
 public:
  // Log entries read per page while replaying.
  static constexpr size_t kReplayPage = 64;

  ~Watch();  // unsubscribes; notify is not running once it returns

  Watch(const Watch&) = delete;
  Watch& operator=(const Watch&) = delete;

  // The next event, or nullopt when none is available now (the notify
  // callback runs when a live one arrives). Errors come from the log.
  absl::StatusOr<std::optional<BusEvent>> Next();
  // True once the bus is closed (shutdown): the stream should end.
  bool closed() const { return sub_->closed(); }
  // The newest sequence number this watch has passed (delivered, skipped as
  // another model's, or reported in a gap); a client resumes after it.
  uint64_t cursor() const { return cursor_; }
  // Stops notify callbacks now (also done by the destructor): after it
  // returns, the callback is not running and never runs again.
  void Detach();

 private:
  friend class History;
  Watch(const MeasurementLog& log, EventBus& bus,
        std::shared_ptr<BusSubscription> sub, uint64_t after,
        uint64_t through);

  const MeasurementLog& log_;
  EventBus& bus_;
  const std::shared_ptr<BusSubscription> sub_;
  uint64_t cursor_;                 // see cursor()
  const uint64_t replay_through_;  // the log's last sequence at Subscribe
  std::vector<MeasurementLog::Entry> page_;  // replay entries read ahead
  size_t page_next_ = 0;                     // next of page_ to consider
};

class History {
 public:
  struct Options {
    size_t capacity_per_model = 1000;  // ring size per model (at least 1)
    size_t max_models = 10000;         // distinct model ids (at least 1)
    size_t max_watchers = 64;          // concurrent watches
    size_t watch_queue = 1024;         // measurements queued per watcher
    // Called with each added entry after the bus has it, under the append
    // lock, so in sequence order (the alert engine); it must be quick and
    // must not call back into History.
    std::function<void(const MeasurementLog::Entry&)> on_append;
  };
  History(std::unique_ptr<MeasurementLog> log, const Options& options);
  ~History();  // closes every watch

  History(const History&) = delete;
  History& operator=(const History&) = delete;

  // Logs `m` (the log sets its sequence number), indexes it and publishes
  // it; returns the stored entry. INVALID_ARGUMENT for an empty model_id,
  // RESOURCE_EXHAUSTED when the model is new and max_models are kept, or
  // the log's error; on error nothing is stored or published.
  absl::StatusOr<MeasurementLog::Entry> Add(rvd::v1::Measurement m);

  // At start, with a durable log: puts `entries` (sequence order, already
  // in the log) into the index, publishing nothing. A model beyond
  // max_models is left out; returns how many entries were left out.
  size_t Restore(const std::vector<MeasurementLog::Entry>& entries);

  // Removes a model's measurements from the log and the index
  // (DeleteModelHistory); returns how many the log held. NOT_FOUND when
  // neither knew the model. Watchers are not told; a resumed watch reports
  // the removed numbers as not retained.
  absl::StatusOr<uint64_t> DeleteModel(const std::string& model_id);

  // A watch of `model_id` ("": every model). Without `after_sequence` it
  // sees only measurements added after this call; with it, first the
  // retained measurements whose sequence is above it (oldest first, a
  // kNotRetained gap for those the log no longer has), then live ones.
  // `notify` is called, possibly on another thread, when a live event is
  // ready or the watch is closed; it must not block or destroy the Watch.
  // OUT_OF_RANGE when after_sequence is above the newest sequence number
  // (a cursor from another run of rvd, whose in-memory log restarted);
  // RESOURCE_EXHAUSTED beyond max_watchers; UNAVAILABLE after CloseWatches.
  absl::StatusOr<std::unique_ptr<Watch>> Subscribe(
      const std::string& model_id, std::optional<uint64_t> after_sequence,
      std::function<void()> notify);
  // On shutdown: closes every watch (their notify callbacks run) and
  // refuses new ones.
  void CloseWatches();

  const MeasurementIndex& index() const { return index_; }
  const EventBus& bus() const { return bus_; }
  const MeasurementLog& log() const { return *log_; }

 private:
  // Serializes Add (the log's order is the index's and the bus's) and
  // makes Watch's log position and bus subscription one atomic step.
  // Readers of the index never take it.
  absl::Mutex append_mu_;
  const std::unique_ptr<MeasurementLog> log_;
  MeasurementIndex index_;
  EventBus bus_;
  const std::function<void(const MeasurementLog::Entry&)> on_append_;
};

}  // namespace rvd

#endif  // RVD_SERVER_HISTORY_H_

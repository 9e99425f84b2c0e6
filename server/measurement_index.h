// The in-memory index of logged measurements: a bounded ring per model,
// answering GetLatest, GetHistory, ListModels and the metrics collector.
//
// Thread-safe: any thread may call any member. The index's lock is held
// only to move pointers (entries are shared with the log, never copied
// under the lock), so a reader never waits for a slow append or a large
// copy. History calls Reserve before it appends to the log and Insert after,
// in sequence order.
#ifndef RVD_SERVER_MEASUREMENT_INDEX_H_
#define RVD_SERVER_MEASUREMENT_INDEX_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "server/measurement_log.h"

namespace rvd {

// A fixed-capacity ring of entries, oldest first. Not thread-safe on its
// own; MeasurementIndex guards it.
class MeasurementRing {
 public:
  using Entry = MeasurementLog::Entry;

  // A capacity of 0 is taken as 1. Slots are allocated as they fill.
  explicit MeasurementRing(size_t capacity);
  // Appends `e`; when full, drops the oldest and returns it (else null).
  Entry Push(Entry e);
  size_t size() const { return size_; }
  size_t capacity() const { return capacity_; }
  // The newest `limit` (0: all), oldest first.
  std::vector<Entry> Newest(size_t limit) const;
  // The newest, or null when empty.
  Entry Latest() const;
  // Entries ever pushed (size() stops at capacity()).
  uint64_t total_pushed() const { return total_pushed_; }

 private:
  size_t capacity_;           // most entries kept
  std::vector<Entry> slots_;  // grows to capacity_, then reused
  size_t next_ = 0;           // slot the next Push writes
  size_t size_ = 0;           // filled slots
  uint64_t total_pushed_ = 0;  // Push calls so far
};

class MeasurementIndex {
 public:
  using Entry = MeasurementLog::Entry;

  // `capacity_per_model` and `max_models` below 1 are taken as 1.
  MeasurementIndex(size_t capacity_per_model, size_t max_models);

  MeasurementIndex(const MeasurementIndex&) = delete;
  MeasurementIndex& operator=(const MeasurementIndex&) = delete;

  // Makes sure `model_id` has a ring: OK when it has one or a new one fits.
  // INVALID_ARGUMENT for an empty id; RESOURCE_EXHAUSTED when the model is
  // new and max_models are kept. A reserved model whose first append then
  // fails keeps its (empty) ring; empty rings are invisible to readers.
  absl::Status Reserve(const std::string& model_id);
  // Adds a logged entry to its model's ring; FAILED_PRECONDITION when the
  // model was not reserved.
  absl::Status Insert(Entry e);
  // Forgets `model_id` and its ring (DeleteModelHistory); false when it had
  // none.
  bool Remove(const std::string& model_id);

  // The newest entry of a model; null when there is none.
  Entry Latest(const std::string& model_id) const;
  // The newest `limit` entries (0: all kept), oldest first; NOT_FOUND for a
  // model without entries.
  absl::StatusOr<std::vector<Entry>> Get(const std::string& model_id,
                                         size_t limit) const;

  struct ModelState {
    std::string model_id;
    uint64_t kept = 0;  // entries in the ring now
    Entry latest;       // never null
  };
  // Every model with entries, sorted by id.
  std::vector<ModelState> Models() const;

  size_t capacity_per_model() const { return capacity_per_model_; }
  size_t max_models() const { return max_models_; }

 private:
  const size_t capacity_per_model_;  // ring capacity of each model
  const size_t max_models_;          // most distinct model ids kept
  mutable absl::Mutex mu_;
  std::map<std::string, MeasurementRing> rings_ ABSL_GUARDED_BY(mu_);
};

}  // namespace rvd

#endif  // RVD_SERVER_MEASUREMENT_INDEX_H_

// The append-only log of measurements: the one place where a measurement
// gets its sequence number. History appends to it before it indexes and
// publishes a measurement, so a sequence number exists for every measurement
// a client can see, and the order of the log is the order of every watch
// stream.
//
// MeasurementLog is the seam for durability: NewMemLog keeps the newest
// entries in memory (sequence numbers restart at 1 with the process); a
// crash-safe on-disk log implements the same interface (LevelDB's Env and
// NewMemEnv are the model). Nothing outside History calls Append.
//
// Invariants every implementation keeps:
//   - sequence numbers start at 1 and are dense: Append assigns
//     LastSequence() + 1, and a failed Append assigns nothing;
//   - entries are immutable once appended and shared (by pointer) with the
//     index and the bus, so that no reader copies under a lock;
//   - the in-memory log drops entries from the oldest end, and DeleteModel
//     removes one model's; the durable log (sqlite_store.h) also removes
//     rows by per-model retention. Read returns the retained entries in
//     sequence order; a number it skips is no longer retained (a watch
//     reports it as such, never silently).
#ifndef RVD_SERVER_MEASUREMENT_LOG_H_
#define RVD_SERVER_MEASUREMENT_LOG_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "rvd/v1/rvd.pb.h"

namespace rvd {

class MeasurementLog {
 public:
  // A logged measurement; its sequence field is set.
  using Entry = std::shared_ptr<const rvd::v1::Measurement>;

  virtual ~MeasurementLog() = default;

  // Sets m.sequence to LastSequence() + 1 and stores m. On error nothing is
  // stored and no sequence number is used. Append may be slow (an on-disk
  // log syncs here); its callers hold no lock that readers need. Calls are
  // serialized by the caller (History's append lock), so that the index and
  // the bus receive entries in sequence order. Thread-safe with respect to
  // the readers below.
  virtual absl::StatusOr<Entry> Append(rvd::v1::Measurement m) = 0;

  // The newest sequence number assigned; 0 before the first Append.
  // Thread-safe.
  virtual uint64_t LastSequence() const = 0;

  // The retained entries with after < sequence <= through, oldest first, at
  // most `max` of them. Entries below the first one returned (all of them,
  // when none is) are no longer retained. Thread-safe.
  virtual absl::StatusOr<std::vector<Entry>> Read(uint64_t after,
                                                  uint64_t through,
                                                  size_t max) const = 0;

  // Removes every retained entry of `model_id` (DeleteModelHistory); returns
  // how many. Sequence numbers are never reused. Calls are serialized with
  // Append by the caller.
  virtual absl::StatusOr<uint64_t> DeleteModel(const std::string& model_id) = 0;
};

// An in-memory log that retains the newest `retained` entries (at least 1).
std::unique_ptr<MeasurementLog> NewMemLog(size_t retained);

}  // namespace rvd

#endif  // RVD_SERVER_MEASUREMENT_LOG_H_

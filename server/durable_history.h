// The daemon's choice of measurement log: the durable SQLite store under
// data_dir, or the in-memory log without one; and, at start, the index and
// the metrics rebuilt from the store.
#ifndef RVD_SERVER_DURABLE_HISTORY_H_
#define RVD_SERVER_DURABLE_HISTORY_H_

#include <cstddef>
#include <memory>

#include "absl/status/statusor.h"
#include "server/config.h"
#include "server/history.h"
#include "server/measurement_log.h"
#include "server/metrics.h"
#include "server/sqlite_store.h"

namespace rvd {

struct MeasurementLogChoice {
  std::unique_ptr<MeasurementLog> log;
  SqliteStore* store = nullptr;  // the log, when it is the durable store
};

// With config.data_dir: opens the store and logs what it found (a damaged
// file: what was recovered and lost, as a warning). Errors are the store's
// (missing or unwritable data_dir, a newer schema). Without: the in-memory
// log keeping `memory_retained` entries.
absl::StatusOr<MeasurementLogChoice> OpenMeasurementLog(
    const Config& config, size_t memory_retained);

// Puts the newest `per_model` measurements of every model from `store` into
// `history`'s index and admits each model's newest into the metrics' series
// budget, so that GetLatest, GetHistory, ListModels and /metrics answer as
// before the restart. Logs what it loaded.
absl::Status RestoreHistory(const SqliteStore& store, size_t per_model,
                            History& history, Metrics& metrics);

}  // namespace rvd

#endif  // RVD_SERVER_DURABLE_HISTORY_H_

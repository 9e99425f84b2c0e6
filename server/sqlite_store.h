// The durable measurement log: a MeasurementLog kept in one SQLite database
// (WAL mode) under data_dir, rvd.db. SQLite gives atomic commits, torn-write
// and crash recovery (the WAL's checksummed frames); this file adds only
// rvd's schema, its retention, and what to do when the file is damaged.
//
// Durability: Append returns once its transaction has committed, so an
// acknowledged measurement survives the death of rvd (kill -9) in every sync
// policy. The policy says what survives the death of the machine:
//   kEveryRecord  synchronous=FULL: the WAL is fsynced by every commit,
//                 before Append returns (the default);
//   kInterval     synchronous=NORMAL: commits are written to the WAL, and a
//                 thread fsyncs it every `sync_interval` when something was
//                 written (group commit of the fsync: a power loss loses at
//                 most the last interval's measurements);
//   kOff          synchronous=OFF: the OS writes the pages when it likes.
//
// Sequence numbers continue across restarts: SQLite's AUTOINCREMENT
// bookkeeping (sqlite_sequence) keeps the largest ever used, even after the
// newest rows are deleted. Unlike the in-memory log, the retained entries are
// not one contiguous range: retention (per model, by count and age) and
// DeleteModel remove rows from the middle, and Read skips those numbers
// (a watch reports them as not retained).
//
// Schema version: PRAGMA user_version (kSchemaVersion); a file written by a
// newer rvd is refused at Open, never modified. A file SQLite finds damaged
// at Open (quick_check, or unreadable) is moved aside, what can still be
// read from it is copied into a new file, and the loss is reported
// (OpenReport, logged by the server and exported as metrics).
//
// Threads: Append, DeleteModel and the retention run on one writer
// connection under write_mu_; Read, Query and LoadRecent on a reader
// connection under read_mu_ (WAL: readers never wait for the writer). The
// newest entries are also kept in memory (window_), so that a watch resuming
// near the head reads no disk. No lock of the index or the bus is taken here.
#ifndef RVD_SERVER_SQLITE_STORE_H_
#define RVD_SERVER_SQLITE_STORE_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "server/measurement_log.h"

struct sqlite3;

namespace rvd {

struct StoreOptions {
  enum class Sync { kEveryRecord, kInterval, kOff };
  Sync sync = Sync::kEveryRecord;
  absl::Duration sync_interval = absl::Milliseconds(100);  // kInterval only
  // Per model: the newest `retention_count` measurements are kept (0: no
  // bound), and none older than `retention_age` (zero: no bound). Applied on
  // append (count: at once; age: at most every `age_check_every`) and at Open.
  uint64_t retention_count = 100000;
  absl::Duration retention_age = absl::ZeroDuration();
  absl::Duration age_check_every = absl::Minutes(1);
  // Newest entries kept in memory for Read (watch replay).
  size_t memory_window = 4096;
  // Tests: SQLite's max_page_count (0: SQLite's default), to make a full
  // disk without one.
  uint64_t max_page_count = 0;
};

// Parses a sync policy as the config writes it: "record", "off", or "<N>ms"
// (1 <= N <= 60000).
absl::StatusOr<StoreOptions> ParseStoreSync(const std::string& text);

// What Open found.
struct StoreOpenReport {
  std::string path;             // the database file
  uint64_t rows = 0;            // measurements on disk after Open
  uint64_t last_sequence = 0;   // where numbering continues from
  uint64_t expired = 0;         // removed by retention at Open
  bool damaged = false;         // the file was damaged and replaced
  std::string damage;           // what SQLite reported
  std::string moved_to;         // where the damaged file was moved
  uint64_t recovered = 0;       // rows copied from the damaged file
  uint64_t lost = 0;            // rows that could not be read from it
  bool lost_is_upper_bound = false;  // the damaged file could not be
                                     // counted: `lost` counts sequence
                                     // numbers of the unreadable range
};

// A selection of one model's measurements (GetHistory's range fields).
struct StoreQuery {
  std::optional<int64_t> from_step;   // step >= from_step
  std::optional<int64_t> to_step;     // step <= to_step
  std::optional<absl::Time> since;    // timestamp >= since
  std::optional<absl::Time> until;    // timestamp < until
  // Set: the oldest `limit` with sequence > after_sequence (paging forward).
  // Unset: the newest `limit`. Either way returned oldest first.
  std::optional<uint64_t> after_sequence;
  size_t limit = 0;  // 0: no limit
};

struct StoreStats {
  uint64_t rows = 0;                // measurements on disk now
  uint64_t append_errors = 0;       // Appends that failed
  uint64_t disk_full_errors = 0;    // of which SQLITE_FULL
  uint64_t expired_total = 0;       // removed by retention
  uint64_t deleted_total = 0;       // removed by DeleteModel
  uint64_t syncs_total = 0;         // kInterval fsyncs
};

class SqliteStore final : public MeasurementLog {
 public:
  static constexpr int kSchemaVersion = 1;
  // PRAGMA application_id of rvd's files: "RVD1".
  static constexpr int32_t kApplicationId = 0x52564431;
  static constexpr char kFileName[] = "rvd.db";

  // Opens (or creates) `dir`/rvd.db. FAILED_PRECONDITION when `dir` does not
  // exist or is not a directory, or when the file has a newer schema or is
  // not rvd's; PERMISSION_DENIED when it is not writable.
  static absl::StatusOr<std::unique_ptr<SqliteStore>> Open(
      const std::string& dir, const StoreOptions& options);
  ~SqliteStore() override;

  SqliteStore(const SqliteStore&) = delete;
  SqliteStore& operator=(const SqliteStore&) = delete;

  // MeasurementLog. Append's errors: RESOURCE_EXHAUSTED when the disk (or
  // max_page_count) is full, UNAVAILABLE for other I/O errors; the
  // transaction is rolled back and no sequence number is used.
  absl::StatusOr<Entry> Append(rvd::v1::Measurement m) override;
  uint64_t LastSequence() const override;
  absl::StatusOr<std::vector<Entry>> Read(uint64_t after, uint64_t through,
                                          size_t max) const override;
  absl::StatusOr<uint64_t> DeleteModel(const std::string& model_id) override;

  // The newest `per_model` (0: all) measurements of every model, in
  // sequence order: what the index's rings are rebuilt from at start.
  absl::StatusOr<std::vector<Entry>> LoadRecent(size_t per_model) const;
  // One model's measurements selected by `q`, oldest first; `*more` (if
  // given) is set when more match than `limit` let through.
  absl::StatusOr<std::vector<Entry>> Query(const std::string& model_id,
                                           const StoreQuery& q,
                                           bool* more = nullptr) const;

  const StoreOpenReport& open_report() const { return report_; }
  StoreStats Stats() const;
  const std::string& path() const { return path_; }

 private:
  SqliteStore(std::string path, const StoreOptions& options);
  absl::Status Init();  // opens the connections, schema, counts
  // Inside the writer's open transaction, so that a rollback undoes them
  // (counts_ is updated by the caller once the commit succeeded): removes
  // the oldest rows of `model_id`, which has `count`, past the count bound;
  // and rows older than the age bound (at most kAgeTrimBatch), adding what
  // each model lost to `removed`.
  absl::Status TrimCount(const std::string& model_id, uint64_t count,
                         uint64_t* removed)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_);
  absl::Status TrimAge(absl::Time now, std::map<std::string, uint64_t>* removed)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_);
  void SyncLoop();  // kInterval

  const std::string path_;
  const StoreOptions options_;
  StoreOpenReport report_;

  mutable absl::Mutex write_mu_;
  sqlite3* db_ ABSL_GUARDED_BY(write_mu_) = nullptr;  // the writer
  std::map<std::string, uint64_t> counts_ ABSL_GUARDED_BY(write_mu_);
  uint64_t rows_ ABSL_GUARDED_BY(write_mu_) = 0;  // sum of counts_
  absl::Time next_age_check_ ABSL_GUARDED_BY(write_mu_);

  mutable absl::Mutex read_mu_;
  sqlite3* rdb_ ABSL_GUARDED_BY(read_mu_) = nullptr;  // the reader

  std::atomic<uint64_t> last_{0};  // newest sequence number assigned

  // The newest entries (those of deleted models removed), sorted by
  // sequence; every retained entry with sequence >= window_from_ is in it.
  mutable absl::Mutex window_mu_;
  std::deque<Entry> window_ ABSL_GUARDED_BY(window_mu_);
  uint64_t window_from_ ABSL_GUARDED_BY(window_mu_) = 1;

  mutable absl::Mutex stats_mu_;
  StoreStats stats_ ABSL_GUARDED_BY(stats_mu_);

  std::atomic<bool> dirty_{false};  // kInterval: written since the last sync
  absl::Notification stop_;
  std::thread syncer_;
};

}  // namespace rvd

#endif  // RVD_SERVER_SQLITE_STORE_H_

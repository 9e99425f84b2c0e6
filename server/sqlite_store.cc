#include "server/sqlite_store.h"

#include <fcntl.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/match.h"
#include "absl/strings/strip.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace rvd {
namespace {

// Rows deleted by one age-retention statement; the rest wait for the next.
constexpr int64_t kAgeTrimBatch = 10000;
// Point reads tried past an unreadable part of a damaged file.
constexpr uint64_t kMaxSalvageProbes = 1u << 21;

class Stmt {
 public:
  Stmt() = default;
  ~Stmt() { sqlite3_finalize(s_); }
  Stmt(const Stmt&) = delete;
  Stmt& operator=(const Stmt&) = delete;
  sqlite3_stmt** out() { return &s_; }
  sqlite3_stmt* get() const { return s_; }

 private:
  sqlite3_stmt* s_ = nullptr;
};

// SQLite's result code as a status. SQLITE_FULL (a full disk, or
// max_page_count) is RESOURCE_EXHAUSTED, a damaged file DATA_LOSS, anything
// else UNAVAILABLE: the store may work again (space freed, I/O recovered).
absl::Status SqlError(sqlite3* db, int rc, absl::string_view what) {
  std::string msg = absl::StrCat("store: ", what, ": ", sqlite3_errstr(rc));
  if (db != nullptr) {
    const char* detail = sqlite3_errmsg(db);
    if (detail != nullptr && std::strcmp(detail, sqlite3_errstr(rc)) != 0) {
      absl::StrAppend(&msg, " (", detail, ")");
    }
  }
  switch (rc & 0xff) {
    case SQLITE_FULL:
      return absl::ResourceExhaustedError(absl::StrCat(
          msg, "; the disk holding data_dir is full, the measurement was not "
               "stored"));
    case SQLITE_CORRUPT:
    case SQLITE_NOTADB:
      return absl::DataLossError(msg);
    default:
      return absl::UnavailableError(msg);
  }
}

absl::Status Exec(sqlite3* db, const char* sql) {
  char* err = nullptr;
  const int rc = sqlite3_exec(db, sql, nullptr, nullptr, &err);
  sqlite3_free(err);
  if (rc != SQLITE_OK) return SqlError(db, rc, sql);
  return absl::OkStatus();
}

absl::Status Prepare(sqlite3* db, const std::string& sql, Stmt* stmt) {
  const int rc =
      sqlite3_prepare_v2(db, sql.c_str(), static_cast<int>(sql.size()),
                         stmt->out(), nullptr);
  if (rc != SQLITE_OK) return SqlError(db, rc, sql);
  return absl::OkStatus();
}

// The single integer a query returns; nullopt without a row.
absl::StatusOr<std::optional<int64_t>> QueryInt(sqlite3* db, const char* sql) {
  Stmt stmt;
  if (absl::Status s = Prepare(db, sql, &stmt); !s.ok()) return s;
  const int rc = sqlite3_step(stmt.get());
  if (rc == SQLITE_ROW) {
    return std::optional<int64_t>(sqlite3_column_int64(stmt.get(), 0));
  }
  if (rc == SQLITE_DONE) return std::optional<int64_t>();
  return SqlError(db, rc, sql);
}

absl::StatusOr<sqlite3*> OpenDb(const std::string& path, int flags) {
  sqlite3* db = nullptr;
  const int rc = sqlite3_open_v2(path.c_str(), &db,
                                 flags | SQLITE_OPEN_NOMUTEX, nullptr);
  if (rc != SQLITE_OK) {
    absl::Status s = SqlError(db, rc, absl::StrCat("cannot open ", path));
    sqlite3_close_v2(db);
    return s;
  }
  sqlite3_extended_result_codes(db, 1);
  sqlite3_busy_timeout(db, 5000);
  return db;
}

int64_t TimeNs(const rvd::v1::Measurement& m) {
  return m.timestamp().seconds() * 1000000000 + m.timestamp().nanos();
}

absl::StatusOr<MeasurementLog::Entry> Decode(const void* data, int size) {
  auto m = std::make_shared<rvd::v1::Measurement>();
  if (!m->ParseFromArray(data, size)) {
    return absl::DataLossError("store: a stored measurement does not parse");
  }
  return MeasurementLog::Entry(std::move(m));
}

// What can still be read from a damaged file.
struct Salvage {
  std::vector<std::pair<int64_t, std::string>> rows;  // seq, body; ascending
  uint64_t max_sequence = 0;
  std::optional<uint64_t> claimed;  // count(*), when it could be read
};

Salvage SalvageRows(const std::string& path) {
  Salvage out;
  // Read-write (nothing is written): a read-only connection cannot open a
  // WAL-mode file whose -shm does not exist.
  absl::StatusOr<sqlite3*> opened = OpenDb(path, SQLITE_OPEN_READWRITE);
  if (!opened.ok()) return out;
  sqlite3* db = *opened;
  // SQLite refuses a file shorter than its header says unless the schema is
  // "writable" (what its own recovery tools do); this connection writes
  // nothing.
  Exec(db, "PRAGMA writable_schema=ON").IgnoreError();
  if (auto v = QueryInt(
          db, "SELECT seq FROM sqlite_sequence WHERE name='measurements'");
      v.ok() && v->has_value()) {
    out.max_sequence = static_cast<uint64_t>(**v);
  }
  if (auto v = QueryInt(db, "SELECT max(seq) FROM measurements");
      v.ok() && v->has_value()) {
    out.max_sequence = std::max<uint64_t>(out.max_sequence, **v);
  }
  if (auto v = QueryInt(db, "SELECT count(*) FROM measurements");
      v.ok() && v->has_value()) {
    out.claimed = static_cast<uint64_t>(**v);
  }
  Stmt scan, probe;
  const bool have_scan =
      Prepare(db, "SELECT seq, body FROM measurements WHERE seq > ? ORDER BY seq",
              &scan).ok();
  const bool have_probe =
      Prepare(db, "SELECT seq, body FROM measurements WHERE seq = ?", &probe)
          .ok();
  auto take = [&](sqlite3_stmt* st) {
    const int64_t seq = sqlite3_column_int64(st, 0);
    const void* body = sqlite3_column_blob(st, 1);
    const int size = sqlite3_column_bytes(st, 1);
    rvd::v1::Measurement m;
    if (body != nullptr && m.ParseFromArray(body, size) &&
        m.sequence() == static_cast<uint64_t>(seq)) {
      out.rows.emplace_back(seq, std::string(static_cast<const char*>(body),
                                             static_cast<size_t>(size)));
    }
    return seq;
  };
  int64_t pos = 0;
  uint64_t probes = 0;
  while (have_scan) {
    // Read in order until the end or the first unreadable page.
    sqlite3_reset(scan.get());
    sqlite3_bind_int64(scan.get(), 1, pos);
    int rc;
    while ((rc = sqlite3_step(scan.get())) == SQLITE_ROW) pos = take(scan.get());
    if (rc == SQLITE_DONE || !have_probe) break;
    // Past the damage: look each next number up on its own (another path
    // through the tree may still be readable), then scan on from a hit.
    bool found = false;
    while (!found && static_cast<uint64_t>(pos) < out.max_sequence &&
           probes < kMaxSalvageProbes) {
      ++pos;
      ++probes;
      sqlite3_reset(probe.get());
      sqlite3_bind_int64(probe.get(), 1, pos);
      if (sqlite3_step(probe.get()) == SQLITE_ROW) {
        take(probe.get());
        found = true;
      }
    }
    if (!found) break;
  }
  out.max_sequence = std::max<uint64_t>(
      out.max_sequence, out.rows.empty() ? 0 : out.rows.back().first);
  sqlite3_finalize(scan.get());
  sqlite3_finalize(probe.get());
  *scan.out() = nullptr;
  *probe.out() = nullptr;
  sqlite3_close_v2(db);
  return out;
}

// Why SQLite finds `path` damaged, or "" when it does not. `version` and
// `app_id` are read first (a newer file is refused before anything else).
struct Probe {
  std::string damage;
  int64_t version = 0;
  int64_t app_id = 0;
};

absl::StatusOr<Probe> ProbeFile(const std::string& path) {
  Probe p;
  absl::StatusOr<sqlite3*> opened = OpenDb(path, SQLITE_OPEN_READWRITE);
  if (!opened.ok()) {
    if (opened.status().code() == absl::StatusCode::kDataLoss) {
      p.damage = std::string(opened.status().message());
      return p;
    }
    return opened.status();
  }
  sqlite3* db = *opened;
  auto finish = [&](absl::StatusOr<Probe> r) {
    sqlite3_close_v2(db);
    return r;
  };
  absl::StatusOr<std::optional<int64_t>> v = QueryInt(db, "PRAGMA user_version");
  if (!v.ok()) {
    if (v.status().code() != absl::StatusCode::kDataLoss) {
      return finish(v.status());
    }
    p.damage = std::string(v.status().message());
    return finish(p);
  }
  p.version = v->value_or(0);
  absl::StatusOr<std::optional<int64_t>> a =
      QueryInt(db, "PRAGMA application_id");
  if (a.ok()) p.app_id = a->value_or(0);
  if (p.version > SqliteStore::kSchemaVersion) return finish(p);
  Stmt check;
  if (absl::Status s = Prepare(db, "PRAGMA quick_check(8)", &check); !s.ok()) {
    p.damage = std::string(s.message());
    return finish(p);
  }
  std::string problems;
  int rc;
  while ((rc = sqlite3_step(check.get())) == SQLITE_ROW) {
    const char* line =
        reinterpret_cast<const char*>(sqlite3_column_text(check.get(), 0));
    if (line != nullptr && std::strcmp(line, "ok") != 0) {
      absl::StrAppend(&problems, problems.empty() ? "" : "; ", line);
    }
  }
  if (rc != SQLITE_DONE) {
    absl::StrAppend(&problems, problems.empty() ? "" : "; ",
                    sqlite3_errstr(rc));
  }
  p.damage = problems;
  sqlite3_finalize(check.get());
  *check.out() = nullptr;
  return finish(p);
}

bool Exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

}  // namespace

absl::StatusOr<StoreOptions> ParseStoreSync(const std::string& text) {
  StoreOptions o;
  if (text == "record") {
    o.sync = StoreOptions::Sync::kEveryRecord;
    return o;
  }
  if (text == "off") {
    o.sync = StoreOptions::Sync::kOff;
    return o;
  }
  absl::string_view v(text);
  int ms = 0;
  if (absl::ConsumeSuffix(&v, "ms") && absl::SimpleAtoi(v, &ms) && ms >= 1 &&
      ms <= 60000) {
    o.sync = StoreOptions::Sync::kInterval;
    o.sync_interval = absl::Milliseconds(ms);
    return o;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "\"", text, "\" is not record, off, or <N>ms with 1 <= N <= 60000"));
}

SqliteStore::SqliteStore(std::string path, const StoreOptions& options)
    : path_(std::move(path)), options_(options) {
  report_.path = path_;
}

absl::StatusOr<std::unique_ptr<SqliteStore>> SqliteStore::Open(
    const std::string& dir, const StoreOptions& options) {
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "data_dir ", dir, ": ", std::strerror(errno),
        " (create it, or set data_dir to \"\" to keep history in memory "
        "only)"));
  }
  if (!S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat("data_dir ", dir, " is not a directory"));
  }
  if (::access(dir.c_str(), W_OK | X_OK) != 0) {
    return absl::PermissionDeniedError(absl::StrCat(
        "data_dir ", dir, " is not writable by rvd (uid ", ::getuid(),
        "): ", std::strerror(errno)));
  }
  const std::string path = absl::StrCat(dir, "/", kFileName);
  std::unique_ptr<SqliteStore> store(new SqliteStore(path, options));

  std::optional<Salvage> salvage;
  if (Exists(path)) {
    absl::StatusOr<Probe> probe = ProbeFile(path);
    if (!probe.ok()) return probe.status();
    if (probe->version > kSchemaVersion) {
      return absl::FailedPreconditionError(absl::StrCat(
          "store ", path, " has schema version ", probe->version,
          ", written by a newer rvd; this rvd reads version ", kSchemaVersion,
          " and older. Run the newer rvd, or point data_dir elsewhere (the "
          "file was not changed)"));
    }
    if (probe->damage.empty() && probe->app_id != 0 &&
        probe->app_id != kApplicationId) {
      return absl::FailedPreconditionError(absl::StrCat(
          "store ", path, " is an SQLite file of another program "
          "(application_id ", probe->app_id, "); the file was not changed"));
    }
    if (!probe->damage.empty()) {
      // Keep what can be read, move the file aside (with its WAL: frames
      // left beside a new file would be replayed into it), start anew.
      salvage = SalvageRows(path);
      StoreOpenReport& r = store->report_;
      r.damaged = true;
      r.damage = probe->damage;
      r.recovered = salvage->rows.size();
      if (salvage->claimed.has_value() && *salvage->claimed >= r.recovered) {
        r.lost = *salvage->claimed - r.recovered;
      } else {
        r.lost = salvage->max_sequence - r.recovered;
        r.lost_is_upper_bound = true;
      }
      r.moved_to = absl::StrCat(path, ".damaged-", absl::ToUnixSeconds(absl::Now()));
      for (const char* suffix : {"", "-wal", "-shm"}) {
        const std::string from = path + suffix;
        if (!Exists(from)) continue;
        if (std::rename(from.c_str(), (r.moved_to + suffix).c_str()) != 0) {
          return absl::UnavailableError(absl::StrCat(
              "store ", path, " is damaged (", probe->damage,
              ") and cannot be moved aside: ", std::strerror(errno)));
        }
      }
    }
  }
  if (absl::Status s = store->Init(); !s.ok()) return s;
  if (salvage.has_value()) {
    absl::MutexLock lock(&store->write_mu_);
    sqlite3* db = store->db_;
    if (absl::Status s = Exec(db, "BEGIN IMMEDIATE"); !s.ok()) return s;
    Stmt ins;
    absl::Status s = Prepare(db,
        "INSERT INTO measurements(seq, model_id, step, time_ns, body) "
        "VALUES(?, ?, ?, ?, ?)", &ins);
    for (const auto& [seq, body] : salvage->rows) {
      if (!s.ok()) break;
      rvd::v1::Measurement m;
      m.ParseFromString(body);  // parsed once already in SalvageRows
      sqlite3_reset(ins.get());
      sqlite3_bind_int64(ins.get(), 1, seq);
      sqlite3_bind_text(ins.get(), 2, m.model_id().data(),
                        static_cast<int>(m.model_id().size()), SQLITE_STATIC);
      sqlite3_bind_int64(ins.get(), 3, m.step());
      sqlite3_bind_int64(ins.get(), 4, TimeNs(m));
      sqlite3_bind_blob(ins.get(), 5, body.data(), static_cast<int>(body.size()),
                        SQLITE_STATIC);
      const int rc = sqlite3_step(ins.get());
      if (rc != SQLITE_DONE) s = SqlError(db, rc, "copying recovered rows");
      ++store->counts_[m.model_id()];
    }
    if (s.ok() && salvage->max_sequence > 0) {
      // Numbering continues after the largest number the damaged file knew.
      s = Exec(db, absl::StrCat(
          "DELETE FROM sqlite_sequence WHERE name='measurements';"
          "INSERT INTO sqlite_sequence(name, seq) VALUES('measurements', ",
          salvage->max_sequence, ")").c_str());
    }
    if (s.ok()) s = Exec(db, "COMMIT");
    if (!s.ok()) {
      Exec(db, "ROLLBACK").IgnoreError();
      return s;
    }
    store->last_.store(salvage->max_sequence);
    store->report_.rows = salvage->rows.size();
    store->rows_ = salvage->rows.size();
    absl::MutexLock window(&store->window_mu_);
    store->window_from_ = salvage->max_sequence + 1;
  }
  store->report_.last_sequence = store->last_.load();
  {
    absl::MutexLock lock(&store->stats_mu_);
    store->stats_.rows = store->report_.rows;
  }
  if (options.sync == StoreOptions::Sync::kInterval) {
    store->syncer_ = std::thread([s = store.get()] { s->SyncLoop(); });
  }
  return store;
}

absl::Status SqliteStore::Init() {
  absl::MutexLock lock(&write_mu_);
  absl::StatusOr<sqlite3*> opened =
      OpenDb(path_, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE);
  if (!opened.ok()) {
    return absl::Status(opened.status().code(),
                        absl::StrCat(opened.status().message(),
                                     " (is data_dir writable by uid ",
                                     ::getuid(), "?)"));
  }
  db_ = *opened;
  {
    Stmt wal;
    if (absl::Status s = Prepare(db_, "PRAGMA journal_mode=WAL", &wal); !s.ok()) {
      return s;
    }
    const int rc = sqlite3_step(wal.get());
    const unsigned char* mode =
        rc == SQLITE_ROW ? sqlite3_column_text(wal.get(), 0) : nullptr;
    if (mode == nullptr ||
        std::strcmp(reinterpret_cast<const char*>(mode), "wal") != 0) {
      return rc == SQLITE_ROW
                 ? absl::UnavailableError(absl::StrCat(
                       "store ", path_, ": SQLite cannot use WAL mode here"))
                 : SqlError(db_, rc, "PRAGMA journal_mode=WAL");
    }
  }
  const char* sync = "PRAGMA synchronous=FULL";
  if (options_.sync == StoreOptions::Sync::kInterval) {
    sync = "PRAGMA synchronous=NORMAL";
  } else if (options_.sync == StoreOptions::Sync::kOff) {
    sync = "PRAGMA synchronous=OFF";
  }
  if (absl::Status s = Exec(db_, sync); !s.ok()) return s;
  if (options_.max_page_count > 0) {
    if (absl::Status s = Exec(db_, absl::StrCat("PRAGMA max_page_count=",
                                                options_.max_page_count)
                                       .c_str());
        !s.ok()) {
      return s;
    }
  }
  // The schema, or a write that proves the file writable: either way one
  // committed transaction before rvd serves.
  if (absl::Status s = Exec(db_, "BEGIN IMMEDIATE"); !s.ok()) return s;
  absl::StatusOr<std::optional<int64_t>> version =
      QueryInt(db_, "PRAGMA user_version");
  absl::Status s = version.status();
  if (s.ok() && version->value_or(0) == 0) {
    absl::StatusOr<std::optional<int64_t>> tables =
        QueryInt(db_, "SELECT count(*) FROM sqlite_master");
    s = tables.status();
    if (s.ok() && tables->value_or(0) != 0) {
      s = absl::FailedPreconditionError(absl::StrCat(
          "store ", path_, " holds tables but no rvd schema version; not "
          "rvd's file (it was not changed)"));
    }
    if (s.ok()) {
      s = Exec(db_, absl::StrCat(
          "CREATE TABLE measurements("
          "  seq INTEGER PRIMARY KEY AUTOINCREMENT,"
          "  model_id TEXT NOT NULL,"
          "  step INTEGER NOT NULL,"
          "  time_ns INTEGER NOT NULL,"
          "  body BLOB NOT NULL);"
          "CREATE INDEX measurements_by_model ON measurements(model_id, seq);"
          "CREATE INDEX measurements_by_time ON measurements(time_ns);"
          "PRAGMA application_id=", kApplicationId, ";"
          "PRAGMA user_version=", kSchemaVersion, ";").c_str());
    }
  } else if (s.ok()) {
    s = Exec(db_, absl::StrCat("PRAGMA user_version=", *(*version)).c_str());
  }
  if (s.ok()) s = Exec(db_, "COMMIT");
  if (!s.ok()) {
    Exec(db_, "ROLLBACK").IgnoreError();
    if (s.code() == absl::StatusCode::kUnavailable &&
        absl::StrContains(s.message(), "readonly")) {
      return absl::PermissionDeniedError(absl::StrCat(
          s.message(), " (is ", path_, " writable by uid ", ::getuid(), "?)"));
    }
    return s;
  }

  absl::StatusOr<std::optional<int64_t>> last = QueryInt(
      db_, "SELECT seq FROM sqlite_sequence WHERE name='measurements'");
  if (!last.ok()) return last.status();
  last_.store(static_cast<uint64_t>(last->value_or(0)));
  {
    Stmt counts;
    if (absl::Status st = Prepare(
            db_, "SELECT model_id, count(*) FROM measurements GROUP BY model_id",
            &counts);
        !st.ok()) {
      return st;
    }
    int rc;
    while ((rc = sqlite3_step(counts.get())) == SQLITE_ROW) {
      const char* id =
          reinterpret_cast<const char*>(sqlite3_column_text(counts.get(), 0));
      const uint64_t n = sqlite3_column_int64(counts.get(), 1);
      counts_[id == nullptr ? "" : id] = n;
      report_.rows += n;
    }
    if (rc != SQLITE_DONE) return SqlError(db_, rc, "counting measurements");
  }
  // Retention the config may have tightened since the last run.
  if (absl::Status st = Exec(db_, "BEGIN IMMEDIATE"); !st.ok()) return st;
  std::map<std::string, uint64_t> removed;
  next_age_check_ = absl::Now() + options_.age_check_every;
  s = TrimAge(absl::Now(), &removed);
  for (auto& [id, n] : counts_) {
    n -= std::min(n, removed[id]);
    uint64_t trimmed = 0;
    if (s.ok()) s = TrimCount(id, n, &trimmed);
    n -= trimmed;
  }
  if (s.ok()) s = Exec(db_, "COMMIT");
  if (!s.ok()) {
    Exec(db_, "ROLLBACK").IgnoreError();
    return s;
  }
  uint64_t rows = 0;
  for (const auto& [id, n] : counts_) rows += n;
  report_.expired = report_.rows - rows;
  report_.rows = rows;
  rows_ = rows;
  {
    absl::MutexLock window(&window_mu_);
    window_from_ = last_.load() + 1;
  }
  absl::StatusOr<sqlite3*> reader = OpenDb(path_, SQLITE_OPEN_READONLY);
  if (!reader.ok()) return reader.status();
  absl::MutexLock read_lock(&read_mu_);
  rdb_ = *reader;
  return absl::OkStatus();
}

SqliteStore::~SqliteStore() {
  stop_.Notify();
  if (syncer_.joinable()) syncer_.join();
  {
    absl::MutexLock lock(&read_mu_);
    sqlite3_close_v2(rdb_);
    rdb_ = nullptr;
  }
  absl::MutexLock lock(&write_mu_);
  sqlite3_close_v2(db_);  // the last connection: checkpoints the WAL
  db_ = nullptr;
}

absl::Status SqliteStore::TrimCount(const std::string& model_id,
                                    uint64_t count, uint64_t* removed) {
  *removed = 0;
  if (options_.retention_count == 0 || count <= options_.retention_count) {
    return absl::OkStatus();
  }
  Stmt del;
  if (absl::Status s = Prepare(
          db_,
          "DELETE FROM measurements WHERE seq IN (SELECT seq FROM "
          "measurements WHERE model_id = ? ORDER BY seq LIMIT ?)",
          &del);
      !s.ok()) {
    return s;
  }
  sqlite3_bind_text(del.get(), 1, model_id.data(),
                    static_cast<int>(model_id.size()), SQLITE_STATIC);
  sqlite3_bind_int64(del.get(), 2,
                     static_cast<int64_t>(count - options_.retention_count));
  const int rc = sqlite3_step(del.get());
  if (rc != SQLITE_DONE) return SqlError(db_, rc, "count retention");
  *removed = sqlite3_changes(db_);
  return absl::OkStatus();
}

absl::Status SqliteStore::TrimAge(absl::Time now,
                                  std::map<std::string, uint64_t>* removed) {
  if (options_.retention_age <= absl::ZeroDuration()) return absl::OkStatus();
  Stmt del;
  if (absl::Status s = Prepare(
          db_,
          "DELETE FROM measurements WHERE seq IN (SELECT seq FROM "
          "measurements WHERE time_ns < ? LIMIT ?) RETURNING model_id",
          &del);
      !s.ok()) {
    return s;
  }
  sqlite3_bind_int64(del.get(), 1,
                     absl::ToUnixNanos(now - options_.retention_age));
  sqlite3_bind_int64(del.get(), 2, kAgeTrimBatch);
  int rc;
  while ((rc = sqlite3_step(del.get())) == SQLITE_ROW) {
    const char* id =
        reinterpret_cast<const char*>(sqlite3_column_text(del.get(), 0));
    ++(*removed)[id == nullptr ? "" : id];
  }
  if (rc != SQLITE_DONE) return SqlError(db_, rc, "age retention");
  return absl::OkStatus();
}

absl::StatusOr<MeasurementLog::Entry> SqliteStore::Append(
    rvd::v1::Measurement m) {
  absl::MutexLock lock(&write_mu_);
  const uint64_t seq = last_.load() + 1;
  m.set_sequence(seq);
  const std::string body = m.SerializeAsString();
  // What retention removes, applied to counts_ once the commit succeeded.
  const uint64_t count = counts_[m.model_id()];
  uint64_t trimmed = 0;
  std::map<std::string, uint64_t> aged;
  const absl::Time now = absl::Now();
  const bool age_due = now >= next_age_check_;
  auto run = [&]() -> absl::Status {
    if (absl::Status s = Exec(db_, "BEGIN IMMEDIATE"); !s.ok()) return s;
    Stmt ins;
    if (absl::Status s = Prepare(
            db_,
            "INSERT INTO measurements(seq, model_id, step, time_ns, body) "
            "VALUES(?, ?, ?, ?, ?)",
            &ins);
        !s.ok()) {
      return s;
    }
    sqlite3_bind_int64(ins.get(), 1, static_cast<int64_t>(seq));
    sqlite3_bind_text(ins.get(), 2, m.model_id().data(),
                      static_cast<int>(m.model_id().size()), SQLITE_STATIC);
    sqlite3_bind_int64(ins.get(), 3, m.step());
    sqlite3_bind_int64(ins.get(), 4, TimeNs(m));
    sqlite3_bind_blob(ins.get(), 5, body.data(), static_cast<int>(body.size()),
                      SQLITE_STATIC);
    const int rc = sqlite3_step(ins.get());
    if (rc != SQLITE_DONE) return SqlError(db_, rc, "storing a measurement");
    if (absl::Status s = TrimCount(m.model_id(), count + 1, &trimmed);
        !s.ok()) {
      return s;
    }
    if (age_due) {
      if (absl::Status s = TrimAge(now, &aged); !s.ok()) return s;
    }
    // The acknowledgement waits for this commit (and, with synchronous=FULL,
    // its fsync): what a client is told was stored survives a crash.
    return Exec(db_, "COMMIT");
  };
  if (absl::Status s = run(); !s.ok()) {
    if (!sqlite3_get_autocommit(db_)) Exec(db_, "ROLLBACK").IgnoreError();
    absl::MutexLock stats(&stats_mu_);
    ++stats_.append_errors;
    if (s.code() == absl::StatusCode::kResourceExhausted) {
      ++stats_.disk_full_errors;
    }
    return s;
  }
  last_.store(seq);
  dirty_.store(true);
  if (age_due) next_age_check_ = now + options_.age_check_every;
  uint64_t expired = trimmed;
  counts_[m.model_id()] = count + 1 - trimmed;
  for (const auto& [id, n] : aged) {
    uint64_t& c = counts_[id];
    c -= std::min(c, n);
    expired += n;
  }
  rows_ = rows_ + 1 - std::min(rows_ + 1, expired);
  {
    absl::MutexLock stats(&stats_mu_);
    stats_.rows = rows_;
    stats_.expired_total += expired;
  }
  auto entry = std::make_shared<const rvd::v1::Measurement>(std::move(m));
  std::deque<Entry> evicted;  // destroyed after the lock is released
  absl::MutexLock window(&window_mu_);
  window_.push_back(entry);
  while (window_.size() > std::max<size_t>(options_.memory_window, 1)) {
    window_from_ = window_.front()->sequence() + 1;
    evicted.push_back(std::move(window_.front()));
    window_.pop_front();
  }
  return Entry(std::move(entry));
}

uint64_t SqliteStore::LastSequence() const { return last_.load(); }

absl::StatusOr<std::vector<MeasurementLog::Entry>> SqliteStore::Read(
    uint64_t after, uint64_t through, size_t max) const {
  std::vector<Entry> out;
  if (through <= after || max == 0) return out;
  {
    absl::MutexLock window(&window_mu_);
    if (after + 1 >= window_from_) {
      auto it = std::upper_bound(
          window_.begin(), window_.end(), after,
          [](uint64_t s, const Entry& e) { return s < e->sequence(); });
      for (; it != window_.end() && (*it)->sequence() <= through &&
             out.size() < max;
           ++it) {
        out.push_back(*it);
      }
      return out;
    }
  }
  absl::MutexLock lock(&read_mu_);
  Stmt sel;
  if (absl::Status s = Prepare(
          rdb_,
          "SELECT body FROM measurements WHERE seq > ? AND seq <= ? "
          "ORDER BY seq LIMIT ?",
          &sel);
      !s.ok()) {
    return s;
  }
  sqlite3_bind_int64(sel.get(), 1, static_cast<int64_t>(after));
  sqlite3_bind_int64(sel.get(), 2,
                     static_cast<int64_t>(std::min<uint64_t>(through, INT64_MAX)));
  sqlite3_bind_int64(sel.get(), 3,
                     static_cast<int64_t>(std::min<size_t>(max, INT64_MAX)));
  int rc;
  while ((rc = sqlite3_step(sel.get())) == SQLITE_ROW) {
    absl::StatusOr<Entry> e = Decode(sqlite3_column_blob(sel.get(), 0),
                                     sqlite3_column_bytes(sel.get(), 0));
    if (!e.ok()) return e.status();
    out.push_back(*std::move(e));
  }
  if (rc != SQLITE_DONE) return SqlError(rdb_, rc, "reading the log");
  return out;
}

absl::StatusOr<uint64_t> SqliteStore::DeleteModel(const std::string& model_id) {
  uint64_t n = 0;
  {
    absl::MutexLock lock(&write_mu_);
    Stmt del;
    if (absl::Status s =
            Prepare(db_, "DELETE FROM measurements WHERE model_id = ?", &del);
        !s.ok()) {
      return s;
    }
    sqlite3_bind_text(del.get(), 1, model_id.data(),
                      static_cast<int>(model_id.size()), SQLITE_STATIC);
    const int rc = sqlite3_step(del.get());
    if (rc != SQLITE_DONE) return SqlError(db_, rc, "deleting a model");
    n = sqlite3_changes(db_);
    counts_.erase(model_id);
    rows_ -= std::min(rows_, n);
    absl::MutexLock stats(&stats_mu_);
    stats_.rows = rows_;
    stats_.deleted_total += n;
  }
  std::deque<Entry> removed;  // destroyed after the lock is released
  absl::MutexLock window(&window_mu_);
  std::deque<Entry> kept;
  for (Entry& e : window_) {
    (e->model_id() == model_id ? removed : kept).push_back(std::move(e));
  }
  window_.swap(kept);
  return n;
}

absl::StatusOr<std::vector<MeasurementLog::Entry>> SqliteStore::LoadRecent(
    size_t per_model) const {
  std::vector<Entry> out;
  absl::MutexLock lock(&read_mu_);
  // Model by model through the (model_id, seq) index, so that the work is
  // what is loaded, not what is stored; then one sort by sequence.
  std::vector<std::string> models;
  {
    Stmt ids;
    if (absl::Status s =
            Prepare(rdb_, "SELECT DISTINCT model_id FROM measurements", &ids);
        !s.ok()) {
      return s;
    }
    int rc;
    while ((rc = sqlite3_step(ids.get())) == SQLITE_ROW) {
      const char* id =
          reinterpret_cast<const char*>(sqlite3_column_text(ids.get(), 0));
      models.emplace_back(id == nullptr ? "" : id);
    }
    if (rc != SQLITE_DONE) return SqlError(rdb_, rc, "listing models");
  }
  Stmt sel;
  if (absl::Status s = Prepare(
          rdb_,
          "SELECT body FROM measurements WHERE model_id = ? ORDER BY seq DESC "
          "LIMIT ?",
          &sel);
      !s.ok()) {
    return s;
  }
  for (const std::string& id : models) {
    sqlite3_reset(sel.get());
    sqlite3_bind_text(sel.get(), 1, id.data(), static_cast<int>(id.size()),
                      SQLITE_STATIC);
    sqlite3_bind_int64(sel.get(), 2,
                       per_model == 0 ? -1 : static_cast<int64_t>(per_model));
    int rc;
    while ((rc = sqlite3_step(sel.get())) == SQLITE_ROW) {
      absl::StatusOr<Entry> e = Decode(sqlite3_column_blob(sel.get(), 0),
                                       sqlite3_column_bytes(sel.get(), 0));
      if (!e.ok()) return e.status();
      out.push_back(*std::move(e));
    }
    if (rc != SQLITE_DONE) return SqlError(rdb_, rc, "loading history");
  }
  std::sort(out.begin(), out.end(), [](const Entry& a, const Entry& b) {
    return a->sequence() < b->sequence();
  });
  return out;
}

absl::StatusOr<std::vector<MeasurementLog::Entry>> SqliteStore::Query(
    const std::string& model_id, const StoreQuery& q, bool* more) const {
  std::string sql = "SELECT body FROM measurements WHERE model_id = ?1";
  if (q.from_step) absl::StrAppend(&sql, " AND step >= ?2");
  if (q.to_step) absl::StrAppend(&sql, " AND step <= ?3");
  if (q.since) absl::StrAppend(&sql, " AND time_ns >= ?4");
  if (q.until) absl::StrAppend(&sql, " AND time_ns < ?5");
  if (q.after_sequence) absl::StrAppend(&sql, " AND seq > ?6");
  absl::StrAppend(&sql, q.after_sequence ? " ORDER BY seq ASC"
                                         : " ORDER BY seq DESC");
  if (q.limit > 0) absl::StrAppend(&sql, " LIMIT ?7");
  std::vector<Entry> out;
  absl::MutexLock lock(&read_mu_);
  Stmt sel;
  if (absl::Status s = Prepare(rdb_, sql, &sel); !s.ok()) return s;
  sqlite3_bind_text(sel.get(), 1, model_id.data(),
                    static_cast<int>(model_id.size()), SQLITE_STATIC);
  if (q.from_step) sqlite3_bind_int64(sel.get(), 2, *q.from_step);
  if (q.to_step) sqlite3_bind_int64(sel.get(), 3, *q.to_step);
  if (q.since) sqlite3_bind_int64(sel.get(), 4, absl::ToUnixNanos(*q.since));
  if (q.until) sqlite3_bind_int64(sel.get(), 5, absl::ToUnixNanos(*q.until));
  if (q.after_sequence) {
    sqlite3_bind_int64(
        sel.get(), 6,
        static_cast<int64_t>(std::min<uint64_t>(*q.after_sequence, INT64_MAX)));
  }
  // One row more than the limit says whether more match.
  if (q.limit > 0) {
    sqlite3_bind_int64(sel.get(), 7, static_cast<int64_t>(q.limit) + 1);
  }
  int rc;
  while ((rc = sqlite3_step(sel.get())) == SQLITE_ROW) {
    absl::StatusOr<Entry> e = Decode(sqlite3_column_blob(sel.get(), 0),
                                     sqlite3_column_bytes(sel.get(), 0));
    if (!e.ok()) return e.status();
    out.push_back(*std::move(e));
  }
  if (rc != SQLITE_DONE) return SqlError(rdb_, rc, "reading history");
  const bool over = q.limit > 0 && out.size() > q.limit;
  if (over) out.pop_back();
  if (more != nullptr) *more = over;
  if (!q.after_sequence) std::reverse(out.begin(), out.end());
  return out;
}

StoreStats SqliteStore::Stats() const {
  absl::MutexLock lock(&stats_mu_);
  return stats_;
}

void SqliteStore::SyncLoop() {
  const std::string wal = path_ + "-wal";
  int fd = -1;
  auto sync = [&] {
    if (!dirty_.exchange(false)) return;
    if (fd < 0) fd = ::open(wal.c_str(), O_RDONLY | O_CLOEXEC);
    // Any descriptor of the file flushes its data (Linux fsync(2)); the
    // WAL is not deleted while rvd's connections are open.
    if (fd < 0 || ::fdatasync(fd) != 0) {
      dirty_.store(true);  // try again next time
      return;
    }
    absl::MutexLock lock(&stats_mu_);
    ++stats_.syncs_total;
  };
  while (!stop_.WaitForNotificationWithTimeout(options_.sync_interval)) sync();
  sync();
  if (fd >= 0) ::close(fd);
}

}  // namespace rvd

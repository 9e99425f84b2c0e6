#include "server/sqlite_store.h"

#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/history.h"

namespace rvd {
namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;

// A fresh directory per test, removed at the end.
class TempDir {
 public:
  TempDir() {
    std::string t = (fs::temp_directory_path() / "rvd_store_XXXXXX").string();
    path_ = mkdtemp(t.data());
  }
  ~TempDir() { fs::remove_all(path_); }
  const std::string& path() const { return path_; }
  std::string db() const { return path_ + "/rvd.db"; }

 private:
  std::string path_;
};

rvd::v1::Measurement Make(const std::string& model, int64_t step,
                          absl::Time t = absl::FromUnixSeconds(1700000000)) {
  rvd::v1::Measurement m;
  m.set_model_id(model);
  m.set_step(step);
  m.set_rv(0.5 + step * 1e-3);
  m.mutable_timestamp()->set_seconds(absl::ToUnixSeconds(t));
  rvd::v1::LayerPR* l = m.add_layers();
  l->set_layer(0);
  l->set_pr(3.0 + step);
  return m;
}

std::unique_ptr<SqliteStore> MustOpen(const std::string& dir,
                                      StoreOptions o = {}) {
  absl::StatusOr<std::unique_ptr<SqliteStore>> s = SqliteStore::Open(dir, o);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *std::move(s) : nullptr;
}

std::vector<int64_t> Steps(const std::vector<MeasurementLog::Entry>& es) {
  std::vector<int64_t> out;
  for (const auto& e : es) out.push_back(e->step());
  return out;
}

std::vector<uint64_t> Seqs(const std::vector<MeasurementLog::Entry>& es) {
  std::vector<uint64_t> out;
  for (const auto& e : es) out.push_back(e->sequence());
  return out;
}

void Exec(const std::string& db, const std::string& sql) {
  sqlite3* h = nullptr;
  ASSERT_EQ(sqlite3_open(db.c_str(), &h), SQLITE_OK);
  char* err = nullptr;
  EXPECT_EQ(sqlite3_exec(h, sql.c_str(), nullptr, nullptr, &err), SQLITE_OK)
      << (err ? err : "");
  sqlite3_free(err);
  sqlite3_close(h);
}

TEST(SqliteStoreTest, AppendAssignsDenseSequencesThatContinueAfterReopen) {
  TempDir dir;
  {
    auto s = MustOpen(dir.path());
    ASSERT_NE(s, nullptr);
    EXPECT_EQ(s->LastSequence(), 0u);
    for (int i = 1; i <= 5; ++i) {
      absl::StatusOr<MeasurementLog::Entry> e = s->Append(Make("a", i));
      ASSERT_TRUE(e.ok()) << e.status();
      EXPECT_EQ((*e)->sequence(), static_cast<uint64_t>(i));
    }
  }
  auto s = MustOpen(dir.path());
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->LastSequence(), 5u);
  EXPECT_EQ(s->open_report().rows, 5u);
  EXPECT_FALSE(s->open_report().damaged);
  EXPECT_EQ((*s->Append(Make("b", 1)))->sequence(), 6u);
  absl::StatusOr<std::vector<MeasurementLog::Entry>> all = s->Read(0, 100, 100);
  ASSERT_TRUE(all.ok());
  EXPECT_THAT(Seqs(*all), ::testing::ElementsAre(1, 2, 3, 4, 5, 6));
  // What a reopened store reads back is what was appended.
  EXPECT_EQ((*all)[2]->model_id(), "a");
  EXPECT_EQ((*all)[2]->step(), 3);
  EXPECT_DOUBLE_EQ((*all)[2]->layers(0).pr(), 6.0);
}

TEST(SqliteStoreTest, DeletedNewestNumbersAreNotReused) {
  TempDir dir;
  {
    auto s = MustOpen(dir.path());
    ASSERT_TRUE(s->Append(Make("a", 1)).ok());
    ASSERT_TRUE(s->Append(Make("b", 1)).ok());
    absl::StatusOr<uint64_t> n = s->DeleteModel("b");
    ASSERT_TRUE(n.ok());
    EXPECT_EQ(*n, 1u);
  }
  auto s = MustOpen(dir.path());
  EXPECT_EQ(s->LastSequence(), 2u);
  EXPECT_EQ((*s->Append(Make("c", 1)))->sequence(), 3u);
  // Read skips the deleted number, from memory and from disk alike.
  EXPECT_THAT(Seqs(*s->Read(0, 10, 10)), ::testing::ElementsAre(1, 3));
  EXPECT_THAT(Seqs(*s->Read(2, 10, 10)), ::testing::ElementsAre(3));
}

TEST(SqliteStoreTest, LoadRecentKeepsTheNewestPerModelInSequenceOrder) {
  TempDir dir;
  {
    auto s = MustOpen(dir.path());
    for (int i = 1; i <= 6; ++i) {
      ASSERT_TRUE(s->Append(Make("a", i)).ok());
      if (i % 2 == 0) {
        ASSERT_TRUE(s->Append(Make("b", i)).ok());
      }
    }
  }
  auto s = MustOpen(dir.path());
  absl::StatusOr<std::vector<MeasurementLog::Entry>> r = s->LoadRecent(2);
  ASSERT_TRUE(r.ok()) << r.status();
  // a: 1 2 3 4 5 6 (seq 1 2 4 5 7 8), b: 2 4 6 (seq 3 6 9).
  EXPECT_THAT(Seqs(*r), ::testing::ElementsAre(6, 7, 8, 9));
  EXPECT_THAT(Steps(*r), ::testing::ElementsAre(4, 5, 6, 6));
}

TEST(SqliteStoreTest, QueryByStepTimeAndPages) {
  TempDir dir;
  auto s = MustOpen(dir.path());
  const absl::Time t0 = absl::FromUnixSeconds(1700000000);
  for (int i = 0; i < 10; ++i) {
    ASSERT_TRUE(s->Append(Make("a", i * 10, t0 + absl::Seconds(i))).ok());
    ASSERT_TRUE(s->Append(Make("other", i, t0 + absl::Seconds(i))).ok());
  }
  StoreQuery q;
  q.from_step = 20;
  q.to_step = 50;
  EXPECT_THAT(Steps(*s->Query("a", q)), ::testing::ElementsAre(20, 30, 40, 50));
  q = {};
  q.since = t0 + absl::Seconds(7);
  EXPECT_THAT(Steps(*s->Query("a", q)), ::testing::ElementsAre(70, 80, 90));
  q = {};
  q.until = t0 + absl::Seconds(2);  // exclusive
  EXPECT_THAT(Steps(*s->Query("a", q)), ::testing::ElementsAre(0, 10));
  // Newest `limit`, oldest first; `more` says others match.
  q = {};
  q.limit = 3;
  bool more = false;
  EXPECT_THAT(Steps(*s->Query("a", q, &more)),
              ::testing::ElementsAre(70, 80, 90));
  EXPECT_TRUE(more);
  // Paging forward from a cursor covers every row once.
  std::vector<int64_t> paged;
  q = {};
  q.limit = 4;
  q.after_sequence = 0;
  do {
    auto page = s->Query("a", q, &more);
    ASSERT_TRUE(page.ok());
    for (const auto& e : *page) paged.push_back(e->step());
    if (!page->empty()) {
      q.after_sequence = page->back()->sequence();
    }
  } while (more);
  EXPECT_THAT(paged, ::testing::ElementsAre(0, 10, 20, 30, 40, 50, 60, 70, 80,
                                            90));
  EXPECT_TRUE(s->Query("nobody", StoreQuery{})->empty());
}

TEST(SqliteStoreTest, RetentionByCountKeepsTheNewestPerModel) {
  TempDir dir;
  StoreOptions o;
  o.retention_count = 3;
  {
    auto s = MustOpen(dir.path(), o);
    for (int i = 1; i <= 7; ++i) ASSERT_TRUE(s->Append(Make("a", i)).ok());
    ASSERT_TRUE(s->Append(Make("b", 1)).ok());
    EXPECT_THAT(Steps(*s->Query("a", StoreQuery{})),
                ::testing::ElementsAre(5, 6, 7));
    EXPECT_EQ(s->Stats().rows, 4u);
    EXPECT_EQ(s->Stats().expired_total, 4u);
  }
  // A tighter bound at the next start applies at once.
  o.retention_count = 2;
  auto s = MustOpen(dir.path(), o);
  EXPECT_EQ(s->open_report().expired, 1u);
  EXPECT_THAT(Steps(*s->Query("a", StoreQuery{})), ::testing::ElementsAre(6, 7));
  EXPECT_THAT(Steps(*s->Query("b", StoreQuery{})), ::testing::ElementsAre(1));
}

TEST(SqliteStoreTest, RetentionByAgeDropsOldRows) {
  TempDir dir;
  StoreOptions o;
  o.retention_age = absl::Hours(1);
  o.age_check_every = absl::ZeroDuration();  // on every append
  auto s = MustOpen(dir.path(), o);
  const absl::Time now = absl::Now();
  ASSERT_TRUE(s->Append(Make("a", 1, now - absl::Hours(3))).ok());
  ASSERT_TRUE(s->Append(Make("b", 1, now - absl::Hours(2))).ok());
  // This append's retention pass removes both older rows (its own is new).
  ASSERT_TRUE(s->Append(Make("a", 2, now)).ok());
  EXPECT_THAT(Steps(*s->Query("a", StoreQuery{})), ::testing::ElementsAre(2));
  EXPECT_TRUE(s->Query("b", StoreQuery{})->empty());
  EXPECT_EQ(s->Stats().rows, 1u);
}

TEST(SqliteStoreTest, MissingOrNonDirectoryDataDirIsAClearError) {
  TempDir dir;
  absl::StatusOr<std::unique_ptr<SqliteStore>> s =
      SqliteStore::Open(dir.path() + "/nope", {});
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.status().message(), HasSubstr("nope"));
  EXPECT_THAT(s.status().message(), HasSubstr("No such file"));
  std::ofstream(dir.path() + "/file") << "x";
  s = SqliteStore::Open(dir.path() + "/file", {});
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.status().message(), HasSubstr("not a directory"));
}

TEST(SqliteStoreTest, UnwritableDataDirIsAClearError) {
  if (geteuid() == 0) GTEST_SKIP() << "root writes anywhere";
  TempDir dir;
  ASSERT_EQ(chmod(dir.path().c_str(), 0500), 0);
  absl::StatusOr<std::unique_ptr<SqliteStore>> s =
      SqliteStore::Open(dir.path(), {});
  chmod(dir.path().c_str(), 0700);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(s.status().message(), HasSubstr("not writable"));
}

TEST(SqliteStoreTest, NewerSchemaVersionIsRefusedAndTheFileLeftAlone) {
  TempDir dir;
  { ASSERT_TRUE(MustOpen(dir.path())->Append(Make("a", 1)).ok()); }
  Exec(dir.db(), "PRAGMA user_version=2");
  const auto size = fs::file_size(dir.db());
  absl::StatusOr<std::unique_ptr<SqliteStore>> s =
      SqliteStore::Open(dir.path(), {});
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.status().message(), HasSubstr("schema version 2"));
  EXPECT_THAT(s.status().message(), HasSubstr("newer rvd"));
  EXPECT_EQ(fs::file_size(dir.db()), size);
  Exec(dir.db(), "PRAGMA user_version=1");
  EXPECT_EQ(MustOpen(dir.path())->LastSequence(), 1u);
}

TEST(SqliteStoreTest, ForeignSqliteFileIsRefused) {
  TempDir dir;
  Exec(dir.db(), "CREATE TABLE t(x)");
  absl::StatusOr<std::unique_ptr<SqliteStore>> s =
      SqliteStore::Open(dir.path(), {});
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.status().message(), HasSubstr("not rvd's"));
}

TEST(SqliteStoreTest, FullDiskFailsTheAppendAndLosesNothingAcknowledged) {
  TempDir dir;
  StoreOptions o;
  o.max_page_count = 12;  // SQLite's own "disk full" (SQLITE_FULL)
  uint64_t acked = 0;
  absl::Status full;
  {
    auto s = MustOpen(dir.path(), o);
    ASSERT_NE(s, nullptr);
    for (int i = 1; i <= 5000 && full.ok(); ++i) {
      rvd::v1::Measurement m = Make("a", i);
      m.add_warnings(std::string(300, 'x'));  // fill pages quickly
      absl::StatusOr<MeasurementLog::Entry> e = s->Append(m);
      if (e.ok()) {
        acked = (*e)->sequence();
      } else {
        full = e.status();
      }
    }
    ASSERT_FALSE(full.ok()) << "never filled";
    EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted) << full;
    EXPECT_THAT(full.message(), HasSubstr("full"));
    // The failed append used no number.
    EXPECT_EQ(s->LastSequence(), acked);
    EXPECT_EQ(s->Stats().disk_full_errors, 1u);
  }
  auto s = MustOpen(dir.path());
  EXPECT_EQ(s->LastSequence(), acked);
  EXPECT_EQ(s->open_report().rows, acked);
  EXPECT_EQ(s->Read(0, acked, acked + 1)->size(), acked);
}

TEST(SqliteStoreTest, TruncatedFileIsReplacedWithWhatCanBeRead) {
  TempDir dir;
  constexpr int kRows = 400;
  {
    auto s = MustOpen(dir.path());
    for (int i = 1; i <= kRows; ++i) {
      rvd::v1::Measurement m = Make("m" + std::to_string(i % 3), i);
      m.add_warnings(std::string(200, 'w'));
      ASSERT_TRUE(s->Append(m).ok());
    }
  }  // closed: the WAL is checkpointed into rvd.db and removed
  ASSERT_FALSE(fs::exists(dir.db() + "-wal"));
  fs::resize_file(dir.db(), fs::file_size(dir.db()) / 2);
  auto s = MustOpen(dir.path());
  ASSERT_NE(s, nullptr);
  const StoreOpenReport& r = s->open_report();
  EXPECT_TRUE(r.damaged);
  EXPECT_FALSE(r.damage.empty());
  EXPECT_TRUE(fs::exists(r.moved_to)) << r.moved_to;
  EXPECT_GT(r.recovered, 0u);
  EXPECT_LT(r.recovered, static_cast<uint64_t>(kRows));
  EXPECT_EQ(r.recovered + r.lost, static_cast<uint64_t>(kRows))
      << "recovered " << r.recovered << " lost " << r.lost
      << (r.lost_is_upper_bound ? " (upper bound)" : "");
  // Numbering continues after the damaged file's; the store works.
  EXPECT_EQ(s->LastSequence(), static_cast<uint64_t>(kRows));
  EXPECT_EQ((*s->Append(Make("m0", 1000)))->sequence(), kRows + 1u);
  EXPECT_EQ(s->Read(0, 10000, 10000)->size(), r.recovered + 1);
}

TEST(SqliteStoreTest, GarbageFileIsReplacedAndReported) {
  TempDir dir;
  { ASSERT_TRUE(MustOpen(dir.path())->Append(Make("a", 1)).ok()); }
  {
    std::fstream f(dir.db(), std::ios::in | std::ios::out | std::ios::binary);
    f.write(std::string(100, '\x5a').data(), 100);  // the header
  }
  auto s = MustOpen(dir.path());
  ASSERT_NE(s, nullptr);
  EXPECT_TRUE(s->open_report().damaged);
  EXPECT_EQ(s->open_report().recovered, 0u);
  EXPECT_TRUE(s->Append(Make("a", 2)).ok());
}

TEST(SqliteStoreTest, ParseStoreSync) {
  EXPECT_EQ(ParseStoreSync("record")->sync, StoreOptions::Sync::kEveryRecord);
  EXPECT_EQ(ParseStoreSync("off")->sync, StoreOptions::Sync::kOff);
  absl::StatusOr<StoreOptions> o = ParseStoreSync("250ms");
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(o->sync, StoreOptions::Sync::kInterval);
  EXPECT_EQ(o->sync_interval, absl::Milliseconds(250));
  for (const char* bad : {"", "always", "0ms", "10s", "-5ms", "99999999ms"}) {
    EXPECT_FALSE(ParseStoreSync(bad).ok()) << bad;
  }
}

TEST(SqliteStoreTest, IntervalSyncFsyncsTheWal) {
  TempDir dir;
  StoreOptions o = *ParseStoreSync("5ms");
  auto s = MustOpen(dir.path(), o);
  ASSERT_TRUE(s->Append(Make("a", 1)).ok());
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (s->Stats().syncs_total == 0 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_GE(s->Stats().syncs_total, 1u);
}

// Readers on their own connection while the writer appends and deletes:
// every read is in sequence order and within what was assigned.
TEST(SqliteStoreTest, ReadersRunBesideTheWriter) {
  TempDir dir;
  StoreOptions o;
  o.memory_window = 16;  // most replays go to the disk
  auto s = MustOpen(dir.path(), o);
  std::atomic<bool> done{false};
  std::atomic<int> bad{0};
  std::vector<std::thread> readers;
  for (int r = 0; r < 3; ++r) {
    readers.emplace_back([&, r] {
      while (!done.load()) {
        const uint64_t last = s->LastSequence();
        absl::StatusOr<std::vector<MeasurementLog::Entry>> es =
            r == 0 ? s->Read(0, last, 1000)
                   : r == 1 ? s->Query("a", StoreQuery{}) : s->LoadRecent(8);
        if (!es.ok()) {
          ++bad;
          continue;
        }
        for (size_t i = 1; i < es->size(); ++i) {
          if ((*es)[i - 1]->sequence() >= (*es)[i]->sequence()) ++bad;
        }
        if (r == 0 && !es->empty() && es->back()->sequence() > last) ++bad;
      }
    });
  }
  int failed_writes = 0;  // no ASSERT here: the readers must be joined
  for (int i = 1; i <= 300; ++i) {
    if (!s->Append(Make(i % 2 ? "a" : "b", i)).ok()) ++failed_writes;
    if (i % 50 == 0 && !s->DeleteModel("b").ok()) ++failed_writes;
  }
  done.store(true);
  for (std::thread& t : readers) t.join();
  EXPECT_EQ(failed_writes, 0);
  EXPECT_EQ(bad.load(), 0);
  EXPECT_EQ(s->Query("a", StoreQuery{})->size(), 150u);
}

// The store under History, as rvd runs it: the index rebuilt at start, a
// watch resuming across a restart from the disk, deleted numbers reported.
std::vector<std::string> Drain(Watch& w) {
  std::vector<std::string> out;
  while (true) {
    absl::StatusOr<std::optional<BusEvent>> e = w.Next();
    EXPECT_TRUE(e.ok()) << e.status();
    if (!e.ok() || !e->has_value()) return out;
    if (const auto* m = std::get_if<MeasurementLog::Entry>(&**e)) {
      out.push_back((*m)->model_id() + std::to_string((*m)->sequence()));
    } else {
      const GapMarker& g = std::get<GapMarker>(**e);
      out.push_back("gap " + std::to_string(g.first_sequence) + "-" +
                    std::to_string(g.last_sequence));
    }
  }
}

TEST(SqliteStoreTest, HistoryRestartsWhereItStopped) {
  TempDir dir;
  History::Options opts;
  opts.capacity_per_model = 2;
  {
    History h(MustOpen(dir.path()), opts);
    for (int i = 1; i <= 3; ++i) {
      ASSERT_TRUE(h.Add(Make("a", i)).ok());
      ASSERT_TRUE(h.Add(Make("b", i)).ok());
    }
    absl::StatusOr<uint64_t> n = h.DeleteModel("b");
    ASSERT_TRUE(n.ok()) << n.status();
    EXPECT_EQ(*n, 3u);
    EXPECT_EQ(h.index().Latest("b"), nullptr);
    EXPECT_EQ(h.DeleteModel("b").status().code(), absl::StatusCode::kNotFound);
    ASSERT_TRUE(h.Add(Make("c", 1)).ok());  // sequence 7
  }
  std::unique_ptr<SqliteStore> store = MustOpen(dir.path());
  const SqliteStore* s = store.get();
  History h(std::move(store), opts);
  absl::StatusOr<std::vector<MeasurementLog::Entry>> recent = s->LoadRecent(2);
  ASSERT_TRUE(recent.ok());
  EXPECT_EQ(h.Restore(*recent), 0u);
  // The rings hold what they held: a's newest two, c's one.
  absl::StatusOr<std::vector<MeasurementLog::Entry>> a = h.index().Get("a", 0);
  ASSERT_TRUE(a.ok());
  EXPECT_THAT(Steps(*a), ::testing::ElementsAre(2, 3));
  EXPECT_EQ(h.index().Latest("c")->sequence(), 7u);
  EXPECT_EQ(h.index().Models().size(), 2u);
  // A cursor from the previous run is valid: the replay comes from disk,
  // with b's deleted numbers (2, 4, 6) reported, never silently skipped.
  absl::StatusOr<std::unique_ptr<Watch>> w = h.Subscribe("", 0, [] {});
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_THAT(Drain(**w), ::testing::ElementsAre("a1", "gap 2-2", "a3",
                                                 "gap 4-4", "a5", "gap 6-6",
                                                 "c7"));
  ASSERT_TRUE(h.Add(Make("a", 4)).ok());
  EXPECT_THAT(Drain(**w), ::testing::ElementsAre("a8"));
}

}  // namespace
}  // namespace rvd

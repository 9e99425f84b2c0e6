#include "server/history.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace rvd {
namespace {

using Entry = MeasurementLog::Entry;
using ::testing::ElementsAre;

rvd::v1::Measurement Make(const std::string& model, int64_t step) {
  rvd::v1::Measurement m;
  m.set_model_id(model);
  m.set_step(step);
  return m;
}

History::Options Opts(size_t capacity = 100, size_t max_models = 16,
                      size_t max_watchers = 8, size_t watch_queue = 1024) {
  History::Options o;
  o.capacity_per_model = capacity;
  o.max_models = max_models;
  o.max_watchers = max_watchers;
  o.watch_queue = watch_queue;
  return o;
}

// Reads every event available now, as text: "a3" for model a's measurement
// with sequence 3, "gap 4-6" for a gap.
std::vector<std::string> Drain(Watch& w) {
  std::vector<std::string> out;
  while (true) {
    absl::StatusOr<std::optional<BusEvent>> e = w.Next();
    EXPECT_TRUE(e.ok()) << e.status();
    if (!e.ok() || !e->has_value()) return out;
    if (const auto* m = std::get_if<Entry>(&**e)) {
      out.push_back(absl::StrCat((*m)->model_id(), (*m)->sequence()));
    } else {
      const GapMarker& g = std::get<GapMarker>(**e);
      out.push_back(absl::StrCat(
          g.reason == GapMarker::Reason::kNotRetained ? "expired " : "gap ",
          g.first_sequence, "-", g.last_sequence));
    }
  }
}

std::unique_ptr<Watch> MustWatch(History& h, const std::string& model,
                                 std::optional<uint64_t> after,
                                 std::function<void()> notify = {}) {
  absl::StatusOr<std::unique_ptr<Watch>> w =
      h.Subscribe(model, after, std::move(notify));
  EXPECT_TRUE(w.ok()) << w.status();
  return w.ok() ? *std::move(w) : nullptr;
}

TEST(HistoryTest, AddAssignsSequenceNumbersInOrderOverAllModels) {
  History h(NewMemLog(100), Opts());
  std::vector<uint64_t> seqs;
  for (const char* id : {"a", "b", "a", "c", "b"}) {
    absl::StatusOr<Entry> e = h.Add(Make(id, 7));
    ASSERT_TRUE(e.ok()) << e.status();
    seqs.push_back((*e)->sequence());
  }
  EXPECT_THAT(seqs, ElementsAre(1, 2, 3, 4, 5));
  EXPECT_EQ(h.index().Latest("a")->sequence(), 3u);
  EXPECT_EQ(h.index().Latest("b")->sequence(), 5u);
  EXPECT_EQ(h.log().LastSequence(), 5u);
  // The index holds the log's entries, not copies.
  EXPECT_EQ(h.index().Latest("c").get(), h.log().Read(3, 4, 1)->at(0).get());
}

TEST(HistoryTest, RefusedMeasurementsUseNoSequenceNumber) {
  History h(NewMemLog(100), Opts(10, /*max_models=*/1));
  EXPECT_EQ(h.Add(Make("", 1)).status().code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_EQ((*h.Add(Make("a", 1)))->sequence(), 1u);
  absl::StatusOr<Entry> refused = h.Add(Make("b", 1));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ((*h.Add(Make("a", 2)))->sequence(), 2u);
  EXPECT_EQ(h.index().Latest("b"), nullptr);
}

// A log whose Append fails: nothing is indexed or published.
class FailingLog final : public MeasurementLog {
 public:
  absl::StatusOr<Entry> Append(rvd::v1::Measurement) override {
    return absl::DataLossError("disk full");
  }
  uint64_t LastSequence() const override { return 0; }
  absl::StatusOr<std::vector<Entry>> Read(uint64_t, uint64_t,
                                          size_t) const override {
    return std::vector<Entry>();
  }
  absl::StatusOr<uint64_t> DeleteModel(const std::string&) override {
    return 0;
  }
};

TEST(HistoryTest, LogFailureStoresAndPublishesNothing) {
  History h(std::make_unique<FailingLog>(), Opts());
  std::unique_ptr<Watch> w = MustWatch(h, "", std::nullopt);
  EXPECT_EQ(h.Add(Make("a", 1)).status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(h.index().Latest("a"), nullptr);
  EXPECT_TRUE(h.index().Models().empty());
  EXPECT_TRUE(Drain(*w).empty());
}

TEST(HistoryTest, LiveWatchSeesOnlyLaterMeasurementsOfItsModel) {
  History h(NewMemLog(100), Opts());
  ASSERT_TRUE(h.Add(Make("a", 1)).ok());
  std::unique_ptr<Watch> all = MustWatch(h, "", std::nullopt);
  std::unique_ptr<Watch> b = MustWatch(h, "b", std::nullopt);
  EXPECT_EQ(all->cursor(), 1u);
  ASSERT_TRUE(h.Add(Make("b", 2)).ok());
  ASSERT_TRUE(h.Add(Make("a", 3)).ok());
  EXPECT_THAT(Drain(*all), ElementsAre("b2", "a3"));
  EXPECT_THAT(Drain(*b), ElementsAre("b2"));
  EXPECT_EQ(all->cursor(), 3u);
}

TEST(HistoryTest, ResumeCursorReplaysThenGoesLive) {
  History h(NewMemLog(100), Opts());
  for (const char* id : {"a", "b", "a", "b", "a"}) ASSERT_TRUE(h.Add(Make(id, 1)).ok());
  std::unique_ptr<Watch> from0 = MustWatch(h, "", 0);
  std::unique_ptr<Watch> a_after2 = MustWatch(h, "a", 2);
  std::unique_ptr<Watch> at_end = MustWatch(h, "", 5);
  ASSERT_TRUE(h.Add(Make("a", 2)).ok());  // sequence 6, live
  EXPECT_THAT(Drain(*from0), ElementsAre("a1", "b2", "a3", "b4", "a5", "a6"));
  EXPECT_THAT(Drain(*a_after2), ElementsAre("a3", "a5", "a6"));
  EXPECT_THAT(Drain(*at_end), ElementsAre("a6"));
}

TEST(HistoryTest, ReplaySpansManyPages) {
  History h(NewMemLog(1000), Opts(1000));
  const int n = 3 * Watch::kReplayPage + 5;
  for (int i = 0; i < n; ++i) ASSERT_TRUE(h.Add(Make(i % 4 ? "x" : "y", i)).ok());
  std::unique_ptr<Watch> w = MustWatch(h, "y", 0);
  std::vector<std::string> got = Drain(*w);
  std::vector<std::string> want;
  for (int i = 0; i < n; i += 4) want.push_back(absl::StrCat("y", i + 1));
  EXPECT_EQ(got, want);
  EXPECT_EQ(w->cursor(), static_cast<uint64_t>(n));
}

TEST(HistoryTest, ACursorOlderThanTheLogGetsANotRetainedGap) {
  History h(NewMemLog(/*retained=*/3), Opts());
  for (int i = 0; i < 8; ++i) ASSERT_TRUE(h.Add(Make("a", i)).ok());
  std::unique_ptr<Watch> w = MustWatch(h, "a", 2);
  EXPECT_THAT(Drain(*w), ElementsAre("expired 3-5", "a6", "a7", "a8"));
}

TEST(HistoryTest, ACursorAboveTheNewestIsOutOfRange) {
  History h(NewMemLog(10), Opts());
  ASSERT_TRUE(h.Add(Make("a", 1)).ok());
  absl::StatusOr<std::unique_ptr<Watch>> w = h.Subscribe("", 2, {});
  EXPECT_EQ(w.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_TRUE(h.Subscribe("", 1, {}).ok());
}

TEST(HistoryTest, MaxWatchersAndCloseWatches) {
  History h(NewMemLog(10), Opts(10, 16, /*max_watchers=*/2));
  std::atomic<int> notified{0};
  std::unique_ptr<Watch> w1 = MustWatch(h, "", std::nullopt, [&] { ++notified; });
  std::unique_ptr<Watch> w2 = MustWatch(h, "", std::nullopt);
  EXPECT_EQ(h.Subscribe("", std::nullopt, {}).status().code(),
            absl::StatusCode::kResourceExhausted);
  w2.reset();  // a destroyed watch frees its place
  std::unique_ptr<Watch> w3 = MustWatch(h, "", std::nullopt);
  h.CloseWatches();
  EXPECT_TRUE(w1->closed());
  EXPECT_TRUE(w3->closed());
  EXPECT_EQ(notified.load(), 1);
  EXPECT_EQ(h.Subscribe("", std::nullopt, {}).status().code(),
            absl::StatusCode::kUnavailable);
}

TEST(HistoryTest, SlowWatcherGetsAGapAndCanRefetchItFromTheLog) {
  History h(NewMemLog(100), Opts(100, 16, 8, /*watch_queue=*/2));
  std::unique_ptr<Watch> w = MustWatch(h, "", std::nullopt);
  for (int i = 0; i < 6; ++i) ASSERT_TRUE(h.Add(Make("a", i)).ok());
  EXPECT_THAT(Drain(*w), ElementsAre("a1", "a2", "gap 3-6"));
  // The gap's first sequence - 1 is the cursor that fetches what it skipped.
  std::unique_ptr<Watch> again = MustWatch(h, "", 2);
  EXPECT_THAT(Drain(*again), ElementsAre("a3", "a4", "a5", "a6"));
}

// A watcher subscribes with a cursor while writers add: replay and live
// join with no gap and no duplicate, whatever the interleaving.
TEST(HistoryTest, ResumeWhileAddingHasNoGapOrDuplicate) {
  const unsigned seed = std::random_device{}();
  std::printf("seed %u\n", seed);
  std::mt19937 rng(seed);
  for (int round = 0; round < 20; ++round) {
    History h(NewMemLog(10000), Opts(10000, 16, 8, /*watch_queue=*/10000));
    constexpr int kWriters = 2;
    constexpr int kEach = 300;
    std::vector<std::thread> writers;
    for (int t = 0; t < kWriters; ++t) {
      writers.emplace_back([&h, t] {
        for (int i = 0; i < kEach; ++i) (void)h.Add(Make(absl::StrCat("m", t), i));
      });
    }
    // Subscribe at some point during the writes, from some cursor.
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 2000));
    const uint64_t last = h.log().LastSequence();
    const uint64_t after = last == 0 ? 0 : rng() % (last + 1);
    std::unique_ptr<Watch> w = MustWatch(h, "", after);
    for (std::thread& t : writers) t.join();
    std::vector<std::string> got = Drain(*w);
    std::vector<std::string> want;
    for (uint64_t s = after + 1; s <= kWriters * kEach; ++s) {
      want.push_back(absl::StrCat((*h.log().Read(s - 1, s, 1))[0]->model_id(), s));
    }
    ASSERT_EQ(got, want) << "round " << round << " after " << after;
  }
}

// Writers, readers and notify-driven watchers (subscribing and leaving) all
// at once; then shutdown. Every watcher's stream increases, and every
// reader sees increasing sequence numbers per model.
TEST(HistoryTest, ConcurrentWritersReadersAndWatchers) {
  const unsigned seed = std::random_device{}();
  std::printf("seed %u\n", seed);
  History h(NewMemLog(512), Opts(64, 8, /*max_watchers=*/8, /*watch_queue=*/32));
  std::atomic<bool> stop{false};
  std::atomic<int> bad{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 3; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; !stop.load(); ++i) (void)h.Add(Make(absl::StrCat("m", t), i));
    });
  }
  threads.emplace_back([&] {
    while (!stop.load()) {
      for (const MeasurementIndex::ModelState& s : h.index().Models()) {
        absl::StatusOr<std::vector<Entry>> es = h.index().Get(s.model_id, 0);
        if (!es.ok()) continue;
        for (size_t i = 1; i < es->size(); ++i) {
          if ((*es)[i]->sequence() <= (*es)[i - 1]->sequence()) ++bad;
        }
      }
    }
  });
  for (int c = 0; c < 4; ++c) {
    threads.emplace_back([&, c] {
      std::mt19937 rng(seed + c);
      while (!stop.load()) {
        absl::Mutex mu;
        bool ready = false;
        const uint64_t last = h.log().LastSequence();
        std::optional<uint64_t> after;
        if (rng() % 2) after = last - std::min<uint64_t>(last, rng() % 600);
        absl::StatusOr<std::unique_ptr<Watch>> w = h.Subscribe(
            c % 2 ? "m1" : "", after, [&] {
              absl::MutexLock lock(&mu);
              ready = true;
            });
        if (!w.ok()) continue;  // max_watchers or closed
        uint64_t prev = 0;
        for (int events = 0; events < 200 && !(*w)->closed();) {
          absl::StatusOr<std::optional<BusEvent>> e = (*w)->Next();
          if (!e.ok()) { ++bad; break; }
          if (!e->has_value()) {
            absl::MutexLock lock(&mu);
            mu.AwaitWithTimeout(absl::Condition(&ready), absl::Milliseconds(10));
            ready = false;
            continue;
          }
          ++events;
          uint64_t first, last_seq;
          if (const auto* m = std::get_if<Entry>(&**e)) {
            first = last_seq = (*m)->sequence();
            if (c % 2 && (*m)->model_id() != "m1") ++bad;
          } else {
            first = std::get<GapMarker>(**e).first_sequence;
            last_seq = std::get<GapMarker>(**e).last_sequence;
          }
          if (first <= prev || last_seq < first) ++bad;
          prev = last_seq;
        }
      }
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  h.CloseWatches();
  stop = true;
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(bad.load(), 0);
  EXPECT_GT(h.log().LastSequence(), 0u);
}

}  // namespace
}  // namespace rvd

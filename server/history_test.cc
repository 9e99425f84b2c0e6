#include "server/history.h"

#include <atomic>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace rvd {
namespace {

rvd::v1::Measurement Make(const std::string& model, int64_t step) {
  rvd::v1::Measurement m;
  m.set_model_id(model);
  m.set_step(step);
  m.set_rv(0.5 + 1e-6 * static_cast<double>(step));
  return m;
}

std::vector<int64_t> Steps(const std::vector<rvd::v1::Measurement>& ms) {
  std::vector<int64_t> steps;
  for (const auto& m : ms) steps.push_back(m.step());
  return steps;
}

// The steps first..last inclusive.
std::vector<int64_t> Range(int64_t first, int64_t last) {
  std::vector<int64_t> r;
  for (int64_t s = first; s <= last; ++s) r.push_back(s);
  return r;
}

TEST(MeasurementRingTest, Empty) {
  MeasurementRing ring(4);
  EXPECT_EQ(ring.size(), 0u);
  EXPECT_EQ(ring.capacity(), 4u);
  EXPECT_EQ(ring.Latest(), nullptr);
  EXPECT_TRUE(ring.Newest(0).empty());
  EXPECT_TRUE(ring.Newest(3).empty());
}

TEST(MeasurementRingTest, ZeroCapacityIsOne) {
  MeasurementRing ring(0);
  EXPECT_EQ(ring.capacity(), 1u);
  ring.Push(Make("m", 1));
  ring.Push(Make("m", 2));
  EXPECT_EQ(Steps(ring.Newest(0)), std::vector<int64_t>({2}));
}

TEST(MeasurementRingTest, CapacityOne) {
  MeasurementRing ring(1);
  for (int64_t s = 1; s <= 50; ++s) {
    ring.Push(Make("m", s));
    ASSERT_EQ(ring.size(), 1u);
    ASSERT_NE(ring.Latest(), nullptr);
    EXPECT_EQ(ring.Latest()->step(), s);
    EXPECT_EQ(Steps(ring.Newest(0)), std::vector<int64_t>({s}));
    EXPECT_EQ(Steps(ring.Newest(1)), std::vector<int64_t>({s}));
    EXPECT_EQ(Steps(ring.Newest(7)), std::vector<int64_t>({s}));
  }
  EXPECT_EQ(ring.total_pushed(), 50u);
}

// After every push, for every capacity and every limit, the ring holds
// exactly the newest min(pushed, capacity) steps in order.
TEST(MeasurementRingTest, WrapsAroundManyTimes) {
  for (size_t capacity : {2u, 3u, 5u, 8u, 13u}) {
    MeasurementRing ring(capacity);
    const int64_t pushes = static_cast<int64_t>(capacity) * 11 + 3;
    for (int64_t s = 1; s <= pushes; ++s) {
      ring.Push(Make("m", s));
      const size_t kept = std::min<size_t>(s, capacity);
      ASSERT_EQ(ring.size(), kept);
      ASSERT_EQ(ring.Latest()->step(), s);
      ASSERT_EQ(Steps(ring.Newest(0)),
                Range(s - static_cast<int64_t>(kept) + 1, s))
          << "capacity " << capacity << " step " << s;
      for (size_t limit = 1; limit <= capacity + 2; ++limit) {
        const size_t n = std::min(limit, kept);
        ASSERT_EQ(Steps(ring.Newest(limit)),
                  Range(s - static_cast<int64_t>(n) + 1, s))
            << "capacity " << capacity << " step " << s << " limit " << limit;
      }
    }
  }
}

TEST(MeasurementRingTest, OverwrittenSlotsHoldNewContent) {
  MeasurementRing ring(2);
  rvd::v1::Measurement big = Make("m", 1);
  for (int i = 0; i < 10; ++i) big.add_warnings("w");
  ring.Push(big);
  ring.Push(Make("m", 2));
  ring.Push(Make("m", 3));  // overwrites the slot of step 1
  auto all = ring.Newest(0);
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0].step(), 2);
  EXPECT_EQ(all[1].step(), 3);
  EXPECT_EQ(all[1].warnings_size(), 0);
}

TEST(HistoryTest, GetUnknownIsNotFound) {
  History h(10, 10);
  auto got = h.Get("nope", 0);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(h.Latest("nope").has_value());
  EXPECT_TRUE(h.Models().empty());
}

TEST(HistoryTest, EmptyModelIdIsRejected) {
  History h(10, 10);
  EXPECT_EQ(h.Add(Make("", 1)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(h.Models().empty());
}

TEST(HistoryTest, AddGetLatest) {
  History h(3, 10);
  for (int64_t s = 1; s <= 5; ++s) ASSERT_TRUE(h.Add(Make("a", s)).ok());
  ASSERT_TRUE(h.Add(Make("b", 100)).ok());
  auto a = h.Get("a", 0);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(Steps(*a), std::vector<int64_t>({3, 4, 5}));
  EXPECT_EQ(Steps(*h.Get("a", 2)), std::vector<int64_t>({4, 5}));
  EXPECT_EQ(Steps(*h.Get("a", 99)), std::vector<int64_t>({3, 4, 5}));
  EXPECT_EQ(h.Latest("a")->step(), 5);
  EXPECT_EQ(h.Latest("b")->step(), 100);
}

TEST(HistoryTest, ModelsSortedWithCountsAndLatest) {
  History h(4, 10);
  for (int64_t s = 1; s <= 6; ++s) ASSERT_TRUE(h.Add(Make("zeta", s)).ok());
  ASSERT_TRUE(h.Add(Make("alpha", 7)).ok());
  ASSERT_TRUE(h.Add(Make("mid", 8)).ok());
  ASSERT_TRUE(h.Add(Make("mid", 9)).ok());
  auto models = h.Models();
  ASSERT_EQ(models.size(), 3u);
  EXPECT_EQ(models[0].model_id(), "alpha");
  EXPECT_EQ(models[0].measurements(), 1u);
  EXPECT_EQ(models[0].latest().step(), 7);
  EXPECT_EQ(models[1].model_id(), "mid");
  EXPECT_EQ(models[1].measurements(), 2u);
  EXPECT_EQ(models[1].latest().step(), 9);
  EXPECT_EQ(models[2].model_id(), "zeta");
  EXPECT_EQ(models[2].measurements(), 4u);  // capacity
  EXPECT_EQ(models[2].latest().step(), 6);
  EXPECT_EQ(models[2].latest().model_id(), "zeta");
}

TEST(HistoryTest, MaxModelsRefusesNewModelsOnly) {
  History h(5, 2);
  ASSERT_TRUE(h.Add(Make("a", 1)).ok());
  ASSERT_TRUE(h.Add(Make("b", 1)).ok());
  absl::Status s = h.Add(Make("c", 1));
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("c"));
  EXPECT_TRUE(h.Add(Make("a", 2)).ok());  // known models still accepted
  EXPECT_TRUE(h.Add(Make("b", 2)).ok());
  EXPECT_EQ(h.Models().size(), 2u);
  EXPECT_EQ(h.Get("c", 0).status().code(), absl::StatusCode::kNotFound);
}

TEST(SubscriptionTest, NextTimesOut) {
  Subscription sub("m");
  const absl::Time start = absl::Now();
  EXPECT_FALSE(sub.Next(absl::Milliseconds(20)).has_value());
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(15));
  EXPECT_FALSE(sub.closed());
}

TEST(SubscriptionTest, BoundedQueueDropsOldest) {
  Subscription sub("", 4);
  for (int64_t s = 1; s <= 10; ++s) sub.Push(Make("m", s));
  EXPECT_EQ(sub.dropped(), 6u);
  std::vector<int64_t> got;
  while (auto m = sub.Next(absl::ZeroDuration())) got.push_back(m->step());
  EXPECT_EQ(got, std::vector<int64_t>({7, 8, 9, 10}));
}

TEST(SubscriptionTest, DefaultQueueIsBounded) {
  Subscription sub("");
  const size_t n = Subscription::kDefaultMaxQueued + 100;
  for (size_t s = 1; s <= n; ++s) sub.Push(Make("m", s));
  EXPECT_EQ(sub.dropped(), 100u);
  auto first = sub.Next(absl::ZeroDuration());
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->step(), 101);
}

TEST(SubscriptionTest, CloseWakesAWaiter) {
  Subscription sub("m");
  std::atomic<bool> returned{false};
  std::thread waiter([&] {
    EXPECT_FALSE(sub.Next(absl::Seconds(30)).has_value());
    returned = true;
  });
  absl::SleepFor(absl::Milliseconds(20));
  EXPECT_FALSE(returned.load());
  const absl::Time start = absl::Now();
  sub.Close();
  waiter.join();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_TRUE(sub.closed());
  sub.Push(Make("m", 1));  // ignored after Close
  EXPECT_FALSE(sub.Next(absl::ZeroDuration()).has_value());
}

TEST(HistoryTest, WatchersSeeTheirModels) {
  History h(10, 10);
  auto all = h.Subscribe("");
  auto only_a = h.Subscribe("a");
  auto only_c = h.Subscribe("c");
  ASSERT_TRUE(h.Add(Make("a", 1)).ok());
  ASSERT_TRUE(h.Add(Make("b", 2)).ok());
  ASSERT_TRUE(h.Add(Make("a", 3)).ok());

  std::vector<std::string> seen;
  while (auto m = all->Next(absl::ZeroDuration())) {
    seen.push_back(absl::StrCat(m->model_id(), m->step()));
  }
  EXPECT_EQ(seen, std::vector<std::string>({"a1", "b2", "a3"}));
  seen.clear();
  while (auto m = only_a->Next(absl::ZeroDuration())) {
    seen.push_back(absl::StrCat(m->model_id(), m->step()));
  }
  EXPECT_EQ(seen, std::vector<std::string>({"a1", "a3"}));
  EXPECT_FALSE(only_c->Next(absl::Milliseconds(5)).has_value());
  EXPECT_FALSE(only_c->closed());
}

TEST(HistoryTest, WatcherOnlySeesLaterMeasurements) {
  History h(10, 10);
  ASSERT_TRUE(h.Add(Make("a", 1)).ok());
  auto sub = h.Subscribe("a");
  EXPECT_FALSE(sub->Next(absl::ZeroDuration()).has_value());
  ASSERT_TRUE(h.Add(Make("a", 2)).ok());
  auto m = sub->Next(absl::ZeroDuration());
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->step(), 2);
}

TEST(HistoryTest, UnsubscribeStopsAndCloses) {
  History h(10, 10);
  auto sub = h.Subscribe("a");
  EXPECT_EQ(h.num_subscriptions(), 1u);
  h.Unsubscribe(sub);
  h.Unsubscribe(sub);  // twice is harmless
  h.Unsubscribe(nullptr);
  EXPECT_EQ(h.num_subscriptions(), 0u);
  EXPECT_TRUE(sub->closed());
  ASSERT_TRUE(h.Add(Make("a", 1)).ok());
  EXPECT_FALSE(sub->Next(absl::ZeroDuration()).has_value());
}

TEST(HistoryTest, CloseAllWakesWatchersAndLaterSubscriptionsAreClosed) {
  History h(10, 10);
  std::vector<std::shared_ptr<Subscription>> subs;
  for (const char* id : {"", "a", "b"}) subs.push_back(h.Subscribe(id));
  std::vector<std::thread> waiters;
  std::atomic<int> woke{0};
  for (auto& sub : subs) {
    waiters.emplace_back([&woke, sub] {
      while (!sub->closed()) sub->Next(absl::Seconds(30));
      ++woke;
    });
  }
  absl::SleepFor(absl::Milliseconds(20));
  h.CloseAllSubscriptions();
  for (auto& t : waiters) t.join();
  EXPECT_EQ(woke.load(), 3);
  EXPECT_EQ(h.num_subscriptions(), 0u);
  auto late = h.Subscribe("a");
  EXPECT_TRUE(late->closed());
  EXPECT_TRUE(h.Add(Make("a", 1)).ok());  // history still works
}

// Several writers, readers and watchers at once. Invariants checked:
//  - every Add succeeds and the final counts are exact;
//  - each model's history is always strictly increasing in step, and its
//    newest entry never goes backwards between reads;
//  - a watcher sees each model's measurements in step order, and only those
//    it asked for; what it did not see is exactly what dropped() counts;
//  - when the watcher's queue cannot overflow (kWriters * kPerWriter <=
//    kDefaultMaxQueued) it sees every measurement, however slow it runs.
void RunConcurrently(const int kPerWriter) {
  constexpr int kWriters = 4;
  constexpr size_t kCapacity = 64;
  const bool must_be_complete = static_cast<size_t>(kWriters * kPerWriter) <=
                                Subscription::kDefaultMaxQueued;
  History h(kCapacity, 100);

  // Default-sized (bounded) queues: a watcher that falls behind loses the
  // oldest entries, which dropped() accounts for below.
  auto only_w1 = h.Subscribe("w1");
  auto all_public = h.Subscribe("");

  std::atomic<bool> writers_done{false};
  std::atomic<int> reader_failures{0};

  auto drain = [&](std::shared_ptr<Subscription> sub,
                   std::map<std::string, std::vector<int64_t>>* out) {
    while (true) {
      auto m = sub->Next(absl::Milliseconds(50));
      if (m.has_value()) {
        (*out)[m->model_id()].push_back(m->step());
      } else if (writers_done.load() || sub->closed()) {
        // One more non-blocking pass so nothing queued is left behind.
        while (auto rest = sub->Next(absl::ZeroDuration())) {
          (*out)[rest->model_id()].push_back(rest->step());
        }
        return;
      }
    }
  };
  std::map<std::string, std::vector<int64_t>> seen_all, seen_w1;
  std::thread watcher_all(drain, all_public, &seen_all);
  std::thread watcher_w1(drain, only_w1, &seen_w1);

  std::vector<std::thread> readers;
  for (int r = 0; r < 2; ++r) {
    readers.emplace_back([&, r] {
      std::map<std::string, int64_t> last_latest;
      while (!writers_done.load()) {
        for (int w = 0; w < kWriters; ++w) {
          const std::string id = absl::StrCat("w", w);
          auto got = h.Get(id, r == 0 ? 0 : 10);
          if (!got.ok()) continue;  // not written yet
          if (got->empty() || got->size() > kCapacity) ++reader_failures;
          for (size_t i = 1; i < got->size(); ++i) {
            if ((*got)[i].step() <= (*got)[i - 1].step()) ++reader_failures;
          }
          auto latest = h.Latest(id);
          if (!latest.has_value() || latest->step() < last_latest[id]) {
            ++reader_failures;
          } else {
            last_latest[id] = latest->step();
          }
        }
        for (const auto& s : h.Models()) {
          if (s.measurements() == 0 || s.measurements() > kCapacity) {
            ++reader_failures;
          }
        }
      }
    });
  }

  std::vector<std::thread> writers;
  std::atomic<int> add_failures{0};
  for (int w = 0; w < kWriters; ++w) {
    writers.emplace_back([&, w] {
      const std::string id = absl::StrCat("w", w);
      for (int s = 1; s <= kPerWriter; ++s) {
        if (!h.Add(Make(id, s)).ok()) ++add_failures;
      }
    });
  }
  for (auto& t : writers) t.join();
  writers_done = true;
  for (auto& t : readers) t.join();
  watcher_all.join();
  watcher_w1.join();

  EXPECT_EQ(add_failures.load(), 0);
  EXPECT_EQ(reader_failures.load(), 0);

  auto models = h.Models();
  ASSERT_EQ(models.size(), static_cast<size_t>(kWriters));
  for (int w = 0; w < kWriters; ++w) {
    const std::string id = absl::StrCat("w", w);
    EXPECT_EQ(models[w].model_id(), id);
    EXPECT_EQ(models[w].measurements(), kCapacity);
    EXPECT_EQ(models[w].latest().step(), kPerWriter);
    EXPECT_EQ(
        Steps(*h.Get(id, 0)),
        Range(kPerWriter - static_cast<int64_t>(kCapacity) + 1, kPerWriter));
  }

  // The watchers: in order per model; complete unless their bounded queue
  // overflowed, in which case the loss is accounted for in dropped().
  auto check_watcher =
      [&](const std::shared_ptr<Subscription>& sub,
          const std::map<std::string, std::vector<int64_t>>& seen,
          size_t expected_models) {
        uint64_t total = 0;
        for (const auto& [id, steps] : seen) {
          total += steps.size();
          for (size_t i = 1; i < steps.size(); ++i) {
            ASSERT_LT(steps[i - 1], steps[i]) << id;
          }
        }
        EXPECT_EQ(total + sub->dropped(), expected_models * kPerWriter);
        if (must_be_complete) EXPECT_EQ(sub->dropped(), 0u);
        if (sub->dropped() == 0) {
          EXPECT_EQ(seen.size(), expected_models);
          for (const auto& [id, steps] : seen) {
            EXPECT_EQ(steps, Range(1, kPerWriter)) << id;
          }
        }
      };
  check_watcher(all_public, seen_all, kWriters);
  check_watcher(only_w1, seen_w1, 1);
  for (const auto& [id, steps] : seen_w1) EXPECT_EQ(id, "w1");
}

TEST(HistoryTest, ConcurrentWritersReadersAndWatchers) {
  for (int round = 0; round < 10; ++round) {
    SCOPED_TRACE(absl::StrCat("round ", round));
    RunConcurrently(/*per_writer=*/250);  // 1000 <= the watchers' queue bound
  }
}

TEST(HistoryTest, ConcurrentWatchersMayFallBehindButNeverGrowUnbounded) {
  RunConcurrently(/*per_writer=*/3000);
}

}  // namespace
}  // namespace rvd

#include "server/event_bus.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace rvd {
namespace {

using Entry = MeasurementLog::Entry;
using Reason = GapMarker::Reason;

Entry Make(const std::string& model, uint64_t sequence) {
  auto m = std::make_shared<rvd::v1::Measurement>();
  m->set_model_id(model);
  m->set_sequence(sequence);
  return m;
}

// The events of a subscription as text: "5" for measurement 5, "gap 6-9/4"
// for a gap of 4 missed between 6 and 9.
std::vector<std::string> Drain(BusSubscription& sub) {
  std::vector<std::string> out;
  while (std::optional<BusEvent> e = sub.Pop()) {
    if (const auto* m = std::get_if<Entry>(&*e)) {
      out.push_back(absl::StrCat((*m)->sequence()));
    } else {
      const GapMarker& g = std::get<GapMarker>(*e);
      EXPECT_EQ(g.reason, Reason::kSlowConsumer);
      out.push_back(absl::StrCat("gap ", g.first_sequence, "-", g.last_sequence,
                                 "/", g.missed));
    }
  }
  return out;
}

std::shared_ptr<BusSubscription> MustSubscribe(EventBus& bus,
                                               const std::string& model,
                                               std::function<void()> notify = {}) {
  absl::StatusOr<std::shared_ptr<BusSubscription>> sub =
      bus.Subscribe(model, std::move(notify));
  EXPECT_TRUE(sub.ok()) << sub.status();
  return sub.ok() ? *sub : nullptr;
}

TEST(EventBusTest, DeliversInOrderToMatchingSubscribers) {
  EventBus bus({/*max_queued=*/16, /*max_subscribers=*/4});
  auto all = MustSubscribe(bus, "");
  auto a = MustSubscribe(bus, "a");
  bus.Publish(Make("a", 1));
  bus.Publish(Make("b", 2));
  bus.Publish(Make("a", 3));
  EXPECT_THAT(Drain(*all), ::testing::ElementsAre("1", "2", "3"));
  EXPECT_THAT(Drain(*a), ::testing::ElementsAre("1", "3"));
  EXPECT_EQ(bus.gap_entries_total(), 0u);
}

TEST(EventBusTest, SubscriberSeesOnlyLaterEntries) {
  EventBus bus({16, 4});
  bus.Publish(Make("a", 1));
  auto sub = MustSubscribe(bus, "");
  bus.Publish(Make("a", 2));
  EXPECT_THAT(Drain(*sub), ::testing::ElementsAre("2"));
}

// A full queue turns the overflow into one gap marker with the first and
// last missed sequence numbers and their count, never a silent drop.
TEST(EventBusTest, FullQueueQueuesAGapMarker) {
  EventBus bus({/*max_queued=*/3, 4});
  auto sub = MustSubscribe(bus, "");
  for (uint64_t s = 1; s <= 10; ++s) bus.Publish(Make("a", s));
  EXPECT_EQ(sub->queued(), 3u);
  EXPECT_EQ(sub->missed(), 7u);
  EXPECT_EQ(bus.gap_entries_total(), 7u);
  EXPECT_THAT(Drain(*sub), ::testing::ElementsAre("1", "2", "3", "gap 4-10/7"));
  // Drained: later entries are queued again.
  bus.Publish(Make("a", 11));
  EXPECT_THAT(Drain(*sub), ::testing::ElementsAre("11"));
}

// Gaps sit where the entries were missed: a freed slot takes the next entry
// after the gap, and a new overflow opens a new gap after it.
TEST(EventBusTest, GapsKeepTheirPlaceInTheStream) {
  EventBus bus({/*max_queued=*/2, 4});
  auto sub = MustSubscribe(bus, "");
  for (uint64_t s = 1; s <= 5; ++s) bus.Publish(Make("a", s));  // 1 2 gap3-5
  ASSERT_TRUE(sub->Pop().has_value());                           // 1 out
  bus.Publish(Make("a", 6));                                     // 6 queued
  bus.Publish(Make("a", 7));                                     // full again
  bus.Publish(Make("a", 8));
  EXPECT_THAT(Drain(*sub),
              ::testing::ElementsAre("2", "gap 3-5/3", "6", "gap 7-8/2"));
  EXPECT_EQ(sub->missed(), 5u);
}

// A filtered subscriber's gap counts its model's entries only: first and
// last are that model's sequence numbers.
TEST(EventBusTest, GapsCountOnlyMatchingEntries) {
  EventBus bus({/*max_queued=*/1, 4});
  auto a = MustSubscribe(bus, "a");
  bus.Publish(Make("a", 1));
  bus.Publish(Make("b", 2));
  bus.Publish(Make("a", 3));
  bus.Publish(Make("b", 4));
  bus.Publish(Make("a", 5));
  bus.Publish(Make("b", 6));
  EXPECT_THAT(Drain(*a), ::testing::ElementsAre("1", "gap 3-5/2"));
  EXPECT_EQ(bus.gap_entries_total(), 2u);
}

TEST(EventBusTest, MaxSubscribers) {
  EventBus bus({16, /*max_subscribers=*/2});
  auto s1 = MustSubscribe(bus, "");
  auto s2 = MustSubscribe(bus, "a");
  absl::StatusOr<std::shared_ptr<BusSubscription>> s3 = bus.Subscribe("", {});
  ASSERT_FALSE(s3.ok());
  EXPECT_EQ(s3.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(s3.status().message(), ::testing::HasSubstr("max_watchers"));
  EXPECT_EQ(bus.num_subscribers(), 2u);
  bus.Unsubscribe(s1);
  bus.Unsubscribe(s1);  // twice is fine
  EXPECT_EQ(bus.num_subscribers(), 1u);
  EXPECT_TRUE(bus.Subscribe("", {}).ok());

  EventBus none({16, /*max_subscribers=*/0});
  EXPECT_EQ(none.Subscribe("", {}).status().code(),
            absl::StatusCode::kResourceExhausted);
}

TEST(EventBusTest, NotifyRunsPerQueuedEventAndStopsAtUnsubscribe) {
  EventBus bus({/*max_queued=*/1, 4});
  std::atomic<int> calls{0};
  auto sub = MustSubscribe(bus, "a", [&calls] { ++calls; });
  bus.Publish(Make("b", 1));  // not for it
  EXPECT_EQ(calls.load(), 0);
  bus.Publish(Make("a", 2));
  bus.Publish(Make("a", 3));  // into a gap: still worth a wake-up
  EXPECT_EQ(calls.load(), 2);
  bus.Unsubscribe(sub);
  EXPECT_TRUE(sub->closed());
  bus.Publish(Make("a", 4));
  bus.Close();
  EXPECT_EQ(calls.load(), 2);
}

// When Unsubscribe returns, a notify that was running has finished: the
// owner may then destroy what the callback uses.
TEST(EventBusTest, UnsubscribeWaitsForARunningNotify) {
  EventBus bus({16, 4});
  std::atomic<bool> in_callback{false};
  std::atomic<bool> finished{false};
  auto sub = MustSubscribe(bus, "", [&] {
    in_callback = true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    finished = true;
  });
  std::thread publisher([&] { bus.Publish(Make("a", 1)); });
  while (!in_callback.load()) std::this_thread::yield();
  bus.Unsubscribe(sub);
  EXPECT_TRUE(finished.load());
  publisher.join();
}

TEST(EventBusTest, CloseNotifiesKeepsQueuedEventsAndRefusesNewSubscribers) {
  EventBus bus({16, 4});
  std::atomic<int> calls{0};
  auto sub = MustSubscribe(bus, "", [&calls] { ++calls; });
  bus.Publish(Make("a", 1));
  bus.Close();
  EXPECT_TRUE(sub->closed());
  EXPECT_EQ(calls.load(), 2);  // the publish and the close
  EXPECT_THAT(Drain(*sub), ::testing::ElementsAre("1"));
  bus.Publish(Make("a", 2));  // closed: not queued
  EXPECT_TRUE(Drain(*sub).empty());
  EXPECT_EQ(bus.Subscribe("", {}).status().code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(bus.num_subscribers(), 1u);  // until its owner unsubscribes
  bus.Unsubscribe(sub);
  EXPECT_EQ(bus.num_subscribers(), 0u);
}

// One publisher, consumers of every speed subscribed throughout, and a
// thread that subscribes and unsubscribes all the while. Each consumer's
// stream is increasing, its gaps sit between what it received, and
// delivered + missed accounts for every entry it wanted.
TEST(EventBusTest, ConcurrentPublishAndConsume) {
  const unsigned seed = std::random_device{}();
  std::printf("seed %u\n", seed);
  constexpr uint64_t kEntries = 20000;
  constexpr int kConsumers = 4;
  EventBus bus({/*max_queued=*/64, /*max_subscribers=*/kConsumers + 1});
  std::vector<std::shared_ptr<BusSubscription>> subs;
  for (int c = 0; c < kConsumers; ++c) {
    subs.push_back(MustSubscribe(bus, c % 2 ? "a" : ""));
  }
  std::atomic<bool> published{false};
  std::atomic<int> bad{0};
  std::vector<uint64_t> delivered(kConsumers, 0), missed(kConsumers, 0);
  std::vector<std::thread> threads;
  for (int c = 0; c < kConsumers; ++c) {
    threads.emplace_back([&, c] {
      std::mt19937 rng(seed + c);
      uint64_t last = 0;
      auto consume = [&](const BusEvent& e) {
        if (const auto* m = std::get_if<Entry>(&e)) {
          if ((*m)->sequence() <= last) ++bad;
          if (c % 2 && (*m)->model_id() != "a") ++bad;
          last = (*m)->sequence();
          ++delivered[c];
        } else {
          const GapMarker& g = std::get<GapMarker>(e);
          if (g.first_sequence <= last || g.last_sequence < g.first_sequence ||
              g.missed == 0 || g.missed > g.last_sequence - g.first_sequence + 1) {
            ++bad;
          }
          last = g.last_sequence;
          missed[c] += g.missed;
        }
      };
      while (true) {
        const bool was_published = published.load();
        std::optional<BusEvent> e = subs[c]->Pop();
        if (e.has_value()) {
          consume(*e);
          // Consumers 0 and 1 are slow: they fall behind and get gaps.
          if (c < 2 && rng() % 64 == 0) {
            std::this_thread::sleep_for(std::chrono::microseconds(200));
          }
        } else if (was_published) {
          break;
        } else {
          std::this_thread::yield();
        }
      }
    });
  }
  std::atomic<uint64_t> churn_missed{0};
  threads.emplace_back([&] {  // churn
    while (!published.load()) {
      absl::StatusOr<std::shared_ptr<BusSubscription>> s = bus.Subscribe("b", {});
      if (s.ok()) {
        (void)(*s)->Pop();
        bus.Unsubscribe(*s);
        churn_missed += (*s)->missed();  // final: nothing reaches it now
      }
    }
  });
  uint64_t a_entries = 0;
  for (uint64_t s = 1; s <= kEntries; ++s) {
    const bool is_a = s % 3 != 0;
    a_entries += is_a;
    bus.Publish(Make(is_a ? "a" : "b", s));
  }
  published = true;
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(bad.load(), 0);
  uint64_t total_missed = 0;
  for (int c = 0; c < kConsumers; ++c) {
    EXPECT_EQ(delivered[c] + missed[c], c % 2 ? a_entries : kEntries)
        << "consumer " << c;
    EXPECT_EQ(missed[c], subs[c]->missed());
    total_missed += missed[c];
  }
  EXPECT_EQ(bus.gap_entries_total(), total_missed + churn_missed.load());
  std::printf("missed by consumer: %llu %llu %llu %llu\n",
              (unsigned long long)missed[0], (unsigned long long)missed[1],
              (unsigned long long)missed[2], (unsigned long long)missed[3]);
}

}  // namespace
}  // namespace rvd

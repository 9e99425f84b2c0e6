#include "server/compute_pool.h"

#include <atomic>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace rvd {
namespace {

using ::testing::HasSubstr;

// Occupies every worker of `pool` until `release` is notified.
std::vector<std::thread> Occupy(ComputePool& pool, int workers,
                                absl::Notification& release) {
  std::vector<std::thread> threads;
  std::atomic<int> started{0};
  for (int i = 0; i < workers; ++i) {
    threads.emplace_back([&] {
      EXPECT_TRUE(pool.Run([&] {
                    ++started;
                    release.WaitForNotification();
                  }).ok());
    });
  }
  while (started < workers) absl::SleepFor(absl::Milliseconds(1));
  return threads;
}

TEST(ComputePoolTest, RunsEveryJobAndCountsWaits) {
  ComputePool pool(2, 64);
  std::atomic<int> ran{0};
  std::vector<std::thread> callers;
  for (int i = 0; i < 16; ++i) {
    callers.emplace_back([&] { EXPECT_TRUE(pool.Run([&] { ++ran; }).ok()); });
  }
  for (std::thread& t : callers) t.join();
  EXPECT_EQ(ran, 16);
  const ComputePoolStats s = pool.Stats();
  EXPECT_EQ(s.waits_total, 16);
  EXPECT_EQ(s.rejected_total, 0);
  EXPECT_EQ(s.queued, 0);
  EXPECT_EQ(s.running, 0);
  EXPECT_GE(s.wait_seconds_total, 0);
}

TEST(ComputePoolTest, QueuedJobsWaitForAWorkerInsteadOfFailing) {
  ComputePool pool(1, 4);
  absl::Notification release;
  std::vector<std::thread> busy = Occupy(pool, 1, release);
  std::atomic<int> ran{0};
  std::vector<std::thread> waiting;
  for (int i = 0; i < 4; ++i) {
    waiting.emplace_back([&] { EXPECT_TRUE(pool.Run([&] { ++ran; }).ok()); });
  }
  while (pool.Stats().queued < 4) absl::SleepFor(absl::Milliseconds(1));
  EXPECT_EQ(pool.Stats().running, 1);
  // The queue is full: the next job is refused at once, naming the limit.
  absl::Status full = pool.Run([&] { ++ran; });
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(full.message(), HasSubstr("queue is full"));
  absl::SleepFor(absl::Milliseconds(100));
  release.Notify();
  for (std::thread& t : busy) t.join();
  for (std::thread& t : waiting) t.join();
  EXPECT_EQ(ran, 4);
  const ComputePoolStats s = pool.Stats();
  EXPECT_EQ(s.rejected_total, 1);
  EXPECT_EQ(s.waits_total, 5);
  EXPECT_GE(s.wait_seconds_total, 4 * 0.1);
}

TEST(ComputePoolTest, DeadlineWhileQueuedRefusesWithoutRunning) {
  ComputePool pool(1, 4);
  absl::Notification release;
  std::vector<std::thread> busy = Occupy(pool, 1, release);
  bool ran = false;
  const absl::Time start = absl::Now();
  absl::Status s =
      pool.Run([&] { ran = true; }, start + absl::Milliseconds(200));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(200));
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  release.Notify();
  for (std::thread& t : busy) t.join();
  EXPECT_FALSE(ran);
  EXPECT_EQ(pool.Stats().queued, 0);
  EXPECT_EQ(pool.Stats().rejected_total, 1);
  // A job whose deadline has passed before it is queued never runs either.
  s = pool.Run([&] { ran = true; }, absl::Now() - absl::Seconds(1));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_FALSE(ran);
}

TEST(ComputePoolTest, CancelledCallerLeavesTheQueue) {
  ComputePool pool(1, 4);
  absl::Notification release;
  std::vector<std::thread> busy = Occupy(pool, 1, release);
  std::atomic<bool> cancel{false};
  bool ran = false;
  absl::Status s;
  std::thread caller([&] {
    s = pool.Run([&] { ran = true; }, absl::InfiniteFuture(),
                 [&] { return cancel.load(); });
  });
  while (pool.Stats().queued < 1) absl::SleepFor(absl::Milliseconds(1));
  cancel = true;
  caller.join();  // within kCancelPoll, with the worker still busy
  EXPECT_EQ(s.code(), absl::StatusCode::kCancelled) << s;
  EXPECT_EQ(pool.Stats().queued, 0);
  release.Notify();
  for (std::thread& t : busy) t.join();
  EXPECT_FALSE(ran);
}

TEST(ComputePoolTest, RunHereIfIdleRunsOnTheCallerWhileAWorkerIsFree) {
  ComputePool pool(1, 4);
  std::thread::id ran_on;
  ASSERT_TRUE(pool.RunHereIfIdle([&] { ran_on = std::this_thread::get_id(); }).ok());
  EXPECT_EQ(ran_on, std::this_thread::get_id());
  EXPECT_EQ(pool.Stats().waits_total, 1);
  EXPECT_EQ(pool.Stats().running, 0);
}

TEST(ComputePoolTest, RunHereIfIdleQueuesWhenEveryWorkerIsBusy) {
  ComputePool pool(1, 4);
  absl::Notification release;
  std::vector<std::thread> busy = Occupy(pool, 1, release);
  std::thread::id caller_id, ran_on;
  std::thread caller([&] {
    caller_id = std::this_thread::get_id();
    EXPECT_TRUE(pool.RunHereIfIdle([&] { ran_on = std::this_thread::get_id(); }).ok());
  });
  while (pool.Stats().queued < 1) absl::SleepFor(absl::Milliseconds(1));
  release.Notify();
  caller.join();
  for (std::thread& t : busy) t.join();
  EXPECT_NE(ran_on, caller_id);  // a worker's
}

TEST(ComputePoolTest, AJobOnItsCallerTakesAWorkersPlace) {
  // One worker: while a job runs on its caller, a queued job waits, so
  // never more jobs run at once than there are workers.
  ComputePool pool(1, 4);
  absl::Notification started, release;
  std::thread here([&] {
    EXPECT_TRUE(pool.RunHereIfIdle([&] {
                  started.Notify();
                  release.WaitForNotification();
                }).ok());
  });
  started.WaitForNotification();
  std::atomic<bool> ran{false};
  std::thread queued([&] { EXPECT_TRUE(pool.Run([&] { ran = true; }).ok()); });
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (pool.Stats().queued < 1 && !ran && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_FALSE(ran);
  EXPECT_EQ(pool.Stats().running, 1);
  release.Notify();
  here.join();
  queued.join();
  EXPECT_TRUE(ran);
}

}  // namespace
}  // namespace rvd

// Health follows the engine: an engine that reports itself lost turns
// serving off exactly once, and the watch thread notices within its period.
#include "server/engine_health.h"

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "server/fake_engine.h"

namespace rvd {
namespace {

void SetLost(FakeEngine& engine) {
  absl::MutexLock lock(&engine.mu);
  engine.stats.healthy = false;
  engine.stats.unhealthy_reason = "cudaErrorIllegalAddress at kernels.cu:1";
}

TEST(EngineHealthWatch, TurnsServingOffOnceWhenTheEngineIsLost) {
  FakeEngine engine;
  int calls = 0;
  bool serving = true;
  EngineHealthWatch watch(engine, [&](bool s) { ++calls, serving = s; }, absl::ZeroDuration());
  EXPECT_TRUE(watch.CheckNow());
  EXPECT_EQ(calls, 0);
  SetLost(engine);
  EXPECT_FALSE(watch.CheckNow());
  EXPECT_FALSE(watch.CheckNow());
  EXPECT_EQ(calls, 1);
  EXPECT_FALSE(serving);
  EXPECT_EQ(watch.reason(), "cudaErrorIllegalAddress at kernels.cu:1");
}

TEST(EngineHealthWatch, ItsThreadNoticesWithinThePeriod) {
  FakeEngine engine;
  absl::Notification off;
  EngineHealthWatch watch(engine, [&](bool) { off.Notify(); }, absl::Milliseconds(10));
  EXPECT_FALSE(off.WaitForNotificationWithTimeout(absl::Milliseconds(50)));
  SetLost(engine);
  EXPECT_TRUE(off.WaitForNotificationWithTimeout(absl::Seconds(5)));
}

}  // namespace
}  // namespace rvd

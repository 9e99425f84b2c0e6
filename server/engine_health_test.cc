// Health follows the engine: an engine that reports itself lost turns
// serving off exactly once, and the watch thread notices within its period.
#include "server/engine_health.h"

#include <atomic>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace rvd {
namespace {

// An engine whose health the test sets.
class FakeEngine : public Engine {
 public:
  std::string Backend() const override { return "fake"; }
  std::string Version() const override { return "fake-1"; }
  std::string DefaultVariant() const override { return "algebraic"; }
  absl::Status ComputePR(absl::Span<const MatrixView>, const VariantSpec&,
                         absl::Span<double>) override {
    return absl::UnavailableError("lost");
  }
  std::map<std::string, int64_t> ServedCounts() const override { return {}; }
  EngineStats Stats() const override {
    EngineStats s;
    s.healthy = healthy;
    s.unhealthy_reason = healthy ? "" : "cudaErrorIllegalAddress at kernels.cu:1";
    return s;
  }
  std::atomic<bool> healthy{true};
};

TEST(EngineHealthWatch, TurnsServingOffOnceWhenTheEngineIsLost) {
  FakeEngine engine;
  int calls = 0;
  bool serving = true;
  EngineHealthWatch watch(engine, [&](bool s) { ++calls, serving = s; }, absl::ZeroDuration());
  EXPECT_TRUE(watch.CheckNow());
  EXPECT_EQ(calls, 0);
  engine.healthy = false;
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
  engine.healthy = false;
  EXPECT_TRUE(off.WaitForNotificationWithTimeout(absl::Seconds(5)));
}

}  // namespace
}  // namespace rvd

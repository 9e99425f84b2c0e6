// The live trigger policy, step for step (live_trigger.h).
#include "server/live_trigger.h"

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace rvd {
namespace {

// Runs `steps` through a trigger; a check is measured when `exceeds(step)`.
// Returns "step:reason" for every step measured and "step:-" for checks
// not measured, skips left out.
std::vector<std::string> RunSteps(const TriggerConfig& config, const std::vector<int64_t>& steps,
                                  const std::vector<int64_t>& forced,
                                  bool (*exceeds)(int64_t step)) {
  Trigger t(config);
  std::vector<std::string> out;
  for (int64_t s : steps) {
    const bool force = std::find(forced.begin(), forced.end(), s) != forced.end();
    const TriggerDecision d = t.Decide(s, force);
    switch (d.action) {
      case TriggerAction::kSkip:
        EXPECT_STREQ(d.reason, "skipped");
        break;
      case TriggerAction::kInference:
        out.push_back(std::to_string(s) + ":inference");
        break;
      case TriggerAction::kMeasure:
        t.Measured(s);
        out.push_back(std::to_string(s) + ":" + d.reason);
        break;
      case TriggerAction::kCheck:
        EXPECT_STREQ(d.reason, "adaptive_check");
        if (exceeds(s)) {
          t.Measured(s);
          out.push_back(std::to_string(s) + ":adaptive");
        } else {
          out.push_back(std::to_string(s) + ":-");
        }
        break;
    }
  }
  return out;
}

std::vector<int64_t> Range(int64_t first, int64_t last) {
  std::vector<int64_t> v;
  for (int64_t s = first; s <= last; ++s) v.push_back(s);
  return v;
}

bool Never(int64_t) { return false; }

TEST(LiveTrigger, IntervalCountsFromTheLastMeasuredStep) {
  TriggerConfig c;
  c.interval = 5;
  EXPECT_EQ(RunSteps(c, Range(3, 20), {}, Never),
            (std::vector<std::string>{"3:first", "8:interval", "13:interval", "18:interval"}));
}

TEST(LiveTrigger, SparseStepsTakeTheFirstDueOne) {
  TriggerConfig c;
  c.interval = 10;
  // 0 first; 7 and 9 are not due; 12 is (>= 10 after 0); then 22, not 20.
  EXPECT_EQ(RunSteps(c, {0, 7, 9, 12, 20, 21, 22, 40}, {}, Never),
            (std::vector<std::string>{"0:first", "12:interval", "22:interval", "40:interval"}));
}

TEST(LiveTrigger, ForcedRestartsTheInterval) {
  TriggerConfig c;
  c.interval = 4;
  EXPECT_EQ(RunSteps(c, Range(1, 12), {3}, Never),
            (std::vector<std::string>{"1:first", "3:forced", "7:interval", "11:interval"}));
}

TEST(LiveTrigger, IntervalOneMeasuresEveryStep) {
  TriggerConfig c;
  c.interval = 1;
  EXPECT_EQ(RunSteps(c, Range(1, 4), {}, Never),
            (std::vector<std::string>{"1:first", "2:interval", "3:interval", "4:interval"}));
}

bool ExceedsAt6And7(int64_t s) { return s == 6 || s == 7; }

TEST(LiveTrigger, AdaptiveChecksEveryStepBetweenIntervals) {
  TriggerConfig c;
  c.interval = 5;
  c.adaptive = true;
  // 6 and 7 exceed: each is measured and moves the interval: 12, not 11.
  EXPECT_EQ(RunSteps(c, Range(1, 13), {}, ExceedsAt6And7),
            (std::vector<std::string>{"1:first", "2:-", "3:-", "4:-", "5:-", "6:interval",
                                      "7:adaptive", "8:-", "9:-", "10:-", "11:-",
                                      "12:interval", "13:-"}));
}

TEST(LiveTrigger, InferenceAnswersFromRegistrationUnlessForced) {
  TriggerConfig c;
  c.inference = true;
  EXPECT_EQ(RunSteps(c, {1, 2, 3}, {2}, Never),
            (std::vector<std::string>{"1:inference", "2:forced", "3:inference"}));
}

TEST(LiveTrigger, ResetMakesTheNextStepFirst) {
  TriggerConfig c;
  c.interval = 100;
  Trigger t(c);
  t.Measured(5);
  EXPECT_EQ(t.Decide(6, false).action, TriggerAction::kSkip);
  t.Reset();
  EXPECT_STREQ(t.Decide(7, false).reason, "first");
}

TEST(LiveTrigger, ExceedsIsTheRelativeFrobeniusDelta) {
  TriggerConfig c;
  c.adaptive = true;
  c.threshold = 0.01;
  Trigger t(c);
  // ||dW|| / ||W|| = sqrt(delta_sq / last_sq).
  EXPECT_FALSE(t.Exceeds(0.99e-4, 1.0));   // 0.00995
  EXPECT_FALSE(t.Exceeds(1e-4, 1.0));      // exactly 0.01: not above
  EXPECT_TRUE(t.Exceeds(1.02e-4, 1.0));    // 0.0101
  EXPECT_TRUE(t.Exceeds(4.1e-4 * 9, 9.0));  // scale-free
  EXPECT_FALSE(t.Exceeds(0, 0));           // all zeros, unchanged
  EXPECT_TRUE(t.Exceeds(1e-30, 0));        // all zeros, changed
}

TEST(LiveTrigger, FromProtoDefaultsAndErrors) {
  rvd::v1::TriggerPolicy p;
  absl::StatusOr<TriggerConfig> c = TriggerConfigFromProto(p);
  ASSERT_TRUE(c.ok());
  EXPECT_FALSE(c->inference);
  EXPECT_EQ(c->interval, 100u);
  EXPECT_DOUBLE_EQ(c->threshold, 0.01);
  p.set_mode(rvd::v1::TriggerPolicy::MODE_INFERENCE);
  p.set_measurement_interval(7);
  p.set_delta_threshold(0.5);
  p.set_adaptive(true);
  c = TriggerConfigFromProto(p);
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE(c->inference);
  EXPECT_EQ(c->interval, 7u);
  EXPECT_TRUE(c->adaptive);
  EXPECT_DOUBLE_EQ(c->threshold, 0.5);
  for (double bad : {-0.1, std::nan(""), std::numeric_limits<double>::infinity()}) {
    p.set_delta_threshold(bad);
    EXPECT_EQ(TriggerConfigFromProto(p).status().code(), absl::StatusCode::kInvalidArgument)
        << bad;
  }
  p.set_delta_threshold(0);
  p.set_mode(static_cast<rvd::v1::TriggerPolicy::Mode>(9));
  EXPECT_EQ(TriggerConfigFromProto(p).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace rvd

// GroupSteps: a step measured only once every rank notified it; a rank that
// is late, moves on, restarts or is gone ends the step with its name.
#include "server/group_steps.h"

#include "gtest/gtest.h"

namespace rvd {
namespace {

using Kind = GroupSteps::Outcome::Kind;
const absl::Time t0 = absl::FromUnixSeconds(1000);

std::vector<GroupSteps::Outcome> Ok(absl::StatusOr<std::vector<GroupSteps::Outcome>> r) {
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : std::vector<GroupSteps::Outcome>{};
}

TEST(GroupStepsTest, CompleteWhenEveryRankNotified) {
  GroupSteps g(3, absl::Seconds(5));
  EXPECT_TRUE(Ok(g.Notify(0, 1, 10, t0)).empty());
  EXPECT_TRUE(Ok(g.Notify(2, 1, 10, t0)).empty());
  EXPECT_EQ(g.pending(), 1u);
  const auto done = Ok(g.Notify(1, 1, 10, t0 + absl::Seconds(1)));
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].kind, Kind::kComplete);
  EXPECT_EQ(done[0].step, 10);
  EXPECT_EQ(g.pending(), 0u);
}

TEST(GroupStepsTest, OneRankGroupCompletesAtOnce) {
  GroupSteps g(1, absl::Seconds(5));
  const auto done = Ok(g.Notify(0, 7, 1, t0));
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].kind, Kind::kComplete);
}

TEST(GroupStepsTest, ALateRankTimesOutNamingIt) {
  GroupSteps g(3, absl::Seconds(5));
  Ok(g.Notify(0, 1, 10, t0));
  Ok(g.Notify(1, 1, 10, t0 + absl::Seconds(2)));
  EXPECT_TRUE(g.Expire(t0 + absl::Seconds(4)).empty());  // the first notification's clock
  const auto failed = g.Expire(t0 + absl::Seconds(5));
  ASSERT_EQ(failed.size(), 1u);
  EXPECT_EQ(failed[0].kind, Kind::kFailed);
  EXPECT_EQ(failed[0].missing, std::vector<int>{2});
  EXPECT_NE(failed[0].why.find("timed out"), std::string::npos) << failed[0].why;
  EXPECT_EQ(g.pending(), 0u);
  // The late rank's notification now opens a new wait; it does not revive the step.
  EXPECT_TRUE(Ok(g.Notify(2, 1, 10, t0 + absl::Seconds(6))).empty());
}

TEST(GroupStepsTest, ARankThatMovesOnFailsTheStepsItSkipped) {
  GroupSteps g(2, absl::Seconds(5));
  Ok(g.Notify(0, 1, 10, t0));
  Ok(g.Notify(0, 1, 11, t0));
  // Rank 1 jumps to 11: step 10 can no longer complete, 11 does.
  const auto ended = Ok(g.Notify(1, 1, 11, t0));
  ASSERT_EQ(ended.size(), 2u);
  EXPECT_EQ(ended[0].step, 10);
  EXPECT_EQ(ended[0].kind, Kind::kFailed);
  EXPECT_EQ(ended[0].missing, std::vector<int>{1});
  EXPECT_NE(ended[0].why.find("moved on"), std::string::npos);
  EXPECT_EQ(ended[1].step, 11);
  EXPECT_EQ(ended[1].kind, Kind::kComplete);
}

TEST(GroupStepsTest, ARestartedRankVoidsWhatItsOldIncarnationNotified) {
  GroupSteps g(2, absl::Seconds(5));
  Ok(g.Notify(0, 1, 20, t0));
  // Rank 0 restarts (incarnation 2) and resumes from an earlier step.
  const auto ended = Ok(g.Notify(0, 2, 15, t0));
  ASSERT_EQ(ended.size(), 1u);
  EXPECT_EQ(ended[0].step, 20);
  EXPECT_EQ(ended[0].kind, Kind::kFailed);
  EXPECT_NE(ended[0].why.find("restarted"), std::string::npos);
  const auto done = Ok(g.Notify(1, 1, 15, t0));
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].kind, Kind::kComplete);
  EXPECT_EQ(done[0].step, 15);
}

TEST(GroupStepsTest, RefusesBadNotifications) {
  GroupSteps g(2, absl::Seconds(5));
  EXPECT_EQ(g.Notify(2, 1, 1, t0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(g.Notify(-1, 1, 1, t0).status().code(), absl::StatusCode::kInvalidArgument);
  Ok(g.Notify(0, 1, 5, t0));
  EXPECT_EQ(g.Notify(0, 1, 5, t0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(g.Notify(0, 1, 4, t0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(g.pending(), 1u);  // a refused notification changes nothing
}

TEST(GroupStepsTest, PendingStepsAreBounded) {
  GroupSteps g(2, absl::Hours(1));
  std::vector<GroupSteps::Outcome> ended;
  for (int s = 1; s <= GroupSteps::kMaxPendingSteps + 1; ++s) ended = Ok(g.Notify(0, 1, s, t0));
  ASSERT_EQ(ended.size(), 1u);
  EXPECT_EQ(ended[0].step, 1);
  EXPECT_NE(ended[0].why.find("pending"), std::string::npos);
  EXPECT_EQ(g.pending(), static_cast<size_t>(GroupSteps::kMaxPendingSteps));
}

}  // namespace
}  // namespace rvd

// GroupStats and GroupMetrics: each rank's series under its group and rank
// label, outcomes counted by name, the last step and its time, and the
// bound on the (group, rank) entries held.
#include "server/group_metrics.h"

#include <map>
#include <string>

#include "gtest/gtest.h"

namespace rvd {
namespace {

rvd::v1::ShardGroup Group(const std::string& id, uint32_t rank, uint32_t world) {
  rvd::v1::ShardGroup g;
  g.set_group_id(id);
  g.set_rank(rank);
  g.set_world_size(world);
  return g;
}

// name{labels...} -> value, labels as "k=v,k=v" in the order collected.
std::map<std::string, double> Samples(const GroupMetrics& metrics) {
  std::map<std::string, double> out;
  for (const prometheus::MetricFamily& f : metrics.Collect()) {
    for (const prometheus::ClientMetric& m : f.metric) {
      std::string key = f.name + "{";
      for (const auto& l : m.label) key += l.name + "=" + l.value + ",";
      key += "}";
      out[key] = f.type == prometheus::MetricType::Counter ? m.counter.value : m.gauge.value;
    }
  }
  return out;
}

TEST(GroupMetricsTest, AnRvdThatWasNeverARankShowsNothing) {
  GroupStats stats;
  GroupMetrics metrics(&stats);
  EXPECT_TRUE(metrics.Collect().empty());
}

TEST(GroupMetricsTest, EachRankItsOwnSeries) {
  GroupStats stats;
  GroupMetrics metrics(&stats);
  stats.Record(Group("g-a", 1, 4), 10, absl::OkStatus(), absl::Milliseconds(250));
  stats.Record(Group("g-a", 1, 4), 11, absl::DeadlineExceededError("missing rank(s) 3"),
               absl::Seconds(30));
  stats.Record(Group("g-a", 1, 4), 12, absl::OkStatus(), absl::Milliseconds(125));
  stats.Record(Group("g-b", 0, 2), 5, absl::FailedPreconditionError("do not tile"),
               absl::Milliseconds(3));
  const std::map<std::string, double> s = Samples(metrics);
  EXPECT_EQ(s.at("rvd_group_steps_total{group_id=g-a,outcome=ok,rank=1,}"), 2);
  EXPECT_EQ(s.at("rvd_group_steps_total{group_id=g-a,outcome=deadline_exceeded,rank=1,}"), 1);
  EXPECT_EQ(s.at("rvd_group_steps_total{group_id=g-b,outcome=failed_precondition,rank=0,}"), 1);
  EXPECT_EQ(s.at("rvd_group_last_step{group_id=g-a,rank=1,}"), 12);
  EXPECT_DOUBLE_EQ(s.at("rvd_group_step_seconds{group_id=g-a,rank=1,}"), 0.125);
  EXPECT_EQ(s.at("rvd_group_world_size{group_id=g-a,rank=1,}"), 4);
  EXPECT_EQ(s.at("rvd_group_world_size{group_id=g-b,rank=0,}"), 2);
  EXPECT_EQ(s.size(), 3u + 3u * 2u);
}

TEST(GroupMetricsTest, TheLeastRecentlyActiveIsForgottenFirst) {
  GroupStats stats;
  for (size_t i = 0; i < kMaxGroupRanksShown; ++i) {
    stats.Record(Group("g-" + std::to_string(i), 0, 1), 1, absl::OkStatus(), absl::Seconds(1));
  }
  // g-0 is active again, so g-1 is now the least recently active.
  stats.Record(Group("g-0", 0, 1), 2, absl::OkStatus(), absl::Seconds(1));
  stats.Record(Group("g-new", 0, 1), 1, absl::OkStatus(), absl::Seconds(1));
  const std::vector<GroupStats::Rank> held = stats.Snapshot();
  ASSERT_EQ(held.size(), kMaxGroupRanksShown);
  std::map<std::string, int64_t> last;
  for (const auto& r : held) last[r.group_id] = r.last_step;
  EXPECT_EQ(last.count("g-1"), 0u);
  EXPECT_EQ(last.at("g-0"), 2);
  EXPECT_EQ(last.count("g-new"), 1u);
}

}  // namespace
}  // namespace rvd

#include "server/group_metrics.h"

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "server/metric_family.h"

namespace rvd {

std::string GroupOutcomeName(const absl::Status& s) {
  if (s.ok()) return "ok";
  return absl::AsciiStrToLower(absl::StatusCodeToString(s.code()));
}

void GroupStats::Record(const rvd::v1::ShardGroup& group, int64_t step,
                        const absl::Status& outcome, absl::Duration took) {
  absl::MutexLock lock(&mu_);
  Rank& r = ranks_[{group.group_id(), group.rank()}];
  r.group_id = group.group_id();
  r.rank = group.rank();
  r.world_size = group.world_size();
  r.last_step = step;
  r.last_step_seconds = absl::ToDoubleSeconds(took);
  ++r.steps[GroupOutcomeName(outcome)];
  r.last_active = ++clock_;
  if (ranks_.size() > kMaxGroupRanksShown) {
    auto oldest = ranks_.begin();
    for (auto it = ranks_.begin(); it != ranks_.end(); ++it) {
      if (it->second.last_active < oldest->second.last_active) oldest = it;
    }
    ranks_.erase(oldest);
  }
}

std::vector<GroupStats::Rank> GroupStats::Snapshot() const {
  absl::MutexLock lock(&mu_);
  std::vector<Rank> out;
  out.reserve(ranks_.size());
  for (const auto& [key, r] : ranks_) out.push_back(r);
  return out;
}

std::vector<prometheus::MetricFamily> GroupMetrics::Collect() const {
  using prometheus::MetricType;
  prometheus::MetricFamily steps = NewFamily(
      "rvd_group_steps_total", "This rank's group measurements of sharded models, by outcome",
      MetricType::Counter);
  prometheus::MetricFamily last = NewFamily(
      "rvd_group_last_step", "The last step this rank took part in", MetricType::Gauge);
  prometheus::MetricFamily seconds = NewFamily(
      "rvd_group_step_seconds",
      "The last step's time on this rank, its request received to the group's answer",
      MetricType::Gauge);
  prometheus::MetricFamily world = NewFamily("rvd_group_world_size", "Ranks in the group",
                                             MetricType::Gauge);
  for (const GroupStats::Rank& r : stats_->Snapshot()) {
    const std::string rank = absl::StrCat(r.rank);
    for (const auto& [outcome, n] : r.steps) {
      AddSample(steps, {{"group_id", r.group_id}, {"rank", rank}, {"outcome", outcome}},
                static_cast<double>(n));
    }
    AddSample(last, {{"group_id", r.group_id}, {"rank", rank}}, static_cast<double>(r.last_step));
    AddSample(seconds, {{"group_id", r.group_id}, {"rank", rank}}, r.last_step_seconds);
    AddSample(world, {{"group_id", r.group_id}, {"rank", rank}},
              static_cast<double>(r.world_size));
  }
  // Families go out only with samples (as metrics.cc's): an rvd that was
  // never a rank shows none of them.
  std::vector<prometheus::MetricFamily> out;
  for (prometheus::MetricFamily* f : {&steps, &last, &seconds, &world}) {
    if (!f->metric.empty()) out.push_back(std::move(*f));
  }
  return out;
}

}  // namespace rvd

// /metrics for this rvd's part in sharded models' groups (issue 18,
// server/shard_group.h): what it did as a rank, each series labelled with
// the group and the rank, so that a group's instances can be told apart on
// a dashboard wherever they run. The group's own result (rvd_rv,
// rvd_participation_ratio) is exported by the coordinator, as any model's.
//
//   rvd_group_steps_total{group_id,rank,outcome}  counter, this rank's group
//                                                 measurements by outcome:
//                                                 ok, or the failure's
//                                                 status code (deadline_
//                                                 exceeded, unavailable, ...)
//   rvd_group_last_step{group_id,rank}            gauge, the last step this
//                                                 rank took part in
//   rvd_group_step_seconds{group_id,rank}         gauge, that step's time
//                                                 here: the rank's request
//                                                 received to the group's
//                                                 answer
//   rvd_group_world_size{group_id,rank}           gauge, ranks in the group
//
// GroupStats holds at most kMaxGroupRanksShown (group, rank) entries; the
// least recently active is forgotten first, so series of groups long gone
// do not pile up. Thread-safe.
#ifndef RVD_SERVER_GROUP_METRICS_H_
#define RVD_SERVER_GROUP_METRICS_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"
#include "rvd/v1/rvd.pb.h"

namespace rvd {

inline constexpr size_t kMaxGroupRanksShown = 64;

class GroupStats {
 public:
  struct Rank {
    std::string group_id;
    uint32_t rank = 0;
    uint32_t world_size = 0;
    int64_t last_step = 0;
    double last_step_seconds = 0;
    std::map<std::string, int64_t> steps;  // by outcome
    uint64_t last_active = 0;              // order of the last Record
  };

  // One group measurement of `group`'s rank at `step`, ended with `outcome`
  // after `took`.
  void Record(const rvd::v1::ShardGroup& group, int64_t step, const absl::Status& outcome,
              absl::Duration took);
  // The (group, rank) entries held, by group id then rank.
  std::vector<Rank> Snapshot() const;

 private:
  mutable absl::Mutex mu_;
  std::map<std::pair<std::string, uint32_t>, Rank> ranks_ ABSL_GUARDED_BY(mu_);
  uint64_t clock_ ABSL_GUARDED_BY(mu_) = 0;
};

// "ok", or the status code's name in lower case ("deadline_exceeded").
std::string GroupOutcomeName(const absl::Status& s);

class GroupMetrics final : public prometheus::Collectable {
 public:
  // `stats` must outlive this and every scrape of it.
  explicit GroupMetrics(const GroupStats* stats) : stats_(stats) {}
  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  const GroupStats* stats_;
};

}  // namespace rvd

#endif  // RVD_SERVER_GROUP_METRICS_H_

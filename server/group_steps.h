// When a sharded model's group measurement may run (issue 18): one rvd
// instance per rank holds its shards, and a step is measured as a group
// only once every rank has notified it. The group's coordinator keeps one
// GroupSteps per group and feeds it the notifications of its peers.
//
// The rules, each a reason a step ends:
// - complete: every rank of the world notified the step.
// - a rank moved on: a rank notified a later step without this one; it
//   cannot come back for it (its snapshot is gone), so the step fails at
//   once, naming the rank.
// - a rank restarted: a new incarnation of a rank fails the pending steps
//   its old incarnation had notified.
// - timeout: `timeout` after a step's first notification (Expire).
// - too many pending: more than kMaxPendingSteps open at once fails the
//   oldest.
// A failure never hangs a rank: its answer names the missing ranks.
//
// Thread-compatible: the caller serializes calls (the coordinator holds
// its group's lock).
#ifndef RVD_SERVER_GROUP_STEPS_H_
#define RVD_SERVER_GROUP_STEPS_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace rvd {

class GroupSteps {
 public:
  static constexpr int kMaxPendingSteps = 16;

  struct Outcome {
    enum class Kind { kComplete, kFailed };
    Kind kind = Kind::kComplete;
    int64_t step = 0;
    std::vector<int> missing;  // kFailed: the ranks that had not notified
    std::string why;           // kFailed: for the log and the status
  };

  // world >= 1 ranks; timeout > 0.
  GroupSteps(int world, absl::Duration timeout);

  // Rank `rank`, in its incarnation `incarnation` (any number that changes
  // when the rank's process restarts), notified `step`. Returns the steps
  // this ended, complete or failed, oldest first. INVALID_ARGUMENT for a
  // rank outside the world or a step not above the rank's last one in the
  // same incarnation (nothing changes then).
  absl::StatusOr<std::vector<Outcome>> Notify(int rank, uint64_t incarnation, int64_t step,
                                              absl::Time now);

  // The pending steps whose timeout has passed, failed, oldest first.
  std::vector<Outcome> Expire(absl::Time now);

  // Steps waiting for ranks now.
  size_t pending() const { return pending_.size(); }

 private:
  struct Pending {
    absl::Time deadline;
    std::map<int, uint64_t> notified;  // rank -> incarnation that notified
  };
  struct Rank {
    bool seen = false;
    uint64_t incarnation = 0;
    int64_t last_step = 0;
  };

  Outcome Fail(int64_t step, const Pending& p, std::string why) const;

  const int world_;
  const absl::Duration timeout_;
  std::vector<Rank> ranks_;
  std::map<int64_t, Pending> pending_;  // by step
};

}  // namespace rvd

#endif  // RVD_SERVER_GROUP_STEPS_H_

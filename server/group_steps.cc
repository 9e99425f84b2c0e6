#include "server/group_steps.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace rvd {

GroupSteps::GroupSteps(int world, absl::Duration timeout)
    : world_(world), timeout_(timeout), ranks_(static_cast<size_t>(world > 0 ? world : 0)) {}

GroupSteps::Outcome GroupSteps::Fail(int64_t step, const Pending& p, std::string why) const {
  Outcome o;
  o.kind = Outcome::Kind::kFailed;
  o.step = step;
  for (int r = 0; r < world_; ++r) {
    if (p.notified.count(r) == 0) o.missing.push_back(r);
  }
  o.why = absl::StrCat("step ", step, ": ", why, "; missing rank(s) ",
                       absl::StrJoin(o.missing, ","));
  return o;
}

absl::StatusOr<std::vector<GroupSteps::Outcome>> GroupSteps::Notify(int rank,
                                                                     uint64_t incarnation,
                                                                     int64_t step,
                                                                     absl::Time now) {
  if (rank < 0 || rank >= world_) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " outside a group of ", world_, " ranks"));
  }
  Rank& r = ranks_[static_cast<size_t>(rank)];
  const bool restarted = r.seen && r.incarnation != incarnation;
  if (r.seen && !restarted && step <= r.last_step) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", rank, " notified step ", step, " after step ", r.last_step,
        ": steps must increase"));
  }
  std::vector<Outcome> ended;
  // A restart voids what the old incarnation notified; moving on voids the
  // steps below this one that the rank never notified.
  for (auto it = pending_.begin(); it != pending_.end();) {
    auto mine = it->second.notified.find(rank);
    std::string why;
    if (restarted && mine != it->second.notified.end() && mine->second != incarnation) {
      why = absl::StrCat("rank ", rank, " restarted");
      it->second.notified.erase(mine);
    } else if (it->first < step && mine == it->second.notified.end()) {
      why = absl::StrCat("rank ", rank, " moved on to step ", step);
    }
    if (why.empty()) {
      ++it;
      continue;
    }
    ended.push_back(Fail(it->first, it->second, why));
    it = pending_.erase(it);
  }
  r.seen = true;
  r.incarnation = incarnation;
  r.last_step = step;

  auto [it, opened] = pending_.try_emplace(step);
  if (opened) it->second.deadline = now + timeout_;
  it->second.notified[rank] = incarnation;
  if (it->second.notified.size() == static_cast<size_t>(world_)) {
    Outcome done;
    done.step = step;
    ended.push_back(std::move(done));
    pending_.erase(it);
  }
  while (pending_.size() > static_cast<size_t>(kMaxPendingSteps)) {
    ended.push_back(Fail(pending_.begin()->first, pending_.begin()->second,
                         absl::StrCat("more than ", kMaxPendingSteps, " steps pending")));
    pending_.erase(pending_.begin());
  }
  std::stable_sort(ended.begin(), ended.end(),
                   [](const Outcome& a, const Outcome& b) { return a.step < b.step; });
  return ended;
}

std::vector<GroupSteps::Outcome> GroupSteps::Expire(absl::Time now) {
  std::vector<Outcome> ended;
  for (auto it = pending_.begin(); it != pending_.end();) {
    if (it->second.deadline > now) {
      ++it;
      continue;
    }
    ended.push_back(Fail(it->first, it->second,
                         absl::StrCat("timed out after ", absl::FormatDuration(timeout_))));
    it = pending_.erase(it);
  }
  return ended;
}

}  // namespace rvd

// /metrics for the checkpoint watcher: a prometheus::Collectable that reads
// the watcher's counters at scrape time, registered beside Metrics when the
// config has a watch section (without one these families do not exist).
//
//   rvd_checkpoint_watch_measured_total   counter, checkpoints measured
//   rvd_checkpoint_watch_failed_total     counter, checkpoints whose read or
//                                         measurement failed (tried again
//                                         when their files change)
//   rvd_checkpoint_watch_pending          gauge, checkpoints found and not
//                                         measured yet (written, settling,
//                                         or failed), at the last look
//   rvd_checkpoint_watch_directories      gauge, directories the globs
//                                         matched at the last look
//   rvd_checkpoint_watch_last_look_timestamp_seconds
//                                         gauge, when the last look ended
//                                         (a stale one: the watcher is stuck)
#ifndef RVD_SERVER_WATCH_METRICS_H_
#define RVD_SERVER_WATCH_METRICS_H_

#include <vector>

#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"
#include "server/checkpoint_watcher.h"

namespace rvd {

class WatchMetrics final : public prometheus::Collectable {
 public:
  // `watcher` must outlive this and every scrape of it.
  explicit WatchMetrics(const CheckpointWatcher* watcher) : watcher_(watcher) {}
  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  const CheckpointWatcher* watcher_;
};

}  // namespace rvd

#endif  // RVD_SERVER_WATCH_METRICS_H_

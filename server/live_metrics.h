// /metrics for live models: a prometheus::Collectable that reads the live
// registry's state and counters at scrape time (server/live_registry.h),
// registered beside Metrics as watch_metrics.h is.
//
//   rvd_live_models                         gauge, live models registered
//   rvd_live_segments_mapped                gauge, producer segments mapped
//                                           (one per producer and segment)
//   rvd_live_notifications_total{outcome}   counter, NotifyStep calls by
//                                           outcome: skipped, inference,
//                                           forced, first, interval,
//                                           adaptive_check, busy, error
//   rvd_live_snapshots_total                counter, snapshots taken
//   rvd_live_snapshot_seconds               histogram, notification to the
//                                           snapshot's copy finished
//   rvd_live_measurement_seconds            histogram, notification to its
//                                           measurement computed
//   rvd_live_measurements_total             counter, live measurements
//                                           recorded
//   rvd_live_releases_total{reason}         counter, models released:
//                                           unregister, replaced,
//                                           producer_exit, lease, shutdown
#ifndef RVD_SERVER_LIVE_METRICS_H_
#define RVD_SERVER_LIVE_METRICS_H_

#include <vector>

#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"
#include "server/live_registry.h"

namespace rvd {

class LiveMetrics final : public prometheus::Collectable {
 public:
  // `registry` must outlive this and every scrape of it.
  explicit LiveMetrics(const LiveRegistry* registry) : registry_(registry) {}
  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  const LiveRegistry* registry_;
};

}  // namespace rvd

#endif  // RVD_SERVER_LIVE_METRICS_H_

// /metrics for the tuning jobs: a prometheus::Collectable that reads the
// job manager's counts at scrape time, registered beside Metrics when this
// rvd can run tuning jobs (on the CPU engine these families do not exist).
//
//   rvd_tuning_iterations_total              counter, iterations run since start
//   rvd_tuning_candidates_total{verdict}     counter, candidates by verdict
//                                            (accepted, slower, incorrect, ...)
//   rvd_tuning_best_seconds{job}             gauge, each held job's best kernel
//                                            time over its target's shapes
//                                            (bounded by the jobs held)
#ifndef RVD_SERVER_TUNE_METRICS_H_
#define RVD_SERVER_TUNE_METRICS_H_

#include <vector>

#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"
#include "self_improve/job_manager.h"

namespace rvd {

class TuneMetrics final : public prometheus::Collectable {
 public:
  // `jobs` must outlive this and every scrape of it.
  explicit TuneMetrics(const tune::JobManager* jobs) : jobs_(jobs) {}
  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  const tune::JobManager* jobs_;
};

}  // namespace rvd

#endif  // RVD_SERVER_TUNE_METRICS_H_

// rvd's Prometheus metrics (prometheus-cpp). Families are built once; the
// per-model gauges are cached so the hot path does no registry lookups.
// Thread-safe.
#ifndef RVD_SERVER_METRICS_H_
#define RVD_SERVER_METRICS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "prometheus/counter.h"
#include "prometheus/exposer.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "rvd/v1/rvd.pb.h"

namespace rvd {

struct MetricsOptions {
  bool per_head = false;             // export rvd_participation_ratio_head
  double rv_alert_threshold = 0.0;   // > 0: export rvd_rv_below_threshold
  std::string version;               // rvd_build_info{version}
  std::string backend;               // rvd_build_info{backend}
  std::string engine_version;        // rvd_build_info{engine_version}
};

class Metrics {
 public:
  explicit Metrics(const MetricsOptions& options);

  // Sets rvd_rv, rvd_participation_ratio(_head), counts the measurement and
  // observes its duration.
  void RecordMeasurement(const rvd::v1::Measurement& m);
  // rvd_ingested_bytes_total
  void AddIngestedBytes(uint64_t bytes);
  // rvd_errors_total{code}, code as the gRPC code name, e.g. INVALID_ARGUMENT.
  void RecordError(const std::string& code);
  // rvd_inflight_requests
  void SetInflight(int64_t n);

  std::shared_ptr<prometheus::Registry> registry() { return registry_; }

 private:
  // ... the implementation decides the members.
};

// Serves `registry` at http://address/metrics. Errors (bad address, port in
// use) are returned, not thrown.
absl::StatusOr<std::unique_ptr<prometheus::Exposer>> StartExposer(
    const std::string& address, std::shared_ptr<prometheus::Registry> registry);

}  // namespace rvd

#endif  // RVD_SERVER_METRICS_H_

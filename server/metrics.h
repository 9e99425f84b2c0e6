// rvd's Prometheus metrics (prometheus-cpp). Families are built once; the
// per-model gauges are cached so the hot path does no registry lookups.
// Thread-safe: any thread may call any member.
//
// Exported (every family has a help string):
//   rvd_rv{model_id}                              gauge, latest R_V
//   rvd_participation_ratio{model_id,layer}       gauge, latest PR per layer
//   rvd_participation_ratio_head{model_id,layer,head}
//                                                 gauge, only if per_head
//   rvd_measurements_total{model_id,variant,backend}  counter
//   rvd_measurement_duration_seconds{variant,backend} histogram, engine time
//   rvd_ingested_bytes_total                      counter, tensor bytes read
//   rvd_errors_total{code}                        counter, by gRPC code name
//   rvd_inflight_requests                         gauge
//   rvd_build_info{version,backend,engine_version}  gauge, always 1
//   rvd_last_measurement_timestamp_seconds{model_id}  gauge, Unix time
//   rvd_rv_alert_threshold                        gauge, only if threshold > 0
//   rvd_rv_below_threshold{model_id}              gauge 0/1, only if
//                                                 threshold > 0
//
// A measurement without rv (an early or late layer had PR 0) removes the
// model's rvd_rv and rvd_rv_below_threshold series (Family::Remove) instead
// of leaving the previous value, so a dashboard or alert never shows a stale
// R_V as if it were current; they come back with the next measurement that
// has rv. Likewise, layers (and heads) absent from a model's newest
// measurement are removed, so the PR series always describe that measurement.
//
// Label cardinality: model_id is bounded by the caller (the service records
// only measurements History accepted, at most max_models models); variant,
// backend and code come from small fixed sets.
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
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "rvd/v1/rvd.pb.h"

namespace rvd {

struct MetricsOptions {
  bool per_head = false;            // export rvd_participation_ratio_head
  double rv_alert_threshold = 0.0;  // > 0: export rvd_rv_below_threshold
  std::string version;              // rvd_build_info{version}
  std::string backend;              // rvd_build_info{backend}
  std::string engine_version;       // rvd_build_info{engine_version}
};

class Metrics {
 public:
  explicit Metrics(const MetricsOptions& options);

  Metrics(const Metrics&) = delete;
  Metrics& operator=(const Metrics&) = delete;

  // Sets rvd_rv, rvd_participation_ratio(_head), counts the measurement and
  // observes its duration.
  void RecordMeasurement(const rvd::v1::Measurement& m);
  // rvd_ingested_bytes_total
  void AddIngestedBytes(uint64_t bytes);
  // rvd_engine_matrices_total{backend, path}: the engine's cumulative
  // matrices per code path (Engine::ServedCounts); counters advance by the
  // growth since the last call.
  void RecordServed(const std::string& backend,
                    const std::map<std::string, int64_t>& counts);
  // rvd_engine_seconds_total{backend, phase}: the engine's cumulative time
  // per phase (Engine::PhaseSeconds), advanced by growth likewise.
  void RecordPhases(const std::string& backend,
                    const std::map<std::string, double>& seconds);
  // rvd_errors_total{code}, code as the gRPC code name, e.g. INVALID_ARGUMENT.
  void RecordError(const std::string& code);
  // rvd_inflight_requests
  void SetInflight(int64_t n);

  std::shared_ptr<prometheus::Registry> registry() { return registry_; }

  // Bucket upper bounds of rvd_measurement_duration_seconds, 100 us to 10 s.
  static const prometheus::Histogram::BucketBoundaries& DurationBuckets();

 private:
  using VariantBackend = std::pair<std::string, std::string>;
  // Per-model series, cached so that Family::Add runs once per label set.
  struct ModelSeries {
    prometheus::Gauge* rv = nullptr;               // null while rv is absent
    prometheus::Gauge* below_threshold = nullptr;  // null likewise
    prometheus::Gauge* last_timestamp = nullptr;
    std::map<uint32_t, prometheus::Gauge*> layer_pr;  // by layer
    std::map<std::pair<uint32_t, uint32_t>, prometheus::Gauge*>
        head_pr;  // by (layer, head)
  };

  const MetricsOptions options_;
  const std::shared_ptr<prometheus::Registry> registry_;

  // Families, built in the constructor; owned by registry_.
  prometheus::Family<prometheus::Gauge>& rv_family_;
  prometheus::Family<prometheus::Gauge>& pr_family_;
  prometheus::Family<prometheus::Gauge>* pr_head_family_;  // null: !per_head
  prometheus::Family<prometheus::Counter>& measurements_family_;
  prometheus::Family<prometheus::Histogram>& duration_family_;
  prometheus::Family<prometheus::Counter>& errors_family_;
  prometheus::Family<prometheus::Counter>& served_family_;
  prometheus::Family<prometheus::Counter>& phase_family_;
  prometheus::Family<prometheus::Gauge>& last_timestamp_family_;
  prometheus::Family<prometheus::Gauge>* below_family_;  // null: threshold 0

  // Unlabelled series, added in the constructor.
  prometheus::Counter& ingested_bytes_;
  prometheus::Gauge& inflight_;

  absl::Mutex mu_;
  std::map<std::string, ModelSeries> models_ ABSL_GUARDED_BY(mu_);
  // rvd_measurements_total by (model_id, variant, backend).
  std::map<std::pair<std::string, VariantBackend>, prometheus::Counter*>
      counters_ ABSL_GUARDED_BY(mu_);
  // rvd_measurement_duration_seconds by (variant, backend).
  std::map<VariantBackend, prometheus::Histogram*> durations_
      ABSL_GUARDED_BY(mu_);
  // rvd_errors_total by code.
  std::map<std::string, prometheus::Counter*> errors_ ABSL_GUARDED_BY(mu_);
  // A counter that follows an engine's cumulative total, and the total it
  // shows; by (backend, path) for rvd_engine_matrices_total and (backend,
  // phase) for rvd_engine_seconds_total.
  struct Followed {
    prometheus::Counter* counter = nullptr;
    double seen = 0.0;
  };
  using FollowedMap = std::map<std::pair<std::string, std::string>, Followed>;
  // Advances the counter {backend, label=key} of `family` to `total`.
  void Follow(prometheus::Family<prometheus::Counter>& family,
              const char* label, const std::string& backend,
              const std::string& key, double total, FollowedMap& series)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  FollowedMap served_ ABSL_GUARDED_BY(mu_);
  FollowedMap phases_ ABSL_GUARDED_BY(mu_);
};

// Serves `registry` at http://address/metrics. Errors (bad address, port in
// use) are returned, not thrown: INVALID_ARGUMENT for an address that is not
// HOST:PORT, UNAVAILABLE when the server cannot listen there. Port 0 picks a
// free port; Exposer::GetListeningPorts() tells which.
absl::StatusOr<std::unique_ptr<prometheus::Exposer>> StartExposer(
    const std::string& address, std::shared_ptr<prometheus::Registry> registry);

}  // namespace rvd

#endif  // RVD_SERVER_METRICS_H_

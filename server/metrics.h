// rvd's Prometheus metrics: a prometheus::Collectable that reads the state
// rvd already keeps (the measurement index, the engine's and the compute
// pool's counters, the event bus) when /metrics is scraped, plus the few
// counters and histograms of events that leave no state behind (requests,
// errors, bytes received), which live in a prometheus-cpp registry of its
// own and are merged into the same scrape.
//
// Read at scrape time (never pushed, so never stale and never a second
// copy):
//   rvd_rv{model_id}                  gauge, R_V of the newest measurement;
//                                     absent while it has no R_V
//   rvd_participation_ratio{model_id,layer}        gauge, newest PR per layer
//   rvd_participation_ratio_head{model_id,layer,head}  gauge, if per_head
//   rvd_last_measurement_timestamp_seconds{model_id}   gauge, Unix time
//   rvd_rv_alert_threshold            gauge, only if threshold > 0
//   rvd_rv_below_threshold{model_id}  gauge 0/1, only if threshold > 0
//   rvd_models                        gauge, models with measurements
//   rvd_series_dropped_total          counter, PR series over the budget
//   rvd_build_info{version,backend,engine_version}  gauge, always 1
//   rvd_inflight_requests             gauge, Measure/MeasureStream calls now
//   rvd_engine_matrices_total{backend,path}   counter, by serving kernel
//   rvd_engine_events_total{backend,event}    counter (plan reused, ...)
//   rvd_engine_seconds_total{backend,phase}   counter
//   rvd_engine_errors_total{code}             counter, failed device calls
//   rvd_engine_device_bytes, rvd_engine_pinned_bytes  gauges, held now
//   rvd_engine_healthy                gauge 0/1
//   rvd_compute_queue_length, rvd_compute_running   gauges
//   rvd_compute_queue_wait_seconds_total, rvd_compute_queue_waits_total,
//   rvd_compute_rejected_total        counters
//   rvd_watchers                      gauge, watch streams now
//   rvd_watch_gap_entries_total       counter, measurements watchers missed
//   rvd_alert_active{model_id,alert}  gauge 0/1, per alert rule (alerts.h)
//   rvd_alerts_fired_total{model_id,alert}  counter, times it went firing
//   rvd_alert_rules, rvd_alert_series_dropped_total,
//   rvd_alert_reload_failures_total
// Counted as they happen (the registry):
//   rvd_measurements_total{model_id,variant,backend}  counter
//   rvd_measurement_duration_seconds{variant,backend} histogram, engine time
//   rvd_ingested_bytes_total          counter, tensor bytes received
//   rvd_errors_total{code}            counter, failed requests by gRPC code
//   rvd_request_duration_seconds{method,code}  histogram, every rvd.v1.Rvd
//                                     call end to end (request_metrics.h)
//
// Cardinality: model_id is bounded by max_models (the index refuses more),
// variant, backend, code, method, path, phase and event by small fixed
// sets. The per-layer and per-head series (models x layers x heads) are held
// to a budget, max_series: a measurement whose series do not fit beside the
// other models' is not exported per layer (its rvd_rv still is), its series
// are counted in rvd_series_dropped_total, and the first such overflow is
// logged. A model's series always describe its newest measurement.
//
// Thread-safe: any thread may call any member; Collect may run concurrently
// with everything else.
#ifndef RVD_SERVER_METRICS_H_
#define RVD_SERVER_METRICS_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "kernels/engine.h"
#include "prometheus/collectable.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/histogram.h"
#include "prometheus/metric_family.h"
#include "prometheus/registry.h"
#include "rvd/v1/rvd.pb.h"
#include "server/alerts.h"
#include "server/compute_pool.h"
#include "server/event_bus.h"
#include "server/measurement_index.h"

namespace rvd {

struct MetricsOptions {
  bool per_head = false;            // export rvd_participation_ratio_head
  double rv_alert_threshold = 0.0;  // > 0: export rvd_rv_below_threshold
  std::string version;              // rvd_build_info{version}
  std::string backend;              // rvd_build_info{backend}
  std::string engine_version;       // rvd_build_info{engine_version}
  // Most rvd_participation_ratio(_head) series exported, over all models.
  uint64_t max_series = 100000;
};

// The state read at scrape time; a null source exports nothing. Each must
// outlive the Metrics (and the exposer serving it).
struct MetricsSources {
  const MeasurementIndex* index = nullptr;
  const Engine* engine = nullptr;
  const ComputePool* pool = nullptr;
  const EventBus* bus = nullptr;
  // rvd_alert_active, rvd_alerts_fired_total and the other rvd_alert_*
  // families (alerts.h), within the same max_series budget.
  const AlertEngine* alerts = nullptr;
};

class Metrics final : public prometheus::Collectable {
 public:
  Metrics(const MetricsOptions& options, const MetricsSources& sources);

  Metrics(const Metrics&) = delete;
  Metrics& operator=(const Metrics&) = delete;

  // Every family, read now; sorted by name.
  std::vector<prometheus::MetricFamily> Collect() const override;

  // A stored measurement: counts it, observes its engine time, and admits
  // its per-layer series into the series budget.
  void RecordMeasurement(const rvd::v1::Measurement& m);
  // At start, a model's newest measurement restored from the durable store:
  // admits its series into the budget as RecordMeasurement does, counting
  // nothing.
  void AdmitSeries(const rvd::v1::Measurement& m);
  // DeleteModelHistory: gives the model's series back to the budget (its
  // gauges went with its ring; its counters stay, as counters do).
  void ForgetModel(const std::string& model_id);
  // rvd_ingested_bytes_total
  void AddIngestedBytes(uint64_t bytes);
  // rvd_errors_total{code}, code as the gRPC code name, e.g. INVALID_ARGUMENT.
  void RecordError(const std::string& code);
  // rvd_request_duration_seconds{method, code}: one finished call. `method`
  // is an rvd.v1.Rvd method name (e.g. "Measure").
  void ObserveRequest(const std::string& method, const std::string& code,
                      double seconds);
  // rvd_inflight_requests: +1 when a measurement call starts, -1 when it
  // ends (RequestMetrics does both). Read at scrape time, so exact.
  void AddInflight(int64_t delta) { inflight_.fetch_add(delta); }
  // Measurement calls in flight now (what rvd_inflight_requests exports).
  int64_t inflight() const { return inflight_.load(); }

  // Bucket upper bounds of rvd_measurement_duration_seconds, 100 us to 10 s.
  static const prometheus::Histogram::BucketBoundaries& DurationBuckets();
  // Of rvd_request_duration_seconds: 100 us to 60 s (a large stream).
  static const prometheus::Histogram::BucketBoundaries& RequestBuckets();

 private:
  using VariantBackend = std::pair<std::string, std::string>;

  // The families read at scrape time, appended to `out`.
  void CollectModels(std::vector<prometheus::MetricFamily>* out) const;
  void CollectEngine(std::vector<prometheus::MetricFamily>* out) const;
  void CollectPoolAndBus(std::vector<prometheus::MetricFamily>* out) const;
  // The per-layer (and per-head) series `m` needs.
  uint64_t SeriesOf(const rvd::v1::Measurement& m) const;
  void AdmitLocked(const std::string& id, uint64_t series)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const MetricsOptions options_;
  const MetricsSources sources_;
  const std::shared_ptr<prometheus::Registry> registry_;  // event counters

  // Families of the registry, built in the constructor; owned by registry_.
  prometheus::Family<prometheus::Counter>& measurements_family_;
  prometheus::Family<prometheus::Histogram>& duration_family_;
  prometheus::Family<prometheus::Counter>& errors_family_;
  prometheus::Family<prometheus::Histogram>& request_family_;
  prometheus::Counter& ingested_bytes_;

  std::atomic<int64_t> inflight_{0};  // measurement calls now

  mutable absl::Mutex mu_;
  // Cached series of the registry, so that Family::Add runs once per label
  // set: by (model_id, variant, backend), (variant, backend), code and
  // (method, code).
  std::map<std::pair<std::string, VariantBackend>, prometheus::Counter*>
      counters_ ABSL_GUARDED_BY(mu_);
  std::map<VariantBackend, prometheus::Histogram*> durations_
      ABSL_GUARDED_BY(mu_);
  std::map<std::string, prometheus::Counter*> errors_ ABSL_GUARDED_BY(mu_);
  std::map<std::pair<std::string, std::string>, prometheus::Histogram*>
      requests_ ABSL_GUARDED_BY(mu_);
  // The series budget: per model, the series admitted for its newest
  // measurement (0: not exported), and their sum (<= max_series).
  std::map<std::string, uint64_t> admitted_ ABSL_GUARDED_BY(mu_);
  uint64_t admitted_total_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t series_dropped_total_ ABSL_GUARDED_BY(mu_) = 0;
  bool overflow_logged_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace rvd

#endif  // RVD_SERVER_METRICS_H_

#include "server/metrics.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "prometheus/client_metric.h"
#include "prometheus/metric_type.h"
#include "server/metric_family.h"
#include "spdlog/spdlog.h"

namespace rvd {
namespace {

using prometheus::ClientMetric;
using prometheus::Counter;
using prometheus::Histogram;
using prometheus::MetricFamily;
using prometheus::MetricType;

// A family goes out only with samples: a scrape shows what exists.
void Emit(MetricFamily f, std::vector<MetricFamily>* out) {
  if (!f.metric.empty()) out->push_back(std::move(f));
}

double TimestampSeconds(const rvd::v1::Measurement& m) {
  return static_cast<double>(m.timestamp().seconds()) +
         1e-9 * static_cast<double>(m.timestamp().nanos());
}

}  // namespace

const Histogram::BucketBoundaries& Metrics::DurationBuckets() {
  // 1-2.5-5 steps: a CPU measurement of a small model takes ~100 us, a large
  // model on the CPU several seconds.
  static const Histogram::BucketBoundaries* const kBuckets =
      new Histogram::BucketBoundaries{1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3,
                                      1e-2, 2.5e-2, 5e-2, 0.1,  0.25,   0.5,
                                      1.0,  2.5,    5.0,  10.0};
  return *kBuckets;
}

const Histogram::BucketBoundaries& Metrics::RequestBuckets() {
  // The engine's range, then the seconds a multi-GB stream takes to arrive.
  static const Histogram::BucketBoundaries* const kBuckets = [] {
    auto* b = new Histogram::BucketBoundaries(DurationBuckets());
    b->insert(b->end(), {30.0, 60.0});
    return b;
  }();
  return *kBuckets;
}

Metrics::Metrics(const MetricsOptions& options, const MetricsSources& sources)
    : options_(options),
      sources_(sources),
      registry_(std::make_shared<prometheus::Registry>()),
      measurements_family_(prometheus::BuildCounter()
                               .Name("rvd_measurements_total")
                               .Help("Measurements completed, by model, the "
                                     "PR variant that served them and the "
                                     "backend.")
                               .Register(*registry_)),
      duration_family_(prometheus::BuildHistogram()
                           .Name("rvd_measurement_duration_seconds")
                           .Help("Engine compute time of a measurement, by "
                                 "PR variant and backend.")
                           .Register(*registry_)),
      errors_family_(prometheus::BuildCounter()
                         .Name("rvd_errors_total")
                         .Help("Requests that failed, by gRPC status code "
                               "name.")
                         .Register(*registry_)),
      request_family_(prometheus::BuildHistogram()
                          .Name("rvd_request_duration_seconds")
                          .Help("rvd.v1.Rvd calls end to end, from the call's "
                                "arrival to its status, by method and gRPC "
                                "status code name (a watch stream lasts as "
                                "long as its watcher).")
                          .Register(*registry_)),
      ingested_bytes_(prometheus::BuildCounter()
                          .Name("rvd_ingested_bytes_total")
                          .Help("Tensor bytes received in measurement "
                                "requests.")
                          .Register(*registry_)
                          .Add({})) {}

uint64_t Metrics::SeriesOf(const rvd::v1::Measurement& m) const {
  uint64_t n = m.layers_size();
  if (options_.per_head) {
    for (const rvd::v1::LayerPR& l : m.layers()) n += l.head_pr_size();
  }
  return n;
}

void Metrics::AdmitLocked(const std::string& id, uint64_t series) {
  // The budget: this model's newest measurement replaces its previous
  // admission, if it fits beside every other model's.
  uint64_t& admitted = admitted_[id];
  const uint64_t others = admitted_total_ - admitted;
  if (others + series <= options_.max_series) {
    admitted = series;
  } else {
    admitted = 0;
    series_dropped_total_ += series;
    if (!overflow_logged_) {
      overflow_logged_ = true;
      spdlog::warn(
          "metrics: the series budget (max_metric_series {}) is spent: the "
          "{} per-layer series of model {} are not exported, nor those of "
          "later models that do not fit (counted in "
          "rvd_series_dropped_total; logged once)",
          options_.max_series, series, id);
    }
  }
  admitted_total_ = others + admitted;
}

void Metrics::ForgetModel(const std::string& model_id) {
  absl::MutexLock lock(&mu_);
  auto it = admitted_.find(model_id);
  if (it == admitted_.end()) return;
  admitted_total_ -= it->second;
  admitted_.erase(it);
}

void Metrics::AdmitSeries(const rvd::v1::Measurement& m) {
  const uint64_t series = SeriesOf(m);
  absl::MutexLock lock(&mu_);
  AdmitLocked(m.model_id(), series);
}

void Metrics::RecordMeasurement(const rvd::v1::Measurement& m) {
  const std::string& id = m.model_id();
  const uint64_t series = SeriesOf(m);
  absl::MutexLock lock(&mu_);
  AdmitLocked(id, series);

  VariantBackend vb(m.variant(), m.backend());
  auto key = std::make_pair(id, vb);
  auto cit = counters_.find(key);
  if (cit == counters_.end()) {
    cit = counters_
              .emplace(key, &measurements_family_.Add({{"model_id", id},
                                                       {"variant", vb.first},
                                                       {"backend", vb.second}}))
              .first;
  }
  cit->second->Increment();
  auto dit = durations_.find(vb);
  if (dit == durations_.end()) {
    dit = durations_
              .emplace(vb, &duration_family_.Add(
                               {{"variant", vb.first}, {"backend", vb.second}},
                               DurationBuckets()))
              .first;
  }
  if (m.elapsed_ms() >= 0) dit->second->Observe(m.elapsed_ms() / 1000.0);
}

void Metrics::AddIngestedBytes(uint64_t bytes) {
  ingested_bytes_.Increment(static_cast<double>(bytes));
}

void Metrics::RecordError(const std::string& code) {
  absl::MutexLock lock(&mu_);
  auto it = errors_.find(code);
  if (it == errors_.end()) {
    it = errors_.emplace(code, &errors_family_.Add({{"code", code}})).first;
  }
  it->second->Increment();
}

void Metrics::ObserveRequest(const std::string& method,
                             const std::string& code, double seconds) {
  absl::MutexLock lock(&mu_);
  auto key = std::make_pair(method, code);
  auto it = requests_.find(key);
  if (it == requests_.end()) {
    it = requests_
             .emplace(key, &request_family_.Add(
                               {{"method", method}, {"code", code}},
                               RequestBuckets()))
             .first;
  }
  it->second->Observe(std::max(seconds, 0.0));
}

void Metrics::CollectModels(std::vector<MetricFamily>* out) const {
  MetricFamily rv = NewFamily(
      "rvd_rv",
      "R_V of the newest measurement of a model: geomean PR of the late "
      "layers / geomean PR of the early layers. Absent while the newest "
      "measurement has no R_V (an all-zero early or late layer).",
      MetricType::Gauge);
  MetricFamily below = NewFamily(
      "rvd_rv_below_threshold",
      "1 when the newest R_V of a model is below rvd_rv_alert_threshold, "
      "else 0. Absent while the newest measurement has no R_V.",
      MetricType::Gauge);
  MetricFamily stamp = NewFamily(
      "rvd_last_measurement_timestamp_seconds",
      "Unix time at which the newest measurement of a model was computed.",
      MetricType::Gauge);
  MetricFamily pr = NewFamily(
      "rvd_participation_ratio",
      "Participation ratio of the attention V block of a layer in the "
      "newest measurement of a model.",
      MetricType::Gauge);
  MetricFamily head = NewFamily(
      "rvd_participation_ratio_head",
      "Participation ratio of one kv head's V block of a layer in the newest "
      "measurement of a model.",
      MetricType::Gauge);
  MetricFamily models = NewFamily(
      "rvd_models", "Models with measurements kept (at most max_models).",
      MetricType::Gauge);
  MetricFamily dropped = NewFamily(
      "rvd_series_dropped_total",
      "Per-layer and per-head PR series not exported because the series "
      "budget (max_metric_series) was spent, summed over measurements.",
      MetricType::Counter);

  std::vector<MeasurementIndex::ModelState> states;
  if (sources_.index != nullptr) states = sources_.index->Models();
  // The admissions of the models read, then the series built unlocked.
  std::vector<uint64_t> admitted(states.size(), 0);
  {
    absl::MutexLock lock(&mu_);
    for (size_t i = 0; i < states.size(); ++i) {
      auto it = admitted_.find(states[i].model_id);
      if (it != admitted_.end()) admitted[i] = it->second;
    }
    AddSample(dropped, {}, static_cast<double>(series_dropped_total_));
  }
  for (size_t i = 0; i < states.size(); ++i) {
    const std::string& id = states[i].model_id;
    const rvd::v1::Measurement& m = *states[i].latest;
    if (m.has_rv()) {
      AddSample(rv, {{"model_id", id}}, m.rv());
      if (options_.rv_alert_threshold > 0) {
        AddSample(below, {{"model_id", id}},
                  m.rv() < options_.rv_alert_threshold ? 1 : 0);
      }
    }
    AddSample(stamp, {{"model_id", id}}, TimestampSeconds(m));
    // Within its admission only: a measurement stored but not yet recorded
    // (or refused) exports no PR series, so the budget holds at any moment.
    const uint64_t series = SeriesOf(m);
    if (series == 0 || series > admitted[i]) continue;
    for (const rvd::v1::LayerPR& l : m.layers()) {
      const std::string layer = absl::StrCat(l.layer());
      AddSample(pr, {{"model_id", id}, {"layer", layer}}, l.pr());
      if (!options_.per_head) continue;
      for (int h = 0; h < l.head_pr_size(); ++h) {
        AddSample(head,
                  {{"model_id", id}, {"layer", layer}, {"head", absl::StrCat(h)}},
                  l.head_pr(h));
      }
    }
  }
  if (sources_.index != nullptr) {
    AddSample(models, {}, static_cast<double>(states.size()));
  }
  Emit(std::move(rv), out);
  Emit(std::move(below), out);
  Emit(std::move(stamp), out);
  Emit(std::move(pr), out);
  Emit(std::move(head), out);
  Emit(std::move(models), out);
  Emit(std::move(dropped), out);
}

void Metrics::CollectEngine(std::vector<MetricFamily>* out) const {
  if (sources_.engine == nullptr) return;
  const EngineStats stats = sources_.engine->Stats();
  const std::string& backend = options_.backend;
  MetricFamily served = NewFamily(
      "rvd_engine_matrices_total",
      "Matrices the engine has computed, by backend and the kernel that "
      "served them (variant/kernel); each matrix counted once.",
      MetricType::Counter);
  for (const auto& [path, n] : stats.served) {
    AddSample(served, {{"backend", backend}, {"path", path}},
              static_cast<double>(n));
  }
  MetricFamily events = NewFamily(
      "rvd_engine_events_total",
      "Engine events that are not a kernel serving a matrix, by backend and "
      "event (e.g. plan_reused, float64_fallback, oracle_fallback).",
      MetricType::Counter);
  for (const auto& [event, n] : stats.events) {
    AddSample(events, {{"backend", backend}, {"event", event}},
              static_cast<double>(n));
  }
  MetricFamily phases = NewFamily(
      "rvd_engine_seconds_total",
      "Engine time by backend and phase (CUDA: h2d, the device time of "
      "host-to-device copies; plan; compute, the rest of the calls).",
      MetricType::Counter);
  for (const auto& [phase, t] : stats.phase_seconds) {
    AddSample(phases, {{"backend", backend}, {"phase", phase}}, t);
  }
  MetricFamily errors = NewFamily(
      "rvd_engine_errors_total",
      "Failed device calls, by error code name (e.g. "
      "cudaErrorMemoryAllocation).",
      MetricType::Counter);
  for (const auto& [code, n] : stats.device_errors) {
    AddSample(errors, {{"code", code}}, static_cast<double>(n));
  }
  MetricFamily device = NewFamily(
      "rvd_engine_device_bytes",
      "Device memory held in the engine's pools now.", MetricType::Gauge);
  AddSample(device, {}, static_cast<double>(stats.device_bytes_held));
  MetricFamily pinned = NewFamily(
      "rvd_engine_pinned_bytes",
      "Page-locked host memory held by the engine now.", MetricType::Gauge);
  AddSample(pinned, {}, static_cast<double>(stats.pinned_bytes_held));
  MetricFamily healthy = NewFamily(
      "rvd_engine_healthy",
      "1 while the engine can serve; 0 after a sticky device error (every "
      "call fails until it is recreated).",
      MetricType::Gauge);
  AddSample(healthy, {}, stats.healthy ? 1 : 0);
  // The kernels' tuning knobs, so that a retune shows on a dashboard without
  // changing the technique names the counters use.
  MetricFamily kernels = NewFamily(
      "rvd_kernel_info",
      "The policy (tuning knobs) of each kernel technique in service; always 1.",
      MetricType::Gauge);
  for (const auto& [technique, policy] : stats.kernel_policies) {
    AddSample(kernels, {{"backend", backend}, {"technique", technique}, {"policy", policy}}, 1);
  }
  Emit(std::move(served), out);
  Emit(std::move(events), out);
  Emit(std::move(phases), out);
  Emit(std::move(errors), out);
  Emit(std::move(device), out);
  Emit(std::move(pinned), out);
  Emit(std::move(healthy), out);
  Emit(std::move(kernels), out);
}

void Metrics::CollectPoolAndBus(std::vector<MetricFamily>* out) const {
  if (sources_.pool != nullptr) {
    const ComputePoolStats s = sources_.pool->Stats();
    MetricFamily length = NewFamily(
        "rvd_compute_queue_length",
        "Measurements waiting for a compute worker now.", MetricType::Gauge);
    AddSample(length, {}, static_cast<double>(s.queued));
    MetricFamily running = NewFamily(
        "rvd_compute_running", "Measurements on a compute worker now.",
        MetricType::Gauge);
    AddSample(running, {}, static_cast<double>(s.running));
    MetricFamily wait = NewFamily(
        "rvd_compute_queue_wait_seconds_total",
        "Time measurements waited for a compute worker, summed over those "
        "that got one (divide by rvd_compute_queue_waits_total).",
        MetricType::Counter);
    AddSample(wait, {}, s.wait_seconds_total);
    MetricFamily waits = NewFamily(
        "rvd_compute_queue_waits_total",
        "Measurements that got a compute worker.", MetricType::Counter);
    AddSample(waits, {}, static_cast<double>(s.waits_total));
    MetricFamily rejected = NewFamily(
        "rvd_compute_rejected_total",
        "Measurements refused by the compute queue (full, deadline passed or "
        "cancelled while waiting).",
        MetricType::Counter);
    AddSample(rejected, {}, static_cast<double>(s.rejected_total));
    Emit(std::move(length), out);
    Emit(std::move(running), out);
    Emit(std::move(wait), out);
    Emit(std::move(waits), out);
    Emit(std::move(rejected), out);
  }
  if (sources_.bus != nullptr) {
    MetricFamily watchers = NewFamily(
        "rvd_watchers", "WatchMeasurements streams open now.",
        MetricType::Gauge);
    AddSample(watchers, {},
              static_cast<double>(sources_.bus->num_subscribers()));
    MetricFamily gaps = NewFamily(
        "rvd_watch_gap_entries_total",
        "Measurements a watcher missed because it read too slowly (each "
        "reported to it in a Gap event), summed over watchers.",
        MetricType::Counter);
    AddSample(gaps, {},
              static_cast<double>(sources_.bus->gap_entries_total()));
    Emit(std::move(watchers), out);
    Emit(std::move(gaps), out);
  }
}

std::vector<MetricFamily> Metrics::Collect() const {
  std::vector<MetricFamily> out = registry_->Collect();
  MetricFamily build = NewFamily(
      "rvd_build_info",
      "Always 1; the labels name the rvd version, the backend and the engine "
      "version.",
      MetricType::Gauge);
  AddSample(build,
            {{"version", options_.version},
             {"backend", options_.backend},
             {"engine_version", options_.engine_version}},
            1);
  out.push_back(std::move(build));
  if (options_.rv_alert_threshold > 0) {
    MetricFamily threshold = NewFamily(
        "rvd_rv_alert_threshold",
        "The configured rv_alert_threshold: rvd_rv below it sets "
        "rvd_rv_below_threshold to 1.",
        MetricType::Gauge);
    AddSample(threshold, {}, options_.rv_alert_threshold);
    out.push_back(std::move(threshold));
  }
  MetricFamily inflight = NewFamily(
      "rvd_inflight_requests",
      "Measure and MeasureStream calls in flight (receiving, queued or "
      "computing).",
      MetricType::Gauge);
  AddSample(inflight, {}, static_cast<double>(inflight_.load()));
  out.push_back(std::move(inflight));
  CollectModels(&out);
  CollectEngine(&out);
  CollectPoolAndBus(&out);
  if (sources_.alerts != nullptr) sources_.alerts->CollectMetrics(&out);
  std::sort(out.begin(), out.end(),
            [](const MetricFamily& a, const MetricFamily& b) {
              return a.name < b.name;
            });
  return out;
}

}  // namespace rvd

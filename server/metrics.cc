#include "server/metrics.h"

#include <exception>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace rvd {
namespace {

using prometheus::Counter;
using prometheus::Family;
using prometheus::Gauge;
using prometheus::Histogram;

// The measurement's completion time in Unix seconds; now if it has none.
double TimestampSeconds(const rvd::v1::Measurement& m) {
  if (m.has_timestamp()) {
    return static_cast<double>(m.timestamp().seconds()) +
           1e-9 * static_cast<double>(m.timestamp().nanos());
  }
  return absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch());
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

Metrics::Metrics(const MetricsOptions& options)
    : options_(options),
      registry_(std::make_shared<prometheus::Registry>()),
      rv_family_(prometheus::BuildGauge()
                     .Name("rvd_rv")
                     .Help("R_V of the newest measurement of a model: geomean "
                           "PR of the late layers / geomean PR of the early "
                           "layers. Absent while the newest measurement has "
                           "no R_V (an all-zero early or late layer).")
                     .Register(*registry_)),
      pr_family_(prometheus::BuildGauge()
                     .Name("rvd_participation_ratio")
                     .Help("Participation ratio of the attention V block of a "
                           "layer in the newest measurement of a model.")
                     .Register(*registry_)),
      pr_head_family_(
          options.per_head
              ? &prometheus::BuildGauge()
                     .Name("rvd_participation_ratio_head")
                     .Help("Participation ratio of one kv head's V block of a "
                           "layer in the newest measurement of a model.")
                     .Register(*registry_)
              : nullptr),
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
      served_family_(prometheus::BuildCounter()
                         .Name("rvd_engine_matrices_total")
                         .Help("Matrices the engine has computed, by backend "
                               "and code path (variant/kernel policy): which "
                               "kernel served the measurements.")
                         .Register(*registry_)),
      phase_family_(prometheus::BuildCounter()
                        .Name("rvd_engine_seconds_total")
                        .Help("Engine time by backend and phase: h2d (device "
                              "time of host-to-device copies), compute (the "
                              "rest of the engine calls).")
                        .Register(*registry_)),
      last_timestamp_family_(
          prometheus::BuildGauge()
              .Name("rvd_last_measurement_timestamp_seconds")
              .Help("Unix time at which the newest measurement of a model "
                    "was computed.")
              .Register(*registry_)),
      below_family_(
          options.rv_alert_threshold > 0
              ? &prometheus::BuildGauge()
                     .Name("rvd_rv_below_threshold")
                     .Help("1 when the newest R_V of a model is below "
                           "rvd_rv_alert_threshold, else 0. Absent while the "
                           "newest measurement has no R_V.")
                     .Register(*registry_)
              : nullptr),
      ingested_bytes_(prometheus::BuildCounter()
                          .Name("rvd_ingested_bytes_total")
                          .Help("Tensor bytes received in measurement "
                                "requests.")
                          .Register(*registry_)
                          .Add({})),
      inflight_(prometheus::BuildGauge()
                    .Name("rvd_inflight_requests")
                    .Help("Measurement requests in flight (queued or "
                          "computing).")
                    .Register(*registry_)
                    .Add({})) {
  prometheus::BuildGauge()
      .Name("rvd_build_info")
      .Help(
          "Always 1; the labels name the rvd version, the backend and the "
          "engine version.")
      .Register(*registry_)
      .Add({{"version", options.version},
            {"backend", options.backend},
            {"engine_version", options.engine_version}})
      .Set(1);
  if (options.rv_alert_threshold > 0) {
    prometheus::BuildGauge()
        .Name("rvd_rv_alert_threshold")
        .Help(
            "The configured rv_alert_threshold: rvd_rv below it sets "
            "rvd_rv_below_threshold to 1.")
        .Register(*registry_)
        .Add({})
        .Set(options.rv_alert_threshold);
  }
}

void Metrics::RecordMeasurement(const rvd::v1::Measurement& m) {
  const std::string& id = m.model_id();
  absl::MutexLock lock(&mu_);
  ModelSeries& series = models_[id];

  // R_V and the alert gauge: set when present, removed when absent.
  if (m.has_rv()) {
    if (series.rv == nullptr) series.rv = &rv_family_.Add({{"model_id", id}});
    series.rv->Set(m.rv());
    if (below_family_ != nullptr) {
      if (series.below_threshold == nullptr) {
        series.below_threshold = &below_family_->Add({{"model_id", id}});
      }
      series.below_threshold->Set(m.rv() < options_.rv_alert_threshold ? 1 : 0);
    }
  } else {
    if (series.rv != nullptr) {
      rv_family_.Remove(series.rv);
      series.rv = nullptr;
    }
    if (series.below_threshold != nullptr) {
      below_family_->Remove(series.below_threshold);
      series.below_threshold = nullptr;
    }
  }

  // Per-layer (and per-head) PR. Series of layers/heads this measurement does
  // not have are removed, so the model's series describe its newest
  // measurement only.
  std::map<uint32_t, Gauge*> layer_pr;
  std::map<std::pair<uint32_t, uint32_t>, Gauge*> head_pr;
  for (const rvd::v1::LayerPR& layer : m.layers()) {
    const std::string layer_str = absl::StrCat(layer.layer());
    Gauge* g = nullptr;
    if (auto it = series.layer_pr.find(layer.layer());
        it != series.layer_pr.end()) {
      g = it->second;
      series.layer_pr.erase(it);
    } else if (auto it2 = layer_pr.find(layer.layer()); it2 != layer_pr.end()) {
      g = it2->second;  // the same layer twice in one measurement
    } else {
      g = &pr_family_.Add({{"model_id", id}, {"layer", layer_str}});
    }
    g->Set(layer.pr());
    layer_pr[layer.layer()] = g;

    if (pr_head_family_ == nullptr) continue;
    for (int h = 0; h < layer.head_pr_size(); ++h) {
      const auto key = std::make_pair(layer.layer(), static_cast<uint32_t>(h));
      Gauge* hg = nullptr;
      if (auto it = series.head_pr.find(key); it != series.head_pr.end()) {
        hg = it->second;
        series.head_pr.erase(it);
      } else if (auto it2 = head_pr.find(key); it2 != head_pr.end()) {
        hg = it2->second;
      } else {
        hg = &pr_head_family_->Add({{"model_id", id},
                                    {"layer", layer_str},
                                    {"head", absl::StrCat(h)}});
      }
      hg->Set(layer.head_pr(h));
      head_pr[key] = hg;
    }
  }
  for (const auto& [layer, g] : series.layer_pr) pr_family_.Remove(g);
  for (const auto& [key, g] : series.head_pr) pr_head_family_->Remove(g);
  series.layer_pr = std::move(layer_pr);
  series.head_pr = std::move(head_pr);

  if (series.last_timestamp == nullptr) {
    series.last_timestamp = &last_timestamp_family_.Add({{"model_id", id}});
  }
  series.last_timestamp->Set(TimestampSeconds(m));

  // Count and time it.
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

void Metrics::Follow(prometheus::Family<prometheus::Counter>& family,
                     const char* label, const std::string& backend,
                     const std::string& key, double total,
                     FollowedMap& series) {
  Followed& f = series[{backend, key}];
  if (f.counter == nullptr)
    f.counter = &family.Add({{"backend", backend}, {label, key}});
  if (total > f.seen) {
    f.counter->Increment(total - f.seen);
    f.seen = total;
  }
}

void Metrics::RecordServed(const std::string& backend,
                           const std::map<std::string, int64_t>& counts) {
  absl::MutexLock lock(&mu_);
  for (const auto& [path, n] : counts) {
    Follow(served_family_, "path", backend, path, static_cast<double>(n),
           served_);
  }
}

void Metrics::RecordPhases(const std::string& backend,
                           const std::map<std::string, double>& seconds) {
  absl::MutexLock lock(&mu_);
  for (const auto& [phase, t] : seconds)
    Follow(phase_family_, "phase", backend, phase, t, phases_);
}

void Metrics::RecordError(const std::string& code) {
  absl::MutexLock lock(&mu_);
  auto it = errors_.find(code);
  if (it == errors_.end()) {
    it = errors_.emplace(code, &errors_family_.Add({{"code", code}})).first;
  }
  it->second->Increment();
}

void Metrics::SetInflight(int64_t n) { inflight_.Set(static_cast<double>(n)); }

absl::StatusOr<std::unique_ptr<prometheus::Exposer>> StartExposer(
    const std::string& address,
    std::shared_ptr<prometheus::Registry> registry) {
  if (registry == nullptr) {
    return absl::InvalidArgumentError("StartExposer: no registry");
  }
  // HOST:PORT; civetweb would read a bare "9464" as every interface, which
  // we do not want to happen by accident.
  const size_t colon = address.rfind(':');
  int port = -1;
  if (colon == std::string::npos || colon == 0 || colon + 1 == address.size() ||
      address.size() - colon - 1 > 5 ||
      !absl::SimpleAtoi(address.substr(colon + 1), &port) || port < 0 ||
      port > 65535 || !absl::ascii_isdigit(address[colon + 1])) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics address \"", address, "\" is not HOST:PORT"));
  }
  try {
    // Two civetweb threads (the default): a scrape held open by one client
    // does not block another.
    auto exposer = std::make_unique<prometheus::Exposer>(address, 2);
    exposer->RegisterCollectable(registry);
    return exposer;
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve /metrics on ", address, ": ", e.what()));
  } catch (...) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve /metrics on ", address));
  }
}

}  // namespace rvd

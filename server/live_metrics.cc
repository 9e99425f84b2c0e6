#include "server/live_metrics.h"

#include <map>
#include <string>
#include <utility>

#include "server/metric_family.h"

namespace rvd {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

// One series per key of `counts` under label `label`.
MetricFamily Labelled(const char* name, const char* help, const char* label,
                      const std::map<std::string, int64_t>& counts) {
  MetricFamily f = NewFamily(name, help, MetricType::Counter);
  for (const auto& [key, n] : counts) AddSample(f, {{label, key}}, static_cast<double>(n));
  return f;
}

}  // namespace

std::vector<MetricFamily> LiveMetrics::Collect() const {
  const LiveStats s = registry_->Stats();
  std::vector<MetricFamily> out;
  auto single = [&out](const char* name, const char* help, MetricType type, double v) {
    out.push_back(SingleSample(name, help, type, v));
  };
  single("rvd_live_models", "Live models registered (RegisterLiveModel)", MetricType::Gauge,
         static_cast<double>(s.models));
  single("rvd_live_segments_mapped",
         "Producer memory segments rvd has mapped (one per producer and segment)",
         MetricType::Gauge, static_cast<double>(s.segments_mapped));
  out.push_back(Labelled("rvd_live_notifications_total", "NotifyStep calls by outcome",
                         "outcome", s.notifications));
  single("rvd_live_snapshots_total", "Snapshots of live weights taken", MetricType::Counter,
         static_cast<double>(s.snapshots));
  auto histogram = [&out](const char* name, const char* help, ClientMetric m) {
    MetricFamily f = NewFamily(name, help, MetricType::Histogram);
    f.metric.push_back(std::move(m));
    out.push_back(std::move(f));
  };
  histogram("rvd_live_snapshot_seconds",
            "From rvd's receipt of a notification to its snapshot's copy finished",
            s.snapshot_seconds);
  histogram("rvd_live_measurement_seconds",
            "From rvd's receipt of a notification to its measurement computed",
            s.measurement_seconds);
  single("rvd_live_measurements_total", "Measurements of live models recorded",
         MetricType::Counter, static_cast<double>(s.measured));
  out.push_back(Labelled("rvd_live_releases_total", "Live models released, by reason", "reason",
                         s.releases));
  return out;
}

}  // namespace rvd

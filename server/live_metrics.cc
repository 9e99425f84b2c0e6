#include "server/live_metrics.h"

#include <limits>
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
  MetricFamily h = NewFamily("rvd_live_snapshot_seconds",
                          "From a notification to its snapshot's copy finished",
                          MetricType::Histogram);
  ClientMetric hm;
  hm.histogram.sample_count = static_cast<uint64_t>(s.snapshot_seconds_count);
  hm.histogram.sample_sum = s.snapshot_seconds_sum;
  uint64_t cumulative = 0;
  for (size_t b = 0; b < s.snapshot_bucket_counts.size(); ++b) {
    cumulative += static_cast<uint64_t>(s.snapshot_bucket_counts[b]);
    ClientMetric::Bucket bucket;
    bucket.cumulative_count = cumulative;
    bucket.upper_bound = b < s.snapshot_bucket_bounds.size()
                             ? s.snapshot_bucket_bounds[b]
                             : std::numeric_limits<double>::infinity();
    hm.histogram.bucket.push_back(bucket);
  }
  h.metric.push_back(std::move(hm));
  out.push_back(std::move(h));
  single("rvd_live_measurements_total", "Measurements of live models recorded",
         MetricType::Counter, static_cast<double>(s.measured));
  out.push_back(Labelled("rvd_live_releases_total", "Live models released, by reason", "reason",
                         s.releases));
  return out;
}

}  // namespace rvd

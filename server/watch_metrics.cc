#include "server/watch_metrics.h"

#include "server/metric_family.h"

namespace rvd {

std::vector<prometheus::MetricFamily> WatchMetrics::Collect() const {
  using prometheus::MetricType;
  const WatchStats s = watcher_->Stats();
  std::vector<prometheus::MetricFamily> out;
  auto add = [&out](const char* name, const char* help, MetricType type,
                    double v) { out.push_back(SingleSample(name, help, type, v)); };
  add("rvd_checkpoint_watch_measured_total",
      "Checkpoints the watch section measured", MetricType::Counter,
      static_cast<double>(s.measured));
  add("rvd_checkpoint_watch_failed_total",
      "Watched checkpoints whose read or measurement failed (tried again when "
      "their files change)",
      MetricType::Counter, static_cast<double>(s.failed));
  add("rvd_checkpoint_watch_pending",
      "Watched checkpoints found and not measured yet at the last look",
      MetricType::Gauge, static_cast<double>(s.pending));
  add("rvd_checkpoint_watch_directories",
      "Directories the watch globs matched at the last look", MetricType::Gauge,
      static_cast<double>(s.directories));
  add("rvd_checkpoint_watch_last_look_timestamp_seconds",
      "Unix time at which the watcher's last look ended", MetricType::Gauge,
      s.last_look_seconds);
  return out;
}

}  // namespace rvd

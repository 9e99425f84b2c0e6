#include "server/watch_metrics.h"

namespace rvd {

std::vector<prometheus::MetricFamily> WatchMetrics::Collect() const {
  using prometheus::MetricType;
  const WatchStats s = watcher_->Stats();
  std::vector<prometheus::MetricFamily> out;
  auto add = [&out](const char* name, const char* help, MetricType type,
                    double v) {
    prometheus::MetricFamily f;
    f.name = name;
    f.help = help;
    f.type = type;
    prometheus::ClientMetric m;
    if (type == MetricType::Counter) {
      m.counter.value = v;
    } else {
      m.gauge.value = v;
    }
    f.metric.push_back(std::move(m));
    out.push_back(std::move(f));
  };
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

// The one way rvd's collectables build the MetricFamily values they hand
// prometheus-cpp at scrape time (metrics.cc, live_metrics.cc,
// store_metrics.cc, watch_metrics.cc, tune_metrics.cc, group_metrics.cc,
// alerts.cc):
// a family, then its samples. Histograms are built where they are used.
#ifndef RVD_SERVER_METRIC_FAMILY_H_
#define RVD_SERVER_METRIC_FAMILY_H_

#include <algorithm>
#include <initializer_list>
#include <string>
#include <utility>

#include "prometheus/client_metric.h"
#include "prometheus/metric_family.h"
#include "prometheus/metric_type.h"

namespace rvd {

inline prometheus::MetricFamily NewFamily(const char* name, const char* help,
                                          prometheus::MetricType type) {
  prometheus::MetricFamily f;
  f.name = name;
  f.help = help;
  f.type = type;
  return f;
}

// Appends one sample of a counter or gauge family; its labels sorted by
// name, as prometheus-cpp's registry writes them.
inline void AddSample(prometheus::MetricFamily& f,
                      std::initializer_list<std::pair<const char*, std::string>> labels,
                      double value) {
  prometheus::ClientMetric& m = f.metric.emplace_back();
  for (const auto& [name, v] : labels) m.label.push_back({name, v});
  std::sort(m.label.begin(), m.label.end());
  if (f.type == prometheus::MetricType::Counter) {
    m.counter.value = value;
  } else {
    m.gauge.value = value;
  }
}

// A family of one unlabelled sample.
inline prometheus::MetricFamily SingleSample(const char* name, const char* help,
                                             prometheus::MetricType type, double value) {
  prometheus::MetricFamily f = NewFamily(name, help, type);
  AddSample(f, {}, value);
  return f;
}

}  // namespace rvd

#endif  // RVD_SERVER_METRIC_FAMILY_H_

#include "server/tune_metrics.h"

#include <string>
#include <utility>
#include <vector>

#include "self_improve/generator.h"

namespace rvd {

std::vector<prometheus::MetricFamily> TuneMetrics::Collect() const {
  using prometheus::MetricType;
  const tune::TuneStats s = jobs_->Stats();
  std::vector<prometheus::MetricFamily> out;

  prometheus::MetricFamily iterations;
  iterations.name = "rvd_tuning_iterations_total";
  iterations.help = "Tuning iterations run (a candidate generated and judged) since rvd started";
  iterations.type = MetricType::Counter;
  prometheus::ClientMetric it;
  it.counter.value = static_cast<double>(s.iterations_total);
  iterations.metric.push_back(std::move(it));
  out.push_back(std::move(iterations));

  prometheus::MetricFamily candidates;
  candidates.name = "rvd_tuning_candidates_total";
  candidates.help = "Tuning candidates by verdict since rvd started";
  candidates.type = MetricType::Counter;
  // Every verdict, zero included: a dashboard's rate() needs the series.
  for (int v = 0; v <= static_cast<int>(tune::Verdict::kGeneratorError); ++v) {
    const std::string name = tune::VerdictName(static_cast<tune::Verdict>(v));
    prometheus::ClientMetric m;
    m.label.push_back({"verdict", name});
    const auto found = s.candidates_total.find(name);
    m.counter.value = found == s.candidates_total.end() ? 0 : static_cast<double>(found->second);
    candidates.metric.push_back(std::move(m));
  }
  out.push_back(std::move(candidates));

  prometheus::MetricFamily best;
  best.name = "rvd_tuning_best_seconds";
  best.help = "The best kernel's time over the job's target shapes, per tuning job held";
  best.type = MetricType::Gauge;
  for (const auto& [job, seconds] : s.best_seconds) {
    prometheus::ClientMetric m;
    m.label.push_back({"job", job});
    m.gauge.value = seconds;
    best.metric.push_back(std::move(m));
  }
  out.push_back(std::move(best));
  return out;
}

}  // namespace rvd

#include "server/tune_metrics.h"

#include <string>
#include <utility>
#include <vector>

#include "self_improve/generator.h"
#include "server/metric_family.h"

namespace rvd {

std::vector<prometheus::MetricFamily> TuneMetrics::Collect() const {
  using prometheus::MetricType;
  const tune::TuneStats s = jobs_->Stats();
  std::vector<prometheus::MetricFamily> out;

  out.push_back(SingleSample(
      "rvd_tuning_iterations_total",
      "Tuning iterations run (a candidate generated and judged) since rvd started",
      MetricType::Counter, static_cast<double>(s.iterations_total)));

  prometheus::MetricFamily candidates = NewFamily(
      "rvd_tuning_candidates_total", "Tuning candidates by verdict since rvd started",
      MetricType::Counter);
  // Every verdict, zero included: a dashboard's rate() needs the series.
  for (int v = 0; v <= static_cast<int>(tune::Verdict::kGeneratorError); ++v) {
    const std::string name = tune::VerdictName(static_cast<tune::Verdict>(v));
    const auto found = s.candidates_total.find(name);
    AddSample(candidates, {{"verdict", name}},
              found == s.candidates_total.end() ? 0 : static_cast<double>(found->second));
  }
  out.push_back(std::move(candidates));

  prometheus::MetricFamily best = NewFamily(
      "rvd_tuning_best_seconds",
      "The best kernel's time over the job's target shapes, per tuning job held",
      MetricType::Gauge);
  for (const auto& [job, seconds] : s.best_seconds) AddSample(best, {{"job", job}}, seconds);
  out.push_back(std::move(best));
  return out;
}

}  // namespace rvd

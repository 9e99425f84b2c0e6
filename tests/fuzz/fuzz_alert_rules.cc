// libFuzzer target: an alert rules file's bytes through ParseAlertRules and,
// when they parse, a short measurement sequence through an AlertEngine
// running them, a reload to the same rules, and a scrape.
//
// What a rule set that ParseAlertRules accepts must guarantee
// (alert_rules.h): at most kMaxAlertRules rules with distinct valid names,
// for and resolve_for >= 1, finite thresholds, a hysteresis >= 0, a drop
// fraction in (0, 1); and every event the engine logs from it is a change
// between two different states, numbered 1, 2, 3, ... in order.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <set>
#include <string>
#include <variant>
#include <vector>

#include "server/alert_rules.h"
#include "server/alerts.h"
#include "spdlog/spdlog.h"
#include "tests/fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const bool quiet = [] {
    spdlog::set_level(spdlog::level::off);  // transitions would flood stderr
    return true;
  }();
  (void)quiet;
  absl::StatusOr<std::vector<rvd::AlertRule>> rules = rvd::ParseAlertRules(
      std::string(reinterpret_cast<const char*>(data), size));
  if (!rules.ok()) {
    FUZZ_CHECK(rules.status().code() == absl::StatusCode::kInvalidArgument);
    return 0;
  }
  FUZZ_CHECK(rules->size() <= rvd::kMaxAlertRules);
  std::set<std::string> names;
  for (const rvd::AlertRule& r : *rules) {
    FUZZ_CHECK(!r.name.empty() && r.name.size() <= 64);
    FUZZ_CHECK(names.insert(r.name).second);
    FUZZ_CHECK(r.for_count >= 1 && r.resolve_for >= 1);
    FUZZ_CHECK(std::isfinite(r.threshold) && std::isfinite(r.hysteresis));
    FUZZ_CHECK(r.hysteresis >= 0);
    if (r.condition == rvd::AlertRule::Condition::kDrop) {
      FUZZ_CHECK(r.fraction > 0 && r.fraction < 1);
      FUZZ_CHECK(r.ema_alpha > 0 && r.ema_alpha <= 1);
      FUZZ_CHECK(r.baseline_measurements >= 1);
    }
    if (r.condition == rvd::AlertRule::Condition::kChange) {
      FUZZ_CHECK(r.change_below.has_value() || r.change_above.has_value());
    }
    (void)r.Describe();
    (void)r.Matches("model-1");
  }

  rvd::AlertEngine::Options options;
  options.retained_events = 1 << 16;  // every event of the sequence below
  rvd::AlertEngine engine(options, *rules);
  std::unique_ptr<rvd::AlertWatch> watch =
      *engine.Subscribe("", std::nullopt, [] {});
  // R_V and layer PRs that rise, collapse and recover, at advancing steps.
  const double rvs[] = {1.0, 0.9, 0.2, 0.1, 0.0, 0.6, 1.2, 3.0, 0.5, 1.0};
  uint64_t seq = 0;
  for (double rv : rvs) {
    for (const char* model : {"model-1", "llama-7b"}) {
      rvd::v1::Measurement m;
      m.set_model_id(model);
      m.set_sequence(++seq);
      m.set_step(static_cast<int64_t>(seq) * 10);
      if (rv > 0) m.set_rv(rv);
      for (uint32_t l = 0; l < 4; ++l) {
        rvd::v1::LayerPR* pr = m.add_layers();
        pr->set_layer(l);
        pr->set_pr(rv * 16 + l);
      }
      engine.Observe(m);
    }
  }
  engine.SetRules(*rules);  // unchanged: every state kept, no event
  std::vector<prometheus::MetricFamily> families;
  engine.CollectMetrics(&families);
  uint64_t expected = 1;
  while (std::optional<rvd::AlertStreamEvent> e = watch->Next()) {
    const rvd::AlertEventPtr* a = std::get_if<rvd::AlertEventPtr>(&*e);
    FUZZ_CHECK(a != nullptr);  // all retained: no gap
    FUZZ_CHECK((*a)->sequence() == expected++);
    FUZZ_CHECK((*a)->state() != (*a)->previous_state());
  }
  FUZZ_CHECK(engine.last_sequence() == expected - 1);
  return 0;
}

#include "server/alerts.h"

#include <algorithm>
#include <map>
#include <atomic>
#include <random>
#include <thread>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/text_serializer.h"
#include "server/alert_rules.h"

namespace rvd {
namespace {

using rvd::v1::ALERT_STATE_FIRING;
using rvd::v1::ALERT_STATE_INACTIVE;
using rvd::v1::ALERT_STATE_PENDING;
using rvd::v1::ALERT_STATE_RESOLVED;
using rvd::v1::AlertState;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::vector<AlertRule> Rules(const std::string& yaml) {
  absl::StatusOr<std::vector<AlertRule>> r = ParseAlertRules(yaml);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : std::vector<AlertRule>{};
}

// Feeds measurements of one model and reads back the events the engine
// logged, through a watch of every model started before the first one.
class Harness {
 public:
  explicit Harness(const std::string& yaml, AlertEngine::Options options = {})
      : engine_(options, Rules(yaml)) {
    watch_ = *engine_.Subscribe("", std::nullopt, [] {});
  }

  // A measurement with R_V `rv` (absent when negative) and layer 0's PR.
  void Feed(double rv, double pr0 = 10, const std::string& model = "m",
            int64_t step = -1) {
    rvd::v1::Measurement m;
    m.set_model_id(model);
    m.set_sequence(++sequence_);
    m.set_step(step >= 0 ? step : static_cast<int64_t>(sequence_) * 100);
    m.mutable_timestamp()->set_seconds(1000 + static_cast<int64_t>(sequence_));
    if (rv >= 0) m.set_rv(rv);
    rvd::v1::LayerPR* l = m.add_layers();
    l->set_layer(0);
    l->set_pr(pr0);
    engine_.Observe(m);
  }
  // The states of the events logged since the last call.
  std::vector<AlertState> Events() {
    std::vector<AlertState> out;
    while (std::optional<AlertStreamEvent> e = watch_->Next()) {
      const AlertEventPtr* a = std::get_if<AlertEventPtr>(&*e);
      EXPECT_NE(a, nullptr) << "unexpected gap";
      if (a == nullptr) continue;
      last_ = **a;
      out.push_back((*a)->state());
    }
    return out;
  }
  AlertEngine& engine() { return engine_; }
  const rvd::v1::AlertEvent& last() const { return last_; }
  std::string Scrape() {
    std::vector<prometheus::MetricFamily> families;
    engine_.CollectMetrics(&families);
    return prometheus::TextSerializer().Serialize(families);
  }

 private:
  AlertEngine engine_;
  std::unique_ptr<AlertWatch> watch_;
  uint64_t sequence_ = 0;
  rvd::v1::AlertEvent last_;
};

TEST(AlertsTest, BelowFiresAtOnceAndResolves) {
  Harness h("rules:\n  - {name: floor, below: 0.5, severity: page, "
            "labels: {team: ml}, annotations: {summary: low}}\n");
  h.Feed(0.9);
  EXPECT_TRUE(h.Events().empty());
  h.Feed(0.4);
  EXPECT_THAT(h.Events(), ElementsAre(ALERT_STATE_FIRING));
  EXPECT_EQ(h.last().alert(), "floor");
  EXPECT_EQ(h.last().model_id(), "m");
  EXPECT_EQ(h.last().previous_state(), ALERT_STATE_INACTIVE);
  EXPECT_EQ(h.last().value(), 0.4);
  EXPECT_EQ(h.last().threshold(), 0.5);
  EXPECT_EQ(h.last().measurement_sequence(), 2u);
  EXPECT_EQ(h.last().since().seconds(), 1002);
  EXPECT_EQ(h.last().severity(), "page");
  EXPECT_EQ(h.last().labels().at("team"), "ml");
  EXPECT_EQ(h.last().annotations().at("summary"), "low");
  EXPECT_EQ(h.last().sequence(), 1u);
  EXPECT_THAT(h.Scrape(), HasSubstr("rvd_alert_active{alert=\"floor\",model_id=\"m\"} 1"));
  h.Feed(0.3);
  EXPECT_TRUE(h.Events().empty());  // still firing: no new event
  h.Feed(0.6);
  EXPECT_THAT(h.Events(), ElementsAre(ALERT_STATE_RESOLVED));
  EXPECT_EQ(h.last().previous_state(), ALERT_STATE_FIRING);
  const std::string text = h.Scrape();
  EXPECT_THAT(text, HasSubstr("rvd_alert_active{alert=\"floor\",model_id=\"m\"} 0"));
  EXPECT_THAT(text, HasSubstr("rvd_alerts_fired_total{alert=\"floor\",model_id=\"m\"} 1"));
  EXPECT_THAT(text, HasSubstr("rvd_alert_rules 1"));
  h.Feed(0.2);
  EXPECT_THAT(h.Events(), ElementsAre(ALERT_STATE_FIRING));
  EXPECT_THAT(h.Scrape(), HasSubstr("rvd_alerts_fired_total{alert=\"floor\",model_id=\"m\"} 2"));
}

TEST(AlertsTest, AboveOnALayer) {
  Harness h("rules:\n  - {name: wide, value: layer_pr, layer: 0, above: 20}\n");
  h.Feed(1, 10);
  h.Feed(1, 25);
  EXPECT_THAT(h.Events(), ElementsAre(ALERT_STATE_FIRING));
  EXPECT_EQ(h.last().value(), 25);
  h.Feed(1, 19);
  EXPECT_THAT(h.Events(), ElementsAre(ALERT_STATE_RESOLVED));
}

TEST(AlertsTest, AMissingValueChangesNothing) {
  Harness h("rules:\n  - {name: floor, below: 0.5, for: 2}\n"
            "  - {name: l9, value: layer_pr, layer: 9, below: 100}\n");
  h.Feed(0.4);
  EXPECT_THAT(h.Events(), ElementsAre(ALERT_STATE_PENDING));
  h.Feed(-1);  // no R_V: neither holds nor breaks the streak
  EXPECT_TRUE(h.Events().empty());
  h.Feed(0.4);
  EXPECT_THAT(h.Events(), ElementsAre(ALERT_STATE_FIRING));
  // Layer 9 never sent: l9 stays inactive.
  for (const AlertEngine::PairState& s : h.engine().States()) {
    if (s.rule == "l9") {
      EXPECT_EQ(s.state, ALERT_STATE_INACTIVE);
    }
  }
}

TEST(AlertsTest, ForCountsConsecutiveMeasurements) {
  Harness h("rules:\n  - {name: floor, below: 0.5, for: 3}\n");
  h.Feed(0.4);
  h.Feed(0.4);
  EXPECT_THAT(h.Events(), ElementsAre(ALERT_STATE_PENDING));
  h.Feed(0.6);  // the streak breaks: back to inactive
  EXPECT_THAT(h.Events(), ElementsAre(ALERT_STATE_INACTIVE));
  h.Feed(0.4);
  h.Feed(0.4);
  EXPECT_THAT(h.Events(), ElementsAre(ALERT_STATE_PENDING));
  EXPECT_EQ(h.last().since().seconds(), 1004);  // pending since the first
  h.Feed(0.4);
  EXPECT_THAT(h.Events(), ElementsAre(ALERT_STATE_FIRING));
  EXPECT_THAT(h.last().description(), HasSubstr("for 3 measurements"));
}

// A value oscillating around the threshold: without hysteresis it flaps on
// every measurement; with it the alert fires once and stays firing until the
// value is back past threshold + hysteresis.
TEST(AlertsTest, HysteresisStopsFlapping) {
  const std::vector<double> values = {0.6, 0.49, 0.51, 0.49, 0.52, 0.48, 0.53, 0.58};
  Harness flappy("rules:\n  - {name: f, below: 0.5}\n");
  Harness steady("rules:\n  - {name: f, below: 0.5, hysteresis: 0.05}\n");
  for (double v : values) {
    flappy.Feed(v);
    steady.Feed(v);
  }
  EXPECT_EQ(flappy.Events().size(), 6u);
  EXPECT_THAT(steady.Events(), ElementsAre(ALERT_STATE_FIRING, ALERT_STATE_RESOLVED));
  EXPECT_EQ(steady.last().value(), 0.58);
}

TEST(AlertsTest, ResolveForNeedsConsecutiveClearMeasurements) {
  Harness h("rules:\n  - {name: f, below: 0.5, resolve_for: 2}\n");
  h.Feed(0.4);
  h.Feed(0.6);
  h.Feed(0.4);  // the clear count starts again
  h.Feed(0.6);
  EXPECT_THAT(h.Events(), ElementsAre(ALERT_STATE_FIRING));
  h.Feed(0.6);
  EXPECT_THAT(h.Events(), ElementsAre(ALERT_STATE_RESOLVED));
}

TEST(AlertsTest, DropFromTheFirstMeasurements) {
  Harness h("rules:\n  - name: d\n    drop: {baseline: first, measurements: 3, fraction: 0.2}\n");
  // Baseline: mean(1.0, 1.2, 0.8) = 1.0; the three are not evaluated.
  h.Feed(1.0);
  h.Feed(1.2);
  h.Feed(0.8);
  h.Feed(0.85);  // a 15% drop
  EXPECT_TRUE(h.Events().empty());
  h.Feed(0.7);  // 30%
  EXPECT_THAT(h.Events(), ElementsAre(ALERT_STATE_FIRING));
  EXPECT_NEAR(h.last().baseline(), 1.0, 1e-12);
  EXPECT_NEAR(h.last().observed(), 0.3, 1e-12);
  EXPECT_EQ(h.last().threshold(), 0.2);
  h.Feed(0.95);
  EXPECT_THAT(h.Events(), ElementsAre(ALERT_STATE_RESOLVED));
}

TEST(AlertsTest, DropFromTheRunningMaximum) {
  Harness h("rules:\n  - name: d\n    drop: {baseline: max, fraction: 0.25}\n");
  h.Feed(1.0);
  h.Feed(2.0);  // the maximum rises
  h.Feed(1.6);  // 20% below 2.0
  EXPECT_TRUE(h.Events().empty());
  h.Feed(1.4);  // 30%
  EXPECT_THAT(h.Events(), ElementsAre(ALERT_STATE_FIRING));
  EXPECT_EQ(h.last().baseline(), 2.0);
}

// The EMA takes only the values of a quiet pair: a sustained drop keeps
// firing instead of pulling its own baseline down.
TEST(AlertsTest, DropFromTheEmaDoesNotChaseTheDrop) {
  Harness h("rules:\n  - name: d\n    drop: {baseline: ema, alpha: 0.5, fraction: 0.2}\n");
  h.Feed(1.0);  // EMA 1.0
  h.Feed(1.2);  // not a drop; EMA 1.1
  EXPECT_TRUE(h.Events().empty());
  h.Feed(0.8);  // (1.1 - 0.8) / 1.1 = 27%
  EXPECT_THAT(h.Events(), ElementsAre(ALERT_STATE_FIRING));
  EXPECT_NEAR(h.last().baseline(), 1.1, 1e-12);
  for (int i = 0; i < 10; ++i) h.Feed(0.8);
  EXPECT_TRUE(h.Events().empty());  // still firing
  h.Feed(1.05);
  EXPECT_THAT(h.Events(), ElementsAre(ALERT_STATE_RESOLVED));
}

TEST(AlertsTest, ChangePerMeasurementAndPerStep) {
  Harness per_m("rules:\n  - name: c\n    change: {below: -0.1}\n");
  per_m.Feed(1.0);
  per_m.Feed(0.95);
  EXPECT_TRUE(per_m.Events().empty());
  per_m.Feed(0.8);  // -0.15
  EXPECT_THAT(per_m.Events(), ElementsAre(ALERT_STATE_FIRING));
  EXPECT_NEAR(per_m.last().observed(), -0.15, 1e-12);
  per_m.Feed(0.8);  // 0
  EXPECT_THAT(per_m.Events(), ElementsAre(ALERT_STATE_RESOLVED));

  Harness per_s("rules:\n  - name: c\n    change: {per: step, below: -0.001, above: 0.01}\n");
  per_s.Feed(1.0, 10, "m", 1000);
  per_s.Feed(0.9, 10, "m", 1200);  // -0.1 over 200 steps: -0.0005
  EXPECT_TRUE(per_s.Events().empty());
  per_s.Feed(0.5, 10, "m", 1300);  // -0.004 per step
  EXPECT_THAT(per_s.Events(), ElementsAre(ALERT_STATE_FIRING));
  EXPECT_NEAR(per_s.last().observed(), -0.004, 1e-12);
  EXPECT_EQ(per_s.last().threshold(), -0.001);
  per_s.Feed(0.1, 10, "m", 1300);  // same step: no rate, nothing changes
  EXPECT_TRUE(per_s.Events().empty());
  per_s.Feed(0.2, 10, "m", 1310);  // +0.01 per step: clear
  EXPECT_THAT(per_s.Events(), ElementsAre(ALERT_STATE_RESOLVED));
  per_s.Feed(0.5, 10, "m", 1320);  // +0.03 per step: above
  EXPECT_THAT(per_s.Events(), ElementsAre(ALERT_STATE_FIRING));
  EXPECT_EQ(per_s.last().threshold(), 0.01);
}

TEST(AlertsTest, StatesArePerModelAndGlob) {
  Harness h("rules:\n  - {name: f, model: \"llama-*\", below: 0.5}\n");
  h.Feed(0.4, 10, "llama-a");
  h.Feed(0.6, 10, "llama-b");
  h.Feed(0.1, 10, "mistral");
  EXPECT_THAT(h.Events(), ElementsAre(ALERT_STATE_FIRING));
  EXPECT_EQ(h.last().model_id(), "llama-a");
  std::map<std::string, AlertState> states;
  for (const auto& s : h.engine().States()) states[s.model_id] = s.state;
  EXPECT_EQ(states.size(), 2u);  // mistral does not match
  EXPECT_EQ(states["llama-a"], ALERT_STATE_FIRING);
  EXPECT_EQ(states["llama-b"], ALERT_STATE_INACTIVE);
}

TEST(AlertsTest, ReloadKeepsUnchangedRulesAndClosesTheOthers) {
  Harness h("rules:\n  - {name: keep, below: 0.5}\n  - {name: gone, below: 0.5}\n"
            "  - {name: edit, below: 0.5}\n");
  h.Feed(0.4);
  EXPECT_EQ(h.Events().size(), 3u);
  h.engine().SetRules(Rules("rules:\n  - {name: keep, below: 0.5, severity: page}\n"
                            "  - {name: edit, below: 0.3}\n  - {name: new, below: 0.5}\n"));
  // gone and edit (changed) end; keep goes on firing, without an event.
  std::vector<AlertState> states = h.Events();
  EXPECT_THAT(states, ElementsAre(ALERT_STATE_INACTIVE, ALERT_STATE_INACTIVE));
  EXPECT_EQ(h.engine().num_rules(), 3u);
  std::map<std::string, AlertState> now;
  for (const auto& s : h.engine().States()) now[s.rule] = s.state;
  EXPECT_EQ(now.size(), 1u);  // only keep has a pair yet
  EXPECT_EQ(now["keep"], ALERT_STATE_FIRING);
  const std::string text = h.Scrape();
  EXPECT_THAT(text, HasSubstr("rvd_alert_active{alert=\"keep\",model_id=\"m\"} 1"));
  EXPECT_THAT(text, ::testing::Not(HasSubstr("alert=\"gone\"")));
  h.Feed(0.4);
  // edit (0.4 is not below 0.3) stays quiet; new fires.
  EXPECT_THAT(h.Events(), ElementsAre(ALERT_STATE_FIRING));
  EXPECT_EQ(h.last().alert(), "new");
}

TEST(AlertsTest, SeriesBudgetLimitsExportNotEvaluation) {
  AlertEngine::Options options;
  options.max_series = 4;  // two pairs
  Harness h("rules:\n  - {name: f, below: 0.5}\n", options);
  h.Feed(0.4, 10, "a");
  h.Feed(0.4, 10, "b");
  h.Feed(0.4, 10, "c");
  EXPECT_EQ(h.Events().size(), 3u);  // all three fire
  const std::string text = h.Scrape();
  EXPECT_THAT(text, HasSubstr("model_id=\"b\""));
  EXPECT_THAT(text, ::testing::Not(HasSubstr("model_id=\"c\"")));
  EXPECT_THAT(text, HasSubstr("rvd_alert_series_dropped_total 2"));
}

TEST(AlertsTest, WatchFiltersResumesAndReportsGaps) {
  AlertEngine::Options options;
  options.retained_events = 4;
  AlertEngine engine(options, Rules("rules:\n  - {name: f, below: 0.5}\n"));
  auto feed = [&, seq = uint64_t{0}](const std::string& model, double rv) mutable {
    rvd::v1::Measurement m;
    m.set_model_id(model);
    m.set_sequence(++seq);
    m.set_rv(rv);
    engine.Observe(m);
  };
  int notified = 0;
  std::unique_ptr<AlertWatch> only_b =
      *engine.Subscribe("b", std::nullopt, [&notified] { ++notified; });
  for (int i = 0; i < 3; ++i) {  // 6 events: a fires, b fires, resolve both
    feed("a", 0.4);
    feed("b", 0.4);
    feed("a", 0.6);
    feed("b", 0.6);
  }
  EXPECT_EQ(engine.last_sequence(), 12u);
  EXPECT_GT(notified, 0);
  // only_b read nothing: events 1..8 are gone (4 retained), a slow-consumer
  // gap; then b's retained events 10 and 12.
  std::optional<AlertStreamEvent> e = only_b->Next();
  ASSERT_TRUE(e.has_value());
  const GapMarker* gap = std::get_if<GapMarker>(&*e);
  ASSERT_NE(gap, nullptr);
  EXPECT_EQ(gap->first_sequence, 1u);
  EXPECT_EQ(gap->last_sequence, 8u);
  EXPECT_EQ(gap->missed, 0u);  // filtered: not known
  EXPECT_EQ(gap->reason, GapMarker::Reason::kSlowConsumer);
  std::vector<uint64_t> got;
  while ((e = only_b->Next())) got.push_back(std::get<AlertEventPtr>(*e)->sequence());
  EXPECT_THAT(got, ElementsAre(10u, 12u));
  EXPECT_EQ(only_b->cursor(), 12u);

  // Resuming: an old cursor is a not-retained gap, a cursor above the newest
  // is refused.
  std::unique_ptr<AlertWatch> resumed = *engine.Subscribe("", 2, [] {});
  e = resumed->Next();
  gap = std::get_if<GapMarker>(&*e);
  ASSERT_NE(gap, nullptr);
  EXPECT_EQ(gap->first_sequence, 3u);
  EXPECT_EQ(gap->last_sequence, 8u);
  EXPECT_EQ(gap->missed, 6u);
  EXPECT_EQ(gap->reason, GapMarker::Reason::kNotRetained);
  EXPECT_EQ(std::get<AlertEventPtr>(*resumed->Next())->sequence(), 9u);
  EXPECT_EQ(engine.Subscribe("", 13, [] {}).status().code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_TRUE(engine.Subscribe("", 12, [] {}).ok());
  engine.CloseWatches();
  EXPECT_TRUE(resumed->closed());
  EXPECT_EQ(engine.Subscribe("", std::nullopt, [] {}).status().code(),
            absl::StatusCode::kUnavailable);
}

TEST(AlertsTest, WatcherLimit) {
  AlertEngine::Options options;
  options.max_watchers = 1;
  AlertEngine engine(options, {});
  absl::StatusOr<std::unique_ptr<AlertWatch>> first =
      engine.Subscribe("", std::nullopt, [] {});
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(engine.Subscribe("", std::nullopt, [] {}).status().code(),
            absl::StatusCode::kResourceExhausted);
  first->reset();
  EXPECT_TRUE(engine.Subscribe("", std::nullopt, [] {}).ok());
}

// Measurements, reloads, scrapes and readers at once: every reader of every
// model sees each alert event exactly once, in order, or inside a gap that
// names it; nothing deadlocks.
TEST(AlertsTest, ConcurrentObserveReloadScrapeAndWatch) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  AlertEngine::Options options;
  options.retained_events = 64;  // small, so that readers meet gaps
  const std::vector<AlertRule> a = Rules(
      "rules:\n  - {name: f, below: 0.5}\n  - {name: g, above: 0.8, for: 2}\n");
  const std::vector<AlertRule> b = Rules(
      "rules:\n  - {name: f, below: 0.5}\n  - {name: g, above: 0.7}\n");
  AlertEngine engine(options, a);
  std::atomic<bool> done{false};
  constexpr int kReaders = 3;
  std::vector<std::unique_ptr<AlertWatch>> watches;
  for (int i = 0; i < kReaders; ++i) {
    watches.push_back(*engine.Subscribe("", std::nullopt, [] {}));
  }
  std::vector<std::vector<std::pair<uint64_t, uint64_t>>> seen(kReaders);
  std::vector<std::thread> threads;
  for (int i = 0; i < kReaders; ++i) {
    threads.emplace_back([&, i] {
      while (true) {
        const bool finished = done.load();
        std::optional<AlertStreamEvent> e = watches[i]->Next();
        if (!e.has_value()) {
          if (finished) return;
          std::this_thread::yield();
          continue;
        }
        if (const auto* g = std::get_if<GapMarker>(&*e)) {
          seen[i].emplace_back(g->first_sequence, g->last_sequence);
        } else {
          const uint64_t s = std::get<AlertEventPtr>(*e)->sequence();
          seen[i].emplace_back(s, s);
        }
      }
    });
  }
  std::thread reloader([&] {
    for (int i = 0; i < 200 && !done.load(); ++i) {
      engine.SetRules(i % 2 ? a : b);
      std::this_thread::yield();
    }
  });
  std::thread scraper([&] {
    while (!done.load()) {
      std::vector<prometheus::MetricFamily> f;
      engine.CollectMetrics(&f);
      (void)engine.States();
    }
  });
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> rv(0.3, 0.9);
  for (uint64_t seq = 1; seq <= 20000; ++seq) {
    rvd::v1::Measurement m;
    m.set_model_id("m" + std::to_string(seq % 4));
    m.set_sequence(seq);
    m.set_rv(rv(rng));
    engine.Observe(m);
  }
  done = true;
  reloader.join();
  scraper.join();
  for (std::thread& t : threads) t.join();
  const uint64_t last = engine.last_sequence();
  ASSERT_GT(last, 1000u);
  for (int i = 0; i < kReaders; ++i) {
    uint64_t next = 1;
    for (const auto& [first, through] : seen[i]) {
      ASSERT_EQ(first, next) << "reader " << i;
      ASSERT_LE(first, through);
      next = through + 1;
    }
    EXPECT_EQ(next, last + 1) << "reader " << i;
  }
}

// Random walks of R_V through a rule with for and hysteresis: the event
// sequence is always a legal path of the state machine and the alert never
// resolves inside the hysteresis band.
TEST(AlertsTest, RandomWalksFollowTheStateMachine) {
  const uint32_t seed = std::random_device{}();
  std::mt19937 rng(seed);
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  Harness h("rules:\n  - {name: f, below: 0.5, for: 2, hysteresis: 0.05}\n");
  std::uniform_real_distribution<double> step(-0.04, 0.04);
  double v = 0.5;
  AlertState state = ALERT_STATE_INACTIVE;
  for (int i = 0; i < 2000; ++i) {
    v = std::clamp(v + step(rng), 0.3, 0.7);
    h.Feed(v);
    for (AlertState next : h.Events()) {
      switch (next) {
        case ALERT_STATE_PENDING:
          EXPECT_NE(state, ALERT_STATE_FIRING);
          EXPECT_LT(v, 0.5);
          break;
        case ALERT_STATE_FIRING:
          EXPECT_EQ(state, ALERT_STATE_PENDING);
          EXPECT_LT(v, 0.5);
          break;
        case ALERT_STATE_RESOLVED:
          EXPECT_EQ(state, ALERT_STATE_FIRING);
          EXPECT_GE(v, 0.55);
          break;
        case ALERT_STATE_INACTIVE:
          EXPECT_EQ(state, ALERT_STATE_PENDING);
          break;
        default:
          ADD_FAILURE() << "state " << next;
      }
      state = next;
    }
  }
}

}  // namespace
}  // namespace rvd

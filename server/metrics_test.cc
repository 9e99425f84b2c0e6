#include "server/metrics.h"

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/text_serializer.h"
#include "server/fake_engine.h"
#include "server/history.h"

namespace rvd {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::string Serialize(const Metrics& metrics) {
  std::ostringstream out;
  prometheus::TextSerializer().Serialize(out, metrics.Collect());
  return out.str();
}

// The samples of a text exposition: "name{labels}" -> value text.
std::map<std::string, std::string> Samples(const std::string& text) {
  std::map<std::string, std::string> samples;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (line.empty() || line[0] == '#') continue;
    const size_t space = line.rfind(' ');
    samples[std::string(line.substr(0, space))] =
        std::string(line.substr(space + 1));
  }
  return samples;
}

// Samples of one family (name, or name{...}).
int Count(const std::map<std::string, std::string>& s, const std::string& name) {
  int n = 0;
  for (const auto& [k, v] : s) {
    if (k == name || absl::StartsWith(k, name + "{")) ++n;
  }
  return n;
}

rvd::v1::Measurement MakeMeasurement(const std::string& model, int64_t step,
                                     std::optional<double> rv, int layers = 2) {
  rvd::v1::Measurement m;
  m.set_model_id(model);
  m.set_step(step);
  m.mutable_timestamp()->set_seconds(1700000000 + step);
  m.mutable_timestamp()->set_nanos(500000000);
  if (rv.has_value()) m.set_rv(*rv);
  for (int layer = 0; layer < layers; ++layer) {
    rvd::v1::LayerPR* l = m.add_layers();
    l->set_layer(layer);
    l->set_pr(10 + layer);
    l->add_head_pr(2.5 + layer);
    l->add_head_pr(3.5 + layer);
  }
  m.set_variant("algebraic");
  m.set_backend("cpu");
  m.set_engine_version("cpu-1");
  m.set_elapsed_ms(3.0);  // 0.003 s
  return m;
}

MetricsOptions Options(bool per_head, double threshold,
                       uint64_t max_series = 100000) {
  MetricsOptions o;
  o.per_head = per_head;
  o.rv_alert_threshold = threshold;
  o.version = "0.1.0";
  o.backend = "cpu";
  o.engine_version = "cpu-1";
  o.max_series = max_series;
  return o;
}

// An engine whose counters a test sets.

// The daemon's wiring in small: measurements go through History, and
// Metrics reads its index.
struct Fixture {
  explicit Fixture(const MetricsOptions& options, size_t max_watchers = 4)
      : history(NewMemLog(100), History::Options{10, 100, max_watchers, 2, {}}),
        metrics(options, MetricsSources{&history.index(), &engine, &pool,
                                        &history.bus()}) {}
  void Record(const rvd::v1::Measurement& m) {
    absl::StatusOr<MeasurementLog::Entry> e = history.Add(m);
    ASSERT_TRUE(e.ok()) << e.status();
    metrics.RecordMeasurement(**e);
  }
  FakeEngine engine;
  ComputePool pool{1, 4};
  History history;
  Metrics metrics;
};

TEST(MetricsTest, RecordsMeasurementSamples) {
  Fixture f(Options(/*per_head=*/false, /*threshold=*/0));
  f.Record(MakeMeasurement("llama", 1, 0.75));
  f.Record(MakeMeasurement("llama", 2, 0.5));
  f.Record(MakeMeasurement("gpt2", 1, 1.25));
  f.metrics.AddIngestedBytes(1000);
  f.metrics.AddIngestedBytes(24);
  f.metrics.RecordError("INVALID_ARGUMENT");
  f.metrics.RecordError("INVALID_ARGUMENT");
  f.metrics.RecordError("NOT_FOUND");

  const auto s = Samples(Serialize(f.metrics));
  // Labels in name order, as the registry writes them.
  EXPECT_EQ(s.at("rvd_rv{model_id=\"llama\"}"), "0.5");
  EXPECT_EQ(s.at("rvd_rv{model_id=\"gpt2\"}"), "1.25");
  EXPECT_EQ(s.at("rvd_participation_ratio{layer=\"0\",model_id=\"llama\"}"), "10");
  EXPECT_EQ(s.at("rvd_participation_ratio{layer=\"1\",model_id=\"llama\"}"), "11");
  EXPECT_EQ(s.at("rvd_measurements_total{backend=\"cpu\",model_id=\"llama\","
                 "variant=\"algebraic\"}"),
            "2");
  EXPECT_EQ(s.at("rvd_measurements_total{backend=\"cpu\",model_id=\"gpt2\","
                 "variant=\"algebraic\"}"),
            "1");
  EXPECT_EQ(s.at("rvd_measurement_duration_seconds_count{backend=\"cpu\","
                 "variant=\"algebraic\"}"),
            "3");
  // 3 ms: in the 5 ms bucket, not in the 2.5 ms one.
  EXPECT_EQ(s.at("rvd_measurement_duration_seconds_bucket{backend=\"cpu\","
                 "variant=\"algebraic\",le=\"0.005\"}"),
            "3");
  EXPECT_EQ(s.at("rvd_measurement_duration_seconds_bucket{backend=\"cpu\","
                 "variant=\"algebraic\",le=\"0.0025\"}"),
            "0");
  EXPECT_EQ(s.at("rvd_ingested_bytes_total"), "1024");
  EXPECT_EQ(s.at("rvd_errors_total{code=\"INVALID_ARGUMENT\"}"), "2");
  EXPECT_EQ(s.at("rvd_errors_total{code=\"NOT_FOUND\"}"), "1");
  EXPECT_EQ(s.at("rvd_last_measurement_timestamp_seconds{model_id=\"llama\"}"),
            "1700000002.5");
  EXPECT_EQ(s.at("rvd_models"), "2");
  EXPECT_EQ(s.at("rvd_series_dropped_total"), "0");
  EXPECT_EQ(s.at("rvd_inflight_requests"), "0");
  EXPECT_EQ(s.at("rvd_build_info{backend=\"cpu\",engine_version=\"cpu-1\","
                 "version=\"0.1.0\"}"),
            "1");
  EXPECT_EQ(s.count("rvd_rv_alert_threshold"), 0u);
  EXPECT_EQ(Count(s, "rvd_rv_below_threshold"), 0);
  EXPECT_EQ(Count(s, "rvd_participation_ratio_head"), 0);
}

// The series describe each model's newest measurement, read from the index
// at the scrape: no stale R_V, no layer the newest does not have.
TEST(MetricsTest, SeriesFollowTheNewestMeasurement) {
  Fixture f(Options(true, 0.8));
  f.Record(MakeMeasurement("m", 1, 0.5, /*layers=*/3));
  auto s = Samples(Serialize(f.metrics));
  EXPECT_EQ(Count(s, "rvd_participation_ratio"), 3);
  EXPECT_EQ(Count(s, "rvd_participation_ratio_head"), 6);
  EXPECT_EQ(s.at("rvd_rv_below_threshold{model_id=\"m\"}"), "1");

  f.Record(MakeMeasurement("m", 2, std::nullopt, /*layers=*/1));
  s = Samples(Serialize(f.metrics));
  EXPECT_EQ(s.count("rvd_rv{model_id=\"m\"}"), 0u);
  EXPECT_EQ(s.count("rvd_rv_below_threshold{model_id=\"m\"}"), 0u);
  EXPECT_EQ(Count(s, "rvd_participation_ratio"), 1);
  EXPECT_EQ(Count(s, "rvd_participation_ratio_head"), 2);
  EXPECT_EQ(s.at("rvd_participation_ratio_head{head=\"1\",layer=\"0\","
                 "model_id=\"m\"}"),
            "3.5");

  f.Record(MakeMeasurement("m", 3, 0.9));
  s = Samples(Serialize(f.metrics));
  EXPECT_EQ(s.at("rvd_rv{model_id=\"m\"}"), "0.9");
  EXPECT_EQ(s.at("rvd_rv_below_threshold{model_id=\"m\"}"), "0");
  EXPECT_EQ(s.at("rvd_rv_alert_threshold"), "0.8");
  EXPECT_EQ(s.at("rvd_measurements_total{backend=\"cpu\",model_id=\"m\","
                 "variant=\"algebraic\"}"),
            "3");
}

// The budget holds the PR series to max_series: a model that does not fit
// exports its R_V but no PR series, counted and logged, until a newer
// measurement of it fits.
TEST(MetricsTest, SeriesBudget) {
  Fixture f(Options(/*per_head=*/false, 0, /*max_series=*/5));
  f.Record(MakeMeasurement("a", 1, 0.5, 2));
  f.Record(MakeMeasurement("b", 1, 0.5, 2));
  f.Record(MakeMeasurement("c", 1, 0.5, 2));  // 2 + 2 + 2 > 5
  auto s = Samples(Serialize(f.metrics));
  EXPECT_EQ(Count(s, "rvd_participation_ratio"), 4);
  EXPECT_EQ(s.count("rvd_participation_ratio{layer=\"0\",model_id=\"c\"}"), 0u);
  EXPECT_EQ(s.at("rvd_rv{model_id=\"c\"}"), "0.5");
  EXPECT_EQ(s.at("rvd_series_dropped_total"), "2");

  f.Record(MakeMeasurement("c", 2, 0.5, 1));  // 2 + 2 + 1 fits
  s = Samples(Serialize(f.metrics));
  EXPECT_EQ(Count(s, "rvd_participation_ratio"), 5);
  EXPECT_EQ(s.at("rvd_participation_ratio{layer=\"0\",model_id=\"c\"}"), "10");

  f.Record(MakeMeasurement("a", 2, 0.5, 3));  // 3 + 2 + 1 > 5: a drops out
  s = Samples(Serialize(f.metrics));
  EXPECT_EQ(Count(s, "rvd_participation_ratio"), 3);
  EXPECT_EQ(s.count("rvd_participation_ratio{layer=\"0\",model_id=\"a\"}"), 0u);
  EXPECT_EQ(s.at("rvd_series_dropped_total"), "5");
}

// The engine's counters are read at each scrape, not pushed.
TEST(MetricsTest, EngineStatsAreReadAtScrapeTime) {
  Fixture f(Options(false, 0));
  {
    absl::MutexLock lock(&f.engine.mu);
    f.engine.stats.served = {{"algebraic/cpu-avx512", 7}};
    f.engine.stats.events = {{"plan_reused", 2}};
    f.engine.stats.phase_seconds = {{"compute", 1.5}};
    f.engine.stats.device_errors = {{"cudaErrorIllegalAddress", 1}};
    f.engine.stats.device_bytes_held = 4096;
    f.engine.stats.pinned_bytes_held = 1024;
    f.engine.stats.healthy = false;
    f.engine.stats.kernel_policies = {{"tma-wgmma-square", "fused-v4-bt128"}};
  }
  auto s = Samples(Serialize(f.metrics));
  EXPECT_EQ(s.at("rvd_kernel_info{backend=\"cpu\",policy=\"fused-v4-bt128\",technique=\"tma-"
                 "wgmma-square\"}"),
            "1");
  EXPECT_EQ(s.at("rvd_engine_matrices_total{backend=\"cpu\",path=\"algebraic/"
                 "cpu-avx512\"}"),
            "7");
  EXPECT_EQ(s.at("rvd_engine_events_total{backend=\"cpu\",event=\"plan_reused\"}"),
            "2");
  EXPECT_EQ(s.at("rvd_engine_seconds_total{backend=\"cpu\",phase=\"compute\"}"),
            "1.5");
  EXPECT_EQ(s.at("rvd_engine_errors_total{code=\"cudaErrorIllegalAddress\"}"),
            "1");
  EXPECT_EQ(s.at("rvd_engine_device_bytes"), "4096");
  EXPECT_EQ(s.at("rvd_engine_pinned_bytes"), "1024");
  EXPECT_EQ(s.at("rvd_engine_healthy"), "0");
  {
    absl::MutexLock lock(&f.engine.mu);
    f.engine.stats.served["algebraic/cpu-avx512"] = 9;
    f.engine.stats.healthy = true;
  }
  s = Samples(Serialize(f.metrics));
  EXPECT_EQ(s.at("rvd_engine_matrices_total{backend=\"cpu\",path=\"algebraic/"
                 "cpu-avx512\"}"),
            "9");
  EXPECT_EQ(s.at("rvd_engine_healthy"), "1");
}

TEST(MetricsTest, PoolWatchersAndGaps) {
  Fixture f(Options(false, 0));
  ASSERT_TRUE(f.pool.Run([] {}).ok());
  absl::StatusOr<std::unique_ptr<Watch>> w =
      f.history.Subscribe("", std::nullopt, {});
  ASSERT_TRUE(w.ok());
  for (int i = 0; i < 5; ++i) f.Record(MakeMeasurement("m", i, 0.5));  // queue 2
  auto s = Samples(Serialize(f.metrics));
  EXPECT_EQ(s.at("rvd_watchers"), "1");
  EXPECT_EQ(s.at("rvd_watch_gap_entries_total"), "3");
  EXPECT_EQ(s.at("rvd_compute_queue_length"), "0");
  EXPECT_EQ(s.at("rvd_compute_running"), "0");
  EXPECT_EQ(s.at("rvd_compute_queue_waits_total"), "1");
  EXPECT_EQ(s.count("rvd_compute_queue_wait_seconds_total"), 1u);
  EXPECT_EQ(s.at("rvd_compute_rejected_total"), "0");
  w->reset();
  s = Samples(Serialize(f.metrics));
  EXPECT_EQ(s.at("rvd_watchers"), "0");
}

TEST(MetricsTest, RequestDurationsAndAnExactInflightGauge) {
  Fixture f(Options(false, 0));
  f.metrics.ObserveRequest("Measure", "OK", 0.002);
  f.metrics.ObserveRequest("Measure", "OK", 20);
  f.metrics.ObserveRequest("GetLatest", "NOT_FOUND", 0.0001);
  constexpr int kThreads = 8;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&f] {
      for (int i = 0; i < 1000; ++i) {
        f.metrics.AddInflight(1);
        f.metrics.AddInflight(-1);
      }
      f.metrics.AddInflight(1);
    });
  }
  for (std::thread& t : threads) t.join();
  auto s = Samples(Serialize(f.metrics));
  EXPECT_EQ(s.at("rvd_inflight_requests"), absl::StrCat(kThreads));
  EXPECT_EQ(s.at("rvd_request_duration_seconds_count{code=\"OK\",method=\"Measure\"}"),
            "2");
  EXPECT_EQ(s.at("rvd_request_duration_seconds_bucket{code=\"OK\",method="
                 "\"Measure\",le=\"10\"}"),
            "1");
  EXPECT_EQ(s.at("rvd_request_duration_seconds_bucket{code=\"OK\",method="
                 "\"Measure\",le=\"30\"}"),
            "2");
  EXPECT_EQ(s.at("rvd_request_duration_seconds_count{code=\"NOT_FOUND\","
                 "method=\"GetLatest\"}"),
            "1");
}

// --- promtool --------------------------------------------------------------

constexpr char kPromtool[] = "/usr/bin/promtool";

// Runs `promtool check metrics` on `text` (on stdin); its exit code and output.
std::pair<int, std::string> Promtool(const std::string& text) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path();
  const std::string stem = absl::StrCat("rvd_metrics_test_", ::getpid());
  const std::filesystem::path in = dir / (stem + ".prom");
  const std::filesystem::path out = dir / (stem + ".out");
  {
    std::ofstream f(in);
    f << text;
  }
  const std::string command = absl::StrCat(kPromtool, " check metrics < ",
                                           in.string(), " > ", out.string(), " 2>&1");
  const int status = std::system(command.c_str());
  std::stringstream report;
  {
    std::ifstream report_file(out);
    report << report_file.rdbuf();
  }
  std::filesystem::remove(in);
  std::filesystem::remove(out);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, report.str()};
}

TEST(PromtoolTest, CheckMetricsIsClean) {
  if (!std::filesystem::exists(kPromtool)) {
    GTEST_SKIP() << kPromtool << " not installed (Debian package prometheus)";
  }
  // The check can fail: a counter without _total is a lint error (exit 3).
  EXPECT_NE(Promtool("# HELP rvd_bad_bytes x\n# TYPE rvd_bad_bytes counter\n"
                     "rvd_bad_bytes 1\n")
                .first,
            0);

  // Everything on, so every family is linted.
  // 6 series a measurement: the first model fits, the second does not.
  Fixture f(Options(/*per_head=*/true, /*threshold=*/0.8, /*max_series=*/8));
  {
    absl::MutexLock lock(&f.engine.mu);
    f.engine.stats.served = {{"algebraic/cpu-avx512", 7}};
    f.engine.stats.events = {{"plan_reused", 2}};
    f.engine.stats.phase_seconds = {{"compute", 1.5}};
    f.engine.stats.device_errors = {{"cudaErrorIllegalAddress", 1}};
  }
  absl::StatusOr<std::unique_ptr<Watch>> w =
      f.history.Subscribe("", std::nullopt, {});
  f.Record(MakeMeasurement("llama-3-8b", 1, 0.75));
  f.Record(MakeMeasurement("gpt2", 1, std::nullopt));
  f.Record(MakeMeasurement("gpt2", 2, 0.5));
  f.metrics.AddIngestedBytes(4096);
  f.metrics.RecordError("INVALID_ARGUMENT");
  f.metrics.ObserveRequest("Measure", "OK", 0.01);
  f.metrics.AddInflight(1);
  const std::string text = Serialize(f.metrics);
  for (const char* family :
       {"rvd_rv", "rvd_participation_ratio_head", "rvd_series_dropped_total",
        "rvd_engine_events_total", "rvd_engine_errors_total", "rvd_watchers",
        "rvd_watch_gap_entries_total", "rvd_compute_queue_wait_seconds_total",
        "rvd_request_duration_seconds", "rvd_rv_below_threshold"}) {
    EXPECT_THAT(text, HasSubstr(absl::StrCat("# TYPE ", family, " "))) << family;
  }
  const auto [exit_code, report] = Promtool(text);
  EXPECT_EQ(exit_code, 0) << "promtool check metrics:\n"
                          << report << "\non:\n"
                          << text;
}

// Many threads record while others scrape; the counts add up exactly and
// no scrape exceeds the series budget.
TEST(MetricsTest, ConcurrentRecordingAndScraping) {
  constexpr uint64_t kBudget = 7;
  Fixture f(Options(true, 0.8, kBudget));
  constexpr int kThreads = 4;
  constexpr int kEach = 300;
  std::atomic<bool> done{false};
  std::atomic<int> over_budget{0};
  std::thread scraper([&] {
    while (!done.load()) {
      const auto s = Samples(Serialize(f.metrics));
      if (Count(s, "rvd_participation_ratio") +
              Count(s, "rvd_participation_ratio_head") >
          static_cast<int>(kBudget)) {
        ++over_budget;
      }
    }
  });
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&f, t] {
      for (int i = 0; i < kEach; ++i) {
        f.Record(MakeMeasurement(absl::StrCat("m", i % 3), i,
                                 i % 2 ? std::optional<double>(0.5) : std::nullopt,
                                 1 + (i + t) % 3));
        f.metrics.AddIngestedBytes(1);
        f.metrics.RecordError(t % 2 ? "INTERNAL" : "UNAVAILABLE");
      }
    });
  }
  for (auto& th : threads) th.join();
  done = true;
  scraper.join();
  EXPECT_EQ(over_budget.load(), 0);
  const auto s = Samples(Serialize(f.metrics));
  EXPECT_EQ(s.at("rvd_ingested_bytes_total"), absl::StrCat(kThreads * kEach));
  EXPECT_EQ(s.at("rvd_errors_total{code=\"INTERNAL\"}"),
            absl::StrCat(kThreads / 2 * kEach));
  EXPECT_EQ(s.at("rvd_measurement_duration_seconds_count{backend=\"cpu\","
                 "variant=\"algebraic\"}"),
            absl::StrCat(kThreads * kEach));
  double total = 0;
  for (int m = 0; m < 3; ++m) {
    total += std::stod(
        s.at(absl::StrCat("rvd_measurements_total{backend=\"cpu\",model_id=\"m",
                          m, "\",variant=\"algebraic\"}")));
  }
  EXPECT_EQ(total, kThreads * kEach);
}

}  // namespace
}  // namespace rvd

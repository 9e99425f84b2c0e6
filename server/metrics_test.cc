#include "server/metrics.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/text_serializer.h"

namespace rvd {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::string Serialize(Metrics& metrics) {
  std::ostringstream out;
  prometheus::TextSerializer().Serialize(out, metrics.registry()->Collect());
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

rvd::v1::Measurement MakeMeasurement(const std::string& model, int64_t step,
                                     std::optional<double> rv) {
  rvd::v1::Measurement m;
  m.set_model_id(model);
  m.set_step(step);
  m.mutable_timestamp()->set_seconds(1700000000 + step);
  m.mutable_timestamp()->set_nanos(500000000);
  if (rv.has_value()) m.set_rv(*rv);
  for (uint32_t layer = 0; layer < 2; ++layer) {
    rvd::v1::LayerPR* l = m.add_layers();
    l->set_layer(layer);
    l->set_pr(10 + layer);
    l->add_head_pr(2.5 + layer);
    l->add_head_pr(3.5 + layer);
    l->set_tensor_name(absl::StrCat("model.layers.", layer, ".v_proj.weight"));
  }
  m.set_variant("algebraic");
  m.set_backend("cpu");
  m.set_engine_version("cpu-1");
  m.set_elapsed_ms(3.0);  // 0.003 s
  return m;
}

MetricsOptions Options(bool per_head, double threshold) {
  MetricsOptions o;
  o.per_head = per_head;
  o.rv_alert_threshold = threshold;
  o.version = "0.1.0";
  o.backend = "cpu";
  o.engine_version = "cpu-1";
  return o;
}

TEST(MetricsTest, RecordsMeasurementSamples) {
  Metrics metrics(Options(/*per_head=*/false, /*threshold=*/0));
  metrics.RecordMeasurement(MakeMeasurement("llama", 1, 0.75));
  metrics.RecordMeasurement(MakeMeasurement("llama", 2, 0.5));
  metrics.RecordMeasurement(MakeMeasurement("gpt2", 1, 1.25));
  metrics.AddIngestedBytes(1000);
  metrics.AddIngestedBytes(24);
  metrics.RecordError("INVALID_ARGUMENT");
  metrics.RecordError("INVALID_ARGUMENT");
  metrics.RecordError("NOT_FOUND");
  metrics.SetInflight(3);

  const std::string text = Serialize(metrics);
  const auto s = Samples(text);
  // prometheus-cpp writes labels in name order.
  EXPECT_EQ(s.at("rvd_rv{model_id=\"llama\"}"), "0.5");
  EXPECT_EQ(s.at("rvd_rv{model_id=\"gpt2\"}"), "1.25");
  EXPECT_EQ(s.at("rvd_participation_ratio{layer=\"0\",model_id=\"llama\"}"),
            "10");
  EXPECT_EQ(s.at("rvd_participation_ratio{layer=\"1\",model_id=\"llama\"}"),
            "11");
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
  EXPECT_EQ(s.at("rvd_measurement_duration_seconds_bucket{backend=\"cpu\","
                 "variant=\"algebraic\",le=\"0.0001\"}"),
            "0");
  EXPECT_EQ(s.at("rvd_measurement_duration_seconds_bucket{backend=\"cpu\","
                 "variant=\"algebraic\",le=\"10\"}"),
            "3");
  EXPECT_EQ(s.at("rvd_ingested_bytes_total"), "1024");
  EXPECT_EQ(s.at("rvd_errors_total{code=\"INVALID_ARGUMENT\"}"), "2");
  EXPECT_EQ(s.at("rvd_errors_total{code=\"NOT_FOUND\"}"), "1");
  EXPECT_EQ(s.at("rvd_inflight_requests"), "3");
  EXPECT_EQ(s.at("rvd_build_info{backend=\"cpu\",engine_version=\"cpu-1\","
                 "version=\"0.1.0\"}"),
            "1");
  EXPECT_EQ(std::stod(s.at(
                "rvd_last_measurement_timestamp_seconds{model_id=\"llama\"}")),
            1700000002.5);

  // Off by default: no per-head series, no alert gauges.
  EXPECT_THAT(text, Not(HasSubstr("rvd_participation_ratio_head")));
  EXPECT_THAT(text, Not(HasSubstr("rvd_rv_below_threshold")));
  EXPECT_THAT(text, Not(HasSubstr("rvd_rv_alert_threshold")));
  // Every family has help text.
  for (const char* family :
       {"rvd_rv", "rvd_participation_ratio", "rvd_measurements_total",
        "rvd_measurement_duration_seconds", "rvd_ingested_bytes_total",
        "rvd_errors_total", "rvd_inflight_requests", "rvd_build_info",
        "rvd_last_measurement_timestamp_seconds"}) {
    EXPECT_THAT(text, HasSubstr(absl::StrCat("# HELP ", family, " ")))
        << family;
  }
}

// The engine's cumulative counts become counters that advance by growth:
// reporting the same totals twice adds nothing.
TEST(MetricsTest, ServedPathsFollowTheEngineTotals) {
  Metrics metrics(Options(/*per_head=*/false, /*threshold=*/0));
  metrics.RecordServed("cuda", {{"fused/fused-v4-x", 40}, {"fused/fused-v1-y", 0}});
  metrics.RecordServed("cuda", {{"fused/fused-v4-x", 40}, {"fused/fused-v1-y", 0}});
  metrics.RecordServed("cuda", {{"fused/fused-v4-x", 120}, {"fused/fused-v1-y", 3}});
  const std::string text = Serialize(metrics);
  const auto s = Samples(text);
  EXPECT_EQ(s.at("rvd_engine_matrices_total{backend=\"cuda\",path=\"fused/fused-v4-x\"}"),
            "120");
  EXPECT_EQ(s.at("rvd_engine_matrices_total{backend=\"cuda\",path=\"fused/fused-v1-y\"}"), "3");
  EXPECT_THAT(text, HasSubstr("# TYPE rvd_engine_matrices_total counter"));
  // Phase seconds likewise.
  metrics.RecordPhases("cuda", {{"h2d", 0.5}, {"compute", 0.25}});
  metrics.RecordPhases("cuda", {{"h2d", 0.75}, {"compute", 0.25}});
  const auto p = Samples(Serialize(metrics));
  EXPECT_EQ(p.at("rvd_engine_seconds_total{backend=\"cuda\",phase=\"h2d\"}"), "0.75");
  EXPECT_EQ(p.at("rvd_engine_seconds_total{backend=\"cuda\",phase=\"compute\"}"), "0.25");
}

TEST(MetricsTest, PerHeadSeriesOnlyWhenEnabled) {
  Metrics off(Options(false, 0));
  off.RecordMeasurement(MakeMeasurement("m", 1, 0.5));
  EXPECT_THAT(Serialize(off), Not(HasSubstr("rvd_participation_ratio_head")));

  Metrics on(Options(true, 0));
  on.RecordMeasurement(MakeMeasurement("m", 1, 0.5));
  const std::string text = Serialize(on);
  EXPECT_THAT(text, HasSubstr("# HELP rvd_participation_ratio_head "));
  const auto s = Samples(text);
  EXPECT_EQ(s.at("rvd_participation_ratio_head{head=\"0\",layer=\"0\","
                 "model_id=\"m\"}"),
            "2.5");
  EXPECT_EQ(s.at("rvd_participation_ratio_head{head=\"1\",layer=\"1\","
                 "model_id=\"m\"}"),
            "4.5");
}

TEST(MetricsTest, MissingRvRemovesTheStaleGauge) {
  Metrics metrics(Options(false, 0.8));
  metrics.RecordMeasurement(MakeMeasurement("m", 1, 0.5));
  auto s = Samples(Serialize(metrics));
  EXPECT_EQ(s.at("rvd_rv{model_id=\"m\"}"), "0.5");
  EXPECT_EQ(s.at("rvd_rv_below_threshold{model_id=\"m\"}"), "1");

  metrics.RecordMeasurement(MakeMeasurement("m", 2, std::nullopt));
  s = Samples(Serialize(metrics));
  EXPECT_EQ(s.count("rvd_rv{model_id=\"m\"}"), 0u);
  EXPECT_EQ(s.count("rvd_rv_below_threshold{model_id=\"m\"}"), 0u);
  // The rest of the measurement is still recorded.
  EXPECT_EQ(s.at("rvd_participation_ratio{layer=\"0\",model_id=\"m\"}"), "10");
  EXPECT_EQ(s.at("rvd_measurements_total{backend=\"cpu\",model_id=\"m\","
                 "variant=\"algebraic\"}"),
            "2");

  metrics.RecordMeasurement(MakeMeasurement("m", 3, 0.9));
  s = Samples(Serialize(metrics));
  EXPECT_EQ(s.at("rvd_rv{model_id=\"m\"}"), "0.9");
  EXPECT_EQ(s.at("rvd_rv_below_threshold{model_id=\"m\"}"), "0");
}

TEST(MetricsTest, AlertThresholdGauges) {
  Metrics metrics(Options(false, 0.8));
  metrics.RecordMeasurement(MakeMeasurement("low", 1, 0.79));
  metrics.RecordMeasurement(MakeMeasurement("high", 1, 0.8));
  const std::string text = Serialize(metrics);
  const auto s = Samples(text);
  EXPECT_EQ(s.at("rvd_rv_alert_threshold"), "0.8");
  EXPECT_EQ(s.at("rvd_rv_below_threshold{model_id=\"low\"}"), "1");
  EXPECT_EQ(s.at("rvd_rv_below_threshold{model_id=\"high\"}"), "0");
  EXPECT_THAT(text, HasSubstr("# HELP rvd_rv_below_threshold "));
  EXPECT_THAT(text, HasSubstr("# HELP rvd_rv_alert_threshold "));
}

TEST(MetricsTest, LayersMissingFromTheNewestMeasurementAreRemoved) {
  Metrics metrics(Options(true, 0));
  metrics.RecordMeasurement(MakeMeasurement("m", 1, 0.5));
  rvd::v1::Measurement fewer = MakeMeasurement("m", 2, 0.5);
  fewer.mutable_layers()->RemoveLast();      // drop layer 1
  fewer.mutable_layers(0)->clear_head_pr();  // and the heads of layer 0
  fewer.mutable_layers(0)->set_pr(7);
  metrics.RecordMeasurement(fewer);
  const auto s = Samples(Serialize(metrics));
  EXPECT_EQ(s.at("rvd_participation_ratio{layer=\"0\",model_id=\"m\"}"), "7");
  EXPECT_EQ(s.count("rvd_participation_ratio{layer=\"1\",model_id=\"m\"}"), 0u);
  for (const auto& [key, value] : s) {
    EXPECT_THAT(key, Not(HasSubstr("rvd_participation_ratio_head"))) << key;
  }
}

// --- The HTTP endpoint -----------------------------------------------------

// GET http://127.0.0.1:port/path over a raw socket; the whole response (status
// line, headers and body) or "" on a connection error.
std::string HttpGet(int port, const std::string& path) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return "";
  timeval tv{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return "";
  }
  const std::string request =
      absl::StrCat("GET ", path,
                   " HTTP/1.0\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
  if (::send(fd, request.data(), request.size(), 0) !=
      static_cast<ssize_t>(request.size())) {
    ::close(fd);
    return "";
  }
  std::string response;
  char buf[4096];
  ssize_t n;
  while ((n = ::recv(fd, buf, sizeof(buf), 0)) > 0) response.append(buf, n);
  ::close(fd);
  return response;
}

TEST(ExposerTest, ServesMetricsOnAnEphemeralPort) {
  Metrics metrics(Options(false, 0));
  metrics.RecordMeasurement(MakeMeasurement("scraped", 1, 0.625));
  auto exposer = StartExposer("127.0.0.1:0", metrics.registry());
  ASSERT_TRUE(exposer.ok()) << exposer.status();
  const std::vector<int> ports = (*exposer)->GetListeningPorts();
  ASSERT_EQ(ports.size(), 1u);
  ASSERT_GT(ports[0], 0);

  const std::string response = HttpGet(ports[0], "/metrics");
  EXPECT_THAT(response, HasSubstr("200 OK"));
  EXPECT_THAT(response, HasSubstr("rvd_rv{model_id=\"scraped\"} 0.625"));
  EXPECT_THAT(response, HasSubstr("# TYPE rvd_measurements_total counter"));
  EXPECT_THAT(response, HasSubstr("rvd_build_info{"));
}

TEST(ExposerTest, PortInUseIsAnErrorNotAnException) {
  Metrics metrics(Options(false, 0));
  auto first = StartExposer("127.0.0.1:0", metrics.registry());
  ASSERT_TRUE(first.ok()) << first.status();
  const int port = (*first)->GetListeningPorts().at(0);
  auto second =
      StartExposer(absl::StrCat("127.0.0.1:", port), metrics.registry());
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable)
      << second.status();
  EXPECT_THAT(second.status().message(), HasSubstr(absl::StrCat(port)));
  // The first one still serves.
  EXPECT_THAT(HttpGet(port, "/metrics"), HasSubstr("rvd_build_info"));
}

TEST(ExposerTest, PortHeldByAnotherSocketIsAnError) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(fd, 1), 0);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const int port = ntohs(addr.sin_port);

  Metrics metrics(Options(false, 0));
  auto exposer =
      StartExposer(absl::StrCat("127.0.0.1:", port), metrics.registry());
  ::close(fd);
  ASSERT_FALSE(exposer.ok());
  EXPECT_EQ(exposer.status().code(), absl::StatusCode::kUnavailable);
}

TEST(ExposerTest, BadAddressesAreInvalidArgument) {
  Metrics metrics(Options(false, 0));
  for (const char* address :
       {"", "9464", "127.0.0.1:", ":9464", "127.0.0.1:http", "127.0.0.1:99999",
        "127.0.0.1:+80"}) {
    auto exposer = StartExposer(address, metrics.registry());
    ASSERT_FALSE(exposer.ok()) << address;
    EXPECT_EQ(exposer.status().code(), absl::StatusCode::kInvalidArgument)
        << address;
  }
  EXPECT_EQ(StartExposer("127.0.0.1:0", nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
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
  const std::string command =
      absl::StrCat(kPromtool, " check metrics < ", in.string(), " > ",
                   out.string(), " 2>&1");
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
  Metrics metrics(Options(/*per_head=*/true, /*threshold=*/0.8));
  metrics.RecordMeasurement(MakeMeasurement("llama-3-8b", 1, 0.75));
  metrics.RecordMeasurement(MakeMeasurement("gpt2", 1, std::nullopt));
  metrics.AddIngestedBytes(4096);
  metrics.RecordError("INVALID_ARGUMENT");
  metrics.SetInflight(1);
  const std::string text = Serialize(metrics);
  const auto [exit_code, report] = Promtool(text);
  EXPECT_EQ(exit_code, 0) << "promtool check metrics:\n"
                          << report << "\non:\n"
                          << text;
}

// Many threads record at once; the counts add up exactly.
TEST(MetricsTest, ConcurrentRecording) {
  Metrics metrics(Options(true, 0.8));
  constexpr int kThreads = 4;
  constexpr int kEach = 500;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&metrics, t] {
      for (int i = 0; i < kEach; ++i) {
        metrics.RecordMeasurement(
            MakeMeasurement(absl::StrCat("m", i % 3), i,
                            i % 2 ? std::optional<double>(0.5) : std::nullopt));
        metrics.AddIngestedBytes(1);
        metrics.RecordError(t % 2 ? "INTERNAL" : "UNAVAILABLE");
        metrics.SetInflight(i);
      }
    });
  }
  for (auto& th : threads) th.join();
  const auto s = Samples(Serialize(metrics));
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

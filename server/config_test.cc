#include "server/config.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace rvd {
namespace {

using ::testing::HasSubstr;

TEST(ConfigTest, EmptyTextGivesDefaults) {
  for (const char* text : {"", "\n", "# only a comment\n", "~"}) {
    absl::StatusOr<Config> c = ParseConfig(text);
    ASSERT_TRUE(c.ok()) << text << ": " << c.status();
    const Config d;
    EXPECT_EQ(c->grpc_address, d.grpc_address);
    EXPECT_EQ(c->metrics_address, d.metrics_address);
    EXPECT_EQ(c->backend, "auto");
    EXPECT_EQ(c->data_dir, "");
    EXPECT_EQ(c->store_sync, "record");
    EXPECT_EQ(c->log_level, "info");
    EXPECT_EQ(c->history_capacity, 1000u);
    EXPECT_EQ(c->max_models, 10000u);
    EXPECT_EQ(c->engine_threads, 0);
    EXPECT_EQ(c->compute_workers, 2);
    EXPECT_EQ(c->max_inflight_requests, 256u);
    EXPECT_EQ(c->max_request_bytes, 4ull << 30);
    EXPECT_EQ(c->max_buffered_bytes, 0u);
    EXPECT_EQ(BufferedBytesLimit(*c), 4ull << 30);
    EXPECT_EQ(c->stream_idle_timeout_seconds, 30.0);
    EXPECT_FALSE(c->per_head_metrics);
    EXPECT_EQ(c->rv_alert_threshold, 0.0);
    EXPECT_EQ(c->default_variant, "");
    EXPECT_EQ(c->tune_duty_cycle, 0.5);
    EXPECT_TRUE(ValidateConfig(*c).ok());
  }
}

TEST(ConfigTest, FullFile) {
  const char* text = R"(
grpc_address: 0.0.0.0:6000
metrics_address: "[::1]:9100"
backend: cuda
data_dir: /tmp/rvd-data
log_level: debug
history_capacity: 7
max_models: 3
engine_threads: 4
compute_workers: 5
max_inflight_requests: 9
max_request_bytes: 8589934592
max_buffered_bytes: 17179869184
stream_idle_timeout_seconds: 2.5
per_head_metrics: yes
rv_alert_threshold: 0.75
default_variant: power_iter
tune_duty_cycle: 1
)";
  absl::StatusOr<Config> c = ParseConfig(text);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->grpc_address, "0.0.0.0:6000");
  EXPECT_EQ(c->metrics_address, "[::1]:9100");
  EXPECT_EQ(c->backend, "cuda");
  EXPECT_EQ(c->data_dir, "/tmp/rvd-data");
  EXPECT_EQ(c->log_level, "debug");
  EXPECT_EQ(c->history_capacity, 7u);
  EXPECT_EQ(c->max_models, 3u);
  EXPECT_EQ(c->engine_threads, 4);
  EXPECT_EQ(c->compute_workers, 5);
  EXPECT_EQ(c->max_inflight_requests, 9u);
  EXPECT_EQ(c->max_request_bytes, 8ull << 30);
  EXPECT_EQ(BufferedBytesLimit(*c), 16ull << 30);
  EXPECT_EQ(c->stream_idle_timeout_seconds, 2.5);
  EXPECT_TRUE(c->per_head_metrics);
  EXPECT_DOUBLE_EQ(c->rv_alert_threshold, 0.75);
  EXPECT_EQ(c->default_variant, "power_iter");
  EXPECT_EQ(c->tune_duty_cycle, 1.0);
  EXPECT_TRUE(ValidateConfig(*c).ok()) << ValidateConfig(*c);
}

TEST(ConfigTest, EmptyMetricsAddressTurnsMetricsOff) {
  for (const char* text : {"metrics_address: \"\"", "metrics_address:"}) {
    absl::StatusOr<Config> c = ParseConfig(text);
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ(c->metrics_address, "");
    EXPECT_TRUE(ValidateConfig(*c).ok());
  }
}

TEST(ConfigTest, UnknownKeyIsNamed) {
  absl::StatusOr<Config> c = ParseConfig("backend: cpu\nhistory_capacty: 5\n");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(c.status().message(), HasSubstr("history_capacty"));
  EXPECT_THAT(c.status().message(), HasSubstr("line 2"));
}

TEST(ConfigTest, DuplicateKeyIsAnError) {
  absl::StatusOr<Config> c = ParseConfig("backend: cpu\nbackend: cuda\n");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(c.status().message(), HasSubstr("backend"));
}

TEST(ConfigTest, WrongTypesAreNamed) {
  const std::pair<const char*, const char*> cases[] = {
      {"history_capacity: many", "history_capacity"},
      {"history_capacity: -1", "history_capacity"},
      {"history_capacity: 1.5", "history_capacity"},
      {"history_capacity: 4294967296", "history_capacity"},  // > uint32
      {"max_models: [1, 2]", "max_models"},
      {"engine_threads: {a: 1}", "engine_threads"},
      {"compute_workers:", "compute_workers"},
      {"max_request_bytes: -5", "max_request_bytes"},
      {"per_head_metrics: maybe", "per_head_metrics"},
      {"per_head_metrics: 2", "per_head_metrics"},
      {"rv_alert_threshold: high", "rv_alert_threshold"},
      {"grpc_address: [a, b]", "grpc_address"},
      {"log_level: {x: y}", "log_level"},
  };
  for (const auto& [text, key] : cases) {
    absl::StatusOr<Config> c = ParseConfig(text);
    ASSERT_FALSE(c.ok()) << text;
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_THAT(c.status().message(), HasSubstr(key)) << text;
  }
}

TEST(ConfigTest, MalformedYamlIsAStatusNotAnException) {
  for (const char* text :
       {"backend: [cpu", "a: b: c", "- 1\n- 2\n", "just a string",
        "\"unterminated", "key: value\n  bad indent: 1\n", "{"}) {
    absl::StatusOr<Config> c = ParseConfig(text);
    ASSERT_FALSE(c.ok()) << text;
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << text;
  }
}

TEST(ConfigTest, BadValuesFailValidation) {
  struct Case {
    const char* text;
    const char* key;
  };
  const Case cases[] = {
      {"backend: gpu", "backend"},
      {"history_capacity: 0", "history_capacity"},
      {"max_models: 0", "max_models"},
      {"max_inflight_requests: 0", "max_inflight_requests"},
      {"compute_workers: 0", "compute_workers"},
      {"compute_workers: -3", "compute_workers"},
      {"engine_threads: -1", "engine_threads"},
      {"max_request_bytes: 0", "max_request_bytes"},
      {"max_buffered_bytes: 1000", "max_buffered_bytes"},
      {"stream_idle_timeout_seconds: 0", "stream_idle_timeout_seconds"},
      {"stream_idle_timeout_seconds: .inf", "stream_idle_timeout_seconds"},
      {"default_variant: magic", "default_variant"},
      {"cuda_device: -1", "cuda_device"},
      {"cuda_streams: 0", "cuda_streams"},
      {"cuda_max_sms: -1", "cuda_max_sms"},
      {"tune_duty_cycle: 0", "tune_duty_cycle"},
      {"tune_duty_cycle: -0.5", "tune_duty_cycle"},
      {"tune_duty_cycle: 1.5", "tune_duty_cycle"},
      {"tune_duty_cycle: .nan", "tune_duty_cycle"},
      {"cuda_max_device_bytes: 1024", "cuda_max_device_bytes"},
      {"log_level: verbose", "log_level"},
      {"log_level: INFO", "log_level"},
      {"rv_alert_threshold: -0.5", "rv_alert_threshold"},
      {"rv_alert_threshold: .nan", "rv_alert_threshold"},
      {"rv_alert_threshold: .inf", "rv_alert_threshold"},
      {"grpc_address: localhost", "grpc_address"},
      {"grpc_address: \":50051\"", "grpc_address"},
      {"grpc_address: \"host:\"", "grpc_address"},
      {"grpc_address: host:99999", "grpc_address"},
      {"grpc_address: host:12ab", "grpc_address"},
      {"grpc_address: \"::1:50051\"", "grpc_address"},
      {"grpc_address: \"[::1:50051\"", "grpc_address"},
      {"grpc_address: \"\"", "grpc_address"},
      {"metrics_address: \"bad host:9464\"", "metrics_address"},
      {"metrics_address: \"9464\"", "metrics_address"},
  };
  for (const Case& tc : cases) {
    absl::StatusOr<Config> c = ParseConfig(tc.text);
    ASSERT_TRUE(c.ok()) << tc.text << ": " << c.status();
    absl::Status s = ValidateConfig(*c);
    ASSERT_FALSE(s.ok()) << tc.text;
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << tc.text;
    EXPECT_THAT(s.message(), HasSubstr(tc.key)) << tc.text;
  }
}

TEST(ConfigTest, GoodAddressesAndLevelsValidate) {
  for (const char* text :
       {"grpc_address: localhost:1", "grpc_address: 10.0.0.1:0",
        "grpc_address: \"[::]:50051\"", "grpc_address: my-host.example:443",
        "log_level: trace", "log_level: warn", "log_level: warning",
        "log_level: err", "log_level: critical", "log_level: \"off\"",
        "backend: cpu", "rv_alert_threshold: 1"}) {
    absl::StatusOr<Config> c = ParseConfig(text);
    ASSERT_TRUE(c.ok()) << text << ": " << c.status();
    EXPECT_TRUE(ValidateConfig(*c).ok()) << text << ": " << ValidateConfig(*c);
  }
}

TEST(ConfigTest, ValidationReportsEveryProblem) {
  Config c;
  c.backend = "tpu";
  c.history_capacity = 0;
  absl::Status s = ValidateConfig(c);
  EXPECT_THAT(s.message(), HasSubstr("backend"));
  EXPECT_THAT(s.message(), HasSubstr("history_capacity"));
}

TEST(ConfigTest, LoadMissingFileIsNotFound) {
  absl::StatusOr<Config> c = LoadConfig("/nonexistent/dir/rvd.yaml");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kNotFound);
}

TEST(ConfigTest, LoadFileNamesThePathInErrors) {
  const std::filesystem::path path =
      std::filesystem::temp_directory_path() /
      ("rvd_config_test_" + std::to_string(::getpid()) + ".yaml");
  {
    std::ofstream out(path);
    out << "backend: cpu\nbogus: 1\n";
  }
  absl::StatusOr<Config> c = LoadConfig(path.string());
  std::filesystem::remove(path);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(c.status().message(), HasSubstr(path.string()));
  EXPECT_THAT(c.status().message(), HasSubstr("bogus"));
}

// The tests run with the repository root as the working directory.
TEST(ConfigTest, RepositoryDefaultConfigParsesAndValidates) {
  absl::StatusOr<Config> c = LoadConfig("config/rvd.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(ValidateConfig(*c).ok()) << ValidateConfig(*c);
  // Same values as the built-in defaults except data_dir.
  const Config d;
  EXPECT_EQ(c->grpc_address, d.grpc_address);
  EXPECT_EQ(c->metrics_address, d.metrics_address);
  EXPECT_EQ(c->backend, d.backend);
  EXPECT_EQ(c->log_level, d.log_level);
  EXPECT_EQ(c->history_capacity, d.history_capacity);
  EXPECT_EQ(c->max_models, d.max_models);
  EXPECT_EQ(c->engine_threads, d.engine_threads);
  EXPECT_EQ(c->compute_workers, d.compute_workers);
  EXPECT_EQ(c->max_inflight_requests, d.max_inflight_requests);
  EXPECT_EQ(c->max_request_bytes, d.max_request_bytes);
  EXPECT_EQ(c->max_buffered_bytes, d.max_buffered_bytes);
  EXPECT_EQ(c->stream_idle_timeout_seconds, d.stream_idle_timeout_seconds);
  EXPECT_EQ(c->per_head_metrics, d.per_head_metrics);
  EXPECT_EQ(c->rv_alert_threshold, d.rv_alert_threshold);
  EXPECT_EQ(c->default_variant, d.default_variant);
  EXPECT_FALSE(std::filesystem::path(c->data_dir).is_absolute())
      << "the default config must work for a non-root user: " << c->data_dir;
}

// ---- the command line --------------------------------------------------

absl::StatusOr<CommandLine> Parse(std::vector<std::string> args) {
  args.insert(args.begin(), "rvd");
  std::vector<const char*> argv;
  for (const std::string& a : args) argv.push_back(a.c_str());
  return ParseCommandLine(argv.size(), argv.data());
}

TEST(CommandLineTest, EveryConfigKeyIsAFlagWithDashes) {
  absl::StatusOr<CommandLine> cl = Parse(
      {"--grpc-address", "127.0.0.1:7001", "--metrics-address=[::1]:7002",
       "--backend", "cpu", "--data-dir", "/tmp/d", "--log-level", "debug",
       "--history-capacity", "7", "--max-models", "3", "--engine-threads",
       "4", "--compute-workers", "5", "--max-inflight-requests", "9",
       "--max-request-bytes", "1000", "--max-buffered-bytes", "2000",
       "--stream-idle-timeout-seconds", "1.5", "--per-head-metrics",
       "--rv-alert-threshold", "0.5", "--default-variant", "sketch",
       "--cuda-device", "1", "--cuda-streams", "2", "--cuda-max-device-bytes",
       "134217728"});
  ASSERT_TRUE(cl.ok()) << cl.status();
  EXPECT_FALSE(cl->exit_now);
  const Config& c = cl->config;
  EXPECT_EQ(c.grpc_address, "127.0.0.1:7001");
  EXPECT_EQ(c.metrics_address, "[::1]:7002");
  EXPECT_EQ(c.backend, "cpu");
  EXPECT_EQ(c.data_dir, "/tmp/d");
  EXPECT_EQ(c.log_level, "debug");
  EXPECT_EQ(c.history_capacity, 7u);
  EXPECT_EQ(c.max_models, 3u);
  EXPECT_EQ(c.engine_threads, 4);
  EXPECT_EQ(c.compute_workers, 5);
  EXPECT_EQ(c.max_inflight_requests, 9u);
  EXPECT_EQ(c.max_request_bytes, 1000u);
  EXPECT_EQ(c.max_buffered_bytes, 2000u);
  EXPECT_EQ(c.stream_idle_timeout_seconds, 1.5);
  EXPECT_TRUE(c.per_head_metrics);
  EXPECT_EQ(c.rv_alert_threshold, 0.5);
  EXPECT_EQ(c.default_variant, "sketch");
  EXPECT_EQ(c.cuda_device, 1);
  EXPECT_EQ(c.cuda_streams, 2);
  EXPECT_EQ(c.cuda_max_device_bytes, 128u << 20);
}

TEST(CommandLineTest, FlagsOverrideTheConfigFile) {
  const std::filesystem::path path =
      std::filesystem::temp_directory_path() /
      ("rvd_cmdline_test_" + std::to_string(::getpid()) + ".yaml");
  {
    std::ofstream out(path);
    out << "backend: cpu\nhistory_capacity: 5\nper_head_metrics: true\n";
  }
  absl::StatusOr<CommandLine> cl =
      Parse({"--config", path.string(), "--history-capacity", "6",
             "--per-head-metrics=false", "--metrics-address", ""});
  std::filesystem::remove(path);
  ASSERT_TRUE(cl.ok()) << cl.status();
  EXPECT_EQ(cl->config.backend, "cpu");              // from the file
  EXPECT_EQ(cl->config.history_capacity, 6u);        // the flag wins
  EXPECT_FALSE(cl->config.per_head_metrics);         // --flag=false
  EXPECT_EQ(cl->config.metrics_address, "");         // "" turns metrics off
  EXPECT_EQ(cl->config.grpc_address, Config().grpc_address);  // untouched
}

TEST(CommandLineTest, BadValuesAreErrorsThatNameTheFlag) {
  const std::pair<std::vector<std::string>, std::vector<const char*>> cases[] = {
      {{"--log-level", "bogus"}, {"log_level", "bogus", "trace"}},
      {{"--history-capacity", "many"}, {"--history-capacity", "many"}},
      {{"--per-head-metrics=maybe"}, {"--per-head-metrics", "maybe"}},
      {{"--grpc-address", "localhost"}, {"grpc_address", "HOST:PORT"}},
      {{"--metrics-address", "[::1:9"}, {"metrics_address", "HOST:PORT"}},
      {{"--no-such-flag"}, {"--no-such-flag"}},
      {{"--config", "/nonexistent/rvd.yaml"}, {"/nonexistent/rvd.yaml"}},
  };
  for (const auto& [args, words] : cases) {
    absl::StatusOr<CommandLine> cl = Parse(args);
    ASSERT_FALSE(cl.ok()) << args[0];
    for (const char* w : words) {
      EXPECT_THAT(cl.status().message(), HasSubstr(w)) << args[0];
    }
  }
}

TEST(CommandLineTest, HelpListsEveryFlagAndWhatDataDirHolds) {
  absl::StatusOr<CommandLine> cl = Parse({"--help"});
  ASSERT_TRUE(cl.ok()) << cl.status();
  EXPECT_TRUE(cl->exit_now);
  for (const char* flag :
       {"--config", "--grpc-address", "--metrics-address", "--backend",
        "--data-dir", "--log-level", "--history-capacity", "--max-models",
        "--engine-threads", "--compute-workers", "--max-inflight-requests",
        "--max-request-bytes", "--max-buffered-bytes",
        "--stream-idle-timeout-seconds", "--per-head-metrics",
        "--rv-alert-threshold", "--default-variant", "--cuda-device",
        "--cuda-streams", "--cuda-max-device-bytes", "--store-sync",
        "--retention-per-model", "--retention-max-age-seconds", "SIGHUP"}) {
    EXPECT_THAT(cl->text, HasSubstr(flag));
  }
  EXPECT_THAT(cl->text, HasSubstr("durable history"));
}

TEST(ConfigTest, StoreKeysAreValidated) {
  Config c;
  c.store_sync = "100ms";
  EXPECT_TRUE(ValidateConfig(c).ok()) << ValidateConfig(c);
  c.store_sync = "sometimes";
  EXPECT_THAT(ValidateConfig(c).message(), HasSubstr("store_sync"));
  c = Config();
  c.retention_per_model = c.history_capacity - 1;
  EXPECT_THAT(ValidateConfig(c).message(), HasSubstr("retention_per_model"));
  c.retention_per_model = 0;  // no bound
  EXPECT_TRUE(ValidateConfig(c).ok());
  c.retention_max_age_seconds = -1;
  EXPECT_THAT(ValidateConfig(c).message(),
              HasSubstr("retention_max_age_seconds"));
}

TEST(HostPortTest, OneParserForEveryAddress) {
  absl::StatusOr<HostPort> hp = ParseHostPort("x", "[::1]:9464");
  ASSERT_TRUE(hp.ok()) << hp.status();
  EXPECT_EQ(hp->host, "[::1]");
  EXPECT_EQ(hp->port, 9464);
  hp = ParseHostPort("x", "localhost:0");
  ASSERT_TRUE(hp.ok());
  EXPECT_EQ(hp->port, 0);
  hp = ParseHostPort("flag --grpc-address", "localhost:65536");
  ASSERT_FALSE(hp.ok());
  EXPECT_THAT(hp.status().message(), HasSubstr("flag --grpc-address"));
  EXPECT_THAT(hp.status().message(), HasSubstr("out of range"));
}

}  // namespace
}  // namespace rvd

// rvd's configuration: config/rvd.yaml, then command-line flags on top.
// Every config key is also a flag, spelled with dashes (--grpc-address);
// the YAML file and the flags share one table and one value parser, so a
// value means the same thing wherever it is written.
#ifndef RVD_SERVER_CONFIG_H_
#define RVD_SERVER_CONFIG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/watch_config.h"

namespace rvd {

struct Config {
  std::string grpc_address = "127.0.0.1:50051";
  std::string metrics_address = "127.0.0.1:9464";  // empty: no /metrics
  std::string backend = "auto";                    // auto | cpu | cuda
  // The durable history's directory (rvd.db, SQLite): it must exist and be
  // writable. Empty: history in memory only, lost at restart.
  std::string data_dir;
  // When an acknowledged measurement reaches the disk itself (it is
  // committed before the call returns in every mode, so it survives a crash
  // of rvd): "record" (fsync per commit, the default), "<N>ms" (an fsync
  // every N ms: a power loss loses at most N ms), "off" (left to the OS).
  std::string store_sync = "record";
  // Kept on disk per model: the newest N (0: no bound; else >=
  // history_capacity) and none older than the age (0: no bound).
  uint64_t retention_per_model = 100000;
  double retention_max_age_seconds = 0;
  std::string log_level = "info";                  // spdlog level name
  uint32_t history_capacity = 1000;     // measurements kept per model
  uint32_t max_models = 10000;          // distinct model ids kept
  uint32_t max_watchers = 64;  // WatchMeasurements streams at once (0: none)
  // Live models (RegisterLiveModel) registered at once; more:
  // RESOURCE_EXHAUSTED.
  uint32_t max_live_models = 64;
  // A live model no call names for this long is released (NotifyStep and
  // RegisterLiveModel renew it; a request's lease_seconds overrides it).
  uint32_t live_lease_seconds = 600;
  // A sharded model's group step (issue 18) that not every rank reported
  // this long after the first one fails, naming the missing ranks (>= 1).
  uint32_t shard_group_timeout_seconds = 30;
  // rvd_participation_ratio(_head) series exported, all models together.
  uint64_t max_metric_series = 100000;
  int engine_threads = 0;               // CPU engine threads; 0: one per core
  int compute_workers = 2;              // measurements computed at once
  // Measurements in the compute phase (computing, or queued for a worker
  // until the client's deadline); more: RESOURCE_EXHAUSTED at once.
  uint32_t max_inflight_requests = 256;
  uint64_t max_request_bytes = 4ull << 30;  // tensor bytes per request
  // Received tensor bytes held at once, all requests together; a request
  // whose bytes would exceed it: RESOURCE_EXHAUSTED. 0: max_request_bytes;
  // else >= max_request_bytes. See BufferedBytesLimit.
  uint64_t max_buffered_bytes = 0;
  // A stream that sends nothing for this long is cancelled.
  double stream_idle_timeout_seconds = 30;
  bool per_head_metrics = false;  // export rvd_participation_ratio_head
  double rv_alert_threshold = 0.0;  // rvd_rv_below_threshold when rv < this
  // YAML alert rules (server/alert_rules.h), reread on SIGHUP; "": none.
  std::string alert_rules_file;
  std::string default_variant;      // empty: the backend's default
  int cuda_device = 0;              // CUDA device ordinal
  int cuda_streams = 4;             // CUDA stream pool size
  uint64_t cuda_max_device_bytes = 4ull << 30;  // device memory rvd may hold
  int cuda_max_sms = 0;  // SMs rvd's persistent kernels may occupy; 0: all
  // The share of time a tuning job's device work may take, in (0, 1]: after
  // work of t seconds it idles t (1 - d) / d (tune::DutyCycle).
  double tune_duty_cycle = 0.5;
  // Directories under which rvd reads checkpoints itself (MeasurePath, the
  // watch section); none: it reads none (server/path_policy.h).
  std::vector<std::string> checkpoint_roots;
  WatchConfig watch;  // checkpoint directories measured as they appear
  // gRPC transport security (server/security.h); all empty: plaintext.
  std::string tls_cert_file;       // PEM chain; with tls_key_file: TLS
  std::string tls_key_file;        // PEM private key of tls_cert_file
  std::string tls_client_ca_file;  // PEM CA: clients need a cert (mTLS)
  std::string auth_token_file;     // bearer token required (needs TLS)
};

// Parses YAML text. Unknown keys and ill-typed values are INVALID_ARGUMENT
// errors naming the key, so that a typo is not silently ignored.
absl::StatusOr<Config> ParseConfig(const std::string& yaml_text);
// Reads and parses a file; NOT_FOUND if it does not exist.
absl::StatusOr<Config> LoadConfig(const std::string& path);
// Checks ranges and address syntax.
absl::Status ValidateConfig(const Config& config);

// The byte budget of received tensors that `config` asks for.
inline uint64_t BufferedBytesLimit(const Config& config) {
  return config.max_buffered_bytes == 0 ? config.max_request_bytes
                                        : config.max_buffered_bytes;
}

// HOST:PORT: a non-empty host (a name, an IPv4 address or a bracketed IPv6
// address such as [::1]) and a decimal port in 0..65535 (0: the OS picks).
struct HostPort {
  std::string host;  // as written, brackets included
  int port = 0;
};
// The one parser of addresses (grpc_address, metrics_address). The error
// names `what` (e.g. "config key 'grpc_address'") and says what is wrong.
absl::StatusOr<HostPort> ParseHostPort(absl::string_view what,
                                       absl::string_view address);

// What rvd's command line asks for.
struct CommandLine {
  Config config;          // defaults, then --config FILE, then the flags
  bool exit_now = false;  // --help or --version: print `text`, exit 0
  std::string text;
};
// Parses rvd's argv: --config FILE and one flag per config key. The
// result's config is validated (ValidateConfig). Errors name the flag or
// key and say what was expected; --help text lists every flag.
absl::StatusOr<CommandLine> ParseCommandLine(int argc, const char* const* argv);

}  // namespace rvd

#endif  // RVD_SERVER_CONFIG_H_

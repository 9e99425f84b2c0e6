// rvd's configuration: config/rvd.yaml, then command-line flags on top.
#ifndef RVD_SERVER_CONFIG_H_
#define RVD_SERVER_CONFIG_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace rvd {

struct Config {
  std::string grpc_address = "127.0.0.1:50051";
  std::string metrics_address = "127.0.0.1:9464";  // empty: no /metrics
  std::string backend = "auto";                    // auto | cpu | cuda
  std::string data_dir = "/var/lib/rvd";           // reserved for durability
  std::string log_level = "info";                  // spdlog level name
  uint32_t history_capacity = 1000;     // measurements kept per model
  uint32_t max_models = 10000;          // distinct model ids kept
  int engine_threads = 0;               // CPU engine threads; 0: one per core
  int compute_workers = 2;              // measurements computed at once
  uint32_t max_inflight_requests = 16;  // more: RESOURCE_EXHAUSTED
  uint64_t max_request_bytes = 4ull << 30;  // tensor bytes per request
  bool per_head_metrics = false;  // export rvd_participation_ratio_head
  double rv_alert_threshold = 0.0;  // rvd_rv_below_threshold when rv < this
  std::string default_variant;      // empty: the backend's default
  int cuda_device = 0;              // CUDA device ordinal
  int cuda_streams = 4;             // CUDA stream pool size
  uint64_t cuda_max_device_bytes = 4ull << 30;  // device memory rvd may hold
};

// Parses YAML text. Unknown keys and ill-typed values are INVALID_ARGUMENT
// errors naming the key, so that a typo is not silently ignored.
absl::StatusOr<Config> ParseConfig(const std::string& yaml_text);
// Reads and parses a file; NOT_FOUND if it does not exist.
absl::StatusOr<Config> LoadConfig(const std::string& path);
// Checks ranges and address syntax.
absl::Status ValidateConfig(const Config& config);

}  // namespace rvd

#endif  // RVD_SERVER_CONFIG_H_

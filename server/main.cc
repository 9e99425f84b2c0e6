// rvd: the daemon. Reads config/rvd.yaml (or --config), applies the flags on
// top, serves until SIGTERM or SIGINT, then shuts down cleanly and exits 0.
#include <malloc.h>
#include <signal.h>

#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "server/config.h"
#include "server/server.h"
#include "spdlog/spdlog.h"

ABSL_FLAG(std::string, config, "",
          "YAML config file (default: built-in defaults)");
ABSL_FLAG(std::string, grpc_address, "",
          "gRPC HOST:PORT (overrides the config)");
ABSL_FLAG(std::string, metrics_address, "",
          "Prometheus HOST:PORT (overrides the config)");
ABSL_FLAG(std::string, backend, "", "auto | cpu | cuda (overrides the config)");
ABSL_FLAG(std::string, data_dir, "", "data directory (overrides the config)");
ABSL_FLAG(std::string, log_level, "",
          "trace|debug|info|warn|error (overrides)");

namespace {

// Lets users write --grpc-address as well as --grpc_address: absl flag
// names are identifiers, the CLI convention is dashes.
std::vector<char*> DashesToUnderscores(int argc, char** argv) {
  std::vector<char*> args(argv, argv + argc);
  for (int i = 1; i < argc && std::string(argv[i]) != "--"; ++i) {
    if (argv[i][0] != '-' || argv[i][1] != '-') continue;
    for (char* c = argv[i] + 2; *c != '\0' && *c != '='; ++c) {
      if (*c == '-') *c = '_';
    }
  }
  return args;
}

void Override(std::string& value, const absl::Flag<std::string>& flag) {
  std::string v = absl::GetFlag(flag);
  if (!v.empty()) value = v;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "rvd [--config FILE] [--grpc-address HOST:PORT] "
      "[--metrics-address HOST:PORT] [--backend auto|cpu|cuda] [--data-dir "
      "DIR]");
  // Streams arrive in megabyte chunks: keep freed memory mapped instead of
  // returning it to the kernel after each request, since re-faulting the
  // pages cost more CPU than receiving the bytes (perf, 128 MB streams).
  mallopt(M_MMAP_THRESHOLD, 64 << 20);
  mallopt(M_TRIM_THRESHOLD, 256 << 20);

  std::vector<char*> args = DashesToUnderscores(argc, argv);
  absl::ParseCommandLine(args.size(), args.data());

  // Block the stop signals in every thread (threads inherit the mask), and
  // wait for them here: no work in a signal handler.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  rvd::Config config;
  if (const std::string path = absl::GetFlag(FLAGS_config); !path.empty()) {
    absl::StatusOr<rvd::Config> loaded = rvd::LoadConfig(path);
    if (!loaded.ok()) {
      std::fprintf(stderr, "rvd: %s\n", loaded.status().ToString().c_str());
      return 2;
    }
    config = *loaded;
  }
  Override(config.grpc_address, FLAGS_grpc_address);
  Override(config.metrics_address, FLAGS_metrics_address);
  Override(config.backend, FLAGS_backend);
  Override(config.data_dir, FLAGS_data_dir);
  Override(config.log_level, FLAGS_log_level);
  spdlog::set_level(spdlog::level::from_str(config.log_level));

  absl::StatusOr<std::unique_ptr<rvd::Server>> server =
      rvd::Server::Start(config);
  if (!server.ok()) {
    spdlog::error("cannot start: {}", server.status().ToString());
    return 1;
  }
  int signal = 0;
  sigwait(&stop_signals, &signal);
  spdlog::info("received {}; finishing in-flight work", strsignal(signal));
  (*server)->Shutdown();
  spdlog::info("stopped");
  return 0;
}

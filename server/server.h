// The rvd daemon: a gRPC server (rvd.v1.Rvd, health, reflection), the PR
// engine with its compute workers, per-model history, and /metrics.
//
// Usage (what main.cc does):
//   absl::StatusOr<std::unique_ptr<Server>> server = Server::Start(config);
//   ... on SIGTERM: (*server)->Shutdown();
// Start and Shutdown are called from one thread; the server's own threads
// serve requests in between.
#ifndef RVD_SERVER_SERVER_H_
#define RVD_SERVER_SERVER_H_

#include <chrono>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "server/config.h"

namespace rvd {

class Server {
 public:
  virtual ~Server() = default;

  // Picks the backend, starts the engine, binds gRPC and metrics. Fails
  // (never exits) on a bad address, a port in use, or an unavailable backend.
  static absl::StatusOr<std::unique_ptr<Server>> Start(const Config& config);

  // How long in-flight requests get to finish once Shutdown is called.
  static constexpr std::chrono::seconds kShutdownGrace{5};

  // Stops accepting new requests, lets in-flight ones finish for up to
  // kShutdownGrace, then cancels them (a request waiting for a worker
  // leaves at once; one inside the engine finishes its call, which this
  // waits for: main exits without waiting past the grace), ends watch
  // streams, and stops every thread. Idempotent.
  virtual void Shutdown() = 0;

  // One line for the log (SIGUSR1): the compute queue, buffered bytes.
  virtual std::string DescribeState() const = 0;

  // The bound gRPC port (useful when the config asked for port 0).
  virtual int grpc_port() const = 0;
  // "cpu" or "cuda": the backend serving measurements.
  virtual std::string backend() const = 0;

  // SIGHUP: rereads alert_rules_file and, when the whole file is valid,
  // replaces the alert rules (rv_alert_threshold's rule included) and
  // returns how many there are; otherwise the old rules stay and the error
  // says why (counted in rvd_alert_reload_failures_total).
  virtual absl::StatusOr<size_t> ReloadAlertRules() = 0;
};

}  // namespace rvd

#endif  // RVD_SERVER_SERVER_H_

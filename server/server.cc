#include "server/server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>

#include <chrono>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "rvd/v1/limits.h"
#include "server/backend.h"
#include "server/compute_pool.h"
#include "server/history.h"
#include "server/metrics.h"
#include "server/metrics_http.h"
#include "server/service.h"
#include "spdlog/spdlog.h"

namespace rvd {
namespace {

constexpr char kServiceName[] = "rvd.v1.Rvd";

class ServerImpl final : public Server {
 public:
  ServerImpl(const Config& config, std::unique_ptr<Engine> engine)
      : engine_(std::move(engine)),
        pool_(config.compute_workers, config.max_inflight_requests),
        history_(config.history_capacity, config.max_models),
        metrics_(MetricsOptions{config.per_head_metrics,
                                config.rv_alert_threshold, RVD_VERSION,
                                engine_->Backend(), engine_->Version()}),
        service_(*engine_, pool_, history_, metrics_,
                 ServiceLimits{config.max_request_bytes,
                               config.max_inflight_requests,
                               config.default_variant,
                               BufferedBytesLimit(config),
                               absl::Seconds(config.stream_idle_timeout_seconds)}) {}

  ~ServerImpl() override { Shutdown(); }

  absl::Status Listen(const Config& config) {
    if (!config.metrics_address.empty()) {
      absl::StatusOr<std::unique_ptr<prometheus::Exposer>> exposer =
          StartMetricsHttp(config.metrics_address, metrics_.registry());
      if (!exposer.ok()) return exposer.status();
      exposer_ = *std::move(exposer);
    }
    grpc::EnableDefaultHealthCheckService(true);
    grpc::reflection::InitProtoReflectionServerBuilderPlugin();
    grpc::ServerBuilder builder;
    builder.AddListeningPort(config.grpc_address,
                             grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(&service_);
    // gRPC refuses a larger message (RESOURCE_EXHAUSTED) from its length
    // prefix; tensors beyond one message go by MeasureStream.
    builder.SetMaxReceiveMessageSize(rvd::v1::kMaxRequestMessageBytes);
    grpc_ = builder.BuildAndStart();
    if (grpc_ == nullptr || port_ == 0) {
      return absl::UnavailableError(
          absl::StrCat("cannot listen for gRPC on ", config.grpc_address,
                       " (address in use or invalid)"));
    }
    // The engine is ready before the server is built, so serving starts now.
    // "rvd.backend.<name>" tells a probe which backend serves.
    grpc_->GetHealthCheckService()->SetServingStatus(kServiceName, true);
    grpc_->GetHealthCheckService()->SetServingStatus(
        "rvd.backend." + engine_->Backend(), true);
    grpc_->GetHealthCheckService()->SetServingStatus(true);
    return absl::OkStatus();
  }

  void Shutdown() override {
    std::call_once(shutdown_once_, [this] {
      if (grpc_ != nullptr) {
        grpc_->GetHealthCheckService()->SetServingStatus(false);
        service_.StopWatches();
        grpc_->Shutdown(std::chrono::system_clock::now() + kShutdownGrace);
        grpc_->Wait();
      }
      exposer_.reset();
    });
  }

  std::string DescribeState() const override {
    const ComputePoolStats s = pool_.Stats();
    return absl::StrCat("compute: ", s.running, " running, ", s.queued,
                        " queued, ", s.waits_total, " served after ",
                        s.wait_seconds_total, " s waiting in all, ",
                        s.rejected_total, " refused; received bytes held: ",
                        service_.buffered_bytes());
  }

  int grpc_port() const override { return port_; }
  std::string backend() const override { return engine_->Backend(); }

 private:
  std::unique_ptr<Engine> engine_;
  ComputePool pool_;
  History history_;
  Metrics metrics_;
  RvdService service_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  std::unique_ptr<grpc::Server> grpc_;
  int port_ = 0;
  std::once_flag shutdown_once_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Server>> Server::Start(const Config& config) {
  if (absl::Status s = ValidateConfig(config); !s.ok()) return s;
  std::string why;
  absl::StatusOr<std::unique_ptr<Engine>> engine =
      CreateEngine(config.backend, config.engine_threads,
                   CudaEngineOptions{config.cuda_device, config.cuda_streams,
                                     config.cuda_max_device_bytes},
                   &why);
  if (!engine.ok()) return engine.status();
  spdlog::info("{}; engine {}, default variant {}", why, (*engine)->Version(),
               (*engine)->DefaultVariant());
  spdlog::info("data_dir {} is not used yet (reserved for the durable history)",
               config.data_dir);
  auto server = std::make_unique<ServerImpl>(config, *std::move(engine));
  if (absl::Status s = server->Listen(config); !s.ok()) return s;
  spdlog::info("rvd {} serving gRPC on {} (port {}), metrics on {}",
               RVD_VERSION, config.grpc_address, server->grpc_port(),
               config.metrics_address.empty()
                   ? std::string("(disabled)")
                   : "http://" + config.metrics_address + "/metrics");
  return server;
}

}  // namespace rvd

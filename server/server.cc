#include "server/server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "rvd/v1/limits.h"
#include "server/alert_rules.h"
#include "server/alerts.h"
#include "server/backend.h"
#include "server/checkpoint_reader.h"
#include "server/checkpoint_watcher.h"
#include "server/watch_metrics.h"
#include "server/compute_pool.h"
#include "server/durable_history.h"
#include "server/engine_health.h"
#include "server/history.h"
#include "server/group_metrics.h"
#include "server/live_metrics.h"
#include "server/live_registry.h"
#include "server/metrics.h"
#include "server/metrics_http.h"
#include "server/request_metrics.h"
#include "server/security.h"
#include "server/service.h"
#include "server/store_metrics.h"
#include "server/tune_metrics.h"
#include "server/tune_service.h"
#include "spdlog/spdlog.h"

namespace rvd {
namespace {

constexpr char kServiceName[] = "rvd.v1.Rvd";
// The in-memory log keeps at least this many measurements (over all models)
// for watchers that resume (WatchRequest.after_sequence).
constexpr size_t kMinLogRetained = 4096;
// Measurements queued per watcher before it is sent a gap.
constexpr size_t kWatchQueue = 1024;
// Alert events kept for WatchAlerts streams that resume.
constexpr size_t kAlertEventsRetained = 4096;

class ServerImpl final : public Server {
 public:
  ServerImpl(const Config& config, std::unique_ptr<Engine> engine,
             MeasurementLogChoice log)
      : engine_(std::move(engine)),
        alerts_(AlertEngine::Options{kAlertEventsRetained, config.max_watchers,
                                     config.max_metric_series},
                {}),
        alert_rules_file_(config.alert_rules_file),
        rv_alert_threshold_(config.rv_alert_threshold),
        pool_(config.compute_workers, config.max_inflight_requests),
        store_(log.store),
        history_(std::move(log.log),
                 History::Options{config.history_capacity, config.max_models,
                                  config.max_watchers, kWatchQueue,
                                  [this](const MeasurementLog::Entry& e) {
                                    alerts_.Observe(*e);
                                  }}),
        metrics_(std::make_shared<Metrics>(
            MetricsOptions{config.per_head_metrics, config.rv_alert_threshold,
                           RVD_VERSION, engine_->Backend(), engine_->Version(),
                           config.max_metric_series},
            MetricsSources{&history_.index(), engine_.get(), &pool_,
                           &history_.bus(), &alerts_})),
        service_(*engine_, pool_, history_, *metrics_,
                 ServiceLimits{config.max_request_bytes,
                               config.max_inflight_requests,
                               config.default_variant,
                               BufferedBytesLimit(config),
                               absl::Seconds(config.stream_idle_timeout_seconds)}) {
    service_.set_store(store_);
    if (store_ != nullptr) store_metrics_ = std::make_shared<StoreMetrics>(store_);
    LiveOptions live;
    live.max_live_models = config.max_live_models;
    live.default_lease = absl::Seconds(config.live_lease_seconds);
    live.max_request_bytes = config.max_request_bytes;
    live.default_variant = config.default_variant;
    live_ = std::make_unique<LiveRegistry>(
        *engine_, pool_, live,
        [this](rvd::v1::Measurement m) { return service_.RecordLiveMeasurement(std::move(m)); });
    service_.set_live(live_.get());
    shard_groups_ = std::make_unique<ShardGroups>(
        *engine_, ShardGroupOptions{absl::Seconds(config.shard_group_timeout_seconds), 0},
        [this](rvd::v1::Measurement m) { return service_.RecordGroupMeasurement(std::move(m)); });
    service_.set_shard_groups(shard_groups_.get());
    live_metrics_ = std::make_shared<LiveMetrics>(live_.get());
    group_metrics_ = std::make_shared<GroupMetrics>(&service_.group_stats());
    spdlog::info("live models: {}", engine_->Live() != nullptr
                                        ? "served (CUDA IPC on the engine's device)"
                                        : "not served (this backend reads no GPU memory)");
    // Tuning jobs (issue 17), resumed from data_dir/tune where they can
    // run; where they cannot, every start is refused with the reason.
    tune_backend_ = MakeTuneBackend(*engine_, config.tune_duty_cycle);
    tune::JobManagerOptions tune_options;
    tune_options.data_dir = config.data_dir;
    tune_options.backend = tune_backend_.get();
    tune_jobs_ = std::make_unique<tune::JobManager>(std::move(tune_options));
    const absl::Status tuning = tune_backend_->Available();
    if (tuning.ok()) {
      if (absl::Status s = tune_jobs_->Recover(); !s.ok()) {
        spdlog::warn("tuning jobs: {}", s.ToString());
      }
      tune_metrics_ = std::make_shared<TuneMetrics>(tune_jobs_.get());
    }
    tune_handlers_ = std::make_unique<TuneHandlers>(tune_jobs_.get());
    service_.set_tuning(tune_handlers_.get());
    spdlog::info("tuning jobs: {}", tuning.ok() ? std::string("available")
                                                : std::string(tuning.message()));
  }

  // With the durable store: the index and metrics as they were (at start).
  absl::Status Restore(const Config& config) {
    if (store_ == nullptr) return absl::OkStatus();
    return RestoreHistory(*store_, config.history_capacity, history_, *metrics_);
  }

  ~ServerImpl() override { Shutdown(); }

  // The checkpoint roots (MeasurePath) and the watcher, checked against the
  // filesystem before serving: a root or a watched directory that does not
  // exist stops the start.
  absl::Status PrepareCheckpoints(const Config& config) {
    absl::StatusOr<std::unique_ptr<CheckpointReader>> reader =
        CheckpointReader::Create(config.checkpoint_roots);
    if (!reader.ok()) return reader.status();
    checkpoints_ = *std::move(reader);
    service_.set_checkpoint_reader(checkpoints_.get());
    for (const std::string& root : checkpoints_->policy().real_roots()) {
      spdlog::info("checkpoint root {}: MeasurePath and watch read under it",
                   root);
    }
    if (config.watch.directories.empty()) return absl::OkStatus();
    WatchHooks hooks;
    hooks.measure = [this](const std::string& path,
                           const rvd::v1::MeasureHeader& header,
                           const std::function<bool()>& stopping) {
      return service_.MeasureCheckpoint(path, header, LoadOptions{},
                                        absl::InfiniteFuture(), stopping,
                                        "watch");
    };
    hooks.has_step = [this](const std::string& model_id, int64_t step) {
      absl::StatusOr<std::vector<MeasurementLog::Entry>> kept =
          history_.index().Get(model_id, 0);
      if (!kept.ok()) return false;
      return std::any_of(kept->begin(), kept->end(),
                         [step](const auto& m) { return m->step() == step; });
    };
    absl::StatusOr<std::unique_ptr<CheckpointWatcher>> watcher =
        CheckpointWatcher::Create(
            config.watch, checkpoints_->policy(),
            config.data_dir.empty()
                ? std::string()
                : config.data_dir + "/checkpoint_watch_seen.jsonl",
            std::move(hooks));
    if (!watcher.ok()) return watcher.status();
    watcher_ = *std::move(watcher);
    watch_metrics_ = std::make_shared<WatchMetrics>(watcher_.get());
    return absl::OkStatus();
  }
  void StartWatching() {
    if (watcher_ != nullptr) watcher_->Start();
  }

  absl::Status Listen(const Config& config) {
    if (!config.metrics_address.empty()) {
      absl::StatusOr<std::unique_ptr<prometheus::Exposer>> exposer =
          StartMetricsHttp(config.metrics_address, metrics_);
      if (!exposer.ok()) return exposer.status();
      exposer_ = *std::move(exposer);
      metrics_address_ = config.metrics_address;
      if (store_metrics_ != nullptr) exposer_->RegisterCollectable(store_metrics_);
      if (watch_metrics_ != nullptr) exposer_->RegisterCollectable(watch_metrics_);
      exposer_->RegisterCollectable(live_metrics_);
      exposer_->RegisterCollectable(group_metrics_);
      if (tune_metrics_ != nullptr) exposer_->RegisterCollectable(tune_metrics_);
    }
    grpc::EnableDefaultHealthCheckService(true);
    grpc::reflection::InitProtoReflectionServerBuilderPlugin();
    // Certificates, key and token are read and checked before listening.
    absl::StatusOr<ServerSecurity> security = MakeServerSecurity(config);
    if (!security.ok()) return security.status();
    security_ = security->description;
    if (std::string warning = ExposureWarning(config); !warning.empty()) {
      spdlog::warn("{}", warning);
    }
    grpc::ServerBuilder builder;
    builder.AddListeningPort(config.grpc_address, security->credentials,
                             &port_);
    builder.RegisterService(&service_);
    {
      std::vector<std::unique_ptr<
          grpc::experimental::ServerInterceptorFactoryInterface>>
          interceptors;
      interceptors.push_back(NewRequestMetricsFactory(metrics_.get()));
      builder.experimental().SetInterceptorCreators(std::move(interceptors));
    }
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
    // Health follows the engine: a lost device turns it NOT_SERVING.
    health_watch_ = std::make_unique<EngineHealthWatch>(
        *engine_, [this](bool serving) { grpc_->GetHealthCheckService()->SetServingStatus(serving); },
        absl::Seconds(1));
    return absl::OkStatus();
  }

  void Shutdown() override {
    std::call_once(shutdown_once_, [this] {
      // No new checkpoint measurement; the one in progress leaves the queue.
      if (watcher_ != nullptr) watcher_->Stop();
      health_watch_.reset();  // before the server it reports to goes
      if (grpc_ != nullptr) {
        grpc_->GetHealthCheckService()->SetServingStatus(false);
        service_.StopWatches();
        tune_handlers_->StopWatches();
        // gRPC's Shutdown(deadline) waits out the whole deadline once a
        // callback method (WatchMeasurements) is registered, even with no
        // call in flight (an idle client connection kept SIGTERM at 5.0 s).
        // So rvd waits for its own measurement calls, within the grace, and
        // then shuts gRPC down at once, cancelling whatever is left.
        const auto deadline = std::chrono::steady_clock::now() + kShutdownGrace;
        while (metrics_->inflight() > 0 && std::chrono::steady_clock::now() < deadline) {
          std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
        // What still computes stops inside the engine (nothing recorded),
        // so that Wait below returns within the grace.
        service_.CancelComputations();
        grpc_->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(100));
        grpc_->Wait();
      }
      // No call reaches the registry any more: release every live model
      // (its snapshots finished, mappings closed) before the engine goes.
      live_->Stop();
      StopMetricsHttp(metrics_address_, std::move(exposer_));
      // Running tuning jobs stop at their next step, resumable from their logs.
      tune_jobs_.reset();
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
  const std::string& security() const { return security_; }
  std::string backend() const override { return engine_->Backend(); }

  absl::StatusOr<size_t> ReloadAlertRules() override {
    absl::StatusOr<std::vector<AlertRule>> rules =
        BuildAlertRules(alert_rules_file_, rv_alert_threshold_);
    if (!rules.ok()) {
      alerts_.NoteReloadFailure();
      return rules.status();
    }
    const size_t n = rules->size();
    alerts_.SetRules(*std::move(rules));
    return n;
  }
  // Before serving: the first rules, and WatchAlerts served.
  void StartAlerts(std::vector<AlertRule> rules) {
    alerts_.SetRules(std::move(rules));
    service_.set_alerts(&alerts_);
  }

 private:
  std::unique_ptr<Engine> engine_;
  // Before history_, whose append hook evaluates the rules.
  AlertEngine alerts_;
  const std::string alert_rules_file_;  // reread on SIGHUP ("": none)
  const double rv_alert_threshold_;     // > 0: one more rule
  ComputePool pool_;
  SqliteStore* store_;  // the log inside history_, or null (in memory)
  History history_;
  std::shared_ptr<StoreMetrics> store_metrics_;  // null without a store
  // Shared with the exposer, which holds it weakly; outlives exposer_.
  std::shared_ptr<Metrics> metrics_;
  RvdService service_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  std::string metrics_address_;  // where exposer_ listens
  std::unique_ptr<grpc::Server> grpc_;
  std::unique_ptr<EngineHealthWatch> health_watch_;
  std::unique_ptr<CheckpointReader> checkpoints_;  // MeasurePath's, the watcher's
  std::unique_ptr<CheckpointWatcher> watcher_;     // null: no watch section
  std::shared_ptr<WatchMetrics> watch_metrics_;    // null without a watcher
  // Last: stopped and gone before the service, pool, history and engine it uses.
  std::unique_ptr<LiveRegistry> live_;
  std::shared_ptr<LiveMetrics> live_metrics_;  // reads live_
  std::shared_ptr<GroupMetrics> group_metrics_;  // reads service_'s group stats
  // Sharded models' groups (issue 18); uses the engine and the service.
  std::unique_ptr<ShardGroups> shard_groups_;
  // Tuning jobs: the manager stops in Shutdown, after gRPC and the exposer.
  std::unique_ptr<tune::TuneBackend> tune_backend_;
  std::unique_ptr<tune::JobManager> tune_jobs_;
  std::unique_ptr<TuneHandlers> tune_handlers_;
  std::shared_ptr<TuneMetrics> tune_metrics_;  // null where jobs cannot run
  int port_ = 0;
  std::string security_;  // ServerSecurity::description, for the log
  std::once_flag shutdown_once_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Server>> Server::Start(const Config& config) {
  if (absl::Status s = ValidateConfig(config); !s.ok()) return s;
  // The alert rules are validated as a whole before anything starts.
  absl::StatusOr<std::vector<AlertRule>> alert_rules =
      BuildAlertRules(config.alert_rules_file, config.rv_alert_threshold);
  if (!alert_rules.ok()) return alert_rules.status();
  spdlog::info("alert rules: {} from {}{}", alert_rules->size(),
               config.alert_rules_file.empty() ? std::string("(no file)")
                                               : config.alert_rules_file,
               config.rv_alert_threshold > 0 ? " and rv_alert_threshold" : "");
  std::string why;
  absl::StatusOr<std::unique_ptr<Engine>> engine =
      CreateEngine(config.backend, config.engine_threads,
                   CudaEngineOptions{config.cuda_device, config.cuda_streams,
                                     config.cuda_max_device_bytes, config.cuda_max_sms},
                   &why);
  if (!engine.ok()) return engine.status();
  spdlog::info("{}; engine {}, default variant {}", why, (*engine)->Version(),
               (*engine)->DefaultVariant());
  // The kernels' tuning knobs go to the log (and rvd_kernel_info), not to
  // the names dashboards and tests use.
  for (const auto& [technique, policy] : (*engine)->Stats().kernel_policies) {
    spdlog::info("kernel {}: policy {}", technique, policy);
  }
  absl::StatusOr<MeasurementLogChoice> log = OpenMeasurementLog(
      config, std::max<size_t>(config.history_capacity, kMinLogRetained));
  if (!log.ok()) return log.status();
  auto server = std::make_unique<ServerImpl>(config, *std::move(engine),
                                             *std::move(log));
  if (absl::Status s = server->Restore(config); !s.ok()) return s;
  server->StartAlerts(*std::move(alert_rules));
  if (absl::Status s = server->PrepareCheckpoints(config); !s.ok()) return s;
  if (absl::Status s = server->Listen(config); !s.ok()) return s;
  server->StartWatching();
  spdlog::info("rvd {} serving gRPC on {} (port {}, {}), metrics on {}",
               RVD_VERSION, config.grpc_address, server->grpc_port(),
               server->security(),
               config.metrics_address.empty()
                   ? std::string("(disabled)")
                   : "http://" + config.metrics_address + "/metrics");
  return server;
}

}  // namespace rvd

// The rvd.v1.Rvd gRPC service: receives tensors, hands the computation to
// the compute pool, stores and publishes the result. Converts absl::Status
// to grpc::Status here and nowhere else. Thread-safe (gRPC's sync server
// calls handlers from many threads). WatchMeasurements is on gRPC's callback
// API: a watch stream holds a reactor, not a thread.
#ifndef RVD_SERVER_SERVICE_H_
#define RVD_SERVER_SERVICE_H_

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "kernels/engine.h"
#include "rvd/v1/rvd.grpc.pb.h"
#include "server/alerts.h"
#include "server/buffer_pool.h"
#include "server/checkpoint_reader.h"
#include "server/cancel_watch.h"
#include "server/compute_pool.h"
#include "server/group_metrics.h"
#include "server/history.h"
#include "server/tune_service.h"
#include "server/live_registry.h"
#include "server/shard_group.h"
#include "server/metrics.h"
#include "server/sqlite_store.h"
#include "server/stream_watchdog.h"

namespace rvd {

struct ServiceLimits {
  uint64_t max_request_bytes = 4ull << 30;  // tensor bytes per request
  // Measurements in the compute phase (computing, or queued for a worker).
  uint32_t max_inflight_requests = 256;
  std::string default_variant;               // empty: the engine's default
  uint64_t max_buffered_bytes = 4ull << 30;  // received bytes, all requests
  absl::Duration stream_idle_timeout = absl::Seconds(30);
};

class RvdService final
    : public rvd::v1::Rvd::WithCallbackMethod_WatchAlerts<
          rvd::v1::Rvd::WithCallbackMethod_WatchMeasurements<
              rvd::v1::Rvd::Service>> {
 public:
  RvdService(Engine& engine, ComputePool& pool, History& history,
             Metrics& metrics, const ServiceLimits& limits);

  // Ends every WatchMeasurements stream (UNAVAILABLE, with the cursor to
  // resume from) and refuses new ones; called before shutdown.
  void StopWatches();

  // The alert engine WatchAlerts streams read (null: UNAVAILABLE); set
  // before serving. StopWatches ends its streams too.
  void set_alerts(AlertEngine* alerts) { alerts_ = alerts; }

  // The live models' registry (RegisterLiveModel, UnregisterLiveModel,
  // NotifyStep; null: UNIMPLEMENTED); set before serving.
  void set_live(LiveRegistry* live) { live_ = live; }
  // The tuning jobs' handlers (StartTuneJob .. CancelTuneJob; null:
  // UNIMPLEMENTED); set before serving.
  void set_tuning(TuneHandlers* tuning) { tuning_ = tuning; }
  // Sharded models' groups (ExchangeShard, ReportPartial, and a header
  // with a shard_group; null: UNIMPLEMENTED); set before serving.
  void set_shard_groups(ShardGroups* groups) { shard_groups_ = groups; }
  // What this rvd did as a rank of those groups (GroupMetrics reads it).
  const GroupStats& group_stats() const { return group_stats_; }
  // Stores a group's measurement, combined here as its coordinator, as
  // every other (history, /metrics); ShardGroups logs it.
  absl::StatusOr<MeasurementLog::Entry> RecordGroupMeasurement(rvd::v1::Measurement m);
  // Stores a live model's measurement as every other (history, /metrics,
  // the log line): the registry's LiveRecorder.
  absl::StatusOr<MeasurementLog::Entry> RecordLiveMeasurement(rvd::v1::Measurement m);

  // Cancels every measurement computing or queued, and every later one
  // (CANCELLED, nothing recorded): the engine calls stop at their next
  // checkpoint. Called when the shutdown grace runs out.
  void CancelComputations() { cancel_watch_.CancelAll(); }

  // Received tensor bytes held now, all requests together.
  uint64_t buffered_bytes() const { return buffered_.used(); }

  // The durable store GetHistory's range requests read (null: the rings).
  void set_store(const SqliteStore* store) { store_ = store; }

  // The reader of checkpoints on rvd's host (MeasurePath, the watcher);
  // called before serving; it must outlive the service.
  void set_checkpoint_reader(const CheckpointReader* reader) {
    checkpoints_ = reader;
  }

  // Measures the checkpoint at `path`, read by rvd itself (the reader set
  // above: nothing crosses gRPC), for `header` (no tensors), as a
  // streamed measurement is computed, stored and logged; `deadline` and
  // `gone` as a client's. A refusal of the reader's path policy is logged
  // with its reason, naming `origin` ("MeasurePath", "watch").
  // FAILED_PRECONDITION without a reader.
  absl::StatusOr<rvd::v1::Measurement> MeasureCheckpoint(
      const std::string& path, const rvd::v1::MeasureHeader& header,
      const LoadOptions& options, absl::Time deadline,
      const std::function<bool()>& gone, const std::string& origin);

  grpc::Status MeasurePath(grpc::ServerContext* context,
                           const rvd::v1::MeasurePathRequest* request,
                           rvd::v1::Measurement* response) override;
  grpc::Status Measure(grpc::ServerContext* context,
                       const rvd::v1::MeasureRequest* request,
                       rvd::v1::Measurement* response) override;
  grpc::Status MeasureStream(grpc::ServerContext* context,
                             grpc::ServerReader<rvd::v1::MeasureChunk>* reader,
                             rvd::v1::Measurement* response) override;
  grpc::Status ExchangeShard(grpc::ServerContext* context,
                             const rvd::v1::ExchangeShardRequest* request,
                             rvd::v1::ExchangeShardResponse* response) override;
  grpc::Status ReportPartial(grpc::ServerContext* context,
                             const rvd::v1::ReportPartialRequest* request,
                             rvd::v1::Measurement* response) override;
  // Activation statistics (activations.h): validated, then computed on the
  // compute pool like a measurement (an in-flight slot, the client's
  // deadline, the byte budget for the request's bytes); nothing is stored.
  grpc::Status RegisterLiveModel(grpc::ServerContext* context,
                                 const rvd::v1::RegisterLiveModelRequest* request,
                                 rvd::v1::RegisterLiveModelResponse* response) override;
  grpc::Status UnregisterLiveModel(grpc::ServerContext* context,
                                   const rvd::v1::UnregisterLiveModelRequest* request,
                                   rvd::v1::UnregisterLiveModelResponse* response) override;
  grpc::Status NotifyStep(grpc::ServerContext* context,
                          const rvd::v1::NotifyStepRequest* request,
                          rvd::v1::NotifyStepResponse* response) override;
  grpc::Status MeasureActivations(grpc::ServerContext* context,
                                  const rvd::v1::MeasureActivationsRequest* request,
                                  rvd::v1::MeasureActivationsResponse* response) override;
  // Tuning jobs: forwarded to the handlers of set_tuning.
  grpc::Status StartTuneJob(grpc::ServerContext* context,
                            const rvd::v1::StartTuneJobRequest* request,
                            rvd::v1::TuneJob* response) override;
  grpc::Status GetTuneJob(grpc::ServerContext* context, const rvd::v1::GetTuneJobRequest* request,
                          rvd::v1::TuneJob* response) override;
  grpc::Status ListTuneJobs(grpc::ServerContext* context,
                            const rvd::v1::ListTuneJobsRequest* request,
                            rvd::v1::ListTuneJobsResponse* response) override;
  grpc::Status WatchTuneJob(grpc::ServerContext* context,
                            const rvd::v1::WatchTuneJobRequest* request,
                            grpc::ServerWriter<rvd::v1::TuneJob>* writer) override;
  grpc::Status CancelTuneJob(grpc::ServerContext* context,
                             const rvd::v1::CancelTuneJobRequest* request,
                             rvd::v1::TuneJob* response) override;
  grpc::Status GetLatest(grpc::ServerContext* context,
                         const rvd::v1::GetLatestRequest* request,
                         rvd::v1::Measurement* response) override;
  grpc::Status GetHistory(grpc::ServerContext* context,
                          const rvd::v1::GetHistoryRequest* request,
                          rvd::v1::GetHistoryResponse* response) override;
  grpc::Status ListModels(grpc::ServerContext* context,
                          const rvd::v1::ListModelsRequest* request,
                          rvd::v1::ListModelsResponse* response) override;
  grpc::Status DeleteModelHistory(
      grpc::ServerContext* context,
      const rvd::v1::DeleteModelHistoryRequest* request,
      rvd::v1::DeleteModelHistoryResponse* response) override;
  // A stream in sequence order: the log after request.after_sequence, then
  // the bus (history.h); at most max_watchers at once.
  // Alert events in sequence order after request.after_sequence (alerts.h);
  // at most max_watchers at once.
  grpc::ServerWriteReactor<rvd::v1::AlertWatchEvent>* WatchAlerts(
      grpc::CallbackServerContext* context,
      const rvd::v1::WatchAlertsRequest* request) override;
  grpc::ServerWriteReactor<rvd::v1::WatchEvent>* WatchMeasurements(
      grpc::CallbackServerContext* context,
      const rvd::v1::WatchRequest* request) override;

 private:
  // The compute phase of one measurement from validated input: takes an
  // in-flight slot, waits for a compute worker (until the client's deadline
  // or cancellation), computes, then stores and publishes the result unless
  // the client has gone meanwhile. A request that is refused, expires or is
  // cancelled computes and records nothing.
  absl::Status Run(grpc::ServerContext* context,
                   const rvd::v1::MeasureHeader& header,
                   const std::vector<std::string_view>& data,
                   rvd::v1::Measurement* response);
  // Run with the caller's deadline and "gone" test (true once the caller
  // has cancelled or its deadline has passed) in place of a gRPC context.
  absl::Status RunUntil(absl::Time deadline, const std::function<bool()>& gone,
                        const rvd::v1::MeasureHeader& header,
                        const std::vector<std::string_view>& data,
                        rvd::v1::Measurement* response);
  // Receives a stream's tensors after its header into `buffer`, which grows
  // as bytes arrive within `reservation` (the global byte budget).
  absl::Status ReceiveStream(grpc::ServerContext* context,
                             grpc::ServerReader<rvd::v1::MeasureChunk>* reader,
                             const rvd::v1::MeasureHeader& header,
                             const std::vector<uint64_t>& begin,
                             StreamWatchdog::Watch& watch,
                             ByteBudget::Reservation& reservation,
                             std::unique_ptr<BufferPool::Buffer>* buffer);
  // Counts the error in /metrics and converts it for gRPC.
  grpc::Status Finish(const absl::Status& status);

  Engine& engine_;
  ComputePool& pool_;
  History& history_;
  const SqliteStore* store_ = nullptr;  // see set_store
  Metrics& metrics_;
  const ServiceLimits limits_;
  BufferPool buffers_;                // receive buffers of streams
  ByteBudget buffered_;               // received bytes held, all requests
  StreamWatchdog watchdog_;           // cancels idle streams
  CancelWatch cancel_watch_;          // a gone caller's flag stops its engine call
  std::atomic<int64_t> inflight_{0};  // measurements in the compute phase
  std::atomic<bool> stopping_{false};  // set by StopWatches
  // MeasurePath's reader (set before serving); null: FAILED_PRECONDITION.
  const CheckpointReader* checkpoints_ = nullptr;
  AlertEngine* alerts_ = nullptr;      // see set_alerts
  LiveRegistry* live_ = nullptr;       // see set_live
  TuneHandlers* tuning_ = nullptr;     // see set_tuning
  ShardGroups* shard_groups_ = nullptr;  // see set_shard_groups
  GroupStats group_stats_;               // every MeasureShard's outcome
};

}  // namespace rvd

#endif  // RVD_SERVER_SERVICE_H_

#include "server/service.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <map>
#include <new>
#include <optional>
#include <string>
#include <utility>
#include <variant>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "server/activations.h"
#include "server/alert_watch.h"
#include "server/history_query.h"
#include "server/log_text.h"
#include "server/measure.h"
#include "server/watch_reactor.h"
#include "spdlog/spdlog.h"

namespace rvd {
namespace {

using rvd::v1::MeasureChunk;
using rvd::v1::MeasureHeader;
using rvd::v1::Measurement;

// absl and gRPC share the canonical code numbering.
grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()),
                      std::string(s.message()));
}

// Holds one of the max_inflight_requests slots for its lifetime: a slot is
// held from the end of receiving to the end of computing (queued for a
// worker or on one), never while bytes are still arriving.
class InflightSlot {
 public:
  InflightSlot(std::atomic<int64_t>& counter, int64_t limit)
      : counter_(counter) {
    acquired_ = counter_.fetch_add(1) < limit;
  }
  ~InflightSlot() { counter_.fetch_sub(1); }
  bool acquired() const { return acquired_; }

 private:
  std::atomic<int64_t>& counter_;
  bool acquired_;
};

// Receive buffers kept mapped between requests.
constexpr uint64_t kMaxIdleBufferBytes = 1ull << 30;
// A stream's buffer starts at one chunk and doubles as bytes arrive, so
// memory follows the bytes received, never the header's claim.
constexpr uint64_t kFirstStreamBuffer = kMaxChunkBytes;

absl::Status Busy(uint32_t limit) {
  return absl::ResourceExhaustedError(absl::StrCat(
      "rvd has ", limit,
      " measurements computing or queued already (max_inflight_requests); "
      "retry later"));
}

absl::Status OverBudget(uint64_t limit, uint64_t want) {
  return absl::ResourceExhaustedError(absl::StrCat(
      "rvd holds too many received bytes to take ", want,
      " more (max_buffered_bytes ", limit, ", all requests); retry later"));
}

// The client's deadline, or none.
absl::Time Deadline(const grpc::ServerContext* context) {
  const std::chrono::system_clock::time_point d = context->deadline();
  if (d == std::chrono::system_clock::time_point::max()) {
    return absl::InfiniteFuture();
  }
  return absl::FromChrono(d);
}

}  // namespace

RvdService::RvdService(Engine& engine, ComputePool& pool, History& history,
                       Metrics& metrics, const ServiceLimits& limits)
    : engine_(engine),
      pool_(pool),
      history_(history),
      metrics_(metrics),
      limits_(limits),
      buffers_(std::min<uint64_t>(limits.max_request_bytes, kMaxIdleBufferBytes),
               HostAllocator{[&engine](uint64_t n) { return engine.AllocateHostBuffer(n); },
                             [&engine](void* p) { engine.FreeHostBuffer(p); }}),
      buffered_(limits.max_buffered_bytes),
      watchdog_(limits.stream_idle_timeout) {}

void RvdService::StopWatches() {
  stopping_ = true;
  history_.CloseWatches();
  if (alerts_ != nullptr) alerts_->CloseWatches();
}

grpc::Status RvdService::Finish(const absl::Status& status) {
  if (!status.ok()) {
    metrics_.RecordError(absl::StatusCodeToString(status.code()));
    spdlog::warn("request failed: {}", LogEscape(status.ToString()));
  }
  return ToGrpc(status);
}

absl::Status RvdService::Run(grpc::ServerContext* context,
                             const MeasureHeader& header,
                             const std::vector<std::string_view>& data,
                             Measurement* response) {
  if (header.has_shard_group()) {
    // A rank of a sharded model: the group's answer, stored by the
    // coordinator, not here.
    if (shard_groups_ == nullptr) {
      return absl::UnimplementedError("rvd serves no sharded model groups");
    }
    const absl::Time start = absl::Now();
    absl::StatusOr<Measurement> m =
        shard_groups_->MeasureShard(header, data, Deadline(context));
    group_stats_.Record(header.shard_group(), header.step(), m.status(), absl::Now() - start);
    if (!m.ok()) return m.status();
    m->set_receive_ms(response->receive_ms());
    *response = *std::move(m);
    return absl::OkStatus();
  }
  // IsCancelled is also true once the deadline has passed.
  return RunUntil(Deadline(context), [context] { return context->IsCancelled(); },
                  header, data, response);
}

absl::Status RvdService::RunUntil(absl::Time deadline,
                                  const std::function<bool()>& gone,
                                  const MeasureHeader& header,
                                  const std::vector<std::string_view>& data,
                                  Measurement* response) {
  InflightSlot slot(inflight_, limits_.max_inflight_requests);
  if (!slot.acquired()) return Busy(limits_.max_inflight_requests);
  // Set when the client goes or the shutdown grace runs out: the engine
  // call stops and nothing is recorded.
  std::atomic<bool> cancel{false};
  CancelWatch::Watch cancel_watch(cancel_watch_, gone, &cancel);
  absl::StatusOr<Measurement> m = absl::InternalError("not computed");
  absl::Status queued = pool_.Run(
      [&] {
        // The client may have left between the queue and the worker.
        if (gone()) {
          m = absl::CancelledError("the client went away before computing");
          return;
        }
        try {
          m = ComputeMeasurement(engine_, header, data, limits_.default_variant, &cancel);
        } catch (const std::bad_alloc&) {
          m = absl::ResourceExhaustedError(
              "out of memory while computing the measurement");
        }
      },
      deadline, gone);
  if (!queued.ok()) return queued;
  if (!m.ok()) return m.status();
  // A result nobody waits for is not recorded: the client may retry, and
  // history must not hold a measurement the client was told failed.
  if (gone()) {
    return absl::CancelledError(
        "the client cancelled or its deadline passed during the computation; "
        "the result was not recorded");
  }
  m->set_receive_ms(response->receive_ms());
  absl::StatusOr<MeasurementLog::Entry> stored = RecordUnlessCancelled(history_, *m, &cancel);
  if (!stored.ok()) return stored.status();
  m->set_sequence((*stored)->sequence());
  metrics_.RecordMeasurement(**stored);
  // Which kernels have served (cumulative, non-zero paths): the log's proof
  // of the path that ran (/metrics reads the engine's counters itself).
  const std::map<std::string, int64_t> served = engine_.Stats().served;
  std::string served_text;
  for (const auto& [path, n] : served) {
    if (n > 0) absl::StrAppend(&served_text, served_text.empty() ? "" : ",", path, "=", n);
  }
  spdlog::info(
      "measured model={} step={} seq={} rv={} layers={} variant={} "
      "backend={} engine={} receive_ms={:.3f} elapsed_ms={:.3f} "
      "served_total={}",
      LogEscape(m->model_id()), m->step(), m->sequence(),
      m->has_rv() ? absl::StrCat(m->rv()) : "absent", m->layers_size(),
      LogEscape(m->variant()), m->backend(), m->engine_version(),
      m->receive_ms(), m->elapsed_ms(), served_text);
  *response = *std::move(m);
  return absl::OkStatus();
}

grpc::Status RvdService::Measure(grpc::ServerContext* context,
                                 const rvd::v1::MeasureRequest* request,
                                 Measurement* response) {
  absl::StatusOr<uint64_t> total =
      ValidateHeader(request->header(), limits_.max_request_bytes);
  if (!total.ok()) return Finish(total.status());
  // gRPC holds the bytes already (at most kMaxRequestMessageBytes); they
  // count against the budget while this request lives.
  ByteBudget::Reservation reservation(buffered_);
  if (!reservation.Take(request->ByteSizeLong())) {
    return Finish(OverBudget(buffered_.limit(), request->ByteSizeLong()));
  }
  metrics_.AddIngestedBytes(*total);
  std::vector<std::string_view> data(request->data().begin(),
                                     request->data().end());
  return Finish(Run(context, request->header(), data, response));
}

absl::StatusOr<MeasurementLog::Entry> RvdService::RecordGroupMeasurement(Measurement m) {
  absl::StatusOr<MeasurementLog::Entry> stored = history_.Add(std::move(m));
  if (stored.ok()) metrics_.RecordMeasurement(**stored);
  return stored;
}

grpc::Status RvdService::ExchangeShard(grpc::ServerContext* /*context*/,
                                       const rvd::v1::ExchangeShardRequest* request,
                                       rvd::v1::ExchangeShardResponse* /*response*/) {
  if (shard_groups_ == nullptr) {
    return Finish(absl::UnimplementedError("rvd serves no sharded model groups"));
  }
  return Finish(shard_groups_->ReceiveShards(*request));
}

grpc::Status RvdService::ReportPartial(grpc::ServerContext* context,
                                       const rvd::v1::ReportPartialRequest* request,
                                       Measurement* response) {
  if (shard_groups_ == nullptr) {
    return Finish(absl::UnimplementedError("rvd serves no sharded model groups"));
  }
  absl::StatusOr<Measurement> m = shard_groups_->Report(*request, Deadline(context));
  if (!m.ok()) return Finish(m.status());
  *response = *std::move(m);
  return grpc::Status::OK;
}

absl::StatusOr<MeasurementLog::Entry> RvdService::RecordLiveMeasurement(Measurement m) {
  absl::StatusOr<MeasurementLog::Entry> stored = history_.Add(std::move(m));
  if (!stored.ok()) return stored;
  const Measurement& e = **stored;
  metrics_.RecordMeasurement(e);
  spdlog::info(
      "measured model={} step={} seq={} rv={} layers={} variant={} backend={} engine={} "
      "origin=live snapshot_ms={:.3f} elapsed_ms={:.3f}",
      LogEscape(e.model_id()), e.step(), e.sequence(),
      e.has_rv() ? absl::StrCat(e.rv()) : "absent", e.layers_size(), LogEscape(e.variant()),
      e.backend(), e.engine_version(), e.receive_ms(), e.elapsed_ms());
  return stored;
}

grpc::Status RvdService::RegisterLiveModel(grpc::ServerContext* context,
                                           const rvd::v1::RegisterLiveModelRequest* request,
                                           rvd::v1::RegisterLiveModelResponse* response) {
  if (live_ == nullptr) return Finish(absl::UnimplementedError("rvd serves no live models"));
  absl::StatusOr<rvd::v1::RegisterLiveModelResponse> r =
      live_->Register(*request, Deadline(context));
  if (!r.ok()) return Finish(r.status());
  *response = *std::move(r);
  spdlog::info(
      "live registered model={} producer={} tensors={} segments={} reused={} "
      "snapshot_bytes={} lease_s={} mode={}",
      LogEscape(request->header().model_id()), request->producer_pid(),
      request->tensors_size(), response->segments_mapped(), response->segments_reused(),
      response->snapshot_bytes(), response->lease_seconds(),
      rvd::v1::TriggerPolicy::Mode_Name(request->policy().mode()));
  return grpc::Status::OK;
}

grpc::Status RvdService::UnregisterLiveModel(grpc::ServerContext*,
                                             const rvd::v1::UnregisterLiveModelRequest* request,
                                             rvd::v1::UnregisterLiveModelResponse*) {
  if (live_ == nullptr) return Finish(absl::UnimplementedError("rvd serves no live models"));
  if (absl::Status s = live_->Unregister(request->model_id()); !s.ok()) return Finish(s);
  spdlog::info("live unregistered model={}", LogEscape(request->model_id()));
  return grpc::Status::OK;
}

grpc::Status RvdService::NotifyStep(grpc::ServerContext*, const rvd::v1::NotifyStepRequest* request,
                                    rvd::v1::NotifyStepResponse* response) {
  if (live_ == nullptr) return Finish(absl::UnimplementedError("rvd serves no live models"));
  absl::StatusOr<rvd::v1::NotifyStepResponse> r = live_->Notify(*request);
  if (!r.ok()) return Finish(r.status());
  *response = *std::move(r);
  // Every training step calls this: debug, not info (the measurements it
  // leads to are logged at info).
  spdlog::debug("live notify model={} step={} snapshot={} reason={}",
                LogEscape(request->model_id()), request->step(), response->snapshot(),
                response->reason());
  return grpc::Status::OK;
}

// The tuning jobs' RPCs: the handlers own their conversions and codes.
namespace {
grpc::Status NoTuning() {
  return grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "this rvd has no tuning jobs");
}
}  // namespace

grpc::Status RvdService::StartTuneJob(grpc::ServerContext* context,
                                      const rvd::v1::StartTuneJobRequest* request,
                                      rvd::v1::TuneJob* response) {
  return tuning_ != nullptr ? tuning_->StartTuneJob(context, request, response) : NoTuning();
}

grpc::Status RvdService::GetTuneJob(grpc::ServerContext* context,
                                    const rvd::v1::GetTuneJobRequest* request,
                                    rvd::v1::TuneJob* response) {
  return tuning_ != nullptr ? tuning_->GetTuneJob(context, request, response) : NoTuning();
}

grpc::Status RvdService::ListTuneJobs(grpc::ServerContext* context,
                                      const rvd::v1::ListTuneJobsRequest* request,
                                      rvd::v1::ListTuneJobsResponse* response) {
  return tuning_ != nullptr ? tuning_->ListTuneJobs(context, request, response) : NoTuning();
}

grpc::Status RvdService::WatchTuneJob(grpc::ServerContext* context,
                                      const rvd::v1::WatchTuneJobRequest* request,
                                      grpc::ServerWriter<rvd::v1::TuneJob>* writer) {
  return tuning_ != nullptr ? tuning_->WatchTuneJob(context, request, writer) : NoTuning();
}

grpc::Status RvdService::CancelTuneJob(grpc::ServerContext* context,
                                       const rvd::v1::CancelTuneJobRequest* request,
                                       rvd::v1::TuneJob* response) {
  return tuning_ != nullptr ? tuning_->CancelTuneJob(context, request, response) : NoTuning();
}

grpc::Status RvdService::MeasureActivations(grpc::ServerContext* context,
                                            const rvd::v1::MeasureActivationsRequest* request,
                                            rvd::v1::MeasureActivationsResponse* response) {
  absl::StatusOr<uint64_t> total = ValidateActivations(*request, limits_.max_request_bytes);
  if (!total.ok()) return Finish(total.status());
  ByteBudget::Reservation reservation(buffered_);
  if (!reservation.Take(request->ByteSizeLong())) {
    return Finish(OverBudget(buffered_.limit(), request->ByteSizeLong()));
  }
  metrics_.AddIngestedBytes(*total);
  InflightSlot slot(inflight_, limits_.max_inflight_requests);
  if (!slot.acquired()) return Finish(Busy(limits_.max_inflight_requests));
  const auto gone = [context] { return context->IsCancelled(); };
  std::atomic<bool> cancel{false};
  CancelWatch::Watch cancel_watch(cancel_watch_, gone, &cancel);
  absl::StatusOr<rvd::v1::MeasureActivationsResponse> r =
      absl::InternalError("not computed");
  absl::Status queued = pool_.Run(
      [&] {
        if (gone()) {
          r = absl::CancelledError("the client went away before computing");
          return;
        }
        try {
          r = ComputeActivationStats(engine_, *request, &cancel);
        } catch (const std::bad_alloc&) {
          r = absl::ResourceExhaustedError("out of memory while computing activation statistics");
        }
      },
      Deadline(context), gone);
  if (!queued.ok()) return Finish(queued);
  if (!r.ok()) return Finish(r.status());
  spdlog::info("activations model={} step={} tensors={} bytes={} backend={} elapsed_ms={:.3f}",
               LogEscape(r->model_id()), r->step(), r->stats_size(), *total, r->backend(),
               r->elapsed_ms());
  *response = *std::move(r);
  return grpc::Status::OK;
}

absl::Status RvdService::ReceiveStream(
    grpc::ServerContext* context, grpc::ServerReader<MeasureChunk>* reader,
    const MeasureHeader& header, const std::vector<uint64_t>& begin,
    StreamWatchdog::Watch& watch, ByteBudget::Reservation& reservation,
    std::unique_ptr<BufferPool::Buffer>* buffer) {
  const int n = header.tensors_size();
  uint64_t capacity = 0;  // bytes of *buffer, all reserved
  uint64_t received = 0;  // bytes so far, tensor after tensor
  int empty_chunks = 0;
  MeasureChunk chunk;
  while (reader->Read(&chunk)) {
    watch.Touch();
    if (chunk.has_header()) {
      return absl::InvalidArgumentError("header sent twice");
    }
    const uint64_t size = chunk.data().size();
    if (size > kMaxChunkBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "chunk of ", size, " bytes exceeds ", kMaxChunkBytes));
    }
    if (size == 0) {
      if (++empty_chunks > kMaxEmptyChunks) {
        return absl::InvalidArgumentError(absl::StrCat(
            "stream sent more than ", kMaxEmptyChunks,
            " chunks without data (the limit)"));
      }
      continue;  // carries nothing; *buffer may not exist yet
    }
    if (received == begin[n]) {
      return absl::InvalidArgumentError(
          "stream carries more bytes than the header's tensors");
    }
    const int current = std::upper_bound(begin.begin(), begin.end(), received) -
                        begin.begin() - 1;
    const std::string& name = header.tensors(current).name();
    const uint64_t offset = received - begin[current];
    if (chunk.tensor_index() != static_cast<uint32_t>(current) ||
        chunk.offset() != offset) {
      return absl::InvalidArgumentError(absl::StrCat(
          "out-of-order chunk: expected tensor ", current, " ('", name,
          "') at offset ", offset, ", got tensor ", chunk.tensor_index(),
          " at offset ", chunk.offset()));
    }
    if (received + size > begin[current + 1]) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", name, "': chunk overruns its ",
                       begin[current + 1] - begin[current], " bytes"));
    }
    if (received + size > capacity) {
      // Double (at least), capped by the header's total: the copies add up
      // to less than the bytes received. The budget counts the buffer's
      // capacity (the smaller buffer, held during the copy, is not counted
      // again, so that a request of the whole budget can be received).
      const uint64_t grown = std::min(
          begin[n], std::max({received + size, 2 * capacity, kFirstStreamBuffer}));
      if (!reservation.Take(grown - capacity)) {
        return OverBudget(buffered_.limit(), grown - capacity);
      }
      absl::StatusOr<BufferPool::Buffer> next = buffers_.Get(grown);
      if (!next.ok()) return next.status();  // the reservation gives back
      auto bigger = std::make_unique<BufferPool::Buffer>(*std::move(next));
      if (received > 0) std::memcpy(bigger->data(), (*buffer)->data(), received);
      *buffer = std::move(bigger);  // the smaller one goes back to the pool
      capacity = grown;
    }
    std::memcpy((*buffer)->data() + received, chunk.data().data(), size);
    received += size;
  }
  if (watch.timed_out()) {
    return absl::DeadlineExceededError(absl::StrCat(
        "stream sent nothing for ",
        absl::FormatDuration(watchdog_.idle_timeout()),
        " (stream_idle_timeout_seconds): cancelled"));
  }
  if (context->IsCancelled()) {
    return absl::CancelledError("client cancelled the stream");
  }
  if (received != begin[n]) {
    const int current = std::upper_bound(begin.begin(), begin.end(), received) -
                        begin.begin() - 1;
    return absl::InvalidArgumentError(absl::StrCat(
        "stream ended early: tensor '", header.tensors(current).name(),
        "' has ", received - begin[current], " of ",
        begin[current + 1] - begin[current], " bytes"));
  }
  return absl::OkStatus();
}

grpc::Status RvdService::MeasureStream(grpc::ServerContext* context,
                                       grpc::ServerReader<MeasureChunk>* reader,
                                       Measurement* response) {
  // Receiving holds no in-flight slot: it is bounded by the byte budget and
  // the idle timeout; only the compute phase (Run) takes a slot.
  StreamWatchdog::Watch watch(watchdog_, [context] { context->TryCancel(); });
  MeasureChunk chunk;
  if (!reader->Read(&chunk)) {
    if (watch.timed_out()) {
      return Finish(absl::DeadlineExceededError(absl::StrCat(
          "stream sent no header for ",
          absl::FormatDuration(watchdog_.idle_timeout()),
          " (stream_idle_timeout_seconds): cancelled")));
    }
    return Finish(absl::InvalidArgumentError("empty stream: no header"));
  }
  watch.Touch();
  if (!chunk.has_header() || !chunk.data().empty()) {
    return Finish(absl::InvalidArgumentError(
        "the first message of a stream must carry the header and no data"));
  }
  const MeasureHeader header = std::move(*chunk.mutable_header());
  absl::StatusOr<uint64_t> total =
      ValidateHeader(header, limits_.max_request_bytes);
  if (!total.ok()) return Finish(total.status());

  // Tensor i is [begin[i], begin[i+1]) of one buffer; sizes were checked.
  const int n = header.tensors_size();
  std::vector<uint64_t> begin(n + 1, 0);
  for (int i = 0; i < n; ++i) {
    begin[i + 1] = begin[i] + *TensorByteSize(header.tensors(i));
  }
  const absl::Time receive_start = absl::Now();
  ByteBudget::Reservation reservation(buffered_);
  std::unique_ptr<BufferPool::Buffer> buffer;
  if (absl::Status s = ReceiveStream(context, reader, header, begin, watch,
                                     reservation, &buffer);
      !s.ok()) {
    return Finish(s);
  }
  // Received: the compute phase (and a group's wait on its peers) is
  // bounded by the deadline and shard_group_timeout_seconds, not idle time.
  watch.Stop();
  response->set_receive_ms(
      absl::ToDoubleMilliseconds(absl::Now() - receive_start));
  metrics_.AddIngestedBytes(*total);
  std::vector<std::string_view> data;
  for (int i = 0; i < n; ++i) {
    data.emplace_back(buffer->data() + begin[i], begin[i + 1] - begin[i]);
  }
  return Finish(Run(context, header, data, response));
}

absl::StatusOr<Measurement> RvdService::MeasureCheckpoint(
    const std::string& path, const MeasureHeader& header,
    const LoadOptions& options, absl::Time deadline,
    const std::function<bool()>& gone, const std::string& origin) {
  if (checkpoints_ == nullptr) {
    return absl::FailedPreconditionError("rvd reads no checkpoints itself");
  }
  std::string reason;
  absl::StatusOr<ReadCheckpoint> read = checkpoints_->Read(
      path, header, options, limits_.max_request_bytes, &reason);
  if (!read.ok()) {
    if (!reason.empty()) {
      spdlog::warn("{}: refused to read {}: {} ({})", origin, LogEscape(path),
                   LogEscape(reason), LogEscape(read.status().ToString()));
    }
    return read.status();
  }
  Measurement m;
  m.set_receive_ms(read->load_ms);  // mapping and checking the files
  if (absl::Status s = RunUntil(deadline, gone, read->header, read->data, &m);
      !s.ok()) {
    return s;
  }
  spdlog::info("{}: read {} ({} tensor bytes mapped, {:.3f} ms) for seq {}",
               origin, LogEscape(read->real_path), read->bytes, read->load_ms,
               m.sequence());
  return m;
}

grpc::Status RvdService::MeasurePath(grpc::ServerContext* context,
                                     const rvd::v1::MeasurePathRequest* request,
                                     Measurement* response) {
  if (request->num_heads() < 0 || request->num_kv_heads() < 0 ||
      request->head_dim() < 0) {
    return Finish(absl::InvalidArgumentError(
        "MeasurePath: num_heads, num_kv_heads and head_dim must be >= 0"));
  }
  LoadOptions options;
  options.arch = request->arch();
  options.num_heads = request->num_heads();
  options.num_kv_heads = request->num_kv_heads();
  options.head_dim = request->head_dim();
  absl::StatusOr<Measurement> m = MeasureCheckpoint(
      request->path(), request->header(), options, Deadline(context),
      [context] { return context->IsCancelled(); }, "MeasurePath");
  if (!m.ok()) return Finish(m.status());
  *response = *std::move(m);
  return grpc::Status::OK;
}

grpc::Status RvdService::GetLatest(grpc::ServerContext*,
                                   const rvd::v1::GetLatestRequest* request,
                                   Measurement* response) {
  if (absl::Status s = ValidateModelId(request->model_id()); !s.ok()) {
    return Finish(s);
  }
  MeasurementLog::Entry m = history_.index().Latest(request->model_id());
  if (m == nullptr) {
    return Finish(absl::NotFoundError(
        absl::StrCat("no measurements of model '", request->model_id(), "'")));
  }
  *response = *m;
  return grpc::Status::OK;
}

grpc::Status RvdService::GetHistory(grpc::ServerContext*,
                                    const rvd::v1::GetHistoryRequest* request,
                                    rvd::v1::GetHistoryResponse* response) {
  if (absl::Status s = ValidateModelId(request->model_id()); !s.ok()) {
    return Finish(s);
  }
  if (IsRangeRequest(*request)) {
    return Finish(SelectHistory(history_.index(), store_, *request, response));
  }
  absl::StatusOr<std::vector<MeasurementLog::Entry>> ms =
      history_.index().Get(request->model_id(), request->limit());
  if (!ms.ok()) return Finish(ms.status());
  for (const MeasurementLog::Entry& m : *ms) *response->add_measurements() = *m;
  return grpc::Status::OK;
}

grpc::Status RvdService::DeleteModelHistory(
    grpc::ServerContext*, const rvd::v1::DeleteModelHistoryRequest* request,
    rvd::v1::DeleteModelHistoryResponse* response) {
  if (absl::Status s = ValidateModelId(request->model_id()); !s.ok()) {
    return Finish(s);
  }
  absl::StatusOr<uint64_t> n = history_.DeleteModel(request->model_id());
  if (!n.ok()) return Finish(n.status());
  response->set_deleted(*n);
  metrics_.ForgetModel(request->model_id());
  spdlog::info("deleted the history of model={}: {} measurements",
               LogEscape(request->model_id()), *n);
  return grpc::Status::OK;
}

grpc::Status RvdService::ListModels(grpc::ServerContext*,
                                    const rvd::v1::ListModelsRequest*,
                                    rvd::v1::ListModelsResponse* response) {
  for (const MeasurementIndex::ModelState& s : history_.index().Models()) {
    rvd::v1::ModelSummary* summary = response->add_models();
    summary->set_model_id(s.model_id);
    summary->set_measurements(s.kept);
    *summary->mutable_latest() = *s.latest;
  }
  return grpc::Status::OK;
}

namespace {

// A WatchMeasurements stream: the Watch's events (the log, then the bus).
using MeasurementWatchReactor = WatchReactor<rvd::v1::WatchEvent, Watch>;

absl::StatusOr<bool> FillWatchEvent(Watch& watch, rvd::v1::WatchEvent* out) {
  absl::StatusOr<std::optional<BusEvent>> next = watch.Next();
  if (!next.ok()) return next.status();
  if (!next->has_value()) return false;
  out->Clear();
  if (const auto* m = std::get_if<MeasurementLog::Entry>(&**next)) {
    *out->mutable_measurement() = **m;
  } else {
    GapToProto(std::get<GapMarker>(**next), out->mutable_gap());
  }
  return true;
}

}  // namespace

grpc::ServerWriteReactor<rvd::v1::AlertWatchEvent>* RvdService::WatchAlerts(
    grpc::CallbackServerContext*, const rvd::v1::WatchAlertsRequest* request) {
  return StartAlertWatch(alerts_, *request,
                         [this](const absl::Status& s) { return Finish(s); });
}

grpc::ServerWriteReactor<rvd::v1::WatchEvent>* RvdService::WatchMeasurements(
    grpc::CallbackServerContext*, const rvd::v1::WatchRequest* request) {
  auto* reactor = new MeasurementWatchReactor(
      FillWatchEvent, MeasurementWatchReactor::OnClose::kEndNow, "watch stream",
      [this](const absl::Status& s) { return Finish(s); });
  if (!request->model_id().empty()) {
    if (absl::Status s = ValidateModelId(request->model_id()); !s.ok()) {
      reactor->Start(s);
      return reactor;
    }
  }
  std::optional<uint64_t> after;
  if (request->has_after_sequence()) after = request->after_sequence();
  reactor->Start(history_.Subscribe(request->model_id(), after,
                                    [reactor] { reactor->Notify(); }));
  return reactor;
}

}  // namespace rvd

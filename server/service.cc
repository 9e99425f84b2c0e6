#include "server/service.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "server/measure.h"
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

// Holds one of the max_inflight_requests slots for its lifetime.
class InflightSlot {
 public:
  InflightSlot(std::atomic<int64_t>& counter, int64_t limit, Metrics& metrics)
      : counter_(counter), metrics_(metrics) {
    acquired_ = counter_.fetch_add(1) < limit;
    metrics_.SetInflight(counter_.load());
  }
  ~InflightSlot() { metrics_.SetInflight(counter_.fetch_sub(1) - 1); }
  bool acquired() const { return acquired_; }

 private:
  std::atomic<int64_t>& counter_;
  Metrics& metrics_;
  bool acquired_;
};

// Receive buffers kept mapped between requests.
constexpr uint64_t kMaxIdleBufferBytes = 1ull << 30;

absl::Status Busy(uint32_t limit) {
  return absl::ResourceExhaustedError(absl::StrCat(
      "rvd is computing ", limit,
      " measurements already (max_inflight_requests); retry later"));
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
                             [&engine](void* p) { engine.FreeHostBuffer(p); }}) {}

void RvdService::StopWatches() {
  stopping_ = true;
  history_.CloseAllSubscriptions();
}

grpc::Status RvdService::Finish(const absl::Status& status) {
  if (!status.ok()) {
    metrics_.RecordError(absl::StatusCodeToString(status.code()));
    spdlog::warn("request failed: {}", status.ToString());
  }
  return ToGrpc(status);
}

absl::Status RvdService::Run(const MeasureHeader& header,
                             const std::vector<std::string_view>& data,
                             Measurement* response) {
  absl::StatusOr<Measurement> m;
  pool_.Run([&] {
    m = ComputeMeasurement(engine_, header, data, limits_.default_variant);
  });
  if (!m.ok()) return m.status();
  m->set_receive_ms(response->receive_ms());
  if (absl::Status s = history_.Add(*m); !s.ok()) return s;
  metrics_.RecordMeasurement(*m);
  // Which kernels have served (cumulative, non-zero paths): the log's and
  // /metrics' proof of the path that ran.
  const std::map<std::string, int64_t> served = engine_.ServedCounts();
  metrics_.RecordServed(engine_.Backend(), served);
  metrics_.RecordPhases(engine_.Backend(), engine_.PhaseSeconds());
  std::string served_text;
  for (const auto& [path, n] : served) {
    if (n > 0) absl::StrAppend(&served_text, served_text.empty() ? "" : ",", path, "=", n);
  }
  spdlog::info(
      "measured model={} step={} rv={} layers={} variant={} backend={} "
      "engine={} receive_ms={:.3f} elapsed_ms={:.3f} served_total={}",
      m->model_id(), m->step(), m->has_rv() ? absl::StrCat(m->rv()) : "absent",
      m->layers_size(), m->variant(), m->backend(), m->engine_version(),
      m->receive_ms(), m->elapsed_ms(), served_text);
  *response = *std::move(m);
  return absl::OkStatus();
}

grpc::Status RvdService::Measure(grpc::ServerContext*,
                                 const rvd::v1::MeasureRequest* request,
                                 Measurement* response) {
  InflightSlot slot(inflight_, limits_.max_inflight_requests, metrics_);
  if (!slot.acquired()) return Finish(Busy(limits_.max_inflight_requests));
  absl::StatusOr<uint64_t> total =
      ValidateHeader(request->header(), limits_.max_request_bytes);
  if (!total.ok()) return Finish(total.status());
  metrics_.AddIngestedBytes(*total);
  std::vector<std::string_view> data(request->data().begin(),
                                     request->data().end());
  return Finish(Run(request->header(), data, response));
}

grpc::Status RvdService::MeasureStream(grpc::ServerContext* context,
                                       grpc::ServerReader<MeasureChunk>* reader,
                                       Measurement* response) {
  InflightSlot slot(inflight_, limits_.max_inflight_requests, metrics_);
  if (!slot.acquired()) return Finish(Busy(limits_.max_inflight_requests));

  MeasureChunk chunk;
  if (!reader->Read(&chunk)) {
    return Finish(absl::InvalidArgumentError("empty stream: no header"));
  }
  if (!chunk.has_header() || !chunk.data().empty()) {
    return Finish(absl::InvalidArgumentError(
        "the first message of a stream must carry the header and no data"));
  }
  const MeasureHeader header = std::move(*chunk.mutable_header());
  absl::StatusOr<uint64_t> total =
      ValidateHeader(header, limits_.max_request_bytes);
  if (!total.ok()) return Finish(total.status());

  // One buffer for all tensors, sized from the validated header, so a
  // stream can never make rvd hold more than max_request_bytes.
  const int n = header.tensors_size();
  std::vector<uint64_t> begin(n + 1, 0);  // tensor i is [begin[i], begin[i+1])
  for (int i = 0; i < n; ++i) {
    begin[i + 1] = begin[i] + *TensorByteSize(header.tensors(i));
  }
  BufferPool::Buffer buffer = buffers_.Get(begin[n]);
  const absl::Time receive_start = absl::Now();
  uint64_t received = 0;  // bytes so far, tensor after tensor
  while (reader->Read(&chunk)) {
    if (chunk.has_header()) {
      return Finish(absl::InvalidArgumentError("header sent twice"));
    }
    if (chunk.data().size() > kMaxChunkBytes) {
      return Finish(absl::InvalidArgumentError(
          absl::StrCat("chunk of ", chunk.data().size(), " bytes exceeds ",
                       kMaxChunkBytes)));
    }
    if (received == begin[n]) {
      return Finish(absl::InvalidArgumentError(
          "stream carries more bytes than the header's tensors"));
    }
    const int current = std::upper_bound(begin.begin(), begin.end(), received) -
                        begin.begin() - 1;
    const std::string& name = header.tensors(current).name();
    const uint64_t offset = received - begin[current];
    if (chunk.tensor_index() != static_cast<uint32_t>(current) ||
        chunk.offset() != offset) {
      return Finish(absl::InvalidArgumentError(
          absl::StrCat("out-of-order chunk: expected tensor ", current, " ('",
                       name, "') at offset ", offset, ", got tensor ",
                       chunk.tensor_index(), " at offset ", chunk.offset())));
    }
    if (received + chunk.data().size() > begin[current + 1]) {
      return Finish(absl::InvalidArgumentError(
          absl::StrCat("tensor '", name, "': chunk overruns its ",
                       begin[current + 1] - begin[current], " bytes")));
    }
    std::memcpy(buffer.data() + received, chunk.data().data(),
                chunk.data().size());
    received += chunk.data().size();
  }
  if (context->IsCancelled()) {
    return Finish(absl::CancelledError("client cancelled the stream"));
  }
  if (received != begin[n]) {
    const int current = std::upper_bound(begin.begin(), begin.end(), received) -
                        begin.begin() - 1;
    return Finish(absl::InvalidArgumentError(absl::StrCat(
        "stream ended early: tensor '", header.tensors(current).name(),
        "' has ", received - begin[current], " of ",
        begin[current + 1] - begin[current], " bytes")));
  }
  response->set_receive_ms(
      absl::ToDoubleMilliseconds(absl::Now() - receive_start));
  metrics_.AddIngestedBytes(*total);
  std::vector<std::string_view> data;
  for (int i = 0; i < n; ++i) {
    data.emplace_back(buffer.data() + begin[i], begin[i + 1] - begin[i]);
  }
  return Finish(Run(header, data, response));
}

grpc::Status RvdService::GetLatest(grpc::ServerContext*,
                                   const rvd::v1::GetLatestRequest* request,
                                   Measurement* response) {
  if (absl::Status s = ValidateModelId(request->model_id()); !s.ok()) {
    return Finish(s);
  }
  std::optional<Measurement> m = history_.Latest(request->model_id());
  if (!m) {
    return Finish(absl::NotFoundError(
        absl::StrCat("no measurements of model '", request->model_id(), "'")));
  }
  *response = *std::move(m);
  return grpc::Status::OK;
}

grpc::Status RvdService::GetHistory(grpc::ServerContext*,
                                    const rvd::v1::GetHistoryRequest* request,
                                    rvd::v1::GetHistoryResponse* response) {
  if (absl::Status s = ValidateModelId(request->model_id()); !s.ok()) {
    return Finish(s);
  }
  absl::StatusOr<std::vector<Measurement>> ms =
      history_.Get(request->model_id(), request->limit());
  if (!ms.ok()) return Finish(ms.status());
  for (Measurement& m : *ms) *response->add_measurements() = std::move(m);
  return grpc::Status::OK;
}

grpc::Status RvdService::ListModels(grpc::ServerContext*,
                                    const rvd::v1::ListModelsRequest*,
                                    rvd::v1::ListModelsResponse* response) {
  for (rvd::v1::ModelSummary& s : history_.Models()) {
    *response->add_models() = std::move(s);
  }
  return grpc::Status::OK;
}

grpc::Status RvdService::WatchMeasurements(
    grpc::ServerContext* context, const rvd::v1::WatchRequest* request,
    grpc::ServerWriter<Measurement>* writer) {
  if (!request->model_id().empty()) {
    if (absl::Status s = ValidateModelId(request->model_id()); !s.ok()) {
      return Finish(s);
    }
  }
  std::shared_ptr<Subscription> sub = history_.Subscribe(request->model_id());
  while (!stopping_ && !context->IsCancelled()) {
    std::optional<Measurement> m = sub->Next(absl::Milliseconds(200));
    if (!m && sub->closed()) break;      // shutting down
    if (m && !writer->Write(*m)) break;  // the client went away
  }
  history_.Unsubscribe(sub);
  return grpc::Status::OK;
}

}  // namespace rvd

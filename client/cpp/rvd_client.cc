#include "client/cpp/rvd_client.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "rvd/v1/limits.h"

namespace rvd {
namespace {

using rvd::v1::kMaxChunkBytes;  // every chunk but a tensor's last is this big

absl::Status FromGrpc(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                      s.error_message());
}

rvd::v1::DType ToProto(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return rvd::v1::DTYPE_F32;
    case DType::kF16:
      return rvd::v1::DTYPE_F16;
    case DType::kBF16:
      return rvd::v1::DTYPE_BF16;
  }
  return rvd::v1::DTYPE_UNSPECIFIED;
}

// Reads a server stream into on_event until it ends, or until on_event says
// stop (the stream is then cancelled: an OK end); else the stream's status.
template <typename Event>
absl::Status ReadStream(grpc::ClientContext* context,
                        grpc::ClientReader<Event>* reader,
                        const std::function<bool(const Event&)>& on_event) {
  Event event;
  while (reader->Read(&event)) {
    if (!on_event(event)) {
      context->TryCancel();
      break;
    }
  }
  grpc::Status s = reader->Finish();
  if (s.error_code() == grpc::StatusCode::CANCELLED) return absl::OkStatus();
  return FromGrpc(s);
}

}  // namespace

std::vector<rvd::v1::TensorSpec> TensorSpecs(const LoadedModel& model) {
  std::vector<rvd::v1::TensorSpec> specs;
  for (const ModelTensor& t : model.tensors) {
    rvd::v1::TensorSpec& spec = specs.emplace_back();
    spec.set_name(t.name);
    spec.set_layer(t.layer);
    spec.set_dtype(ToProto(t.dtype));
    spec.add_shape(t.rows);
    spec.add_shape(t.cols);
    // VLayout mirrors the proto enum's numbering.
    spec.set_layout(static_cast<rvd::v1::VLayout>(t.layout));
    spec.mutable_geometry()->set_num_heads(t.geometry.num_heads);
    spec.mutable_geometry()->set_num_kv_heads(t.geometry.num_kv_heads);
    spec.mutable_geometry()->set_head_dim(t.geometry.head_dim);
  }
  return specs;
}

RvdClient::RvdClient(const std::shared_ptr<grpc::Channel>& channel)
    : stub_(rvd::v1::Rvd::NewStub(channel)) {}

RvdClient::RvdClient(const std::string& address) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(rvd::v1::kMaxReplyMessageBytes);
  args.SetMaxSendMessageSize(rvd::v1::kMaxRequestMessageBytes);
  stub_ = rvd::v1::Rvd::NewStub(grpc::CreateCustomChannel(
      address, grpc::InsecureChannelCredentials(), args));
}

absl::StatusOr<rvd::v1::Measurement> RvdClient::Measure(
    const rvd::v1::MeasureHeader& header, const LoadedModel& model,
    const ProgressFn& progress) {
  uint64_t total = 0;
  for (const ModelTensor& t : model.tensors) total += t.bytes;
  grpc::ClientContext context;
  rvd::v1::Measurement response;
  std::unique_ptr<grpc::ClientWriter<rvd::v1::MeasureChunk>> writer =
      stub_->MeasureStream(&context, &response);
  rvd::v1::MeasureChunk chunk;
  *chunk.mutable_header() = header;
  bool open = writer->Write(chunk);
  chunk.clear_header();
  uint64_t sent = 0;
  for (size_t i = 0; open && i < model.tensors.size(); ++i) {
    const ModelTensor& t = model.tensors[i];
    for (uint64_t offset = 0; open && offset < t.bytes; offset += kMaxChunkBytes) {
      const uint64_t n = std::min<uint64_t>(kMaxChunkBytes, t.bytes - offset);
      chunk.set_tensor_index(i);
      chunk.set_offset(offset);
      chunk.set_data(t.data + offset, n);
      open = writer->Write(chunk);
      sent += n;
      if (progress) progress(sent, total);
    }
  }
  // When a Write fails the daemon has already answered; Finish reports why.
  writer->WritesDone();
  if (absl::Status s = FromGrpc(writer->Finish()); !s.ok()) return s;
  return response;
}

absl::StatusOr<rvd::v1::Measurement> RvdClient::MeasurePath(
    const rvd::v1::MeasurePathRequest& request) {
  grpc::ClientContext context;
  rvd::v1::Measurement response;
  if (absl::Status s =
          FromGrpc(stub_->MeasurePath(&context, request, &response));
      !s.ok()) {
    return s;
  }
  return response;
}

absl::StatusOr<rvd::v1::Measurement> RvdClient::GetLatest(
    const std::string& model_id) {
  grpc::ClientContext context;
  rvd::v1::GetLatestRequest request;
  request.set_model_id(model_id);
  rvd::v1::Measurement response;
  if (absl::Status s = FromGrpc(stub_->GetLatest(&context, request, &response));
      !s.ok()) {
    return s;
  }
  return response;
}

absl::StatusOr<std::vector<rvd::v1::Measurement>> RvdClient::GetHistory(
    const std::string& model_id, uint32_t limit) {
  grpc::ClientContext context;
  rvd::v1::GetHistoryRequest request;
  request.set_model_id(model_id);
  request.set_limit(limit);
  rvd::v1::GetHistoryResponse response;
  if (absl::Status s =
          FromGrpc(stub_->GetHistory(&context, request, &response));
      !s.ok()) {
    return s;
  }
  return std::vector<rvd::v1::Measurement>(response.measurements().begin(),
                                           response.measurements().end());
}

absl::StatusOr<rvd::v1::GetHistoryResponse> RvdClient::GetHistoryPage(
    const rvd::v1::GetHistoryRequest& request) {
  grpc::ClientContext context;
  rvd::v1::GetHistoryResponse response;
  if (absl::Status s =
          FromGrpc(stub_->GetHistory(&context, request, &response));
      !s.ok()) {
    return s;
  }
  return response;
}

absl::StatusOr<uint64_t> RvdClient::DeleteModelHistory(
    const std::string& model_id) {
  grpc::ClientContext context;
  rvd::v1::DeleteModelHistoryRequest request;
  request.set_model_id(model_id);
  rvd::v1::DeleteModelHistoryResponse response;
  if (absl::Status s = FromGrpc(
          stub_->DeleteModelHistory(&context, request, &response));
      !s.ok()) {
    return s;
  }
  return response.deleted();
}

absl::StatusOr<std::vector<rvd::v1::ModelSummary>> RvdClient::ListModels() {
  grpc::ClientContext context;
  rvd::v1::ListModelsResponse response;
  if (absl::Status s = FromGrpc(
          stub_->ListModels(&context, rvd::v1::ListModelsRequest(), &response));
      !s.ok()) {
    return s;
  }
  return std::vector<rvd::v1::ModelSummary>(response.models().begin(),
                                            response.models().end());
}

absl::Status RvdClient::Watch(
    const std::string& model_id, std::optional<uint64_t> after_sequence,
    const std::function<bool(const rvd::v1::WatchEvent&)>& on_event) {
  grpc::ClientContext context;
  if (!AddWatch(&context)) return absl::OkStatus();
  rvd::v1::WatchRequest request;
  request.set_model_id(model_id);
  if (after_sequence.has_value()) request.set_after_sequence(*after_sequence);
  std::unique_ptr<grpc::ClientReader<rvd::v1::WatchEvent>> reader =
      stub_->WatchMeasurements(&context, request);
  absl::Status s = ReadStream(&context, reader.get(), on_event);
  RemoveWatch(&context);
  return s;
}

absl::Status RvdClient::WatchAlerts(
    const std::string& model_id, std::optional<uint64_t> after_sequence,
    const std::function<bool(const rvd::v1::AlertWatchEvent&)>& on_event) {
  grpc::ClientContext context;
  if (!AddWatch(&context)) return absl::OkStatus();
  rvd::v1::WatchAlertsRequest request;
  request.set_model_id(model_id);
  if (after_sequence.has_value()) request.set_after_sequence(*after_sequence);
  std::unique_ptr<grpc::ClientReader<rvd::v1::AlertWatchEvent>> reader =
      stub_->WatchAlerts(&context, request);
  absl::Status s = ReadStream(&context, reader.get(), on_event);
  RemoveWatch(&context);
  return s;
}

bool RvdClient::AddWatch(grpc::ClientContext* context) {
  std::lock_guard<std::mutex> lock(watches_mu_);
  if (watches_cancelled_) return false;
  watches_.insert(context);
  return true;
}

void RvdClient::RemoveWatch(grpc::ClientContext* context) {
  std::lock_guard<std::mutex> lock(watches_mu_);
  watches_.erase(context);
}

void RvdClient::CancelWatches() {
  std::lock_guard<std::mutex> lock(watches_mu_);
  watches_cancelled_ = true;
  for (grpc::ClientContext* c : watches_) c->TryCancel();
}

}  // namespace rvd

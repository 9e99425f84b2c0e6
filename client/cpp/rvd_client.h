// A C++ client of rvd.v1.Rvd: measures a checkpoint loaded by
// model_loader.h (tensors streamed in chunks of at most 4 MiB), and reads
// history. One RvdClient per channel; thread-compatible.
#ifndef RVD_CLIENT_CPP_RVD_CLIENT_H_
#define RVD_CLIENT_CPP_RVD_CLIENT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/cpp/channel.h"
#include "client/cpp/model_loader.h"
#include "rvd/v1/rvd.grpc.pb.h"

namespace rvd {

// Called after each chunk with (bytes sent, bytes in all).
using ProgressFn = std::function<void(uint64_t, uint64_t)>;

// The specs of a loaded model's V tensors, in the model's order.
std::vector<rvd::v1::TensorSpec> TensorSpecs(const LoadedModel& model);

class RvdClient {
 public:
  // address: HOST:PORT, plaintext. Does not connect until the first call.
  explicit RvdClient(const std::string& address);
  // Over a channel from CreateRvdChannel (client/cpp/channel.h): TLS,
  // mutual TLS, a bearer token.
  explicit RvdClient(const std::shared_ptr<grpc::Channel>& channel);

  // Sends header + the model's tensor bytes over MeasureStream. The
  // header's `tensors` must be TensorSpecs(model). Errors carry the
  // daemon's status code and message.
  absl::StatusOr<rvd::v1::Measurement> Measure(
      const rvd::v1::MeasureHeader& header, const LoadedModel& model,
      const ProgressFn& progress);

  // Asks rvd to read the checkpoint at request.path itself (MeasurePath:
  // nothing is sent but the request). rvd refuses a path it cannot see or
  // may not read (FAILED_PRECONDITION, PERMISSION_DENIED, NOT_FOUND): the
  // caller then streams with Measure.
  absl::StatusOr<rvd::v1::Measurement> MeasurePath(
      const rvd::v1::MeasurePathRequest& request);

  absl::StatusOr<rvd::v1::Measurement> GetLatest(const std::string& model_id);
  absl::StatusOr<std::vector<rvd::v1::Measurement>> GetHistory(
      const std::string& model_id, uint32_t limit);
  absl::StatusOr<std::vector<rvd::v1::ModelSummary>> ListModels();
  // One GetHistory call as given (ranges, paging: see rvd.proto).
  absl::StatusOr<rvd::v1::GetHistoryResponse> GetHistoryPage(
      const rvd::v1::GetHistoryRequest& request);
  // DeleteModelHistory: how many measurements rvd removed.
  absl::StatusOr<uint64_t> DeleteModelHistory(const std::string& model_id);
  // Calls on_event for each event of a watch stream (a measurement, or a
  // gap marker where rvd skipped some) until it returns false or the stream
  // ends. after_sequence: the resume cursor (WatchRequest.after_sequence);
  // nullopt: only measurements stored from now on.
  absl::Status Watch(
      const std::string& model_id, std::optional<uint64_t> after_sequence,
      const std::function<bool(const rvd::v1::WatchEvent&)>& on_event);
  // The same for a WatchAlerts stream: alert events (pending, firing,
  // resolved, ...) and gaps, resumable after an alert event's sequence.
  absl::Status WatchAlerts(
      const std::string& model_id, std::optional<uint64_t> after_sequence,
      const std::function<bool(const rvd::v1::AlertWatchEvent&)>& on_event);
  // Ends every Watch and WatchAlerts call of this client in progress, and
  // any started later (they return OK); callable from any thread, e.g. one
  // watch's thread when the other's stream ended.
  void CancelWatches();

 private:
  std::unique_ptr<rvd::v1::Rvd::Stub> stub_;
  // The watches in progress, for CancelWatches; registered while they run.
  bool AddWatch(grpc::ClientContext* context);  // false: cancelled already
  void RemoveWatch(grpc::ClientContext* context);
  std::mutex watches_mu_;
  std::set<grpc::ClientContext*> watches_;  // guarded by watches_mu_
  bool watches_cancelled_ = false;          // guarded by watches_mu_
};

}  // namespace rvd

#endif  // RVD_CLIENT_CPP_RVD_CLIENT_H_

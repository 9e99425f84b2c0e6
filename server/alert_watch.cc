#include "server/alert_watch.h"

#include <memory>
#include <optional>
#include <utility>
#include <variant>

#include "server/measure.h"
#include "server/watch_reactor.h"

namespace rvd {
namespace {

// Events logged before the engine closed its watches are delivered first.
using AlertWatchReactor = WatchReactor<rvd::v1::AlertWatchEvent, AlertWatch>;

absl::StatusOr<bool> FillAlertEvent(AlertWatch& watch,
                                    rvd::v1::AlertWatchEvent* out) {
  std::optional<AlertStreamEvent> next = watch.Next();
  if (!next.has_value()) return false;
  out->Clear();
  if (const auto* a = std::get_if<AlertEventPtr>(&*next)) {
    *out->mutable_alert() = **a;
  } else {
    GapToProto(std::get<GapMarker>(*next), out->mutable_gap());
  }
  return true;
}

}  // namespace

grpc::ServerWriteReactor<rvd::v1::AlertWatchEvent>* StartAlertWatch(
    AlertEngine* engine, const rvd::v1::WatchAlertsRequest& request,
    std::function<grpc::Status(const absl::Status&)> finish) {
  auto* reactor = new AlertWatchReactor(
      FillAlertEvent, AlertWatchReactor::OnClose::kDrainFirst, "alert watch",
      std::move(finish));
  if (engine == nullptr) {
    reactor->Start(absl::UnavailableError("alerts are not served"));
    return reactor;
  }
  if (!request.model_id().empty()) {
    if (absl::Status s = ValidateModelId(request.model_id()); !s.ok()) {
      reactor->Start(s);
      return reactor;
    }
  }
  std::optional<uint64_t> after;
  if (request.has_after_sequence()) after = request.after_sequence();
  reactor->Start(engine->Subscribe(request.model_id(), after,
                                   [reactor] { reactor->Notify(); }));
  return reactor;
}

}  // namespace rvd

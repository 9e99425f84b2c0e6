// The WatchAlerts stream: one gRPC callback reactor per stream over an
// AlertWatch (alerts.h), as WatchMeasurements' reactor is over a Watch.
#ifndef RVD_SERVER_ALERT_WATCH_H_
#define RVD_SERVER_ALERT_WATCH_H_

#include <functional>

#include "absl/status/status.h"
#include "grpcpp/grpcpp.h"
#include "rvd/v1/rvd.grpc.pb.h"
#include "server/alerts.h"

namespace rvd {

// A started WatchAlerts stream over `engine` (null: the stream ends at once
// with UNAVAILABLE). `finish` counts a failed stream in /metrics and
// converts its status. gRPC owns the reactor; it deletes itself in OnDone.
grpc::ServerWriteReactor<rvd::v1::AlertWatchEvent>* StartAlertWatch(
    AlertEngine* engine, const rvd::v1::WatchAlertsRequest& request,
    std::function<grpc::Status(const absl::Status&)> finish);

}  // namespace rvd

#endif  // RVD_SERVER_ALERT_WATCH_H_

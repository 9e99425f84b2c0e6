// A gRPC server interceptor that observes every rvd.v1.Rvd call end to end
// for /metrics: rvd_request_duration_seconds{method,code}, from the call's
// arrival to the status it sends (whatever the handler, sync or callback),
// and rvd_inflight_requests for Measure, MeasureStream and MeasurePath, +1 at arrival and
// -1 at the status (or when a call ends without sending one). Calls of other
// services (health, reflection) are not observed. Thread-safe.
#ifndef RVD_SERVER_REQUEST_METRICS_H_
#define RVD_SERVER_REQUEST_METRICS_H_

#include <memory>

#include <grpcpp/support/server_interceptor.h>

#include "server/metrics.h"

namespace rvd {

// Register with ServerBuilder::experimental().SetInterceptorCreators.
// `metrics` must outlive the server.
std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
NewRequestMetricsFactory(Metrics* metrics);

}  // namespace rvd

#endif  // RVD_SERVER_REQUEST_METRICS_H_

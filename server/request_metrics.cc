#include "server/request_metrics.h"

#include <chrono>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/string_view.h"
#include "rvd/v1/rvd.pb.h"

namespace rvd {
namespace {

using grpc::experimental::InterceptionHookPoints;

constexpr absl::string_view kPrefix = "/rvd.v1.Rvd/";

// Whether rvd.v1.Rvd has this method: the method label takes no name a
// client makes up (an unknown method reaches interceptors too).
bool IsRvdMethod(absl::string_view name) {
  const google::protobuf::ServiceDescriptor* service =
      rvd::v1::WatchRequest::descriptor()->file()->FindServiceByName("Rvd");
  return service != nullptr &&
         service->FindMethodByName(std::string(name)) != nullptr;
}

class RequestInterceptor final : public grpc::experimental::Interceptor {
 public:
  RequestInterceptor(Metrics* metrics, std::string method)
      : metrics_(metrics),
        method_(std::move(method)),
        measures_(method_ == "Measure" || method_ == "MeasureStream" ||
                  method_ == "MeasurePath") {
    if (measures_) metrics_->AddInflight(1);
  }
  // A call cancelled before its handler answered sends no status.
  ~RequestInterceptor() override {
    if (!done_) Done(grpc::StatusCode::CANCELLED);
  }

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            InterceptionHookPoints::PRE_SEND_STATUS) &&
        !done_) {
      Done(methods->GetSendStatus().error_code());
    }
    methods->Proceed();
  }

 private:
  void Done(grpc::StatusCode code) {
    done_ = true;
    if (measures_) metrics_->AddInflight(-1);
    const std::chrono::duration<double> seconds =
        std::chrono::steady_clock::now() - start_;
    // absl and gRPC share the canonical code numbering.
    metrics_->ObserveRequest(
        method_, absl::StatusCodeToString(static_cast<absl::StatusCode>(code)),
        seconds.count());
  }

  Metrics* const metrics_;
  const std::string method_;  // e.g. "Measure"
  const bool measures_;       // counted in rvd_inflight_requests
  const std::chrono::steady_clock::time_point start_ =
      std::chrono::steady_clock::now();
  // Set once; a call's batches are intercepted one at a time.
  bool done_ = false;
};

class RequestMetricsFactory final
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit RequestMetricsFactory(Metrics* metrics) : metrics_(metrics) {}

  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    const absl::string_view method = info->method();
    if (!absl::StartsWith(method, kPrefix)) return nullptr;
    const absl::string_view name = method.substr(kPrefix.size());
    if (!IsRvdMethod(name)) return nullptr;
    return new RequestInterceptor(metrics_, std::string(name));
  }

 private:
  Metrics* const metrics_;
};

}  // namespace

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
NewRequestMetricsFactory(Metrics* metrics) {
  return std::make_unique<RequestMetricsFactory>(metrics);
}

}  // namespace rvd

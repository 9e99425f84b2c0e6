// The HTTP side of /metrics: prometheus-cpp's Exposer (civetweb) with every
// request that is not GET /metrics answered here, before civetweb's own
// error path sees it. Debian's civetweb overflows its small worker stack
// building an error page, so a request civetweb would answer with an error
// (a browser at /, a probe of /favicon.ico, POST /metrics) killed rvd with
// SIGSEGV; this answers each with a small page of its own:
//   GET or HEAD /         200, a landing page linking to /metrics
//   GET /metrics          200, the exposition (prometheus-cpp)
//   HEAD /metrics         200, headers only
//   other methods there   405 with Allow: GET, HEAD
//   any other path        404
//   malformed requests    civetweb's status (400, 413, ...) with a one-line
//                         body of ours
// Workers: kHttpThreads, and a connection that sends nothing is dropped
// after kHttpRequestTimeoutMs, so half-open connections cannot take every
// worker from a scrape.
#ifndef RVD_SERVER_METRICS_HTTP_H_
#define RVD_SERVER_METRICS_HTTP_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "prometheus/collectable.h"
#include "prometheus/exposer.h"

namespace rvd {

inline constexpr int kHttpThreads = 8;
inline constexpr int kHttpRequestTimeoutMs = 5000;

// Serves `collectable` at http://`address`/metrics (address: HOST:PORT, see
// ParseHostPort). INVALID_ARGUMENT for a bad address, UNAVAILABLE when the
// port cannot be bound.
absl::StatusOr<std::unique_ptr<prometheus::Exposer>> StartMetricsHttp(
    const std::string& address,
    std::shared_ptr<prometheus::Collectable> collectable);

// Stops what StartMetricsHttp(address, ...) started; a scrape in progress
// finishes first. Debian 12's civetweb (1.15) notices the stop only when
// its accept loop's poll returns, which without a connection is every 2 s,
// so a plain destruction took up to 2 s of rvd's shutdown; this connects to
// the listener until the exposer is gone, and it goes within milliseconds.
void StopMetricsHttp(const std::string& address,
                     std::unique_ptr<prometheus::Exposer> exposer);

}  // namespace rvd

#endif  // RVD_SERVER_METRICS_HTTP_H_

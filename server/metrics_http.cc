#include "server/metrics_http.h"

#include <CivetServer.h>
#include <civetweb.h>

#include <cstring>
#include <exception>
#include <string>
#include "absl/strings/string_view.h"

#include "absl/strings/str_cat.h"
#include "server/config.h"

namespace rvd {
namespace {

constexpr char kLandingPage[] =
    "<!DOCTYPE html>\n<html><head><title>rvd</title></head><body>\n"
    "<h1>rvd</h1>\n<p>Participation ratio of transformer V weights.</p>\n"
    "<p><a href=\"/metrics\">Metrics</a></p>\n</body></html>\n";
// The exposition format prometheus-cpp's handler answers with.
constexpr char kMetricsType[] = "text/plain; version=0.0.4";

const char* Reason(int status) {
  switch (status) {
    case 200:
      return "OK";
    case 400:
      return "Bad Request";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 413:
      return "Payload Too Large";
    default:
      return status < 500 ? "Client Error" : "Server Error";
  }
}

// Writes a whole response and closes the connection (no keep-alive: a
// client that wants more reconnects). Returns the status, as civetweb's
// begin_request expects of a request it need not handle further.
int Reply(mg_connection* conn, int status, absl::string_view type,
          absl::string_view body, bool head, absl::string_view extra = "") {
  std::string out = absl::StrCat(
      "HTTP/1.1 ", status, " ", Reason(status), "\r\nContent-Type: ", type,
      "\r\nContent-Length: ", body.size(), "\r\n", extra,
      "Connection: close\r\n\r\n");
  if (!head) out.append(body.data(), body.size());
  mg_write(conn, out.data(), out.size());
  return status;
}

// civetweb's begin_request: 0 lets civetweb pass the request on (to
// prometheus-cpp's /metrics handler); a status means it was answered here.
int Route(mg_connection* conn) {
  const mg_request_info* info = mg_get_request_info(conn);
  const absl::string_view method =
      info->request_method != nullptr ? info->request_method : "";
  const absl::string_view path = info->local_uri != nullptr ? info->local_uri : "";
  const bool get = method == "GET";
  const bool head = method == "HEAD";
  constexpr absl::string_view kAllow = "Allow: GET, HEAD\r\n";
  if (path == "/metrics") {
    if (get) return 0;
    if (head) return Reply(conn, 200, kMetricsType, "", true);
    return Reply(conn, 405, "text/plain",
                 "405 method not allowed: /metrics answers GET and HEAD\n",
                 false, kAllow);
  }
  if (path == "/") {
    if (get || head) return Reply(conn, 200, "text/html", kLandingPage, head);
    return Reply(conn, 405, "text/plain",
                 "405 method not allowed: / answers GET and HEAD\n", false,
                 kAllow);
  }
  return Reply(conn, 404, "text/plain", "404 not found: see /metrics\n", head);
}

// civetweb's http_error: a request civetweb itself rejects (malformed,
// too large, a handler that declined). Answered here; 0 tells civetweb not
// to build its own error page.
int Error(mg_connection* conn, int status, const char* /*message*/) {
  Reply(conn, status, "text/plain", absl::StrCat(status, " ", Reason(status), "\n"),
        false);
  return 0;
}

}  // namespace

absl::StatusOr<std::unique_ptr<prometheus::Exposer>> StartMetricsHttp(
    const std::string& address,
    std::shared_ptr<prometheus::Collectable> collectable) {
  if (collectable == nullptr) {
    return absl::InvalidArgumentError("StartMetricsHttp: nothing to serve");
  }
  // HOST:PORT only: civetweb would read a bare "9464" as every interface.
  if (absl::StatusOr<HostPort> hp = ParseHostPort("metrics address", address);
      !hp.ok()) {
    return hp.status();
  }
  // civetweb copies the callbacks when it starts.
  CivetCallbacks callbacks;
  callbacks.begin_request = Route;
  callbacks.http_error = Error;
  try {
    auto exposer = std::make_unique<prometheus::Exposer>(
        std::vector<std::string>{
            "listening_ports", address,                                   //
            "num_threads", std::to_string(kHttpThreads),                  //
            "request_timeout_ms", std::to_string(kHttpRequestTimeoutMs),  //
            "enable_keep_alive", "no"},
        &callbacks);
    exposer->RegisterCollectable(collectable);
    return exposer;
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve /metrics on ", address, ": ", e.what()));
  } catch (...) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve /metrics on ", address));
  }
}

}  // namespace rvd

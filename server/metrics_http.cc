#include "server/metrics_http.h"

#include <CivetServer.h>
#include <civetweb.h>

#include <netdb.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cstring>
#include <exception>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
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

// The host a local client reaches a listener bound to `host` at: a
// wildcard binding through loopback, any other as written (unbracketed).
std::string LocalHost(const std::string& host) {
  if (host.empty() || host == "0.0.0.0") return "127.0.0.1";
  if (host == "[::]") return "::1";
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    return host.substr(1, host.size() - 2);
  }
  return host;
}

// Opens and closes one TCP connection to host:port, giving up after 100 ms;
// whether it connects does not matter to the caller.
void Knock(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0) {
    return;
  }
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    timeval timeout{0, 100 * 1000};  // bounds connect() on Linux
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
    const bool connected = connect(fd, a->ai_addr, a->ai_addrlen) == 0;
    close(fd);
    if (connected) break;
  }
  freeaddrinfo(found);
}

}  // namespace

void StopMetricsHttp(const std::string& address,
                     std::unique_ptr<prometheus::Exposer> exposer) {
  if (exposer == nullptr) return;
  absl::StatusOr<HostPort> hp = ParseHostPort("metrics address", address);
  const std::string host = hp.ok() ? LocalHost(hp->host) : "127.0.0.1";
  const std::vector<int> ports = exposer->GetListeningPorts();
  absl::Notification stopped;
  std::thread stopper([&] {
    exposer.reset();
    stopped.Notify();
  });
  // A knock before civetweb sees its stop flag is served as an empty
  // request (the connection is already closed); one after it wakes the
  // accept loop, which then exits.
  while (!stopped.WaitForNotificationWithTimeout(absl::Milliseconds(10))) {
    for (int port : ports) Knock(host, port);
  }
  stopper.join();
}

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

// One HTTP POST and its answer, for the LLM providers (self_improve/providers/,
// private to the folder). The providers build requests and read answers; the
// transport only moves bytes, so the tests can put a scripted server behind
// the real libcurl transport and a provider never sees a socket.
//
// Thread-safety: a transport may be used by several threads at once (each
// Post is independent: its own curl handle, no shared connection).
#ifndef RVD_SELF_IMPROVE_PROVIDERS_HTTP_TRANSPORT_H_
#define RVD_SELF_IMPROVE_PROVIDERS_HTTP_TRANSPORT_H_

#include <atomic>
#include <cstddef>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace rvd::tune {

struct HttpRequest {
  std::string url;  // http:// or https:// only; redirects are not followed
  // Header lines as (name, value). May carry a key: a transport never puts
  // a header value in a log line or a status message.
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;  // sent as is (the caller sets Content-Type)
  absl::Duration connect_timeout = absl::Seconds(10);
  absl::Duration total_timeout = absl::Seconds(300);  // connect to last byte
  size_t max_response_bytes = 8 << 20;                // a longer body is RESOURCE_EXHAUSTED
  // When it turns true the transfer stops within about a second
  // (curl looks at least once a second): CANCELLED.
  const std::atomic<bool>* cancelled = nullptr;
};

struct HttpResponse {
  long status = 0;  // the HTTP status code
  std::string body;
  std::string retry_after;  // the Retry-After header's value, "" when absent
};

class HttpTransport {
 public:
  virtual ~HttpTransport() = default;
  // The server's answer, whatever its status code. Errors are the
  // transport's only: DEADLINE_EXCEEDED (connect or total timeout),
  // UNAVAILABLE (no connection, reset, nothing received), CANCELLED,
  // RESOURCE_EXHAUSTED (body over max_response_bytes), INVALID_ARGUMENT (a
  // URL that is not http(s)), INTERNAL (anything else curl reports).
  virtual absl::StatusOr<HttpResponse> Post(const HttpRequest& request) = 0;
};

// `url` as logs and statuses show it: no user:password@, no query or
// fragment (either may hold a secret).
std::string LoggableUrl(absl::string_view url);

// The libcurl transport (curl_global_init once per process, on first use).
std::unique_ptr<HttpTransport> NewCurlTransport();

}  // namespace rvd::tune

#endif  // RVD_SELF_IMPROVE_PROVIDERS_HTTP_TRANSPORT_H_

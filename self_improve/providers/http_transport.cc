#include "self_improve/providers/http_transport.h"

#include <curl/curl.h>

#include <mutex>
#include <string_view>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace rvd::tune {
namespace {

// What the callbacks of one transfer share with Post.
struct Transfer {
  HttpResponse response;
  size_t max_bytes = 0;
  bool too_large = false;
  bool cancelled = false;
  const std::atomic<bool>* cancel_flag = nullptr;
};

size_t OnBody(char* data, size_t size, size_t count, void* user) {
  auto* t = static_cast<Transfer*>(user);
  const size_t n = size * count;
  if (t->response.body.size() + n > t->max_bytes) {
    t->too_large = true;
    return 0;  // curl stops with CURLE_WRITE_ERROR
  }
  t->response.body.append(data, n);
  return n;
}

size_t OnHeader(char* data, size_t size, size_t count, void* user) {
  auto* t = static_cast<Transfer*>(user);
  const size_t n = size * count;
  absl::string_view line(data, n);
  // A new status line starts a new header block (after a 100 Continue).
  if (absl::StartsWith(line, "HTTP/")) t->response.retry_after.clear();
  constexpr absl::string_view kRetryAfter = "retry-after:";
  if (line.size() > kRetryAfter.size() &&
      absl::EqualsIgnoreCase(line.substr(0, kRetryAfter.size()), kRetryAfter)) {
    t->response.retry_after =
        std::string(absl::StripAsciiWhitespace(line.substr(kRetryAfter.size())));
  }
  return n;
}

int OnProgress(void* user, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
  auto* t = static_cast<Transfer*>(user);
  if (t->cancel_flag != nullptr && t->cancel_flag->load(std::memory_order_relaxed)) {
    t->cancelled = true;
    return 1;  // curl stops with CURLE_ABORTED_BY_CALLBACK
  }
  return 0;
}

class CurlTransport : public HttpTransport {
 public:
  CurlTransport() {
    static std::once_flag once;
    std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
  }

  absl::StatusOr<HttpResponse> Post(const HttpRequest& request) override {
    const absl::string_view url = request.url;
    if (!absl::StartsWith(url, "http://") && !absl::StartsWith(url, "https://")) {
      return absl::InvalidArgumentError(
          absl::StrCat("http: not an http(s) URL: ", LoggableUrl(url)));
    }
    CURL* curl = curl_easy_init();
    if (curl == nullptr) return absl::InternalError("http: curl_easy_init failed");
    curl_slist* headers = nullptr;
    // curl adds "Expect: 100-continue" to larger bodies; an empty value
    // turns it off (one round trip, and servers that ignore it do not stall).
    headers = curl_slist_append(headers, "Expect:");
    for (const auto& [name, value] : request.headers) {
      headers = curl_slist_append(headers, absl::StrCat(name, ": ", value).c_str());
    }
    Transfer t;
    t.max_bytes = request.max_response_bytes;
    t.cancel_flag = request.cancelled;
    char error[CURL_ERROR_SIZE] = {0};
    const std::string url_copy(url);
    curl_easy_setopt(curl, CURLOPT_URL, url_copy.c_str());
    curl_easy_setopt(curl, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(curl, CURLOPT_FOLLOWLOCATION, 0L);  // a key never follows a redirect
    curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);        // threads: no SIGALRM
    curl_easy_setopt(curl, CURLOPT_POST, 1L);
    curl_easy_setopt(curl, CURLOPT_POSTFIELDS, request.body.data());
    curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE,
                     static_cast<curl_off_t>(request.body.size()));
    curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS,
                     static_cast<long>(absl::ToInt64Milliseconds(request.connect_timeout)));
    curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS,
                     static_cast<long>(absl::ToInt64Milliseconds(request.total_timeout)));
    curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, OnBody);
    curl_easy_setopt(curl, CURLOPT_WRITEDATA, &t);
    curl_easy_setopt(curl, CURLOPT_HEADERFUNCTION, OnHeader);
    curl_easy_setopt(curl, CURLOPT_HEADERDATA, &t);
    curl_easy_setopt(curl, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(curl, CURLOPT_XFERINFOFUNCTION, OnProgress);
    curl_easy_setopt(curl, CURLOPT_XFERINFODATA, &t);
    curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, error);
    const CURLcode rc = curl_easy_perform(curl);
    long status = 0;
    curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
    curl_easy_cleanup(curl);
    curl_slist_free_all(headers);

    if (rc == CURLE_OK) {
      t.response.status = status;
      return std::move(t.response);
    }
    // curl's own words; the error buffer names the host, never a header.
    const std::string what =
        absl::StrCat(LoggableUrl(url), ": ", error[0] != 0 ? error : curl_easy_strerror(rc));
    switch (rc) {
      case CURLE_OPERATION_TIMEDOUT:
        return absl::DeadlineExceededError(absl::StrCat("http: timed out: ", what));
      case CURLE_ABORTED_BY_CALLBACK:
        if (t.cancelled) return absl::CancelledError("http: cancelled");
        break;
      case CURLE_WRITE_ERROR:
        if (t.too_large) {
          return absl::ResourceExhaustedError(absl::StrCat(
              "http: ", LoggableUrl(url), ": reply longer than ", t.max_bytes, " bytes"));
        }
        break;
      case CURLE_COULDNT_RESOLVE_HOST:
      case CURLE_COULDNT_RESOLVE_PROXY:
      case CURLE_COULDNT_CONNECT:
      case CURLE_SEND_ERROR:
      case CURLE_RECV_ERROR:
      case CURLE_GOT_NOTHING:
      case CURLE_PARTIAL_FILE:
      case CURLE_SSL_CONNECT_ERROR:
        return absl::UnavailableError(absl::StrCat("http: ", what));
      case CURLE_UNSUPPORTED_PROTOCOL:
      case CURLE_URL_MALFORMAT:
        return absl::InvalidArgumentError(absl::StrCat("http: ", what));
      default:
        break;
    }
    return absl::InternalError(absl::StrCat("http: ", what));
  }
};

}  // namespace

std::string LoggableUrl(absl::string_view url) {
  url = url.substr(0, url.find_first_of("?#"));
  const size_t scheme = url.find("://");
  const size_t at = url.find('@');
  const size_t path = url.find('/', scheme == absl::string_view::npos ? 0 : scheme + 3);
  if (scheme == absl::string_view::npos || at == absl::string_view::npos ||
      (path != absl::string_view::npos && at > path)) {
    return std::string(url);
  }
  return absl::StrCat(url.substr(0, scheme + 3), url.substr(at + 1));
}

std::unique_ptr<HttpTransport> NewCurlTransport() { return std::make_unique<CurlTransport>(); }

}  // namespace rvd::tune

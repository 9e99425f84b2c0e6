#include "self_improve/providers/llm_provider.h"

#include <algorithm>
#include <cstdlib>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/cord.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "nlohmann/json.hpp"
#include "self_improve/providers/protocols.h"
#include "spdlog/spdlog.h"

namespace rvd::tune {
namespace {

constexpr char kKindPayload[] = "type.rvd.dev/rvd.tune.LlmErrorKind";
constexpr size_t kMaxErrorTextChars = 400;

// Server text for a status or a log line: control characters escaped and
// cut, so that a reply cannot forge a log line or flood it.
std::string Excerpt(absl::string_view text) {
  std::string out;
  for (char c : text.substr(0, kMaxErrorTextChars)) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) {
      absl::StrAppend(&out, c == '\n' ? "\\n" : absl::StrCat("\\x", absl::Hex(u, absl::kZeroPad2)));
    } else {
      out.push_back(c);
    }
  }
  if (text.size() > kMaxErrorTextChars) out += "...";
  return out;
}

// The host of an http(s) URL ("" when there is none).
absl::string_view UrlHost(absl::string_view url) {
  if (!absl::ConsumePrefix(&url, "https://")) absl::ConsumePrefix(&url, "http://");
  url = url.substr(0, url.find_first_of("/?#"));
  if (const size_t at = url.rfind('@'); at != absl::string_view::npos) url.remove_prefix(at + 1);
  if (absl::StartsWith(url, "[")) return url.substr(0, url.find(']') + 1);
  return url.substr(0, url.find(':'));
}

bool IsLoopback(absl::string_view host) {
  return host == "localhost" || host == "[::1]" || absl::StartsWith(host, "127.");
}

// The status for an HTTP error answer.
absl::Status HttpStatusError(long status, std::string message) {
  absl::StatusCode code = absl::StatusCode::kUnknown;
  if (status == 400 || status == 413 || status == 422) {
    code = absl::StatusCode::kInvalidArgument;
  } else if (status == 401) {
    code = absl::StatusCode::kUnauthenticated;
  } else if (status == 403) {
    code = absl::StatusCode::kPermissionDenied;
  } else if (status == 404) {
    code = absl::StatusCode::kNotFound;
  } else if (status == 408 || status == 504) {
    code = absl::StatusCode::kDeadlineExceeded;
  } else if (status == 429) {
    code = absl::StatusCode::kResourceExhausted;
  } else if (status >= 500) {
    code = absl::StatusCode::kUnavailable;
  } else if (status >= 400) {
    code = absl::StatusCode::kFailedPrecondition;
  }
  return WithLlmErrorKind(absl::Status(code, std::move(message)), LlmErrorKind::kHttpStatus);
}

bool Retryable(const absl::Status& s, long http_status) {
  if (LlmErrorKindOf(s) == LlmErrorKind::kHttpStatus) {
    return http_status == 408 || http_status == 429 || http_status >= 500;
  }
  return LlmErrorKindOf(s) == LlmErrorKind::kTransport &&
         s.code() == absl::StatusCode::kUnavailable;
}

class HttpLlmProvider : public LlmProvider {
 public:
  HttpLlmProvider(LlmConfig config, std::unique_ptr<internal::Protocol> protocol, std::string url,
                  std::string key, std::unique_ptr<HttpTransport> transport)
      : config_(std::move(config)),
        protocol_(std::move(protocol)),
        url_(std::move(url)),
        key_(std::move(key)),
        transport_(std::move(transport)) {}

  std::string Name() const override {
    return absl::StrCat(LlmProtocolName(config_.protocol), ":", config_.model);
  }

  absl::StatusOr<ChatReply> Chat(const ChatRequest& request) override {
    HttpRequest http;
    http.url = url_;
    http.headers = protocol_->Headers(config_, key_);
    http.body = protocol_->Body(config_, request).dump();
    http.connect_timeout = config_.connect_timeout;
    http.total_timeout = config_.request_timeout;
    http.max_response_bytes = config_.max_reply_bytes;
    http.cancelled = request.cancelled;

    absl::Duration backoff = config_.initial_backoff;
    absl::Status last;
    int made = 0;  // attempts made
    for (int attempt = 1; attempt <= config_.max_attempts; ++attempt) {
      if (Cancelled(request)) return absl::CancelledError("llm: cancelled");
      const absl::Time start = absl::Now();
      made = attempt;
      long http_status = 0;
      std::string retry_after;
      absl::StatusOr<ChatReply> reply = Attempt(http, &http_status, &retry_after);
      if (reply.ok()) {
        reply->attempts = attempt;
        reply->latency = absl::Now() - start;
        spdlog::info("llm {}: reply in {:.1f} s ({} chars, {} tokens in, {} out{}){}", Name(),
                     absl::ToDoubleSeconds(reply->latency), reply->text.size(), reply->input_tokens,
                     reply->output_tokens, reply->truncated ? ", cut at max_tokens" : "",
                     attempt > 1 ? absl::StrCat(", attempt ", attempt) : "");
        return reply;
      }
      last = Redact(reply.status());
      if (last.code() == absl::StatusCode::kCancelled) return last;
      if (!Retryable(last, http_status) || attempt == config_.max_attempts) break;
      absl::Duration wait = std::min(backoff, config_.max_backoff);
      if (int64_t seconds = 0; absl::SimpleAtoi(retry_after, &seconds) && seconds >= 0) {
        wait = std::min(absl::Seconds(seconds), config_.max_backoff);
      }
      spdlog::warn("llm {}: attempt {} of {} failed: {}; next in {:.1f} s", Name(), attempt,
                   config_.max_attempts, std::string(last.message()), absl::ToDoubleSeconds(wait));
      if (!SleepUnlessCancelled(wait, request)) return absl::CancelledError("llm: cancelled");
      backoff *= 2;
    }
    if (made > 1) {
      last = WithLlmErrorKind(
          absl::Status(last.code(), absl::StrCat(last.message(), " (", made, " attempts)")),
          LlmErrorKindOf(last));
    }
    spdlog::warn("llm {}: {}", Name(), std::string(last.message()));
    return last;
  }

 private:
  static bool Cancelled(const ChatRequest& r) {
    return r.cancelled != nullptr && r.cancelled->load(std::memory_order_relaxed);
  }

  static bool SleepUnlessCancelled(absl::Duration d, const ChatRequest& r) {
    const absl::Time end = absl::Now() + d;
    while (absl::Now() < end) {
      if (Cancelled(r)) return false;
      absl::SleepFor(std::min(absl::Milliseconds(50), end - absl::Now()));
    }
    return !Cancelled(r);
  }

  // One request; *http_status is the answer's code (0 without one).
  absl::StatusOr<ChatReply> Attempt(const HttpRequest& http, long* http_status,
                                    std::string* retry_after) {
    absl::StatusOr<HttpResponse> response = transport_->Post(http);
    if (!response.ok()) {
      return WithLlmErrorKind(
          absl::Status(response.status().code(),
                       absl::StrCat("llm ", Name(), ": ", response.status().message())),
          LlmErrorKind::kTransport);
    }
    *http_status = response->status;
    *retry_after = response->retry_after;
    const nlohmann::json body = nlohmann::json::parse(response->body, nullptr, false);
    if (response->status < 200 || response->status >= 300) {
      std::string text = body.is_discarded() ? "" : protocol_->ErrorText(body);
      if (text.empty()) text = response->body;
      return HttpStatusError(response->status,
                             absl::StrCat("llm ", Name(), ": HTTP ", response->status, " from ",
                                          LoggableUrl(url_), ": ", Excerpt(text)));
    }
    if (body.is_discarded()) {
      return WithLlmErrorKind(
          absl::DataLossError(
              absl::StrCat("llm ", Name(), ": reply is not JSON: ", Excerpt(response->body))),
          LlmErrorKind::kMalformed);
    }
    absl::StatusOr<ChatReply> reply = protocol_->ParseReply(body);
    if (!reply.ok()) {
      // A proxy may answer 200 with an error object: say what it said.
      const std::string error = protocol_->ErrorText(body);
      return WithLlmErrorKind(
          absl::Status(
              reply.status().code(),
              absl::StrCat(
                  "llm ", Name(), ": ", Excerpt(reply.status().message()),
                  error.empty() ? "" : absl::StrCat(" (the server says: ", Excerpt(error), ")"))),
          LlmErrorKindOf(reply.status()));
    }
    if (absl::StripAsciiWhitespace(reply->text).empty()) {
      return WithLlmErrorKind(
          absl::DataLossError(absl::StrCat("llm ", Name(), ": the reply has no text",
                                           reply->truncated ? " (cut at max_tokens)" : "")),
          LlmErrorKind::kEmpty);
    }
    return reply;
  }

  // `s` with every occurrence of the key replaced (a server may quote it).
  absl::Status Redact(const absl::Status& s) const {
    if (key_.empty() || !absl::StrContains(s.message(), key_)) return s;
    return WithLlmErrorKind(
        absl::Status(s.code(), absl::StrReplaceAll(s.message(), {{key_, "[redacted]"}})),
        LlmErrorKindOf(s));
  }

  const LlmConfig config_;
  const std::unique_ptr<internal::Protocol> protocol_;
  const std::string url_;
  const std::string key_;  // never logged, never in a status
  const std::unique_ptr<HttpTransport> transport_;
};

absl::Status ConfigError(std::string message) {
  return WithLlmErrorKind(absl::InvalidArgumentError(std::move(message)), LlmErrorKind::kConfig);
}

}  // namespace

const char* LlmProtocolName(LlmProtocol p) {
  switch (p) {
    case LlmProtocol::kOpenAi:
      return "openai";
    case LlmProtocol::kAnthropic:
      return "anthropic";
    case LlmProtocol::kOllama:
      return "ollama";
  }
  return "unknown";
}

absl::StatusOr<LlmProtocol> ParseLlmProtocol(absl::string_view name) {
  for (LlmProtocol p : {LlmProtocol::kOpenAi, LlmProtocol::kAnthropic, LlmProtocol::kOllama}) {
    if (name == LlmProtocolName(p)) return p;
  }
  return ConfigError(
      absl::StrCat("llm: unknown protocol \"", Excerpt(name), "\" (openai, anthropic or ollama)"));
}

const char* LlmErrorKindName(LlmErrorKind kind) {
  switch (kind) {
    case LlmErrorKind::kNone:
      return "none";
    case LlmErrorKind::kConfig:
      return "config";
    case LlmErrorKind::kHttpStatus:
      return "http_status";
    case LlmErrorKind::kTransport:
      return "transport";
    case LlmErrorKind::kMalformed:
      return "malformed";
    case LlmErrorKind::kRefusal:
      return "refusal";
    case LlmErrorKind::kEmpty:
      return "empty";
    case LlmErrorKind::kNoCode:
      return "no_code";
    case LlmErrorKind::kWrongKernel:
      return "wrong_kernel";
    case LlmErrorKind::kTruncated:
      return "truncated";
  }
  return "none";
}

LlmErrorKind LlmErrorKindOf(const absl::Status& status) {
  const auto payload = status.GetPayload(kKindPayload);
  if (!payload) return LlmErrorKind::kNone;
  int value = 0;
  if (!absl::SimpleAtoi(std::string(*payload), &value) || value < 0 ||
      value > static_cast<int>(LlmErrorKind::kTruncated)) {
    return LlmErrorKind::kNone;
  }
  return static_cast<LlmErrorKind>(value);
}

absl::Status WithLlmErrorKind(absl::Status status, LlmErrorKind kind) {
  if (!status.ok())
    status.SetPayload(kKindPayload, absl::Cord(absl::StrCat(static_cast<int>(kind))));
  return status;
}

absl::StatusOr<std::unique_ptr<LlmProvider>> NewLlmProvider(
    const LlmConfig& config, std::unique_ptr<HttpTransport> transport) {
  std::unique_ptr<internal::Protocol> protocol = internal::NewProtocol(config.protocol);
  if (protocol == nullptr) return ConfigError("llm: unknown protocol");
  const char* name = LlmProtocolName(config.protocol);
  if (config.model.empty()) return ConfigError(absl::StrCat("llm ", name, ": no model named"));
  std::string base(config.base_url.empty() ? protocol->DefaultBaseUrl() : config.base_url);
  while (absl::EndsWith(base, "/")) base.pop_back();
  if ((!absl::StartsWith(base, "http://") && !absl::StartsWith(base, "https://")) ||
      UrlHost(base).empty()) {
    return ConfigError(
        absl::StrCat("llm ", name, ": base_url \"", Excerpt(base), "\" is not an http(s) URL"));
  }
  if (config.max_tokens < 1 || config.max_attempts < 1 ||
      config.connect_timeout <= absl::ZeroDuration() ||
      config.request_timeout <= absl::ZeroDuration() || config.max_reply_bytes == 0 ||
      config.initial_backoff < absl::ZeroDuration() || config.max_backoff < absl::ZeroDuration()) {
    return ConfigError(
        absl::StrCat("llm ", name,
                     ": max_tokens, max_attempts, timeouts and max_reply_bytes must be "
                     "positive, backoffs not negative"));
  }
  const std::string key_env = config.api_key_env.value_or(protocol->DefaultKeyEnv());
  std::string key;
  if (!key_env.empty()) {
    const char* value = std::getenv(key_env.c_str());
    if (value == nullptr || *value == '\0') {
      return WithLlmErrorKind(
          absl::FailedPreconditionError(absl::StrCat(
              "llm ", name, ": the environment variable ", key_env,
              " holding the key is not set (api_key_env: \"\" for a server without keys)")),
          LlmErrorKind::kConfig);
    }
    key = value;
    if (absl::StartsWith(base, "http://") && !IsLoopback(UrlHost(base))) {
      return ConfigError(absl::StrCat("llm ", name,
                                      ": refusing to send the key over plain "
                                      "http to ",
                                      UrlHost(base), " (use https)"));
    }
  }
  std::string url = absl::StrCat(base, protocol->Path());
  spdlog::info("llm: {} provider, model {}, POST {}, key {}", name, config.model, LoggableUrl(url),
               key_env.empty() ? std::string("none") : absl::StrCat("from $", key_env));
  if (transport == nullptr) transport = NewCurlTransport();
  return std::make_unique<HttpLlmProvider>(config, std::move(protocol), std::move(url),
                                           std::move(key), std::move(transport));
}

}  // namespace rvd::tune

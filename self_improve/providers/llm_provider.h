// Chat with a language model over HTTP (self_improve/providers/): one
// conversation in, the model's text out, every failure a status that says
// what went wrong. Three protocols:
//   openai     OpenAI-compatible chat completions, POST {base_url}/chat/completions
//              (OpenAI: https://api.openai.com/v1; vLLM: http://HOST:8000/v1;
//              Ollama's compatible endpoint: http://HOST:11434/v1)
//   anthropic  Anthropic Messages, POST {base_url}/v1/messages
//              (https://api.anthropic.com)
//   ollama     Ollama's native chat, POST {base_url}/api/chat
//              (http://HOST:11434), non-streaming
//
// Keys come from the environment only (OPENAI_API_KEY, ANTHROPIC_API_KEY or
// the variable api_key_env names), are read once when the provider is made,
// and appear in no log line and no status: a server's error text that
// quotes the key has it replaced by "[redacted]".
//
// Errors (the code, and LlmErrorKindOf's kind for the worker's log):
//   kHttpStatus   the server answered 4xx/5xx: 400/413 INVALID_ARGUMENT,
//                 401 UNAUTHENTICATED, 403 PERMISSION_DENIED, 404 NOT_FOUND
//                 (model or base_url), 408/504 DEADLINE_EXCEEDED, 429
//                 RESOURCE_EXHAUSTED, 5xx (and Anthropic's 529) UNAVAILABLE;
//                 the message carries the server's own error text
//   kTransport    no answer: DEADLINE_EXCEEDED (timeout), UNAVAILABLE,
//                 CANCELLED, RESOURCE_EXHAUSTED (reply over max_reply_bytes)
//   kMalformed    DATA_LOSS: not JSON, or JSON without the protocol's fields
//   kRefusal      FAILED_PRECONDITION: the model declined (OpenAI's refusal
//                 or content_filter, Anthropic's stop_reason "refusal")
//   kEmpty        DATA_LOSS: a well-formed reply with no text
// 429, 5xx and UNAVAILABLE are retried (max_attempts in all, exponential
// backoff from initial_backoff, a Retry-After of at most max_backoff
// honoured); the status of the last attempt is returned, saying how many
// were made.
//
// Thread-safety: Chat may be called from several threads at once.
#ifndef RVD_SELF_IMPROVE_PROVIDERS_LLM_PROVIDER_H_
#define RVD_SELF_IMPROVE_PROVIDERS_LLM_PROVIDER_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "self_improve/providers/http_transport.h"

namespace rvd::tune {

enum class LlmProtocol { kOpenAi, kAnthropic, kOllama };
// "openai", "anthropic", "ollama".
const char* LlmProtocolName(LlmProtocol p);
// INVALID_ARGUMENT naming the accepted names.
absl::StatusOr<LlmProtocol> ParseLlmProtocol(absl::string_view name);

struct LlmConfig {
  LlmProtocol protocol = LlmProtocol::kOpenAi;
  std::string model;     // required: the server's model name
  std::string base_url;  // "" = the protocol's public default (above)
  // The environment variable holding the key. Unset: OPENAI_API_KEY for
  // openai, ANTHROPIC_API_KEY for anthropic, none for ollama. "": send no
  // key (a local vLLM or Ollama). A named variable that is unset or empty
  // is FAILED_PRECONDITION when the provider is made.
  std::optional<std::string> api_key_env;
  absl::Duration connect_timeout = absl::Seconds(10);
  absl::Duration request_timeout = absl::Seconds(600);  // one attempt, to the last byte
  int max_tokens = 8192;                    // the reply's limit (Anthropic requires one)
  std::optional<double> temperature = 0.2;  // unset: the server's default
  int max_attempts = 3;                     // 1: no retry
  absl::Duration initial_backoff = absl::Seconds(2);
  absl::Duration max_backoff = absl::Seconds(60);
  size_t max_reply_bytes = 4 << 20;
  // OpenAI's newer models take max_completion_tokens in place of max_tokens.
  bool openai_max_completion_tokens = false;
  std::string anthropic_version = "2023-06-01";  // the anthropic-version header
};

struct ChatMessage {
  enum class Role { kUser, kAssistant };
  Role role = Role::kUser;
  std::string content;
};

struct ChatRequest {
  std::string system;                 // "" = none
  std::vector<ChatMessage> messages;  // user first, alternating
  const std::atomic<bool>* cancelled = nullptr;
};

struct ChatReply {
  std::string text;
  bool truncated = false;                       // stopped at max_tokens
  std::string model;                            // as the server names it ("" if it does not)
  int attempts = 0;                             // HTTP requests made
  int64_t input_tokens = 0, output_tokens = 0;  // 0 when not reported
  absl::Duration latency;                       // of the successful attempt
};

// The kinds of failure above, carried as a status payload so that a
// caller tells a refusal from a rejected key without reading messages.
enum class LlmErrorKind {
  kNone,    // ok, or a status that did not come from this folder
  kConfig,  // the configuration (model, URL, key variable)
  kHttpStatus,
  kTransport,
  kMalformed,
  kRefusal,
  kEmpty,
  kNoCode,       // kernel_extract.h: no fenced code block
  kWrongKernel,  // kernel_extract.h: the entry missing, changed or doubled,
                 // or host code in a device-code-only candidate
  kTruncated,    // kernel_extract.h: max_tokens cut the code block
};
// "config", "http_status", "transport", "malformed", "refusal", "empty",
// "no_code", "wrong_kernel", "truncated", "none".
const char* LlmErrorKindName(LlmErrorKind kind);
LlmErrorKind LlmErrorKindOf(const absl::Status& status);
absl::Status WithLlmErrorKind(absl::Status status, LlmErrorKind kind);

class LlmProvider {
 public:
  virtual ~LlmProvider() = default;
  // "openai:gpt-4o", "anthropic:claude-...", "ollama:codellama:70b".
  virtual std::string Name() const = 0;
  virtual absl::StatusOr<ChatReply> Chat(const ChatRequest& request) = 0;
};

// Checks `config` (a model, an http(s) base URL, a key where one is named,
// no key over plain http to a host other than loopback, positive limits),
// reads the key, and logs one line naming the protocol, endpoint, model and
// the key's variable (never its value). `transport` null: libcurl.
absl::StatusOr<std::unique_ptr<LlmProvider>> NewLlmProvider(
    const LlmConfig& config, std::unique_ptr<HttpTransport> transport = nullptr);

}  // namespace rvd::tune

#endif  // RVD_SELF_IMPROVE_PROVIDERS_LLM_PROVIDER_H_

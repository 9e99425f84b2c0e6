// The three chat protocols' wire formats (private to providers/): what each
// sends and how each answer is read. llm_provider.cc owns the transport,
// the retries, the key and the error statuses; a protocol only knows its
// JSON.
#ifndef RVD_SELF_IMPROVE_PROVIDERS_PROTOCOLS_H_
#define RVD_SELF_IMPROVE_PROVIDERS_PROTOCOLS_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "self_improve/providers/llm_provider.h"

namespace rvd::tune::internal {

class Protocol {
 public:
  virtual ~Protocol() = default;
  virtual const char* DefaultBaseUrl() const = 0;
  virtual const char* DefaultKeyEnv() const = 0;  // "" = none
  virtual const char* Path() const = 0;           // appended to the base URL
  // Content-Type, the key's header (when `key` is not empty), version headers.
  virtual std::vector<std::pair<std::string, std::string>> Headers(
      const LlmConfig& config, const std::string& key) const = 0;
  virtual nlohmann::json Body(const LlmConfig& config, const ChatRequest& request) const = 0;
  // A 2xx answer: text, truncation, model, usage. Errors: DATA_LOSS without
  // the protocol's fields, FAILED_PRECONDITION for a refusal, each with its
  // LlmErrorKind.
  virtual absl::StatusOr<ChatReply> ParseReply(const nlohmann::json& body) const = 0;
  // The server's own error text in an error answer's JSON ("" when none).
  virtual std::string ErrorText(const nlohmann::json& body) const = 0;
};

std::unique_ptr<Protocol> NewProtocol(LlmProtocol protocol);

}  // namespace rvd::tune::internal

#endif  // RVD_SELF_IMPROVE_PROVIDERS_PROTOCOLS_H_

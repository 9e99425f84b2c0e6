#include "self_improve/providers/protocols.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace rvd::tune::internal {
namespace {

using nlohmann::json;
using HeaderList = std::vector<std::pair<std::string, std::string>>;

const char* RoleName(ChatMessage::Role role) {
  return role == ChatMessage::Role::kUser ? "user" : "assistant";
}

absl::Status Malformed(absl::string_view what) {
  return WithLlmErrorKind(absl::DataLossError(absl::StrCat("malformed reply: ", what)),
                          LlmErrorKind::kMalformed);
}

absl::Status Refused(absl::string_view what) {
  return WithLlmErrorKind(absl::FailedPreconditionError(absl::StrCat("the model refused: ", what)),
                          LlmErrorKind::kRefusal);
}

// body[key] as a string when it is one, else "".
std::string StringAt(const json& body, const char* key) {
  if (!body.is_object()) return "";
  auto it = body.find(key);
  return it != body.end() && it->is_string() ? it->get<std::string>() : "";
}

int64_t IntAt(const json& body, const char* key) {
  if (!body.is_object()) return 0;
  auto it = body.find(key);
  return it != body.end() && it->is_number_integer() ? it->get<int64_t>() : 0;
}

// The messages with the system prompt first, as OpenAI and Ollama take them.
json MessagesWithSystem(const ChatRequest& request) {
  json messages = json::array();
  if (!request.system.empty()) {
    messages.push_back({{"role", "system"}, {"content", request.system}});
  }
  for (const ChatMessage& m : request.messages) {
    messages.push_back({{"role", RoleName(m.role)}, {"content", m.content}});
  }
  return messages;
}

// {"error": {"message": ...}} (OpenAI, Anthropic), {"error": "..."} (Ollama),
// {"message": ...} (vLLM's older errors), {"detail": ...} (FastAPI servers).
std::string CommonErrorText(const json& body) {
  if (!body.is_object()) return "";
  auto error = body.find("error");
  if (error != body.end()) {
    if (error->is_string()) return error->get<std::string>();
    if (error->is_object()) {
      std::string text = StringAt(*error, "message");
      const std::string type = StringAt(*error, "type");
      if (!type.empty()) text = text.empty() ? type : absl::StrCat(type, ": ", text);
      return text;
    }
  }
  std::string text = StringAt(body, "message");
  if (text.empty()) text = StringAt(body, "detail");
  return text;
}

class OpenAiProtocol : public Protocol {
 public:
  const char* DefaultBaseUrl() const override { return "https://api.openai.com/v1"; }
  const char* DefaultKeyEnv() const override { return "OPENAI_API_KEY"; }
  const char* Path() const override { return "/chat/completions"; }
  HeaderList Headers(const LlmConfig&, const std::string& key) const override {
    HeaderList h = {{"Content-Type", "application/json"}};
    if (!key.empty()) h.emplace_back("Authorization", absl::StrCat("Bearer ", key));
    return h;
  }
  json Body(const LlmConfig& config, const ChatRequest& request) const override {
    json body = {
        {"model", config.model}, {"messages", MessagesWithSystem(request)}, {"stream", false}};
    body[config.openai_max_completion_tokens ? "max_completion_tokens" : "max_tokens"] =
        config.max_tokens;
    if (config.temperature) body["temperature"] = *config.temperature;
    return body;
  }
  absl::StatusOr<ChatReply> ParseReply(const json& body) const override {
    if (!body.is_object()) return Malformed("not a JSON object");
    auto choices = body.find("choices");
    if (choices == body.end() || !choices->is_array() || choices->empty()) {
      return Malformed("no \"choices\"");
    }
    const json& choice = (*choices)[0];
    if (!choice.is_object()) return Malformed("choices[0] is not an object");
    auto message = choice.find("message");
    if (message == choice.end() || !message->is_object()) {
      return Malformed("choices[0] has no \"message\"");
    }
    const std::string finish = StringAt(choice, "finish_reason");
    const std::string refusal = StringAt(*message, "refusal");
    if (!refusal.empty()) return Refused(refusal);
    if (finish == "content_filter") return Refused("finish_reason content_filter");
    ChatReply reply;
    auto content = message->find("content");
    if (content != message->end() && content->is_string()) {
      reply.text = content->get<std::string>();
    } else if (content != message->end() && content->is_array()) {
      for (const json& part : *content) {  // [{"type": "text", "text": ...}]
        if (StringAt(part, "type") == "text") reply.text += StringAt(part, "text");
      }
    } else if (content != message->end() && !content->is_null()) {
      return Malformed("message.content is neither text nor parts");
    }
    reply.truncated = finish == "length";
    reply.model = StringAt(body, "model");
    if (auto usage = body.find("usage"); usage != body.end()) {
      reply.input_tokens = IntAt(*usage, "prompt_tokens");
      reply.output_tokens = IntAt(*usage, "completion_tokens");
    }
    return reply;
  }
  std::string ErrorText(const json& body) const override { return CommonErrorText(body); }
};

class AnthropicProtocol : public Protocol {
 public:
  const char* DefaultBaseUrl() const override { return "https://api.anthropic.com"; }
  const char* DefaultKeyEnv() const override { return "ANTHROPIC_API_KEY"; }
  const char* Path() const override { return "/v1/messages"; }
  HeaderList Headers(const LlmConfig& config, const std::string& key) const override {
    HeaderList h = {{"Content-Type", "application/json"},
                    {"anthropic-version", config.anthropic_version}};
    if (!key.empty()) h.emplace_back("x-api-key", key);
    return h;
  }
  json Body(const LlmConfig& config, const ChatRequest& request) const override {
    json messages = json::array();
    for (const ChatMessage& m : request.messages) {
      messages.push_back({{"role", RoleName(m.role)}, {"content", m.content}});
    }
    json body = {{"model", config.model},
                 {"max_tokens", config.max_tokens},
                 {"messages", std::move(messages)}};
    if (!request.system.empty()) body["system"] = request.system;
    if (config.temperature) body["temperature"] = *config.temperature;
    return body;
  }
  absl::StatusOr<ChatReply> ParseReply(const json& body) const override {
    if (!body.is_object()) return Malformed("not a JSON object");
    auto content = body.find("content");
    if (content == body.end() || !content->is_array()) return Malformed("no \"content\" array");
    const std::string stop = StringAt(body, "stop_reason");
    if (stop == "refusal") return Refused("stop_reason refusal");
    ChatReply reply;
    for (const json& block : *content) {  // text blocks; thinking and tool blocks skipped
      if (StringAt(block, "type") == "text") reply.text += StringAt(block, "text");
    }
    reply.truncated = stop == "max_tokens";
    reply.model = StringAt(body, "model");
    if (auto usage = body.find("usage"); usage != body.end()) {
      reply.input_tokens = IntAt(*usage, "input_tokens");
      reply.output_tokens = IntAt(*usage, "output_tokens");
    }
    return reply;
  }
  std::string ErrorText(const json& body) const override { return CommonErrorText(body); }
};

class OllamaProtocol : public Protocol {
 public:
  const char* DefaultBaseUrl() const override { return "http://localhost:11434"; }
  const char* DefaultKeyEnv() const override { return ""; }
  const char* Path() const override { return "/api/chat"; }
  HeaderList Headers(const LlmConfig&, const std::string& key) const override {
    HeaderList h = {{"Content-Type", "application/json"}};
    if (!key.empty()) h.emplace_back("Authorization", absl::StrCat("Bearer ", key));
    return h;
  }
  json Body(const LlmConfig& config, const ChatRequest& request) const override {
    json options = {{"num_predict", config.max_tokens}};
    if (config.temperature) options["temperature"] = *config.temperature;
    return {{"model", config.model},
            {"messages", MessagesWithSystem(request)},
            {"stream", false},
            {"options", std::move(options)}};
  }
  absl::StatusOr<ChatReply> ParseReply(const json& body) const override {
    if (!body.is_object()) return Malformed("not a JSON object");
    auto message = body.find("message");
    if (message == body.end() || !message->is_object()) return Malformed("no \"message\"");
    auto content = message->find("content");
    if (content == message->end() || !content->is_string()) {
      return Malformed("message.content is not text");
    }
    ChatReply reply;
    reply.text = content->get<std::string>();
    reply.truncated = StringAt(body, "done_reason") == "length";
    reply.model = StringAt(body, "model");
    reply.input_tokens = IntAt(body, "prompt_eval_count");
    reply.output_tokens = IntAt(body, "eval_count");
    return reply;
  }
  std::string ErrorText(const json& body) const override { return CommonErrorText(body); }
};

}  // namespace

std::unique_ptr<Protocol> NewProtocol(LlmProtocol protocol) {
  switch (protocol) {
    case LlmProtocol::kOpenAi:
      return std::make_unique<OpenAiProtocol>();
    case LlmProtocol::kAnthropic:
      return std::make_unique<AnthropicProtocol>();
    case LlmProtocol::kOllama:
      return std::make_unique<OllamaProtocol>();
  }
  return nullptr;
}

}  // namespace rvd::tune::internal

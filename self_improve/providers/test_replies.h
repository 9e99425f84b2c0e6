// Replies of each chat protocol as its server sends them (test code only):
// the bodies the scripted server answers with in the provider and
// generator tests.
#ifndef RVD_SELF_IMPROVE_PROVIDERS_TEST_REPLIES_H_
#define RVD_SELF_IMPROVE_PROVIDERS_TEST_REPLIES_H_

#include <string>

#include "nlohmann/json.hpp"
#include "self_improve/providers/llm_provider.h"

namespace rvd::tune::testing {

// A 2xx body of `protocol` whose text is `text`; `finish` "" is the
// protocol's normal stop.
inline std::string ChatBody(LlmProtocol protocol, const std::string& text,
                            const std::string& finish = "") {
  using nlohmann::json;
  switch (protocol) {
    case LlmProtocol::kOpenAi:
      return json{{"id", "chatcmpl-1"},
                  {"model", "test-model"},
                  {"choices",
                   {{{"index", 0},
                     {"message", {{"role", "assistant"}, {"content", text}, {"refusal", nullptr}}},
                     {"finish_reason", finish.empty() ? "stop" : finish}}}},
                  {"usage", {{"prompt_tokens", 11}, {"completion_tokens", 7}}}}
          .dump();
    case LlmProtocol::kAnthropic:
      return json{{"id", "msg_1"},
                  {"type", "message"},
                  {"role", "assistant"},
                  {"model", "test-model"},
                  {"content", {{{"type", "text"}, {"text", text}}}},
                  {"stop_reason", finish.empty() ? "end_turn" : finish},
                  {"usage", {{"input_tokens", 11}, {"output_tokens", 7}}}}
          .dump();
    case LlmProtocol::kOllama:
      return json{{"model", "test-model"},
                  {"message", {{"role", "assistant"}, {"content", text}}},
                  {"done", true},
                  {"done_reason", finish.empty() ? "stop" : finish},
                  {"prompt_eval_count", 11},
                  {"eval_count", 7}}
          .dump();
  }
  return "";
}

// The base URL a provider of `protocol` takes for a server at `server`
// (OpenAI's carries the /v1 the others put in their paths).
inline std::string BaseUrlFor(LlmProtocol protocol, const std::string& server) {
  return protocol == LlmProtocol::kOpenAi ? server + "/v1/" : server;
}

}  // namespace rvd::tune::testing

#endif  // RVD_SELF_IMPROVE_PROVIDERS_TEST_REPLIES_H_

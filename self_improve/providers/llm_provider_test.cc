// The three chat protocols against a scripted local HTTP server: good
// replies, malformed JSON, missing fields, timeouts, refusals, empty and cut
// replies, HTTP 401/429/500, a dropped connection, cancellation, and the key
// (sent in its header, never in a log line or a status: every test's
// TearDown reads the whole log).
#include "self_improve/providers/llm_provider.h"

#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <memory>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/time/clock.h"
#include "nlohmann/json.hpp"
#include "self_improve/providers/scripted_http_server.h"
#include "self_improve/providers/test_replies.h"
#include "spdlog/sinks/ostream_sink.h"
#include "spdlog/spdlog.h"

namespace rvd::tune {
namespace {

using ::nlohmann::json;
using ::rvd::tune::testing::ReceivedRequest;
using ::rvd::tune::testing::ScriptedHttpServer;
using ::rvd::tune::testing::ScriptedReply;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kKey[] = "sk-rvd-test-0123456789abcdef";
constexpr char kKeyEnv[] = "RVD_LLM_TEST_KEY";

std::string GoodBody(LlmProtocol protocol, const std::string& text,
                     const std::string& finish = "") {
  return testing::ChatBody(protocol, text, finish);
}

// Scripted replies (the struct's designated initializers would leave
// fields out, which -Wmissing-field-initializers refuses).
ScriptedReply Answer(std::string body, int status = 200) {
  ScriptedReply r;
  r.status = status;
  r.body = std::move(body);
  return r;
}
ScriptedReply Delayed(std::string body, absl::Duration delay) {
  ScriptedReply r = Answer(std::move(body));
  r.delay = delay;
  return r;
}
ScriptedReply Hangup() {
  ScriptedReply r;
  r.close_without_answer = true;
  return r;
}

// The finish reason of each protocol for a reply cut at max_tokens.
std::string LengthFinish(LlmProtocol p) {
  return p == LlmProtocol::kAnthropic ? "max_tokens" : "length";
}

std::string ExpectedPath(LlmProtocol p) {
  switch (p) {
    case LlmProtocol::kOpenAi:
      return "/v1/chat/completions";
    case LlmProtocol::kAnthropic:
      return "/v1/messages";
    case LlmProtocol::kOllama:
      return "/api/chat";
  }
  return "";
}

class ProviderTest : public ::testing::TestWithParam<LlmProtocol> {
 protected:
  void SetUp() override {
    ASSERT_EQ(setenv(kKeyEnv, kKey, 1), 0);
    sink_ = std::make_shared<spdlog::sinks::ostream_sink_mt>(log_);
    auto logger = std::make_shared<spdlog::logger>("test", sink_);
    logger->set_level(spdlog::level::trace);
    previous_ = spdlog::default_logger();
    spdlog::set_default_logger(logger);
  }
  void TearDown() override {
    spdlog::set_default_logger(previous_);
    EXPECT_THAT(log_.str(), Not(HasSubstr(kKey))) << "the key reached the log";
    EXPECT_THAT(log_.str(), Not(HasSubstr("0123456789abcdef")));
  }

  LlmConfig Config() const {
    LlmConfig c;
    c.protocol = GetParam();
    c.model = "test-model";
    c.base_url = testing::BaseUrlFor(GetParam(), server_.BaseUrl());
    c.api_key_env = kKeyEnv;
    c.max_tokens = 1234;
    c.temperature = 0.5;
    c.initial_backoff = absl::Milliseconds(10);
    c.max_backoff = absl::Milliseconds(100);
    c.request_timeout = absl::Seconds(5);
    return c;
  }

  std::unique_ptr<LlmProvider> Provider(const LlmConfig& c) {
    absl::StatusOr<std::unique_ptr<LlmProvider>> p = NewLlmProvider(c);
    EXPECT_TRUE(p.ok()) << p.status();
    return p.ok() ? std::move(*p) : nullptr;
  }

  static ChatRequest Request() {
    ChatRequest r;
    r.system = "You write CUDA.";
    r.messages.push_back({ChatMessage::Role::kUser, "Write a kernel."});
    return r;
  }

  // The status of a Chat that must fail, checked to hold no key.
  absl::Status Fails(const LlmConfig& c) {
    std::unique_ptr<LlmProvider> p = Provider(c);
    if (p == nullptr) return absl::InternalError("no provider");
    absl::StatusOr<ChatReply> r = p->Chat(Request());
    EXPECT_FALSE(r.ok());
    EXPECT_THAT(std::string(r.status().message()), Not(HasSubstr(kKey)));
    return r.status();
  }

  ScriptedHttpServer server_;
  std::ostringstream log_;
  std::shared_ptr<spdlog::sinks::ostream_sink_mt> sink_;
  std::shared_ptr<spdlog::logger> previous_;
};

TEST_P(ProviderTest, GoodReplyAndTheRequestOnTheWire) {
  server_.Enqueue(Answer(GoodBody(GetParam(), "```cuda\n__global__ void k() {}\n```")));
  std::unique_ptr<LlmProvider> p = Provider(Config());
  ASSERT_NE(p, nullptr);
  ChatRequest request = Request();
  request.messages.push_back({ChatMessage::Role::kAssistant, "first try"});
  request.messages.push_back({ChatMessage::Role::kUser, "it failed"});
  absl::StatusOr<ChatReply> r = p->Chat(request);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->text, "```cuda\n__global__ void k() {}\n```");
  EXPECT_FALSE(r->truncated);
  EXPECT_EQ(r->model, "test-model");
  EXPECT_EQ(r->attempts, 1);
  EXPECT_EQ(r->input_tokens, 11);
  EXPECT_EQ(r->output_tokens, 7);
  EXPECT_EQ(p->Name(), absl::StrCat(LlmProtocolName(GetParam()), ":test-model"));

  const std::vector<ReceivedRequest> got = server_.Requests();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].method, "POST");
  EXPECT_EQ(got[0].path, ExpectedPath(GetParam()));
  EXPECT_EQ(got[0].headers.at("content-type"), "application/json");
  const json body = json::parse(got[0].body);
  EXPECT_EQ(body["model"], "test-model");
  const json& messages = body["messages"];
  switch (GetParam()) {
    case LlmProtocol::kOpenAi:
      EXPECT_EQ(got[0].headers.at("authorization"), absl::StrCat("Bearer ", kKey));
      EXPECT_EQ(body["max_tokens"], 1234);
      EXPECT_EQ(body["temperature"], 0.5);
      EXPECT_EQ(body["stream"], false);
      ASSERT_EQ(messages.size(), 4u);
      EXPECT_EQ(messages[0]["role"], "system");
      EXPECT_EQ(messages[0]["content"], "You write CUDA.");
      break;
    case LlmProtocol::kAnthropic:
      EXPECT_EQ(got[0].headers.at("x-api-key"), kKey);
      EXPECT_EQ(got[0].headers.at("anthropic-version"), "2023-06-01");
      EXPECT_EQ(got[0].headers.count("authorization"), 0u);
      EXPECT_EQ(body["max_tokens"], 1234);
      EXPECT_EQ(body["system"], "You write CUDA.");
      ASSERT_EQ(messages.size(), 3u);  // the system prompt is not a message
      break;
    case LlmProtocol::kOllama:
      EXPECT_EQ(got[0].headers.at("authorization"), absl::StrCat("Bearer ", kKey));
      EXPECT_EQ(body["stream"], false);
      EXPECT_EQ(body["options"]["num_predict"], 1234);
      EXPECT_EQ(body["options"]["temperature"], 0.5);
      ASSERT_EQ(messages.size(), 4u);
      EXPECT_EQ(messages[0]["role"], "system");
      break;
  }
  const json& last = messages[messages.size() - 1];
  EXPECT_EQ(last["role"], "user");
  EXPECT_EQ(last["content"], "it failed");
  EXPECT_EQ(messages[messages.size() - 2]["role"], "assistant");
  EXPECT_THAT(log_.str(), HasSubstr("reply in"));
  EXPECT_THAT(log_.str(), HasSubstr(absl::StrCat("from $", kKeyEnv)));
}

TEST_P(ProviderTest, NoKeyVariableSendsNoKey) {
  server_.Enqueue(Answer(GoodBody(GetParam(), "hello")));
  LlmConfig c = Config();
  c.api_key_env = "";
  std::unique_ptr<LlmProvider> p = Provider(c);
  ASSERT_NE(p, nullptr);
  ASSERT_TRUE(p->Chat(Request()).ok());
  const std::vector<ReceivedRequest> got = server_.Requests();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].headers.count("authorization"), 0u);
  EXPECT_EQ(got[0].headers.count("x-api-key"), 0u);
}

TEST_P(ProviderTest, MalformedJsonIsDataLoss) {
  server_.Enqueue(Answer("{\"choices\": [ this is not json"));
  const absl::Status s = Fails(Config());
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_EQ(LlmErrorKindOf(s), LlmErrorKind::kMalformed);
  EXPECT_THAT(std::string(s.message()), HasSubstr("not JSON"));
  EXPECT_EQ(server_.Requests().size(), 1u);  // not retried
}

TEST_P(ProviderTest, JsonWithoutTheProtocolsFieldsIsDataLoss) {
  server_.Enqueue(Answer(R"({"unexpected": true})"));
  const absl::Status s = Fails(Config());
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_EQ(LlmErrorKindOf(s), LlmErrorKind::kMalformed);
  EXPECT_THAT(std::string(s.message()), HasSubstr("malformed reply"));
}

TEST_P(ProviderTest, ErrorObjectWithStatus200IsQuoted) {
  server_.Enqueue(Answer(R"({"error": {"message": "upstream model crashed"}})"));
  const absl::Status s = Fails(Config());
  EXPECT_EQ(LlmErrorKindOf(s), LlmErrorKind::kMalformed) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("upstream model crashed"));
}

TEST_P(ProviderTest, EmptyTextIsItsOwnError) {
  server_.Enqueue(Answer(GoodBody(GetParam(), "  \n ")));
  const absl::Status s = Fails(Config());
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_EQ(LlmErrorKindOf(s), LlmErrorKind::kEmpty);
}

TEST_P(ProviderTest, CutAtMaxTokensIsReported) {
  server_.Enqueue(
      Answer(GoodBody(GetParam(), "```cuda\n__global__ void k(", LengthFinish(GetParam()))));
  std::unique_ptr<LlmProvider> p = Provider(Config());
  ASSERT_NE(p, nullptr);
  absl::StatusOr<ChatReply> r = p->Chat(Request());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->truncated);
}

TEST_P(ProviderTest, TimeoutIsDeadlineExceeded) {
  server_.Enqueue(Delayed(GoodBody(GetParam(), "late"), absl::Seconds(3)));
  LlmConfig c = Config();
  c.request_timeout = absl::Milliseconds(300);
  const absl::Time start = absl::Now();
  const absl::Status s = Fails(c);
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_EQ(LlmErrorKindOf(s), LlmErrorKind::kTransport);
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  EXPECT_EQ(server_.Requests().size(), 1u);  // a timeout is not retried
}

TEST_P(ProviderTest, RateLimitedThenAnswered) {
  ScriptedReply limited =
      Answer(R"({"error": {"message": "slow down", "type": "rate_limit_error"}})", 429);
  limited.headers = {{"Retry-After", "0"}};
  server_.Enqueue(limited);
  server_.Enqueue(Answer(GoodBody(GetParam(), "after the wait")));
  std::unique_ptr<LlmProvider> p = Provider(Config());
  ASSERT_NE(p, nullptr);
  absl::StatusOr<ChatReply> r = p->Chat(Request());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->text, "after the wait");
  EXPECT_EQ(r->attempts, 2);
  EXPECT_EQ(server_.Requests().size(), 2u);
  EXPECT_THAT(log_.str(), HasSubstr("slow down"));  // the retry is logged with the reason
}

TEST_P(ProviderTest, RateLimitedEveryTimeIsResourceExhausted) {
  for (int i = 0; i < 2; ++i) {
    server_.Enqueue(Answer(R"({"error": {"message": "quota exceeded"}})", 429));
  }
  LlmConfig c = Config();
  c.max_attempts = 2;
  const absl::Status s = Fails(c);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_EQ(LlmErrorKindOf(s), LlmErrorKind::kHttpStatus);
  EXPECT_THAT(std::string(s.message()), HasSubstr("HTTP 429"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("quota exceeded"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("2 attempts"));
}

TEST_P(ProviderTest, ServerErrorsAreRetriedThenUnavailable) {
  for (int i = 0; i < 3; ++i) server_.Enqueue(Answer("<html>oops</html>", 500));
  const absl::Status s = Fails(Config());
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_EQ(LlmErrorKindOf(s), LlmErrorKind::kHttpStatus);
  EXPECT_THAT(std::string(s.message()), HasSubstr("HTTP 500"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("oops"));  // a body that is not JSON, quoted
  EXPECT_THAT(std::string(s.message()), HasSubstr("3 attempts"));
  EXPECT_EQ(server_.Requests().size(), 3u);
}

TEST_P(ProviderTest, RejectedKeyIsNotRetriedAndItsEchoIsRedacted) {
  server_.Enqueue(Answer(json{{"error",
                               {{"message", absl::StrCat("Incorrect API key provided: ", kKey)},
                                {"type", "authentication_error"}}}}
                             .dump(),
                         401));
  const absl::Status s = Fails(Config());
  EXPECT_EQ(s.code(), absl::StatusCode::kUnauthenticated) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("[redacted]"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("authentication_error"));
  EXPECT_EQ(server_.Requests().size(), 1u);
}

TEST_P(ProviderTest, UnknownModelIsNotFound) {
  server_.Enqueue(Answer(R"({"error": "model 'test-model' not found"})", 404));
  const absl::Status s = Fails(Config());
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("model 'test-model' not found"));
}

TEST_P(ProviderTest, DroppedConnectionIsUnavailable) {
  server_.Enqueue(Hangup());
  LlmConfig c = Config();
  c.max_attempts = 1;
  const absl::Status s = Fails(c);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_EQ(LlmErrorKindOf(s), LlmErrorKind::kTransport);
}

TEST_P(ProviderTest, DroppedConnectionIsRetried) {
  server_.Enqueue(Hangup());
  server_.Enqueue(Answer(GoodBody(GetParam(), "second time")));
  std::unique_ptr<LlmProvider> p = Provider(Config());
  ASSERT_NE(p, nullptr);
  absl::StatusOr<ChatReply> r = p->Chat(Request());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->text, "second time");
}

TEST_P(ProviderTest, ReplyOverTheLimitIsResourceExhausted) {
  server_.Enqueue(Answer(GoodBody(GetParam(), std::string(5000, 'x'))));
  LlmConfig c = Config();
  c.max_reply_bytes = 1000;
  const absl::Status s = Fails(c);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_EQ(LlmErrorKindOf(s), LlmErrorKind::kTransport);
}

TEST_P(ProviderTest, CancelledWhileWaiting) {
  server_.Enqueue(Delayed(GoodBody(GetParam(), "never read"), absl::Seconds(4)));
  std::unique_ptr<LlmProvider> p = Provider(Config());
  ASSERT_NE(p, nullptr);
  std::atomic<bool> cancelled{false};
  ChatRequest request = Request();
  request.cancelled = &cancelled;
  std::thread canceller([&] {
    absl::SleepFor(absl::Milliseconds(200));
    cancelled = true;
  });
  const absl::Time start = absl::Now();
  absl::StatusOr<ChatReply> r = p->Chat(request);
  canceller.join();
  EXPECT_EQ(r.status().code(), absl::StatusCode::kCancelled) << r.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
}

TEST_P(ProviderTest, NobodyListeningIsUnavailable) {
  // A port bound and never listened on: connections to it are refused.
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  LlmConfig c = Config();
  c.base_url =
      testing::BaseUrlFor(GetParam(), absl::StrCat("http://127.0.0.1:", ntohs(addr.sin_port)));
  c.max_attempts = 1;
  const absl::Status s = Fails(c);
  close(fd);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_EQ(LlmErrorKindOf(s), LlmErrorKind::kTransport);
}

INSTANTIATE_TEST_SUITE_P(Protocols, ProviderTest,
                         ::testing::Values(LlmProtocol::kOpenAi, LlmProtocol::kAnthropic,
                                           LlmProtocol::kOllama),
                         [](const auto& info) { return LlmProtocolName(info.param); });

// Refusals are protocol-specific (Ollama has no refusal signal: a refusal
// in words has no code block, kernel_extract_test's NoCode case).
class RefusalTest : public ProviderTest {};

TEST_P(RefusalTest, OpenAiRefusalField) {
  server_.Enqueue(Answer(json{
      {"choices",
       {{{"message",
          {{"role", "assistant"}, {"content", nullptr}, {"refusal", "I can't help with that."}}},
         {"finish_reason",
          "stop"}}}}}.dump()));
  const absl::Status s = Fails(Config());
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_EQ(LlmErrorKindOf(s), LlmErrorKind::kRefusal);
  EXPECT_THAT(std::string(s.message()), HasSubstr("I can't help with that."));
}

TEST_P(RefusalTest, OpenAiContentFilter) {
  server_.Enqueue(Answer(GoodBody(LlmProtocol::kOpenAi, "", "content_filter")));
  const absl::Status s = Fails(Config());
  EXPECT_EQ(LlmErrorKindOf(s), LlmErrorKind::kRefusal) << s;
}

INSTANTIATE_TEST_SUITE_P(OpenAi, RefusalTest, ::testing::Values(LlmProtocol::kOpenAi),
                         [](const auto& info) { return LlmProtocolName(info.param); });

class AnthropicRefusalTest : public ProviderTest {};

TEST_P(AnthropicRefusalTest, StopReasonRefusal) {
  server_.Enqueue(Answer(GoodBody(LlmProtocol::kAnthropic, "I won't", "refusal")));
  const absl::Status s = Fails(Config());
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_EQ(LlmErrorKindOf(s), LlmErrorKind::kRefusal);
}

INSTANTIATE_TEST_SUITE_P(Anthropic, AnthropicRefusalTest,
                         ::testing::Values(LlmProtocol::kAnthropic),
                         [](const auto& info) { return LlmProtocolName(info.param); });

// Configuration errors, before any request.
TEST(LlmConfigTest, MissingKeyVariableNamesTheVariable) {
  unsetenv("RVD_LLM_TEST_UNSET_KEY");
  LlmConfig c;
  c.model = "m";
  c.api_key_env = "RVD_LLM_TEST_UNSET_KEY";
  absl::StatusOr<std::unique_ptr<LlmProvider>> p = NewLlmProvider(c);
  EXPECT_EQ(p.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(p.status().message()), HasSubstr("RVD_LLM_TEST_UNSET_KEY"));
  EXPECT_EQ(LlmErrorKindOf(p.status()), LlmErrorKind::kConfig);
}

TEST(LlmConfigTest, DefaultKeyVariables) {
  unsetenv("OPENAI_API_KEY");
  unsetenv("ANTHROPIC_API_KEY");
  LlmConfig c;
  c.model = "m";
  EXPECT_THAT(std::string(NewLlmProvider(c).status().message()), HasSubstr("OPENAI_API_KEY"));
  c.protocol = LlmProtocol::kAnthropic;
  EXPECT_THAT(std::string(NewLlmProvider(c).status().message()), HasSubstr("ANTHROPIC_API_KEY"));
  c.protocol = LlmProtocol::kOllama;  // no key by default
  EXPECT_TRUE(NewLlmProvider(c).ok());
  ASSERT_EQ(setenv("OPENAI_API_KEY", kKey, 1), 0);
  c.protocol = LlmProtocol::kOpenAi;
  EXPECT_TRUE(NewLlmProvider(c).ok());
  unsetenv("OPENAI_API_KEY");
}

TEST(LlmConfigTest, NoKeyOverPlainHttpToAnotherHost) {
  ASSERT_EQ(setenv(kKeyEnv, kKey, 1), 0);
  LlmConfig c;
  c.model = "m";
  c.api_key_env = kKeyEnv;
  c.base_url = "http://llm.example.com/v1";
  absl::StatusOr<std::unique_ptr<LlmProvider>> p = NewLlmProvider(c);
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(p.status().message()), HasSubstr("llm.example.com"));
  c.base_url = "https://llm.example.com/v1";
  EXPECT_TRUE(NewLlmProvider(c).ok());
  c.base_url = "http://localhost:8000/v1";
  EXPECT_TRUE(NewLlmProvider(c).ok());
}

TEST_P(ProviderTest, UrlCredentialsAreNotLogged) {
  server_.Enqueue(Answer(R"({"error": "nope"})", 500));
  LlmConfig c = Config();
  c.base_url = absl::StrReplaceAll(c.base_url, {{"http://", "http://user:hunter2@"}});
  c.max_attempts = 1;
  const absl::Status s = Fails(c);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_THAT(std::string(s.message()), Not(HasSubstr("hunter2")));
  EXPECT_THAT(log_.str(), Not(HasSubstr("hunter2")));
  EXPECT_THAT(log_.str(), HasSubstr("POST http://127.0.0.1:"));
  server_.Enqueue(Hangup());  // a transport error names the URL too
  const absl::Status t = Fails(c);
  EXPECT_EQ(t.code(), absl::StatusCode::kUnavailable) << t;
  EXPECT_THAT(std::string(t.message()), HasSubstr("127.0.0.1"));
  EXPECT_THAT(std::string(t.message()), Not(HasSubstr("hunter2")));
}

TEST(LlmConfigTest, BadValues) {
  LlmConfig c;
  c.api_key_env = "";
  EXPECT_EQ(NewLlmProvider(c).status().code(), absl::StatusCode::kInvalidArgument);  // no model
  c.model = "m";
  c.base_url = "ftp://host/";
  EXPECT_EQ(NewLlmProvider(c).status().code(), absl::StatusCode::kInvalidArgument);
  c.base_url = "";
  c.max_tokens = 0;
  EXPECT_EQ(NewLlmProvider(c).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseLlmProtocol("gemini").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(*ParseLlmProtocol("anthropic"), LlmProtocol::kAnthropic);
}

}  // namespace
}  // namespace rvd::tune

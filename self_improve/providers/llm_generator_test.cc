// The LLM generator end to end against a scripted local server: the
// analysis, suggestion and self-review turns with their prompts on the
// wire, a reply without a usable kernel answered once with what was wrong,
// the compile-error retry's conversation, and the failures (refusal, HTTP
// error, cut reply, cancellation) as statuses a job can log, never
// OUT_OF_RANGE.
#include "self_improve/providers/llm_generator.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "nlohmann/json.hpp"
#include "self_improve/providers/scripted_http_server.h"
#include "self_improve/providers/test_replies.h"

namespace rvd::tune {
namespace {

using ::nlohmann::json;
using ::rvd::tune::testing::ReceivedRequest;
using ::rvd::tune::testing::ScriptedHttpServer;
using ::rvd::tune::testing::ScriptedReply;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kKernel[] = R"(#include <cuda_bf16.h>
// rvd-launch: threads=256 smem=0 tile_rows=0 tile_cols=0
extern "C" __global__ void rvd_tune_candidate(const rvd::cuda::MatrixDesc* mats,
    const rvd::tune::TuneJob* jobs, int num_jobs, double* g2, double* trace, float* maxabs) {
  for (int j = blockIdx.x; j < num_jobs; j += gridDim.x) {
    if (threadIdx.x == 0) { g2[j] = 0; trace[j] = 0; maxabs[j] = 0; }
  }
}
)";

constexpr char kAnalysis[] = R"(```json
{"primary_bottleneck": "memory_bandwidth", "root_cause": "each tile re-reads its rows",
 "highest_impact_optimization": "128x128 tiles", "estimated_speedup": 1.4}
```)";

std::string Suggestion(const std::string& kernel = kKernel,
                       const std::string& technique = "128x128 tiles with uint4 loads") {
  return absl::StrCat("Technique: ", technique, "\n\n```cuda\n", kernel, "```\n");
}

// An OpenAI chat completion whose text is `text`.
ScriptedReply Reply(const std::string& text, const std::string& finish = "stop") {
  ScriptedReply r;
  r.body =
      json{{"model", "m"},
           {"choices",
            {{{"message", {{"role", "assistant"}, {"content", text}}}, {"finish_reason", finish}}}}}
          .dump();
  return r;
}

// The messages of the n-th request the server saw.
json Messages(const std::vector<ReceivedRequest>& got, size_t n) {
  return json::parse(got.at(n).body)["messages"];
}

class LlmGeneratorTest : public ::testing::Test {
 protected:
  LlmGeneratorOptions Options(bool analyze, bool review) const {
    LlmGeneratorOptions o;
    o.llm.protocol = LlmProtocol::kOpenAi;
    o.llm.model = "m";
    o.llm.base_url = server_.BaseUrl() + "/v1";
    o.llm.api_key_env = "";
    o.llm.initial_backoff = absl::Milliseconds(5);
    o.analyze = analyze;
    o.self_review = review;
    return o;
  }

  std::unique_ptr<Generator> Make(const LlmGeneratorOptions& o) {
    absl::StatusOr<std::unique_ptr<Generator>> g = NewLlmGenerator(o);
    EXPECT_TRUE(g.ok()) << g.status();
    return g.ok() ? std::move(*g) : nullptr;
  }

  static CandidateRequest Request() {
    CandidateRequest r;
    r.target.dtype = DType::kBF16;
    r.target.shape_class = "wide";
    r.target.arch = "sm_90a";
    r.target.shapes = {{480, 128, 4096}};
    r.iteration = 3;
    r.best_source = "// rvd-launch: threads=128 smem=0 tile_rows=0 tile_cols=0\nCURRENT_BEST\n";
    r.best_description = "naive";
    r.profile.seconds = 1e-4;
    r.bottleneck.bottleneck = Bottleneck::kMemoryBandwidth;
    r.bottleneck.signals = {"DRAM at 86% of peak (> 80%)"};
    return r;
  }

  ScriptedHttpServer server_;
};

TEST_F(LlmGeneratorTest, AnalyzeSuggestReview) {
  server_.Enqueue(Reply(kAnalysis));
  server_.Enqueue(Reply(Suggestion()));
  server_.Enqueue(Reply(absl::StrCat("Verdict: unchanged\n```cuda\n", kKernel, "```")));
  std::unique_ptr<Generator> g = Make(Options(true, true));
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(g->Name(), "openai:m");
  absl::StatusOr<Candidate> c = g->Generate(Request());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->source, kKernel);
  EXPECT_EQ(c->description, "128x128 tiles with uint4 loads");

  const std::vector<ReceivedRequest> got = server_.Requests();
  ASSERT_EQ(got.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(Messages(got, i)[0]["role"], "system");
    EXPECT_THAT(Messages(got, i)[0]["content"].get<std::string>(), HasSubstr("NVRTC"));
  }
  const std::string analyze = Messages(got, 0)[1]["content"];
  EXPECT_THAT(analyze, HasSubstr("# Analyze the bottleneck"));
  EXPECT_THAT(analyze, HasSubstr("CURRENT_BEST"));
  const std::string suggest = Messages(got, 1)[1]["content"];
  EXPECT_THAT(suggest, HasSubstr("# Write a faster kernel"));
  EXPECT_THAT(suggest, HasSubstr("Root cause: each tile re-reads its rows"));
  EXPECT_THAT(suggest, HasSubstr("Primary bottleneck: memory_bandwidth (estimated speedup 1.40x)"));
  EXPECT_THAT(suggest, HasSubstr(kCandidateSignature));
  const std::string review = Messages(got, 2)[1]["content"];
  EXPECT_THAT(review, HasSubstr("# Review a CUDA kernel"));
  EXPECT_THAT(review, HasSubstr("g2[j] = 0; trace[j] = 0;"));  // the candidate itself
}

TEST_F(LlmGeneratorTest, ReviewThatFixesReplacesTheKernel) {
  const std::string fixed = absl::StrReplaceAll(kKernel, {{"maxabs[j] = 0;", "maxabs[j] = 0.0f;"}});
  server_.Enqueue(Reply(Suggestion()));
  server_.Enqueue(Reply(
      absl::StrCat("**Verdict:** fixed: maxabs as a float literal\n```cuda\n", fixed, "```")));
  std::unique_ptr<Generator> g = Make(Options(false, true));
  absl::StatusOr<Candidate> c = g->Generate(Request());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->source, fixed);
  EXPECT_EQ(c->description,
            "128x128 tiles with uint4 loads (self-review: maxabs as a float literal)");
}

TEST_F(LlmGeneratorTest, UnchangedVerdictKeepsTheKernelAsItWas) {
  const std::string reformatted = absl::StrReplaceAll(kKernel, {{"  for (", "    for ("}});
  server_.Enqueue(Reply(Suggestion()));
  server_.Enqueue(Reply(absl::StrCat("Verdict: unchanged\n```cuda\n", reformatted, "```")));
  std::unique_ptr<Generator> g = Make(Options(false, true));
  absl::StatusOr<Candidate> c = g->Generate(Request());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->source, kKernel);
  EXPECT_EQ(c->description, "128x128 tiles with uint4 loads");
}

TEST_F(LlmGeneratorTest, UnusableReviewKeepsTheKernel) {
  server_.Enqueue(Reply(Suggestion()));
  server_.Enqueue(Reply("Verdict: fixed: everything\n```cuda\n__global__ void other() {}\n```"));
  std::unique_ptr<Generator> g = Make(Options(false, true));
  absl::StatusOr<Candidate> c = g->Generate(Request());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->source, kKernel);
  EXPECT_EQ(c->description, "128x128 tiles with uint4 loads");
}

TEST_F(LlmGeneratorTest, MalformedAnalysisFallsBackToTheClassification) {
  server_.Enqueue(Reply("The kernel is slow because of memory."));
  server_.Enqueue(Reply(Suggestion()));
  std::unique_ptr<Generator> g = Make(Options(true, false));
  absl::StatusOr<Candidate> c = g->Generate(Request());
  ASSERT_TRUE(c.ok()) << c.status();
  const std::string suggest = Messages(server_.Requests(), 1)[1]["content"];
  EXPECT_THAT(suggest, HasSubstr("DRAM at 86% of peak"));
  EXPECT_THAT(suggest, Not(HasSubstr("Root cause:")));
}

TEST_F(LlmGeneratorTest, UnusableReplyIsAnsweredWithWhatWasWrong) {
  server_.Enqueue(Reply("Here is my idea: use bigger tiles. I hope that helps!"));
  server_.Enqueue(Reply(Suggestion()));
  std::unique_ptr<Generator> g = Make(Options(false, false));
  absl::StatusOr<Candidate> c = g->Generate(Request());
  ASSERT_TRUE(c.ok()) << c.status();
  const std::vector<ReceivedRequest> got = server_.Requests();
  ASSERT_EQ(got.size(), 2u);
  const json second = Messages(got, 1);
  ASSERT_EQ(second.size(), 4u);  // system, the prompt, the reply, what was wrong
  EXPECT_EQ(second[2]["role"], "assistant");
  EXPECT_THAT(second[2]["content"].get<std::string>(), HasSubstr("bigger tiles"));
  EXPECT_THAT(second[3]["content"].get<std::string>(), HasSubstr("no fenced code block"));
}

TEST_F(LlmGeneratorTest, WrongKernelTwiceIsTheIterationsError) {
  const std::string renamed = absl::StrReplaceAll(kKernel, {{"rvd_tune_candidate", "my_kernel"}});
  server_.Enqueue(Reply(Suggestion(renamed)));
  server_.Enqueue(Reply(Suggestion(renamed)));
  std::unique_ptr<Generator> g = Make(Options(false, false));
  absl::StatusOr<Candidate> c = g->Generate(Request());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << c.status();
  EXPECT_EQ(LlmErrorKindOf(c.status()), LlmErrorKind::kWrongKernel);
  EXPECT_EQ(server_.Requests().size(), 2u);
}

TEST_F(LlmGeneratorTest, MissingLaunchAnnotationIsAWrongKernel) {
  const std::string bare = absl::StrReplaceAll(
      kKernel, {{"// rvd-launch: threads=256 smem=0 tile_rows=0 tile_cols=0\n", ""}});
  server_.Enqueue(Reply(Suggestion(bare)));
  server_.Enqueue(Reply(Suggestion()));
  std::unique_ptr<Generator> g = Make(Options(false, false));
  absl::StatusOr<Candidate> c = g->Generate(Request());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_THAT(Messages(server_.Requests(), 1)[3]["content"].get<std::string>(),
              HasSubstr("launch annotation"));
}

TEST_F(LlmGeneratorTest, CompileErrorRetryIsOneMoreTurn) {
  server_.Enqueue(Reply(kAnalysis));
  server_.Enqueue(Reply(Suggestion()));
  std::unique_ptr<Generator> g = Make(Options(true, false));
  ASSERT_TRUE(g->Generate(Request()).ok());

  CandidateRequest retry = Request();
  retry.attempt = 1;
  retry.failed_source = "BROKEN_SOURCE";
  retry.compile_log = "kernel.cu(3): error: expected a \";\"";
  server_.Enqueue(Reply(Suggestion(kKernel, "the same tiles, the missing semicolon added")));
  absl::StatusOr<Candidate> c = g->Generate(retry);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->description, "the same tiles, the missing semicolon added");
  const std::vector<ReceivedRequest> got = server_.Requests();
  ASSERT_EQ(got.size(), 3u);  // no second analysis
  const json m = Messages(got, 2);
  ASSERT_EQ(m.size(), 4u);
  EXPECT_THAT(m[1]["content"].get<std::string>(), HasSubstr("Root cause: each tile"));  // kept
  EXPECT_EQ(m[2]["role"], "assistant");
  EXPECT_EQ(m[2]["content"], "```cuda\nBROKEN_SOURCE\n```");
  EXPECT_THAT(m[3]["content"].get<std::string>(), HasSubstr("expected a \";\""));
  EXPECT_THAT(m[3]["content"].get<std::string>(), HasSubstr("NVRTC for sm_90a"));
}

TEST_F(LlmGeneratorTest, RefusalIsNotRetried) {
  ScriptedReply refused;
  refused.body = json{
      {"choices",
       {{{"message", {{"role", "assistant"}, {"content", nullptr}, {"refusal", "No."}}},
         {"finish_reason",
          "stop"}}}}}.dump();
  server_.Enqueue(refused);
  std::unique_ptr<Generator> g = Make(Options(false, false));
  absl::StatusOr<Candidate> c = g->Generate(Request());
  EXPECT_EQ(LlmErrorKindOf(c.status()), LlmErrorKind::kRefusal) << c.status();
  EXPECT_EQ(server_.Requests().size(), 1u);
}

TEST_F(LlmGeneratorTest, HttpErrorAtTheAnalysisEndsTheIteration) {
  ScriptedReply denied;
  denied.status = 401;
  denied.body = R"({"error": {"message": "invalid key"}})";
  server_.Enqueue(denied);
  std::unique_ptr<Generator> g = Make(Options(true, true));
  absl::StatusOr<Candidate> c = g->Generate(Request());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kUnauthenticated) << c.status();
  EXPECT_EQ(server_.Requests().size(), 1u);
}

TEST_F(LlmGeneratorTest, CutReplyIsNeverOutOfRange) {
  const std::string cut =
      absl::StrCat("Technique: x\n```cuda\n", std::string(kKernel).substr(0, 120));
  server_.Enqueue(Reply(cut, "length"));
  server_.Enqueue(Reply(cut, "length"));
  std::unique_ptr<Generator> g = Make(Options(false, false));
  absl::StatusOr<Candidate> c = g->Generate(Request());
  EXPECT_EQ(LlmErrorKindOf(c.status()), LlmErrorKind::kTruncated) << c.status();
  EXPECT_NE(c.status().code(), absl::StatusCode::kOutOfRange);  // OUT_OF_RANGE ends a job
}

TEST_F(LlmGeneratorTest, CancelledBeforeAsking) {
  std::unique_ptr<Generator> g = Make(Options(true, true));
  std::atomic<bool> cancelled{true};
  CandidateRequest r = Request();
  r.cancelled = &cancelled;
  EXPECT_EQ(g->Generate(r).status().code(), absl::StatusCode::kCancelled);
  EXPECT_TRUE(server_.Requests().empty());
}

// The whole turn on every protocol: a wrong kernel answered with what was
// wrong, then a good one.
class LlmGeneratorProtocolTest : public LlmGeneratorTest,
                                 public ::testing::WithParamInterface<LlmProtocol> {};

TEST_P(LlmGeneratorProtocolTest, WrongKernelThenAGoodOne) {
  const std::string changed = absl::StrReplaceAll(kKernel, {{"int num_jobs", "long num_jobs"}});
  ScriptedReply wrong;
  wrong.body = testing::ChatBody(GetParam(), Suggestion(changed));
  ScriptedReply good;
  good.body = testing::ChatBody(GetParam(), Suggestion());
  server_.Enqueue(wrong);
  server_.Enqueue(good);
  LlmGeneratorOptions o = Options(false, false);
  o.llm.protocol = GetParam();
  o.llm.base_url = testing::BaseUrlFor(GetParam(), server_.BaseUrl());
  std::unique_ptr<Generator> g = Make(o);
  ASSERT_NE(g, nullptr);
  absl::StatusOr<Candidate> c = g->Generate(Request());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->source, kKernel);
  const std::vector<ReceivedRequest> got = server_.Requests();
  ASSERT_EQ(got.size(), 2u);
  const json m = Messages(got, 1);
  const std::string last = m[m.size() - 1]["content"];
  EXPECT_THAT(last, HasSubstr("signature of rvd_tune_candidate changed"));
  EXPECT_THAT(last, HasSubstr("long num_jobs"));
}

INSTANTIATE_TEST_SUITE_P(Protocols, LlmGeneratorProtocolTest,
                         ::testing::Values(LlmProtocol::kOpenAi, LlmProtocol::kAnthropic,
                                           LlmProtocol::kOllama),
                         [](const auto& info) { return LlmProtocolName(info.param); });

TEST(LlmGeneratorOptionsTest, Settings) {
  absl::StatusOr<LlmGeneratorOptions> o =
      ParseLlmGeneratorOptions({{"protocol", "anthropic"},
                                {"model", "claude-x"},
                                {"max_tokens", "4096"},
                                {"temperature", ""},
                                {"request_timeout_seconds", "120"},
                                {"analyze", "false"},
                                {"self_review", "true"},
                                {"max_format_retries", "2"},
                                {"api_key_env", "MY_KEY"}});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->llm.protocol, LlmProtocol::kAnthropic);
  EXPECT_EQ(o->llm.model, "claude-x");
  EXPECT_EQ(o->llm.max_tokens, 4096);
  EXPECT_FALSE(o->llm.temperature.has_value());
  EXPECT_EQ(o->llm.request_timeout, absl::Seconds(120));
  EXPECT_FALSE(o->analyze);
  EXPECT_TRUE(o->self_review);
  EXPECT_EQ(o->max_format_retries, 2);
  EXPECT_EQ(o->llm.api_key_env, "MY_KEY");

  EXPECT_THAT(
      std::string(
          ParseLlmGeneratorOptions({{"model", "m"}, {"max_tokens", "0"}}).status().message()),
      HasSubstr("max_tokens"));
  EXPECT_THAT(
      std::string(ParseLlmGeneratorOptions({{"model", "m"}, {"modle", "x"}}).status().message()),
      HasSubstr("unknown setting \"modle\""));
  EXPECT_FALSE(ParseLlmGeneratorOptions({{"protocol", "openai"}}).ok());  // no model
  EXPECT_FALSE(ParseLlmGeneratorOptions({{"model", "m"}, {"analyze", "maybe"}}).ok());
}

TEST(LlmGeneratorOptionsTest, OptionsForARegisteredName) {
  absl::StatusOr<LlmGeneratorOptions> o =
      LlmGeneratorOptionsFor("ollama:qwen2.5-coder:32b", {{"base_url", "http://gpu-box:11434"}});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->llm.protocol, LlmProtocol::kOllama);
  EXPECT_EQ(o->llm.model, "qwen2.5-coder:32b");
  EXPECT_EQ(o->llm.base_url, "http://gpu-box:11434");
  EXPECT_TRUE(LlmGeneratorOptionsFor("openai:m", {{"protocol", "openai"}}).ok());
  EXPECT_THAT(
      std::string(LlmGeneratorOptionsFor("openai:m", {{"model", "other"}}).status().message()),
      HasSubstr("its name says model m"));
  EXPECT_FALSE(LlmGeneratorOptionsFor("builtin", {}).ok());
}

TEST(LlmGeneratorOptionsTest, GeneratorNames) {
  LlmConfig c;
  ASSERT_TRUE(ParseGeneratorName("ollama:codellama:70b", &c).ok());
  EXPECT_EQ(c.protocol, LlmProtocol::kOllama);
  EXPECT_EQ(c.model, "codellama:70b");
  EXPECT_FALSE(ParseGeneratorName("gpt-4o", &c).ok());
  EXPECT_FALSE(ParseGeneratorName("gemini:pro", &c).ok());
  EXPECT_FALSE(ParseGeneratorName("openai:", &c).ok());
}

}  // namespace
}  // namespace rvd::tune

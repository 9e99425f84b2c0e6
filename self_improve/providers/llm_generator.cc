#include "self_improve/providers/llm_generator.h"

#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "nlohmann/json.hpp"
#include "self_improve/prompts/prompts.h"
#include "self_improve/providers/kernel_extract.h"
#include "spdlog/spdlog.h"

namespace rvd::tune {
namespace {

constexpr size_t kMaxDescriptionChars = 200;

using Role = ChatMessage::Role;

bool IsCancelled(const CandidateRequest& r) {
  return r.cancelled != nullptr && r.cancelled->load(std::memory_order_relaxed);
}

// Text outside fenced blocks, line by line, until the first fence.
std::vector<absl::string_view> ProseLines(absl::string_view text) {
  std::vector<absl::string_view> lines;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    const absl::string_view s = absl::StripLeadingAsciiWhitespace(line);
    if (absl::StartsWith(s, "```") || absl::StartsWith(s, "~~~")) break;
    lines.push_back(s);
  }
  return lines;
}

// The value of the first prose line "<key>: value" (markdown bold allowed),
// collapsed to one line and cut; "" when there is none.
std::string LineValue(absl::string_view text, absl::string_view key) {
  for (absl::string_view line : ProseLines(text)) {
    std::string plain = absl::StrReplaceAll(line, {{"*", ""}, {"`", ""}});
    absl::string_view s = absl::StripLeadingAsciiWhitespace(plain);
    if (!absl::StartsWithIgnoreCase(s, key)) continue;
    s.remove_prefix(key.size());
    if (!absl::ConsumePrefix(&s, ":")) continue;
    std::string value = absl::StrJoin(
        absl::StrSplit(absl::StripAsciiWhitespace(s), absl::ByAnyChar(" \t\r"), absl::SkipEmpty()),
        " ");
    if (value.size() > kMaxDescriptionChars) value = value.substr(0, kMaxDescriptionChars) + "...";
    return value;
  }
  return "";
}

// The analysis reply's JSON object, checked and turned into the text the
// suggestion prompt shows; DATA_LOSS when it is not what was asked for.
absl::StatusOr<std::string> ReadAnalysis(absl::string_view text) {
  std::string body;
  for (const FencedBlock& b : FindFencedBlocks(text)) {
    if (b.info == "json" || b.info.empty()) {
      body = b.body;
      break;
    }
  }
  if (body.empty()) {
    const size_t open = text.find('{'), close = text.rfind('}');
    if (open != absl::string_view::npos && close != absl::string_view::npos && close > open) {
      body = std::string(text.substr(open, close - open + 1));
    }
  }
  const nlohmann::json j = nlohmann::json::parse(body, nullptr, false);
  auto text_at = [&](const char* key) -> std::string {
    if (!j.is_object() || !j.contains(key) || !j[key].is_string()) return "";
    return j[key].get<std::string>();
  };
  const std::string primary = text_at("primary_bottleneck");
  bool known = false;
  for (Bottleneck b : {Bottleneck::kCompute, Bottleneck::kMemoryBandwidth,
                       Bottleneck::kMemoryLatency, Bottleneck::kOccupancy, Bottleneck::kMixed}) {
    known = known || primary == BottleneckName(b);
  }
  const std::string cause = text_at("root_cause");
  const std::string change = text_at("highest_impact_optimization");
  if (!known || cause.empty() || change.empty()) {
    return WithLlmErrorKind(
        absl::DataLossError("the analysis is not the JSON object asked for (primary_bottleneck "
                            "one of the classes, root_cause, highest_impact_optimization)"),
        LlmErrorKind::kMalformed);
  }
  std::string speedup;
  if (j.contains("estimated_speedup") && j["estimated_speedup"].is_number()) {
    speedup = absl::StrFormat(" (estimated speedup %.2fx)", j["estimated_speedup"].get<double>());
  }
  return absl::StrCat("Primary bottleneck: ", primary, speedup, "\nRoot cause: ", cause,
                      "\nHighest-impact optimization: ", change);
}

std::string Fenced(absl::string_view source) {
  return absl::StrCat("```cuda\n", source, absl::EndsWith(source, "\n") ? "" : "\n", "```");
}

class LlmGenerator : public Generator {
 public:
  LlmGenerator(LlmGeneratorOptions options, std::unique_ptr<LlmProvider> provider)
      : options_(std::move(options)), provider_(std::move(provider)) {}

  std::string Name() const override { return provider_->Name(); }

  absl::StatusOr<Candidate> Generate(const CandidateRequest& request) override {
    if (IsCancelled(request)) return absl::CancelledError("llm: cancelled");
    absl::StatusOr<Candidate> c = request.attempt > 0 && !request.failed_source.empty()
                                      ? FixCompileError(request)
                                      : Suggest(request);
    if (!c.ok()) {
      spdlog::warn("llm {}: iteration {} attempt {}: no candidate ({}): {}", Name(),
                   request.iteration, request.attempt, LlmErrorKindName(LlmErrorKindOf(c.status())),
                   std::string(c.status().message()));
      // OUT_OF_RANGE would end the job as "exhausted"; a model can be asked again.
      if (c.status().code() == absl::StatusCode::kOutOfRange) {
        return WithLlmErrorKind(absl::UnknownError(c.status().message()),
                                LlmErrorKindOf(c.status()));
      }
      return c;
    }
    spdlog::info("llm {}: iteration {} attempt {}: candidate \"{}\" ({} chars)", Name(),
                 request.iteration, request.attempt, c->description, c->source.size());
    return c;
  }

 private:
  absl::StatusOr<ChatReply> Ask(const CandidateRequest& r, std::vector<ChatMessage> messages) {
    ChatRequest chat;
    chat.system = std::string(PromptText(PromptTemplate::kSystem));
    chat.messages = std::move(messages);
    chat.cancelled = r.cancelled;
    return provider_->Chat(chat);
  }

  // Step 1: the model's analysis, or "" when its reply is not usable.
  // Errors: the provider's (a model that cannot be reached for the
  // analysis will not be for the kernel either).
  absl::StatusOr<std::string> Analyze(const CandidateRequest& r) {
    absl::StatusOr<std::string> prompt = AnalyzeBottleneckPrompt(r);
    if (!prompt.ok()) return prompt.status();
    absl::StatusOr<ChatReply> reply = Ask(r, {{Role::kUser, *prompt}});
    if (!reply.ok()) return reply.status();
    absl::StatusOr<std::string> analysis = ReadAnalysis(reply->text);
    if (!analysis.ok()) {
      spdlog::warn("llm {}: iteration {}: {}; the classification alone goes on", Name(),
                   r.iteration, std::string(analysis.status().message()));
      return std::string();
    }
    return analysis;
  }

  // The kernel in `reply`, with its description; kNoCode, kTruncated or
  // kWrongKernel (a launch annotation ParseLaunchAnnotation refuses too).
  absl::StatusOr<Candidate> Usable(const CandidateRequest& r, const ChatReply& reply) {
    KernelExtractOptions extract;
    extract.signature = r.signature;
    extract.truncated = reply.truncated;
    absl::StatusOr<std::string> source = ExtractKernelSource(reply.text, extract);
    if (!source.ok()) return source.status();
    absl::StatusOr<CandidateLaunch> launch = ParseLaunchAnnotation(*source);
    if (!launch.ok()) {
      return WithLlmErrorKind(absl::InvalidArgumentError(launch.status().message()),
                              LlmErrorKind::kWrongKernel);
    }
    Candidate c;
    c.source = *std::move(source);
    c.description = LineValue(reply.text, "Technique");
    if (c.description.empty())
      c.description = absl::StrCat("LLM candidate, iteration ", r.iteration);
    return c;
  }

  // Asks with `messages`, and again (max_format_retries times) with what
  // was wrong when the reply has no usable kernel.
  absl::StatusOr<Candidate> AskForKernel(const CandidateRequest& r,
                                         std::vector<ChatMessage> messages) {
    for (int turn = 0;; ++turn) {
      absl::StatusOr<ChatReply> reply = Ask(r, messages);
      if (!reply.ok()) return reply.status();
      absl::StatusOr<Candidate> c = Usable(r, *reply);
      if (c.ok()) return c;
      const LlmErrorKind kind = LlmErrorKindOf(c.status());
      const bool fixable = kind == LlmErrorKind::kNoCode || kind == LlmErrorKind::kWrongKernel ||
                           kind == LlmErrorKind::kTruncated;
      if (!fixable || turn >= options_.max_format_retries) return c.status();
      spdlog::warn("llm {}: iteration {}: unusable reply ({}); asking again", Name(), r.iteration,
                   std::string(c.status().message()));
      absl::StatusOr<std::string> again = WrongAnswerPrompt(r, c.status().message());
      if (!again.ok()) return again.status();
      messages.push_back({Role::kAssistant, reply->text});
      messages.push_back({Role::kUser, *std::move(again)});
    }
  }

  // Step 3: the model reviews `c`; a usable reviewed kernel replaces it.
  // Only cancellation is an error (a failed review keeps the candidate).
  absl::Status Review(const CandidateRequest& r, Candidate* c) {
    absl::StatusOr<std::string> prompt = VerifyCorrectnessPrompt(r, c->source);
    if (!prompt.ok()) return prompt.status();
    absl::StatusOr<ChatReply> reply = Ask(r, {{Role::kUser, *prompt}});
    if (!reply.ok()) {
      if (reply.status().code() == absl::StatusCode::kCancelled) return reply.status();
      spdlog::warn("llm {}: iteration {}: self-review failed ({}); the candidate stays as it was",
                   Name(), r.iteration, std::string(reply.status().message()));
      return absl::OkStatus();
    }
    absl::StatusOr<Candidate> reviewed = Usable(r, *reply);
    if (!reviewed.ok()) {
      spdlog::warn("llm {}: iteration {}: self-review unusable ({}); the candidate stays as it was",
                   Name(), r.iteration, std::string(reviewed.status().message()));
      return absl::OkStatus();
    }
    const std::string verdict = LineValue(reply->text, "Verdict");
    // "unchanged" keeps the candidate as it was, even if the copy differs
    // (a reformatting is not a fix the review stands behind).
    if (absl::StartsWithIgnoreCase(verdict, "unchanged")) return absl::OkStatus();
    if (reviewed->source != c->source) {
      absl::string_view fixed = verdict;
      absl::ConsumePrefix(&fixed, "fixed");
      absl::ConsumePrefix(&fixed, ":");
      fixed = absl::StripAsciiWhitespace(fixed);
      absl::StrAppend(&c->description, " (self-review: ", fixed.empty() ? "changed" : fixed, ")");
      c->source = std::move(reviewed->source);
    }
    return absl::OkStatus();
  }

  absl::StatusOr<Candidate> Suggest(const CandidateRequest& r) {
    std::string analysis;
    if (options_.analyze) {
      absl::StatusOr<std::string> a = Analyze(r);
      if (!a.ok()) return a.status();
      analysis = *std::move(a);
    }
    analysis_iteration_ = r.iteration;
    analysis_ = analysis;
    absl::StatusOr<std::string> prompt = SuggestOptimizationPrompt(r, analysis);
    if (!prompt.ok()) return prompt.status();
    absl::StatusOr<Candidate> c = AskForKernel(r, {{Role::kUser, *std::move(prompt)}});
    if (!c.ok()) return c;
    if (options_.self_review) {
      if (absl::Status s = Review(r, &*c); !s.ok()) return s;
    }
    return c;
  }

  // The compiler's log as the next turn after the iteration's suggestion
  // (rebuilt from the request: the same prompt, the failed source as the
  // model's answer). No self-review: the compiler has just reviewed it.
  absl::StatusOr<Candidate> FixCompileError(const CandidateRequest& r) {
    const std::string analysis = analysis_iteration_ == r.iteration ? analysis_ : "";
    absl::StatusOr<std::string> suggest = SuggestOptimizationPrompt(r, analysis);
    if (!suggest.ok()) return suggest.status();
    absl::StatusOr<std::string> log = CompileErrorPrompt(r);
    if (!log.ok()) return log.status();
    std::vector<ChatMessage> messages = {{Role::kUser, *std::move(suggest)},
                                         {Role::kAssistant, Fenced(r.failed_source)},
                                         {Role::kUser, *std::move(log)}};
    return AskForKernel(r, std::move(messages));
  }

  const LlmGeneratorOptions options_;
  const std::unique_ptr<LlmProvider> provider_;
  int analysis_iteration_ = -1;  // the iteration analysis_ was made for
  std::string analysis_;
};

absl::Status BadSetting(absl::string_view key, absl::string_view value, absl::string_view want) {
  return absl::InvalidArgumentError(
      absl::StrCat("llm generator: ", key, " \"", value, "\" is not ", want));
}

}  // namespace

absl::Status ParseGeneratorName(absl::string_view name, LlmConfig* config) {
  const size_t colon = name.find(':');
  if (colon == absl::string_view::npos || colon + 1 == name.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "llm generator: \"", name, "\" is not PROTOCOL:MODEL (openai:, anthropic:, ollama:)"));
  }
  absl::StatusOr<LlmProtocol> protocol = ParseLlmProtocol(name.substr(0, colon));
  if (!protocol.ok()) return protocol.status();
  config->protocol = *protocol;
  config->model = std::string(name.substr(colon + 1));
  return absl::OkStatus();
}

absl::StatusOr<LlmGeneratorOptions> ParseLlmGeneratorOptions(
    const std::map<std::string, std::string>& settings) {
  LlmGeneratorOptions o;
  LlmConfig& c = o.llm;
  for (const auto& [key, value] : settings) {
    double d = 0;
    int i = 0;
    bool b = false;
    if (key == "protocol") {
      absl::StatusOr<LlmProtocol> p = ParseLlmProtocol(value);
      if (!p.ok()) return p.status();
      c.protocol = *p;
    } else if (key == "model") {
      c.model = value;
    } else if (key == "base_url") {
      c.base_url = value;
    } else if (key == "api_key_env") {
      c.api_key_env = value;
    } else if (key == "connect_timeout_seconds" || key == "request_timeout_seconds") {
      if (!absl::SimpleAtod(value, &d) || !(d > 0)) return BadSetting(key, value, "> 0");
      (key == "connect_timeout_seconds" ? c.connect_timeout : c.request_timeout) = absl::Seconds(d);
    } else if (key == "max_tokens") {
      if (!absl::SimpleAtoi(value, &i) || i < 1) return BadSetting(key, value, "an integer >= 1");
      c.max_tokens = i;
    } else if (key == "temperature") {
      if (value.empty()) {
        c.temperature.reset();
      } else if (!absl::SimpleAtod(value, &d) || d < 0 || d > 2) {
        return BadSetting(key, value, "in [0, 2] or \"\"");
      } else {
        c.temperature = d;
      }
    } else if (key == "max_attempts") {
      if (!absl::SimpleAtoi(value, &i) || i < 1 || i > 10) {
        return BadSetting(key, value, "an integer in [1, 10]");
      }
      c.max_attempts = i;
    } else if (key == "max_format_retries") {
      if (!absl::SimpleAtoi(value, &i) || i < 0 || i > 5) {
        return BadSetting(key, value, "an integer in [0, 5]");
      }
      o.max_format_retries = i;
    } else if (key == "openai_max_completion_tokens" || key == "analyze" || key == "self_review") {
      if (!absl::SimpleAtob(value, &b)) return BadSetting(key, value, "true or false");
      (key == "analyze"       ? o.analyze
       : key == "self_review" ? o.self_review
                              : c.openai_max_completion_tokens) = b;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("llm generator: unknown setting \"", key, "\""));
    }
  }
  if (c.model.empty()) return absl::InvalidArgumentError("llm generator: no model");
  return o;
}

absl::StatusOr<LlmGeneratorOptions> LlmGeneratorOptionsFor(
    absl::string_view name, const std::map<std::string, std::string>& settings) {
  LlmConfig named;
  if (absl::Status s = ParseGeneratorName(name, &named); !s.ok()) return s;
  std::map<std::string, std::string> all = settings;
  for (const auto& [key, value] :
       {std::pair<std::string, std::string>{"protocol", LlmProtocolName(named.protocol)},
        std::pair<std::string, std::string>{"model", named.model}}) {
    auto [it, fresh] = all.try_emplace(key, value);
    if (!fresh && it->second != value) {
      return absl::InvalidArgumentError(absl::StrCat("llm generator ", name, ": its name says ",
                                                     key, " ", value, ", its settings ",
                                                     it->second));
    }
  }
  return ParseLlmGeneratorOptions(all);
}

absl::StatusOr<std::unique_ptr<Generator>> NewLlmGenerator(
    const LlmGeneratorOptions& options, std::unique_ptr<HttpTransport> transport) {
  if (options.max_format_retries < 0) {
    return absl::InvalidArgumentError("llm generator: max_format_retries < 0");
  }
  absl::StatusOr<std::unique_ptr<LlmProvider>> provider =
      NewLlmProvider(options.llm, std::move(transport));
  if (!provider.ok()) return provider.status();
  return std::make_unique<LlmGenerator>(options, *std::move(provider));
}

}  // namespace rvd::tune

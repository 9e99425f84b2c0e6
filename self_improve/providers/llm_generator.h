// The LLM generator (self_improve/providers/, public to the worker): a
// Generator (generator.h) that asks a chat model for each candidate, with
// seed 000's prompts (self_improve/prompts/):
//   1. analyze_bottleneck.md (optional): the model's reading of the profile,
//      a JSON object; a reply that is not one is logged and the
//      classification alone goes on;
//   2. suggest_optimization.md: the kernel; a reply without a usable kernel
//      (no code block, the entry missing or changed, host code, no valid
//      launch annotation) is answered once with what was wrong
//      (max_format_retries) before the iteration fails;
//   3. verify_correctness.md (optional): the model reviews its kernel
//      before it is compiled; a usable reviewed kernel replaces it, an
//      unusable review keeps it.
// A compile-error retry (request.attempt > 0) is one turn after the
// iteration's suggestion: the failed source as the model's answer, the
// compiler's log as the next message (compile_error.md).
//
// Errors: the provider's and the extraction's statuses (LlmErrorKindOf
// tells them apart), CANCELLED; never OUT_OF_RANGE (a model can always be
// asked again, so an LLM job ends by its budget, never as "exhausted").
//
// Thread-safety: as a Generator, one job's thread at a time.
#ifndef RVD_SELF_IMPROVE_PROVIDERS_LLM_GENERATOR_H_
#define RVD_SELF_IMPROVE_PROVIDERS_LLM_GENERATOR_H_

#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "self_improve/generator.h"
#include "self_improve/providers/llm_provider.h"

namespace rvd::tune {

struct LlmGeneratorOptions {
  LlmConfig llm;
  bool analyze = true;         // step 1
  bool self_review = true;     // step 3
  int max_format_retries = 1;  // step 2's follow-ups for an unusable reply
};

// The options from flat key/value settings (a config file section or an
// API request's map): protocol (openai|anthropic|ollama), model, base_url,
// api_key_env, connect_timeout_seconds, request_timeout_seconds,
// max_tokens, temperature ("" for the server's default), max_attempts,
// openai_max_completion_tokens, analyze, self_review, max_format_retries.
// INVALID_ARGUMENT naming an unknown key or a bad value; model is required.
absl::StatusOr<LlmGeneratorOptions> ParseLlmGeneratorOptions(
    const std::map<std::string, std::string>& settings);

// "openai:gpt-4o" -> protocol openai, model gpt-4o (the model may itself
// hold colons: "ollama:codellama:70b"). INVALID_ARGUMENT otherwise.
absl::Status ParseGeneratorName(absl::string_view name, LlmConfig* config);

// The options of the generator registered as `name` ("anthropic:claude-x",
// the job's JobSpec::generator) with `settings` for the rest: the name
// gives the protocol and the model, which settings may repeat but not
// contradict. For the worker's table of generators by name:
//   generators[name] = [o](const JobSpec&) { return NewLlmGenerator(o); };
absl::StatusOr<LlmGeneratorOptions> LlmGeneratorOptionsFor(
    absl::string_view name, const std::map<std::string, std::string>& settings);

// NewLlmProvider's checks (the key's variable, the URL); `transport` null:
// libcurl.
absl::StatusOr<std::unique_ptr<Generator>> NewLlmGenerator(
    const LlmGeneratorOptions& options, std::unique_ptr<HttpTransport> transport = nullptr);

}  // namespace rvd::tune

#endif  // RVD_SELF_IMPROVE_PROVIDERS_LLM_GENERATOR_H_

// rvd_tune_llm_probe: one LLM generator turn against a real model, by hand
// (a development tool, not installed): the naive starting kernel of the
// built-in space as the current best, nothing measured, the prompts and
// the reply filter of the worker. Prints the candidate's description and
// source, or the error with its kind. Exit 0 with a candidate, 1 without,
// 2 on a bad command line.
//
//   rvd_tune_llm_probe anthropic:claude-sonnet-4-5
//   rvd_tune_llm_probe openai:gpt-4o analyze=false self_review=false
//   rvd_tune_llm_probe ollama:qwen2.5-coder:32b base_url=http://gpu-box:11434
//
// Settings are LlmGeneratorOptionsFor's (llm_generator.h); keys come from
// the environment (OPENAI_API_KEY, ANTHROPIC_API_KEY, api_key_env=NAME).
#include <iostream>
#include <map>
#include <string>

#include "self_improve/generator.h"
#include "self_improve/providers/llm_generator.h"
#include "self_improve/space.h"

int main(int argc, char** argv) {
  using namespace rvd::tune;  // NOLINT: a small tool
  if (argc < 2) {
    std::cerr << "usage: " << argv[0] << " PROTOCOL:MODEL [key=value ...]\n";
    return 2;
  }
  std::map<std::string, std::string> settings;
  for (int i = 2; i < argc; ++i) {
    const std::string kv = argv[i];
    const size_t eq = kv.find('=');
    if (eq == std::string::npos) {
      std::cerr << "not key=value: " << kv << "\n";
      return 2;
    }
    settings[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  absl::StatusOr<LlmGeneratorOptions> options = LlmGeneratorOptionsFor(argv[1], settings);
  if (!options.ok()) {
    std::cerr << options.status() << "\n";
    return 2;
  }
  absl::StatusOr<std::unique_ptr<Generator>> generator = NewLlmGenerator(*options);
  if (!generator.ok()) {
    std::cerr << generator.status() << "\n";
    return 2;
  }
  CandidateRequest request;
  request.target.dtype = rvd::DType::kBF16;
  request.target.shape_class = "wide";
  request.target.arch = "sm_90a";
  request.target.shapes = {{480, 128, 4096}};
  request.iteration = 1;
  absl::StatusOr<Candidate> best = Emit(NaivePoint(), request.target.dtype);
  if (!best.ok()) {
    std::cerr << best.status() << "\n";
    return 1;
  }
  request.best_source = best->source;
  request.best_description = best->description;
  absl::StatusOr<Candidate> c = (*generator)->Generate(request);
  if (!c.ok()) {
    std::cout << "no candidate (" << LlmErrorKindName(LlmErrorKindOf(c.status()))
              << "): " << c.status() << "\n";
    return 1;
  }
  std::cout << "description: " << c->description << "\n\n" << c->source;
  return 0;
}

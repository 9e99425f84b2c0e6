// The LLM generators' prompts (self_improve/prompts/): seed 000's three
// templates (analyze_bottleneck.md, suggest_optimization.md with the
// technique menu, verify_correctness.md, the self-review before compiling),
// the compile-error and wrong-answer follow-ups and the system prompt,
// compiled in; and their
// assembly from a CandidateRequest: the target, the profile, the
// bottleneck, the signature to keep, the history.
//
// The contract and the types a candidate receives are quoted from rvd's own
// sources, compiled in with the templates (generator.h's comment,
// kernels/cuda/descriptors.h's MatrixDesc, candidate_abi.h's TuneJob, the
// block reduction of kernels/cuda/block_sums.cuh), so
// the prompt says what the harness checks and cannot drift from it.
//
// Thread-safe: pure functions over constant data.
#ifndef RVD_SELF_IMPROVE_PROMPTS_PROMPTS_H_
#define RVD_SELF_IMPROVE_PROMPTS_PROMPTS_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "self_improve/generator.h"
#include "self_improve/profile.h"

namespace rvd::tune {

enum class PromptTemplate {
  kSystem,               // system.md
  kAnalyzeBottleneck,    // analyze_bottleneck.md
  kSuggestOptimization,  // suggest_optimization.md
  kVerifyCorrectness,    // verify_correctness.md
  kCompileError,         // compile_error.md
  kWrongAnswer,          // wrong_answer.md
};
const char* PromptFileName(PromptTemplate t);
// The template's text as compiled in.
absl::string_view PromptText(PromptTemplate t);

// `tmpl` with each {{name}} (name: [a-z_]+) replaced by vars[name], in one
// pass: a value is inserted as it is and never scanned for placeholders
// (a kernel or a log holding "{{x}}" stays as it is). INVALID_ARGUMENT
// naming a placeholder without a value, a value no placeholder takes (a
// misspelt name), or a "{{" that does not open a well-formed placeholder.
absl::StatusOr<std::string> RenderPrompt(absl::string_view tmpl,
                                         const std::map<std::string, std::string>& vars);

// The pieces, as the templates show them.
std::string FormatTarget(const TuneTarget& target);
std::string FormatProfile(const KernelProfile& profile);
std::string FormatClassification(const BottleneckReport& report);
// A Markdown table of the job's earlier candidates, oldest first.
std::string FormatHistory(const std::vector<HistoryEntry>& history);
// The per-job contract, from generator.h's comment.
std::string CandidateContract();
// MatrixDesc and TuneJob as rvd declares them, in their namespaces.
std::string CandidateAbi();
// "__nv_bfloat16", "__half", "float".
const char* ElementType(DType dtype);

// The whole prompts (user messages; PromptText(kSystem) is the system one).
absl::StatusOr<std::string> AnalyzeBottleneckPrompt(const CandidateRequest& request);
// `analysis`: the model's analysis of the bottleneck (or "" to use the
// classification alone).
absl::StatusOr<std::string> SuggestOptimizationPrompt(const CandidateRequest& request,
                                                      absl::string_view analysis);
absl::StatusOr<std::string> VerifyCorrectnessPrompt(const CandidateRequest& request,
                                                    absl::string_view candidate);
// The retry's follow-up: request.compile_log for request.target.arch.
absl::StatusOr<std::string> CompileErrorPrompt(const CandidateRequest& request);
// The follow-up to a reply without a usable kernel: what was wrong with it.
absl::StatusOr<std::string> WrongAnswerPrompt(const CandidateRequest& request,
                                              absl::string_view error);

}  // namespace rvd::tune

#endif  // RVD_SELF_IMPROVE_PROMPTS_PROMPTS_H_

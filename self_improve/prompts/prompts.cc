#include "self_improve/prompts/prompts.h"

#include <algorithm>
#include <set>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "kernels/pr_check.h"
#include "self_improve/prompts/embedded.h"
#include "self_improve/providers/kernel_extract.h"

namespace rvd::tune {
namespace {

// A compiler log longer than this is cut (its first errors are the ones
// that matter; the rest are often consequences).
constexpr size_t kMaxCompileLogChars = 8000;

absl::string_view Embedded(absl::string_view name) {
  for (int i = 0; i < internal::kEmbeddedFileCount; ++i) {
    if (name == internal::kEmbeddedFiles[i].name) return internal::kEmbeddedFiles[i].text;
  }
  return {};
}

// The declaration `opening` ("struct MatrixDesc {") through its "};", with
// the comment lines right above it; "" when absent.
std::string Declaration(absl::string_view text, absl::string_view opening) {
  const size_t at = text.find(opening);
  if (at == absl::string_view::npos) return "";
  const size_t end = text.find("\n};", at);
  if (end == absl::string_view::npos) return "";
  size_t begin = text.rfind('\n', at);
  begin = begin == absl::string_view::npos ? 0 : begin + 1;
  // Take the comment lines above, up to a blank or code line.
  while (begin > 0) {
    const size_t prev = text.rfind('\n', begin - 2);
    const size_t start = prev == absl::string_view::npos ? 0 : prev + 1;
    if (!absl::StartsWith(absl::StripLeadingAsciiWhitespace(text.substr(start, begin - start)),
                          "//")) {
      break;
    }
    begin = start;
  }
  return std::string(text.substr(begin, end + 3 - begin));
}

std::string Percent(const std::optional<double>& v) {
  return v ? absl::StrFormat("%.1f%%", *v) : "n/a";
}

// A table cell: one line, no column separator.
std::string Cell(absl::string_view text) {
  std::string s = absl::StrReplaceAll(text, {{"\n", " "}, {"\r", " "}, {"|", "\\|"}});
  return std::string(absl::StripAsciiWhitespace(s));
}

std::string BottleneckNames() {
  std::vector<std::string> names;
  for (Bottleneck b : {Bottleneck::kCompute, Bottleneck::kMemoryBandwidth,
                       Bottleneck::kMemoryLatency, Bottleneck::kOccupancy, Bottleneck::kMixed}) {
    names.emplace_back(BottleneckName(b));
  }
  return absl::StrJoin(names, ", ");
}

// The headers a candidate may include, as kernel_extract allows them.
std::string AllowedIncludes() {
  std::vector<std::string> names;
  for (const std::string& h : KernelExtractOptions().allowed_includes) {
    names.push_back(absl::StrCat("`", h, absl::EndsWith(h, "/") ? "...`" : "`"));
  }
  return absl::StrJoin(names, ", ");
}

std::string AnnotationExample() {
  CandidateLaunch launch;
  launch.threads = 256;
  launch.smem = 65536;
  launch.tile_rows = 128;
  launch.tile_cols = 128;
  return FormatLaunchAnnotation(launch);
}

}  // namespace

const char* PromptFileName(PromptTemplate t) {
  switch (t) {
    case PromptTemplate::kSystem:
      return "system.md";
    case PromptTemplate::kAnalyzeBottleneck:
      return "analyze_bottleneck.md";
    case PromptTemplate::kSuggestOptimization:
      return "suggest_optimization.md";
    case PromptTemplate::kVerifyCorrectness:
      return "verify_correctness.md";
    case PromptTemplate::kCompileError:
      return "compile_error.md";
    case PromptTemplate::kWrongAnswer:
      return "wrong_answer.md";
  }
  return "";
}

absl::string_view PromptText(PromptTemplate t) { return Embedded(PromptFileName(t)); }

absl::StatusOr<std::string> RenderPrompt(absl::string_view tmpl,
                                         const std::map<std::string, std::string>& vars) {
  std::string out;
  std::set<std::string> used;
  size_t pos = 0;
  for (;;) {
    const size_t open = tmpl.find("{{", pos);
    if (open == absl::string_view::npos) {
      absl::StrAppend(&out, tmpl.substr(pos));
      break;
    }
    absl::StrAppend(&out, tmpl.substr(pos, open - pos));
    const size_t close = tmpl.find("}}", open + 2);
    const absl::string_view name = close == absl::string_view::npos
                                       ? absl::string_view()
                                       : tmpl.substr(open + 2, close - open - 2);
    const bool well_formed = !name.empty() && std::all_of(name.begin(), name.end(), [](char c) {
      return (c >= 'a' && c <= 'z') || c == '_';
    });
    if (!well_formed) {
      return absl::InvalidArgumentError(
          absl::StrCat("prompt: a \"{{\" that opens no placeholder at offset ", open, ": \"",
                       tmpl.substr(open, 24), "\""));
    }
    auto it = vars.find(std::string(name));
    if (it == vars.end()) {
      return absl::InvalidArgumentError(absl::StrCat("prompt: no value for {{", name, "}}"));
    }
    out.append(it->second);
    used.insert(it->first);
    pos = close + 2;
  }
  for (const auto& [name, value] : vars) {
    if (!used.count(name)) {
      return absl::InvalidArgumentError(absl::StrCat("prompt: the template has no {{", name, "}}"));
    }
  }
  return out;
}

const char* ElementType(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "float";
    case DType::kF16:
      return "__half";
    case DType::kBF16:
      return "__nv_bfloat16";
  }
  return "?";
}

std::string FormatTarget(const TuneTarget& t) {
  std::vector<std::string> shapes;
  for (const TuneShape& s : t.shapes) {
    shapes.push_back(absl::StrFormat("%d x %dx%d (Gram side %d, long side %d%s)", s.count, s.rows,
                                     s.cols, std::min(s.rows, s.cols), std::max(s.rows, s.cols),
                                     s.rows > s.cols ? ", tall: G = W^T W" : ""));
  }
  return absl::StrCat(
      "- registry entry: variant ", t.variant, ", dtype ", DTypeName(t.dtype), " (elements ",
      ElementType(t.dtype), "), shape class ", t.shape_class, "\n- architecture: ", t.arch,
      "\n- timed and checked on: ", shapes.empty() ? "(no shapes)" : absl::StrJoin(shapes, "; "));
}

std::string FormatProfile(const KernelProfile& p) {
  std::vector<std::string> lines;
  if (p.seconds <= 0) {
    lines.push_back("- not timed yet");
  } else {
    lines.push_back(
        absl::StrFormat("- one launch over the batch: %.2f us (median)", p.seconds * 1e6));
    if (p.bytes > 0) {
      lines.push_back(absl::StrFormat(
          "- memory: %.1f MB read, %.1f GB/s%s", p.bytes / 1e6, p.BytesPerSecond() / 1e9,
          p.peak_bytes_per_second > 0
              ? absl::StrFormat(" = %.1f%% of the measured %.0f GB/s",
                                100 * p.BytesPerSecond() / p.peak_bytes_per_second,
                                p.peak_bytes_per_second / 1e9)
              : ""));
    }
    if (p.flops > 0) {
      lines.push_back(absl::StrFormat(
          "- compute: %.2f GFLOP useful, %.1f TFLOP/s%s", p.flops / 1e9, p.FlopsPerSecond() / 1e12,
          p.peak_flops_per_second > 0
              ? absl::StrFormat(" = %.1f%% of the measured %.0f TFLOP/s",
                                100 * p.FlopsPerSecond() / p.peak_flops_per_second,
                                p.peak_flops_per_second / 1e12)
              : ""));
    }
    if (p.bytes > 0 && p.flops > 0 && p.peak_bytes_per_second > 0 && p.peak_flops_per_second > 0) {
      lines.push_back(absl::StrFormat(
          "- arithmetic intensity: %.1f flop/byte (ridge point %.1f); memory-bandwidth floor "
          "%.2f us",
          p.flops / p.bytes, p.peak_flops_per_second / p.peak_bytes_per_second,
          1e6 * p.bytes / p.peak_bytes_per_second));
    }
  }
  const NcuMetrics& n = p.ncu;
  if (!n.sm_throughput_pct && !n.sm_active_cycles_pct && !n.dram_throughput_pct &&
      !n.l2_hit_rate_pct && !n.l1_hit_rate_pct && !n.achieved_occupancy_pct &&
      !n.memory_stall_pct && !n.registers_per_thread) {
    lines.push_back("- Nsight Compute: not available for this run");
  } else {
    lines.push_back(absl::StrCat(
        "- Nsight Compute: SM throughput ", Percent(n.sm_throughput_pct), ", SM active cycles ",
        Percent(n.sm_active_cycles_pct), ", DRAM throughput ", Percent(n.dram_throughput_pct),
        ", L1 hit rate ", Percent(n.l1_hit_rate_pct), ", L2 hit rate ", Percent(n.l2_hit_rate_pct),
        ", achieved occupancy ", Percent(n.achieved_occupancy_pct),
        ", warp cycles stalled on memory ", Percent(n.memory_stall_pct), ", registers per thread ",
        n.registers_per_thread ? absl::StrCat(*n.registers_per_thread) : "n/a"));
  }
  return absl::StrJoin(lines, "\n");
}

std::string FormatClassification(const BottleneckReport& r) {
  std::string out = absl::StrCat("Classified as **", BottleneckName(r.bottleneck), "**");
  if (r.signals.empty()) return absl::StrCat(out, " (no signal above its threshold).");
  absl::StrAppend(&out, ", from:");
  for (const std::string& s : r.signals) absl::StrAppend(&out, "\n- ", s);
  return out;
}

std::string FormatHistory(const std::vector<HistoryEntry>& history) {
  if (history.empty()) return "Nothing yet: this is the job's first candidate.";
  std::string out =
      "| iteration | what was tried | verdict | time (us) | why |\n|---|---|---|---|---|";
  for (const HistoryEntry& h : history) {
    absl::StrAppend(&out, "\n| ", h.iteration, " | ", Cell(h.description), " | ",
                    VerdictName(h.verdict), " | ",
                    h.seconds > 0 ? absl::StrFormat("%.2f", h.seconds * 1e6) : "-", " | ",
                    Cell(h.reason), " |");
  }
  return out;
}

std::string CandidateContract() {
  // generator.h's comment from "A candidate is device code only" to the
  // paragraph before "Thread-safety", without the comment markers.
  const absl::string_view header = Embedded("generator.h");
  std::vector<std::string> lines;
  bool in = false;
  for (absl::string_view line : absl::StrSplit(header, '\n')) {
    if (!absl::ConsumePrefix(&line, "//")) {
      if (in) break;
      continue;
    }
    absl::ConsumePrefix(&line, " ");
    if (absl::StartsWith(line, "A candidate is device code only")) in = true;
    if (absl::StartsWith(line, "Thread-safety")) break;
    if (in) lines.emplace_back(line);
  }
  while (!lines.empty() && lines.back().empty()) lines.pop_back();
  return absl::StrJoin(lines, "\n");
}

std::string CandidateAbi() {
  const std::string matrix = Declaration(Embedded("descriptors.h"), "struct MatrixDesc {");
  const std::string job = Declaration(Embedded("candidate_abi.h"), "struct TuneJob {");
  if (matrix.empty() || job.empty()) return "";
  return absl::StrCat("namespace rvd::cuda {\n", matrix, "\n}  // namespace rvd::cuda\n\n",
                      "namespace rvd::tune {\n", job, "\n}  // namespace rvd::tune");
}

absl::StatusOr<std::string> AnalyzeBottleneckPrompt(const CandidateRequest& r) {
  return RenderPrompt(PromptText(PromptTemplate::kAnalyzeBottleneck),
                      {{"target", FormatTarget(r.target)},
                       {"profile", FormatProfile(r.profile)},
                       {"classification", FormatClassification(r.bottleneck)},
                       {"source", r.best_source},
                       {"bottleneck_names", BottleneckNames()}});
}

absl::StatusOr<std::string> SuggestOptimizationPrompt(const CandidateRequest& r,
                                                      absl::string_view analysis) {
  std::string bottleneck = FormatClassification(r.bottleneck);
  if (!analysis.empty()) absl::StrAppend(&bottleneck, "\n\nAnalysis:\n", analysis);
  return RenderPrompt(
      PromptText(PromptTemplate::kSuggestOptimization),
      {{"target", FormatTarget(r.target)},
       {"contract", CandidateContract()},
       {"abi", CandidateAbi()},
       {"element_type", ElementType(r.target.dtype)},
       {"signature", r.signature},
       {"annotation", AnnotationExample()},
       {"tolerance", absl::StrCat(kExactPrTolerance.rtol)},
       {"includes", AllowedIncludes()},
       {"block_sums", std::string(Embedded("block_sums.cuh"))},
       {"description", r.best_description.empty() ? "(no description)" : r.best_description},
       {"source", r.best_source},
       {"profile", FormatProfile(r.profile)},
       {"analysis", bottleneck},
       {"history", FormatHistory(r.history)}});
}

absl::StatusOr<std::string> VerifyCorrectnessPrompt(const CandidateRequest& r,
                                                    absl::string_view candidate) {
  return RenderPrompt(PromptText(PromptTemplate::kVerifyCorrectness),
                      {{"target", FormatTarget(r.target)},
                       {"contract", CandidateContract()},
                       {"abi", CandidateAbi()},
                       {"signature", r.signature},
                       {"candidate", std::string(candidate)}});
}

absl::StatusOr<std::string> CompileErrorPrompt(const CandidateRequest& r) {
  std::string log = r.compile_log;
  if (log.size() > kMaxCompileLogChars) {
    log = absl::StrCat(log.substr(0, kMaxCompileLogChars), "\n[... ",
                       log.size() - kMaxCompileLogChars, " more characters cut]");
  }
  return RenderPrompt(PromptText(PromptTemplate::kCompileError),
                      {{"arch", r.target.arch}, {"compile_log", log}, {"signature", r.signature}});
}

absl::StatusOr<std::string> WrongAnswerPrompt(const CandidateRequest& r, absl::string_view error) {
  return RenderPrompt(PromptText(PromptTemplate::kWrongAnswer),
                      {{"error", std::string(error)}, {"signature", r.signature}});
}

}  // namespace rvd::tune

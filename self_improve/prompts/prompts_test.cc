// The prompts: templates compiled in byte for byte, the placeholder
// substitution and its errors, and each assembled prompt carrying what the
// generator must see (the signature, the profile's numbers, the
// bottleneck, the history, the contract and the types).
#include "self_improve/prompts/prompts.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace rvd::tune {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr PromptTemplate kAll[] = {PromptTemplate::kSystem,
                                   PromptTemplate::kAnalyzeBottleneck,
                                   PromptTemplate::kSuggestOptimization,
                                   PromptTemplate::kVerifyCorrectness,
                                   PromptTemplate::kCompileError,
                                   PromptTemplate::kWrongAnswer};

std::string ReadSource(const std::string& path) {
  std::ifstream in(std::string(RVD_SOURCE_DIR) + "/" + path, std::ios::binary);
  EXPECT_TRUE(in.good()) << path;
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

CandidateRequest Request() {
  CandidateRequest r;
  r.target.dtype = DType::kBF16;
  r.target.shape_class = "wide";
  r.target.arch = "sm_90a";
  r.target.shapes = {{480, 128, 4096}, {32, 1024, 4096}};
  r.iteration = 4;
  r.best_source = "// rvd-launch: threads=128 smem=0 tile_rows=0 tile_cols=0\nBEST_SOURCE_BODY\n";
  r.best_description = "naive: one block per matrix";
  r.profile.seconds = 250e-6;
  r.profile.bytes = 480.0 * 128 * 4096 * 2;
  r.profile.flops = 480.0 * 2 * 128 * 128 * 4096;
  r.profile.peak_bytes_per_second = 4.0e12;
  r.profile.peak_flops_per_second = 800e12;
  r.profile.ncu.dram_throughput_pct = 86.52;
  r.profile.ncu.achieved_occupancy_pct = 47.8;
  r.bottleneck.bottleneck = Bottleneck::kMemoryBandwidth;
  r.bottleneck.signals = {"DRAM at 86% of peak (> 80%)"};
  HistoryEntry a;
  a.iteration = 2;
  a.description = "float4 loads | unrolled";
  a.verdict = Verdict::kIncorrect;
  a.reason = "PR off by 3e-5 on\nthe power-law inputs";
  HistoryEntry b;
  b.iteration = 3;
  b.description = "128x128 tiles";
  b.verdict = Verdict::kSlower;
  b.reason = "1.2% faster, spread 2%";
  b.seconds = 240e-6;
  r.history = {a, b};
  return r;
}

TEST(PromptsTest, TemplatesAreCompiledInByteForByte) {
  for (PromptTemplate t : kAll) {
    EXPECT_EQ(PromptText(t), ReadSource(absl::StrCat("self_improve/prompts/", PromptFileName(t))))
        << PromptFileName(t);
  }
}

TEST(PromptsTest, RenderSubstitutesOncePerPlaceholder) {
  absl::StatusOr<std::string> s =
      RenderPrompt("a {{x}} b {{y_z}} c {{x}}", {{"x", "1"}, {"y_z", "{{x}}"}});
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(*s, "a 1 b {{x}} c 1");  // a value is never scanned again
}

TEST(PromptsTest, RenderErrors) {
  EXPECT_THAT(std::string(RenderPrompt("{{x}} {{y}}", {{"x", "1"}}).status().message()),
              HasSubstr("no value for {{y}}"));
  EXPECT_THAT(std::string(RenderPrompt("{{x}}", {{"x", "1"}, {"typo", "2"}}).status().message()),
              HasSubstr("no {{typo}}"));
  EXPECT_EQ(RenderPrompt("int a[] = {{1, 2}};", {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RenderPrompt("open {{x", {{"x", "1"}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(*RenderPrompt("no placeholders", {}), "no placeholders");
}

TEST(PromptsTest, SuggestOptimizationCarriesEverything) {
  const CandidateRequest r = Request();
  absl::StatusOr<std::string> p = SuggestOptimizationPrompt(r, "DRAM-bound: rows re-read per tile");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_THAT(*p, HasSubstr(kCandidateSignature));  // verbatim
  EXPECT_THAT(*p, HasSubstr("BEST_SOURCE_BODY"));
  EXPECT_THAT(*p, HasSubstr("naive: one block per matrix"));
  // The target and the profile's numbers.
  EXPECT_THAT(*p, HasSubstr("sm_90a"));
  EXPECT_THAT(*p, HasSubstr("480 x 128x4096 (Gram side 128, long side 4096)"));
  EXPECT_THAT(*p, HasSubstr("__nv_bfloat16"));
  EXPECT_THAT(*p, HasSubstr("250.00 us"));
  EXPECT_THAT(*p, HasSubstr("DRAM throughput 86.5%"));
  EXPECT_THAT(*p, HasSubstr("achieved occupancy 47.8%"));
  EXPECT_THAT(*p, HasSubstr("L2 hit rate n/a"));
  // The bottleneck, the analysis and the history.
  EXPECT_THAT(*p, HasSubstr("**memory_bandwidth**"));
  EXPECT_THAT(*p, HasSubstr("DRAM at 86% of peak (> 80%)"));
  EXPECT_THAT(*p, HasSubstr("DRAM-bound: rows re-read per tile"));
  EXPECT_THAT(*p,
              HasSubstr("| 2 | float4 loads \\| unrolled | incorrect | - | PR off by 3e-5 on the "
                        "power-law inputs |"));
  EXPECT_THAT(*p, HasSubstr("| 3 | 128x128 tiles | slower | 240.00 | 1.2% faster, spread 2% |"));
  // The technique menu, the tolerance, the contract and the types.
  for (const char* section : {"**memory_bandwidth**", "**compute**", "**occupancy**",
                              "**memory_latency**", "**mixed**"}) {
    EXPECT_THAT(*p, HasSubstr(section));
  }
  EXPECT_THAT(*p, HasSubstr("2e-06"));
  EXPECT_THAT(*p, HasSubstr("maxabs[j] = the largest |w| the job read"));
  EXPECT_THAT(*p, HasSubstr("struct MatrixDesc {"));
  EXPECT_THAT(*p, HasSubstr("struct TuneJob {"));
  EXPECT_THAT(*p, HasSubstr("int32_t diagonal;"));
  EXPECT_THAT(*p, HasSubstr("WriteBlockSums("));                // block_sums.cuh, quoted
  EXPECT_THAT(*p, HasSubstr("`kernels/cuda/block_sums.cuh`"));  // the includes allowed
  EXPECT_THAT(*p, HasSubstr("`cuda/std/...`"));
  EXPECT_THAT(*p, Not(HasSubstr("{{")));
}

TEST(PromptsTest, TheAnnotationExampleParses) {
  absl::StatusOr<std::string> p = SuggestOptimizationPrompt(Request(), "");
  ASSERT_TRUE(p.ok()) << p.status();
  for (absl::string_view line : absl::StrSplit(*p, '\n')) {
    if (!absl::StartsWith(line, "// rvd-launch:") || absl::StrContains(line, "tile_rows=0")) {
      continue;
    }
    absl::StatusOr<CandidateLaunch> launch = ParseLaunchAnnotation(line);
    ASSERT_TRUE(launch.ok()) << launch.status() << ": " << line;
    EXPECT_EQ(launch->threads, 256);
    return;
  }
  ADD_FAILURE() << "no annotation example in the prompt";
}

TEST(PromptsTest, ContractAndAbiComeFromTheSources) {
  const std::string contract = CandidateContract();
  EXPECT_THAT(contract, HasSubstr("A candidate is device code only"));
  for (const char* term : {"g2[j]", "trace[j]", "maxabs[j]", "no floating-point atomics"}) {
    EXPECT_THAT(contract, HasSubstr(term));
  }
  EXPECT_THAT(contract, Not(HasSubstr("//")));
  EXPECT_THAT(contract, Not(HasSubstr("Thread-safety")));
  const std::string abi = CandidateAbi();
  EXPECT_THAT(abi, HasSubstr("namespace rvd::cuda {\n// A matrix as the kernels see it"));
  EXPECT_THAT(abi, HasSubstr("int32_t aligned;"));
  EXPECT_THAT(abi, HasSubstr("namespace rvd::tune {"));
  EXPECT_THAT(abi, HasSubstr("int32_t row0;"));
}

TEST(PromptsTest, AnalyzeBottleneck) {
  absl::StatusOr<std::string> p = AnalyzeBottleneckPrompt(Request());
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_THAT(*p, HasSubstr("compute, memory_bandwidth, memory_latency, occupancy, mixed"));
  EXPECT_THAT(*p, HasSubstr("\"primary_bottleneck\""));
  EXPECT_THAT(*p, HasSubstr("\"estimated_speedup\""));
  EXPECT_THAT(*p, HasSubstr("BEST_SOURCE_BODY"));
  EXPECT_THAT(*p, HasSubstr("DRAM at 86% of peak"));
}

TEST(PromptsTest, VerifyCorrectnessQuotesTheCandidateAsItIs) {
  const std::string candidate = "__global__ void k() { int a[2] = {{1}}; /* {{target}} */ }";
  absl::StatusOr<std::string> p = VerifyCorrectnessPrompt(Request(), candidate);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_THAT(*p, HasSubstr(candidate));
  EXPECT_THAT(*p, HasSubstr(kCandidateSignature));
  EXPECT_THAT(*p, HasSubstr("Verdict: unchanged"));
  EXPECT_THAT(*p, HasSubstr("struct TuneJob {"));
}

TEST(PromptsTest, CompileErrorCutsALongLog) {
  CandidateRequest r = Request();
  r.attempt = 1;
  r.compile_log = absl::StrCat("kernel.cu(12): error: identifier \"x\" is undefined\n",
                               std::string(20000, 'e'));
  absl::StatusOr<std::string> p = CompileErrorPrompt(r);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_THAT(*p, HasSubstr("NVRTC for sm_90a"));
  EXPECT_THAT(*p, HasSubstr("identifier \"x\" is undefined"));
  EXPECT_THAT(*p, HasSubstr("more characters cut"));
  EXPECT_LT(p->size(), 9000u);
}

TEST(PromptsTest, WrongAnswerSaysWhatWasWrong) {
  absl::StatusOr<std::string> p =
      WrongAnswerPrompt(Request(), "the reply has no fenced code block");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_THAT(*p, HasSubstr("the reply has no fenced code block"));
  EXPECT_THAT(*p, HasSubstr(kCandidateSignature));
}

TEST(PromptsTest, ProfileWithoutTimingOrNcu) {
  KernelProfile p;
  EXPECT_THAT(FormatProfile(p), HasSubstr("not timed yet"));
  EXPECT_THAT(FormatProfile(p), HasSubstr("Nsight Compute: not available"));
  EXPECT_EQ(FormatHistory({}), "Nothing yet: this is the job's first candidate.");
}

}  // namespace
}  // namespace rvd::tune

// The kernel's extraction from a reply: the block that defines the entry
// with its signature, and each wrong answer a clear status.
#include "self_improve/providers/kernel_extract.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "self_improve/generator.h"
#include "self_improve/providers/llm_provider.h"
#include "self_improve/space.h"

namespace rvd::tune {
namespace {

using ::testing::HasSubstr;

constexpr char kSignature[] =
    "extern \"C\" __global__ void rvd_tune_candidate(const rvd::cuda::MatrixDesc* mats, "
    "const rvd::tune::TuneJob* jobs, int num_jobs, double* g2, double* trace, "
    "float* maxabs)";

// A well-formed candidate, the entry laid out differently from the signature.
constexpr char kKernel[] = R"(#include <cuda_bf16.h>
#include "kernels/cuda/descriptors.h"
#include "self_improve/candidate_abi.h"
// rvd-launch: threads=256 smem=0 tile_rows=0 tile_cols=0
__device__ __forceinline__ double Square(double x) { return x * x; }

extern "C" __global__ void __launch_bounds__(256)
rvd_tune_candidate(const rvd::cuda::MatrixDesc* __restrict__ mats,
                   const rvd::tune::TuneJob* __restrict__ jobs,  // the jobs
                   int num_jobs, double* g2, double* trace, float* maxabs) {
  for (int j = blockIdx.x; j < num_jobs; j += gridDim.x) {
    if (threadIdx.x == 0) { g2[j] = Square(1.0); trace[j] = 0; maxabs[j] = 0; }
  }
}
)";

KernelExtractOptions Options() {
  KernelExtractOptions o;
  o.signature = kSignature;
  return o;
}

std::string Fenced(absl::string_view code, absl::string_view tag = "cuda") {
  return absl::StrCat("```", tag, "\n", code, "```\n");
}

absl::Status Error(absl::string_view reply, KernelExtractOptions o = Options()) {
  absl::StatusOr<std::string> s = ExtractKernelSource(reply, o);
  EXPECT_FALSE(s.ok()) << *s;
  return s.status();
}

TEST(KernelExtractTest, TakesTheBlockThatDefinesTheEntry) {
  const std::string reply = absl::StrCat("Technique: grid-stride jobs\n\nA helper first:\n",
                                         Fenced("__device__ int Helper();\n"), "And the kernel:\n",
                                         Fenced(kKernel), "Done.\n");
  absl::StatusOr<std::string> s = ExtractKernelSource(reply, Options());
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(*s, kKernel);
}

TEST(KernelExtractTest, AcceptsUntaggedTildeAndIndentedFences) {
  ASSERT_TRUE(ExtractKernelSource(Fenced(kKernel, ""), Options()).ok());
  ASSERT_TRUE(ExtractKernelSource(absl::StrCat("~~~cpp\n", kKernel, "~~~\n"), Options()).ok());
  ASSERT_TRUE(ExtractKernelSource(absl::StrCat("  ```cu\n", kKernel, "  ```\n"), Options()).ok());
  // A block still open at the end of a reply that was not cut counts.
  ASSERT_TRUE(ExtractKernelSource(absl::StrCat("```cuda\n", kKernel), Options()).ok());
}

TEST(KernelExtractTest, ExternCBlockCountsAsThePrefix) {
  const std::string code =
      "extern \"C\" {\n__global__ void rvd_tune_candidate(const rvd::cuda::MatrixDesc* mats, "
      "const rvd::tune::TuneJob* jobs, int num_jobs, double* g2, double* trace, float* "
      "maxabs) {}\n}\n";
  EXPECT_TRUE(ExtractKernelSource(Fenced(code), Options()).ok());
}

TEST(KernelExtractTest, TheLastDefiningBlockWins) {
  const std::string second = absl::StrReplaceAll(kKernel, {{"Square(1.0)", "Square(2.0)"}});
  absl::StatusOr<std::string> s =
      ExtractKernelSource(absl::StrCat(Fenced(kKernel), Fenced(second)), Options());
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_THAT(*s, HasSubstr("Square(2.0)"));
}

TEST(KernelExtractTest, ProseIsNoCode) {
  const absl::Status s = Error("I'm sorry, but I can't help with writing that kernel.");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(LlmErrorKindOf(s), LlmErrorKind::kNoCode);
}

TEST(KernelExtractTest, OnlyOtherLanguagesIsNoCode) {
  EXPECT_EQ(LlmErrorKindOf(Error(Fenced("{\"a\": 1}\n", "json"))), LlmErrorKind::kNoCode);
}

TEST(KernelExtractTest, ChangedSignatureQuotesBoth) {
  const std::string changed = absl::StrReplaceAll(kKernel, {{"float* maxabs", "double* maxabs"}});
  const absl::Status s = Error(Fenced(changed));
  EXPECT_EQ(LlmErrorKindOf(s), LlmErrorKind::kWrongKernel);
  EXPECT_THAT(std::string(s.message()), HasSubstr("signature of rvd_tune_candidate changed"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("double* maxabs"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("float* maxabs"));
}

TEST(KernelExtractTest, MissingExternCIsAChangedSignature) {
  const std::string changed = absl::StrReplaceAll(kKernel, {{"extern \"C\" ", ""}});
  EXPECT_EQ(LlmErrorKindOf(Error(Fenced(changed))), LlmErrorKind::kWrongKernel);
}

TEST(KernelExtractTest, OtherEntryNameIsWrongKernel) {
  const std::string renamed = absl::StrReplaceAll(kKernel, {{"rvd_tune_candidate", "my_kernel"}});
  const absl::Status s = Error(Fenced(renamed));
  EXPECT_EQ(LlmErrorKindOf(s), LlmErrorKind::kWrongKernel);
  EXPECT_THAT(std::string(s.message()), HasSubstr("no code block defines rvd_tune_candidate"));
}

TEST(KernelExtractTest, ADeclarationAloneIsNotADefinition) {
  const std::string decl = absl::StrCat(kSignature, ";\n");
  EXPECT_EQ(LlmErrorKindOf(Error(Fenced(decl))), LlmErrorKind::kWrongKernel);
}

TEST(KernelExtractTest, DefinedTwice) {
  const absl::Status s = Error(Fenced(absl::StrCat(kKernel, kKernel)));
  EXPECT_EQ(LlmErrorKindOf(s), LlmErrorKind::kWrongKernel);
  EXPECT_THAT(std::string(s.message()), HasSubstr("2 times"));
}

TEST(KernelExtractTest, HostCodeIsRefused) {
  for (const char* host :
       {"cudaMalloc(&p, 4);", "cudaMemcpyAsync(a, b, 4, cudaMemcpyDeviceToDevice, 0);",
        "cudaStreamSynchronize(0);", "cublasSgemm(h);", "other<<<1, 32>>>();",
        "cudaDeviceSynchronize();"}) {
    const std::string code =
        absl::StrReplaceAll(kKernel, {{"g2[j] = Square(1.0);", absl::StrCat(host, " g2[j] = 0;")}});
    const absl::Status s = Error(Fenced(code));
    EXPECT_EQ(LlmErrorKindOf(s), LlmErrorKind::kWrongKernel) << host;
    EXPECT_THAT(std::string(s.message()), HasSubstr("device code only")) << host;
  }
}

TEST(KernelExtractTest, HostNamesInCommentsAndStringsAreFine) {
  const std::string code = absl::StrReplaceAll(
      kKernel, {{"// the jobs", "// no cudaMalloc here, no <<<launch>>> either"}});
  EXPECT_TRUE(ExtractKernelSource(Fenced(code), Options()).ok());
}

TEST(KernelExtractTest, ASecondGlobalFunctionIsRefused) {
  const std::string code = absl::StrCat("__global__ void helper_kernel() {}\n", kKernel);
  const absl::Status s = Error(Fenced(code));
  EXPECT_EQ(LlmErrorKindOf(s), LlmErrorKind::kWrongKernel);
  EXPECT_THAT(std::string(s.message()), HasSubstr("2 __global__ functions"));
}

TEST(KernelExtractTest, IncludesOutsideTheListAreRefused) {
  for (const char* inc : {"#include <cublas_v2.h>\n", "#include <cstdio>\n",
                          "#include \"../../etc/passwd\"\n", "#include MACRO_HEADER\n"}) {
    const absl::Status s = Error(Fenced(absl::StrCat(inc, kKernel)));
    EXPECT_EQ(LlmErrorKindOf(s), LlmErrorKind::kWrongKernel) << inc;
    EXPECT_THAT(std::string(s.message()), HasSubstr("includes")) << inc;
  }
  for (const char* inc :
       {"#include <cuda/std/cstdint>\n", "#include \"kernels/cuda/block_sums.cuh\"\n"}) {
    EXPECT_TRUE(ExtractKernelSource(Fenced(absl::StrCat(inc, kKernel)), Options()).ok()) << inc;
  }
}

TEST(KernelExtractTest, CutInsideTheBlockIsTruncated) {
  KernelExtractOptions o = Options();
  o.truncated = true;
  const std::string cut = absl::StrCat("```cuda\n", std::string(kKernel).substr(0, 300));
  const absl::Status s = Error(cut, o);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(LlmErrorKindOf(s), LlmErrorKind::kTruncated);
  // Cut after the block closed: the kernel is whole.
  EXPECT_TRUE(ExtractKernelSource(absl::StrCat(Fenced(kKernel), "Notes: the ker"), o).ok());
}

// A model that answers with the current best as it is must pass: every
// kernel of the built-in space (the naive start among them), as a reply.
TEST(KernelExtractTest, TheBuiltInKernelsPassTheFilter) {
  KernelExtractOptions o;
  o.signature = kCandidateSignature;
  int checked = 0;
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (const SpacePoint& p : Points(DefaultSpace(), dtype)) {
      absl::StatusOr<Candidate> c = Emit(p, dtype);
      ASSERT_TRUE(c.ok()) << PointKey(p) << ": " << c.status();
      absl::StatusOr<std::string> s = ExtractKernelSource(
          absl::StrCat("Technique: ", c->description, "\n", Fenced(c->source)), o);
      ASSERT_TRUE(s.ok()) << PointKey(p) << " " << DTypeName(dtype) << ": " << s.status();
      EXPECT_EQ(*s, absl::EndsWith(c->source, "\n") ? c->source : c->source + "\n");
      ++checked;
    }
  }
  EXPECT_GT(checked, 10);
}

TEST(KernelExtractTest, FencedBlocks) {
  const std::vector<FencedBlock> b =
      FindFencedBlocks("text\n```JSON {.x}\n{\"a\": 1}\n```\n````cuda\nx\n```\ny\n````\n~~~\nopen");
  ASSERT_EQ(b.size(), 3u);
  EXPECT_EQ(b[0].info, "json");
  EXPECT_EQ(b[0].body, "{\"a\": 1}\n");
  EXPECT_EQ(b[1].info, "cuda");
  EXPECT_EQ(b[1].body, "x\n```\ny\n");  // a shorter fence does not close a longer one
  EXPECT_TRUE(b[1].closed);
  EXPECT_FALSE(b[2].closed);
  EXPECT_EQ(b[2].body, "open\n");
}

}  // namespace
}  // namespace rvd::tune

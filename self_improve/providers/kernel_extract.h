// The kernel in a model's reply (self_improve/providers/): the fenced code
// block that defines the candidate entry with its exact signature, checked
// to be device code only. A cheap filter in front of the harness, never a
// substitute for it: it turns the common wrong answers into a clear status
// before anything is compiled, and the harness (compile, verify, time)
// still judges everything that passes.
//
// Thread-safe: pure functions.
#ifndef RVD_SELF_IMPROVE_PROVIDERS_KERNEL_EXTRACT_H_
#define RVD_SELF_IMPROVE_PROVIDERS_KERNEL_EXTRACT_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace rvd::tune {

struct KernelExtractOptions {
  // The entry's declaration, kept verbatim up to whitespace, comments,
  // `inline`/`__forceinline__`/`__noinline__`, `__restrict__` and a
  // `__launch_bounds__(...)`, which a candidate may add; `extern "C" { ... }`
  // around the definition counts as the `extern "C"` prefix.
  absl::string_view signature;
  // Headers a candidate may include (the NVRTC include path has the
  // toolkit's and rvd's source root): an entry ending in '/' allows every
  // header under it. The suggestion prompt lists these.
  std::vector<std::string> allowed_includes = {"cuda_bf16.h",
                                               "cuda_fp16.h",
                                               "mma.h",
                                               "cuda_pipeline.h",
                                               "cuda/std/",
                                               "cuda/barrier",
                                               "cuda/pipeline",
                                               "cooperative_groups.h",
                                               "cooperative_groups/",
                                               "kernels/cuda/descriptors.h",
                                               "kernels/cuda/block_sums.cuh",
                                               "self_improve/candidate_abi.h"};
  bool truncated = false;  // the reply stopped at max_tokens
};

// The source of the last fenced block (``` or ~~~; untagged or tagged
// cuda, cu, cuh, c++, cpp, cxx, cc, c, h, hpp) that defines the entry once.
// Errors, INVALID_ARGUMENT with an LlmErrorKind (llm_provider.h):
//   kNoCode       no fenced code block (a prose answer, a refusal in words)
//   kTruncated    RESOURCE_EXHAUSTED: the reply stopped at max_tokens inside the
//                 block (never OUT_OF_RANGE, which a Generator keeps for "exhausted")
//   kWrongKernel  no block defines the entry; its signature changed (the
//                 message quotes both); defined twice; a second __global__
//                 function; host code (a <<<...>>> launch, the CUDA runtime's
//                 memory, stream, event, graph or device calls, cuBLAS,
//                 cuDNN, CUTLASS); an #include outside allowed_includes.
absl::StatusOr<std::string> ExtractKernelSource(absl::string_view reply,
                                                const KernelExtractOptions& options);

// The fenced blocks of `text` as (info string, body), in order; a block
// still open at the end runs to the end. For tests and the JSON reply of
// the analysis prompt.
struct FencedBlock {
  std::string info;  // the fence's info string, lower-cased, first word
  std::string body;
  bool closed = true;
};
std::vector<FencedBlock> FindFencedBlocks(absl::string_view text);

}  // namespace rvd::tune

#endif  // RVD_SELF_IMPROVE_PROVIDERS_KERNEL_EXTRACT_H_

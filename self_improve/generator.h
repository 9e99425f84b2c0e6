// The generator interface of the tuning worker (self_improve/, public): what
// a generator is asked for and what it answers. Implementations: the
// built-in offline search (search_generator.h) and the LLM providers over
// HTTP (self_improve/providers/, helper `llm`). The worker's loop
// (tune_loop.h) is the only caller.
//
// A candidate is device code only: one __global__ function with the
// signature kCandidateSignature, implementing the per-job contract below.
// rvd owns every launch, every buffer and every timer; the geometry of the
// launch (threads per block, dynamic shared memory, the tile of G a job
// covers) is declared in the source itself by one annotation line
// (FormatLaunchAnnotation), so that a source says everything about the
// kernel and nothing else has to travel with it.
//
// The per-job contract (the sums the finalize turns into PR; the product
// kernels' contract, kernels/cuda/kernels.h LaunchFused): for job j =
// jobs[j] on matrix d = mats[jobs[j].matrix], with G the Gram on the
// smaller side (W W^T when d.tall == 0, else W^T W, side d.n, long side d.k):
//   g2[j]     = sum of G(r, c)^2 over the tile's entries on or above the
//               diagonal of G (r in [row0, row0 + rows), c in [col0, col0 +
//               cols), c >= r), those above it counted twice, so that the
//               jobs' g2 of a matrix add to ||G||_F^2;
//   trace[j]  = sum of G(r, r) over the tile's entries on the diagonal (0
//               when diagonal == 0: the tile does not meet it);
//   maxabs[j] = the largest |w| the job read (0 for a job reading nothing),
//               NaN or Inf when it read one.
// Each sum within 2e-6 relative of the float64 value, the same bits in
// every launch (no floating-point atomics). Blocks take jobs blockIdx.x,
// blockIdx.x + gridDim.x, ...: the grid is rvd's (the SM cap). A candidate
// writes nothing else, reads nothing but its arguments.
//
// Thread-safety: a Generator is used by one job's thread at a time.
#ifndef RVD_SELF_IMPROVE_GENERATOR_H_
#define RVD_SELF_IMPROVE_GENERATOR_H_

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/engine.h"
#include "self_improve/profile.h"

namespace rvd::tune {

// The device function every candidate defines, verbatim (the loop looks it
// up by this name; NVRTC compiles it with kernels/cuda/descriptors.h and
// self_improve/candidate_abi.h on the include path, which define MatrixDesc
// and TuneJob).
inline constexpr char kCandidateEntry[] = "rvd_tune_candidate";
inline constexpr char kCandidateSignature[] =
    "extern \"C\" __global__ void rvd_tune_candidate(const rvd::cuda::MatrixDesc* mats, "
    "const rvd::tune::TuneJob* jobs, int num_jobs, double* g2, double* trace, "
    "float* maxabs)";

// The launch geometry a candidate declares, as one line of its source:
//   // rvd-launch: threads=256 smem=49152 tile_rows=128 tile_cols=64
// tile_rows/tile_cols: the Gram tile one job covers (0: the whole Gram, one
// job per matrix); rvd enumerates the jobs from it (upper-triangle tiles,
// row-major), so it is part of the kernel, not a tuning knob of rvd's.
struct CandidateLaunch {
  int threads = 0;    // threads per block, 32 .. 1024, a multiple of 32
  int smem = 0;       // dynamic shared memory per block, bytes (0 .. 227 KiB)
  int tile_rows = 0;  // Gram rows per job (0: whole Gram)
  int tile_cols = 0;  // Gram columns per job (0: tile_rows)
  bool operator==(const CandidateLaunch&) const = default;
};

// The annotation line for `launch` (no newline).
std::string FormatLaunchAnnotation(const CandidateLaunch& launch);
// The one annotation line of `source`, validated (ranges above; tile_rows
// and tile_cols multiples of 16, or tile_rows 0 and tile_cols 0).
// INVALID_ARGUMENT naming what is missing, repeated or out of range.
absl::StatusOr<CandidateLaunch> ParseLaunchAnnotation(absl::string_view source);

// One matrix shape of a target's benchmark: `count` matrices rows x cols.
struct TuneShape {
  int count = 0;
  int rows = 0;
  int cols = 0;
  bool operator==(const TuneShape&) const = default;
};

// What a job tunes: a kernel registry entry (kernels/cuda/kernel_registry.h)
// on the engine's device, and the shapes it is timed and checked on.
struct TuneTarget {
  std::string variant = "fused";  // the only variant with kernels of rvd's own
  DType dtype = DType::kBF16;
  std::string shape_class;        // "square", "triangle", "wide" or "tall"
  std::string arch;               // the exact architecture, e.g. "sm_90a"
  std::vector<TuneShape> shapes;  // benchmark shapes, all of the shape class
};

// What happened to a candidate. Names (VerdictName): "accepted", "slower",
// "incorrect", "nondeterministic", "compile_error", "launch_error",
// "impossible", "held_out_failed", "generator_error".
enum class Verdict {
  kAccepted,          // correct and faster than the best beyond the spread
  kSlower,            // correct, not faster by min_improvement beyond the spread
  kIncorrect,         // a PR or per-job sum outside the tolerance, or NaN/Inf hidden
  kNondeterministic,  // two runs on the same inputs differ in a bit
  kCompileError,      // still failing after the retries
  kLaunchError,       // the launch failed, faulted or a sanitizer reported it
  kImpossible,        // faster than the memory-bandwidth floor: the timing is wrong
  kHeldOutFailed,     // correct on the search inputs, not on the held-out set
  kGeneratorError,    // the generator had no candidate (its error is the reason)
};
const char* VerdictName(Verdict v);

// One earlier candidate of this job, for the generator's history.
struct HistoryEntry {
  int iteration = 0;
  std::string description;  // the generator's own words for what it tried
  Verdict verdict = Verdict::kGeneratorError;
  std::string reason;       // why, in a sentence with the numbers
  double seconds = 0;       // its median time, 0 when not timed
};

// A request for one candidate.
struct CandidateRequest {
  TuneTarget target;
  std::string signature = kCandidateSignature;  // keep it verbatim
  int iteration = 0;              // 1 .. max_iter
  std::string best_source;        // the current best kernel's source
  std::string best_description;   // and what it is
  KernelProfile profile;          // of the current best
  BottleneckReport bottleneck;    // ClassifyBottleneck(profile)
  std::vector<HistoryEntry> history;  // this job's earlier candidates, oldest first
  // The compile-error feedback: on a retry (attempt 1 .. 3) the source that
  // failed and the compiler's log for it; empty on attempt 0.
  int attempt = 0;
  std::string failed_source;
  std::string compile_log;
  // Set when the job is cancelled: a generator that waits (HTTP) returns
  // CANCELLED soon after.
  const std::atomic<bool>* cancelled = nullptr;
};

// A generator's answer.
struct Candidate {
  std::string source;       // device code with the annotation and the entry
  std::string description;  // one line: what this candidate tries
};

class Generator {
 public:
  virtual ~Generator() = default;
  // Its name as a job reports it: "builtin", "openai:<model>", ...
  virtual std::string Name() const = 0;
  // One candidate for `request`. Errors: OUT_OF_RANGE when it has nothing
  // left to offer (the job ends, "search exhausted"); CANCELLED; any other
  // code is this iteration's generator_error (the job goes on, and the
  // patience counts it).
  virtual absl::StatusOr<Candidate> Generate(const CandidateRequest& request) = 0;
};

}  // namespace rvd::tune

#endif  // RVD_SELF_IMPROVE_GENERATOR_H_

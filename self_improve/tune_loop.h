// One tuning job's iteration loop (self_improve/, public): profile the
// current best -> classify the bottleneck -> generate -> compile (a compile
// error goes back to the generator, up to `compile_retries` times) ->
// verify -> benchmark against the best (A-B-A-B) -> accept or reject
// (acceptance.h) -> held-out re-check of an accepted one -> log.
//
// Written against four small interfaces so that the loop runs on a CPU in
// the tests with fakes: Compiler, Verifier, Benchmarker (the GPU side,
// implemented over the CUDA module) and Generator (generator.h). The loop
// owns the seeds: the verifier's and the benchmark's inputs come from the
// job's secret seed, which no generator sees.
//
// Error codes of the tools: a candidate that fails at run time (launch
// error, fault, a sanitizer report) is ABORTED from Verify or Compare and
// becomes that candidate's launch_error; any other error is the harness or
// the device failing and ends the job with it.
//
// Thread-compatible: one thread runs a loop; `cancelled` may be set from
// any thread and is looked at between steps (and by the generator).
#ifndef RVD_SELF_IMPROVE_TUNE_LOOP_H_
#define RVD_SELF_IMPROVE_TUNE_LOOP_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "self_improve/acceptance.h"
#include "self_improve/generator.h"
#include "self_improve/profile.h"

namespace rvd::tune {

// A compiled candidate as the GPU side holds it (a loaded module and its
// function, its launch); opaque to the loop.
class CompiledKernel {
 public:
  virtual ~CompiledKernel() = default;
  // For the log: e.g. "sm_90a cubin, 96 registers, 0 spills".
  virtual std::string Describe() const = 0;
};

struct CompileResult {
  std::shared_ptr<const CompiledKernel> kernel;  // null: the source did not compile
  std::string log;                               // the compiler's log (the retry's feedback)
};

class Compiler {
 public:
  virtual ~Compiler() = default;
  // Compiles `source` (whose annotation says `launch`) for the target's
  // exact architecture. A source that does not compile is a result with
  // no kernel and the log; an error is the compiler itself failing.
  virtual absl::StatusOr<CompileResult> Compile(const TuneTarget& target,
                                                const std::string& source,
                                                const CandidateLaunch& launch) = 0;
  // The product kernel serving the target's registry entry now, as a
  // job's starting best (start "product").
  virtual absl::StatusOr<std::shared_ptr<const CompiledKernel>> Product(
      const TuneTarget& target) = 0;
};

struct VerifyRequest {
  uint64_t seed = 0;      // the inputs' seed (from the job's secret seed)
  int inputs = 20;        // input sets, each every shape of the target
  bool held_out = false;  // the held-out set drawn after the search
};

class Verifier {
 public:
  virtual ~Verifier() = default;
  // Runs `kernel` on fresh inputs from `request.seed` against the float64
  // reference (reference.h, and the oracle's PR), outputs poisoned, twice.
  virtual absl::StatusOr<CorrectnessEvidence> Verify(const TuneTarget& target,
                                                     const CompiledKernel& kernel,
                                                     const VerifyRequest& request) = 0;
};

struct BenchRequest {
  uint64_t seed = 0;              // the timed inputs' seed
  int rounds = 4;                 // A-B pairs
  bool long_measurement = false;  // the second, longer measurement of a big claim
};

class Benchmarker {
 public:
  virtual ~Benchmarker() = default;
  // The kernel's speed on the target's shapes against the device's
  // ceilings (and ncu's metrics where enabled).
  virtual absl::StatusOr<KernelProfile> Profile(const TuneTarget& target,
                                                const CompiledKernel& kernel,
                                                uint64_t seed) = 0;
  // Interleaved blocks, candidate then best, `rounds` times.
  virtual absl::StatusOr<TimingEvidence> Compare(const TuneTarget& target,
                                                 const CompiledKernel& candidate,
                                                 const CompiledKernel& best,
                                                 const BenchRequest& request) = 0;
};

struct TuneBudget {
  int max_iter = 30;             // iterations after the starting point
  int patience = 3;              // consecutive iterations without an accepted candidate
  double min_improvement = 0.01; // faster by this fraction beyond the spread
};

struct LoopConfig {
  TuneTarget target;
  TuneBudget budget;
  uint64_t secret_seed = 0;     // the inputs' seeds derive from it; never given out
  std::string start = "naive";  // "naive" (the space's naive point) or "product"
  int compile_retries = 3;      // generator calls after a failed compile, per iteration
  int verify_inputs = 20;
  int bench_rounds = 4;
  int long_bench_rounds = 16;
};

// One iteration as logged (iteration 0: the starting point).
struct IterationRecord {
  int iteration = 0;
  std::string description;  // the generator's
  std::string source;       // the candidate's source ("" for the product kernel)
  Verdict verdict = Verdict::kGeneratorError;
  std::string reason;
  std::string bottleneck;   // the class the generator was given
  int compile_attempts = 0; // generator + compile rounds used
  double candidate_seconds = 0;
  double best_seconds = 0;  // the best's median in the same comparison
  double speedup = 0;
  double spread = 0;
  std::string held_out;     // the held-out check's reason (the gap), accepted candidates
  double best_after = 0;    // the best's time after this iteration
};

enum class StopReason { kBudget, kPatience, kExhausted, kCancelled };
// "budget", "patience", "exhausted", "cancelled".
const char* StopReasonName(StopReason r);

struct LoopOutcome {
  StopReason stop = StopReason::kBudget;
  std::string why;               // e.g. "3 iterations without improvement (patience 3)"
  double baseline_seconds = 0;   // the starting point's
  double best_seconds = 0;
  std::string best_description;
  std::string best_source;
};

// What the loop reports as it goes (the job manager: its log, its progress).
class LoopObserver {
 public:
  virtual ~LoopObserver() = default;
  // Entering a step of `iteration`: "profiling", "generating", "compiling",
  // "verifying", "benchmarking", "held_out".
  virtual void OnPhase(int iteration, const char* phase) = 0;
  // An iteration ended (iteration 0: the starting point was measured).
  virtual void OnRecord(const IterationRecord& record) = 0;
};

class TuneLoop {
 public:
  TuneLoop(LoopConfig config, Compiler& compiler, Verifier& verifier, Benchmarker& bench,
           Generator& generator, LoopObserver& observer);

  // Continues after `records` (a resumed job's log, iteration 0 first):
  // their history is the generator's, the last accepted source is the best
  // (recompiled and verified again before use), the trailing rejections
  // count against the patience. Call before Run.
  void Restore(std::vector<IterationRecord> records);

  // Runs until the budget, the patience, the generator or `cancelled`
  // ends it. An error: the job failed (a tool's failure, or a starting
  // kernel that does not compile or is not correct).
  absl::StatusOr<LoopOutcome> Run(const std::atomic<bool>& cancelled);

  // The seed of iteration `iteration`'s inputs for `purpose` (verify,
  // held-out, bench, profile): a function of the secret seed only.
  static uint64_t DeriveSeed(uint64_t secret, int iteration, int purpose);

 private:
  struct Best {
    std::shared_ptr<const CompiledKernel> kernel;
    std::string source;
    std::string description;
    double seconds = 0;
    KernelProfile profile;
  };

  absl::Status StartBest(const std::atomic<bool>& cancelled);
  // One iteration; fills `record`. An error ends the job.
  absl::Status Iterate(int iteration, const std::atomic<bool>& cancelled,
                       IterationRecord* record, bool* exhausted);
  std::vector<HistoryEntry> History() const;

  const LoopConfig config_;
  const AcceptanceRules rules_;
  Compiler& compiler_;
  Verifier& verifier_;
  Benchmarker& bench_;
  Generator& generator_;
  LoopObserver& observer_;

  std::vector<IterationRecord> records_;  // every iteration so far, 0 first
  Best best_;
  double baseline_seconds_ = 0;
  int without_improvement_ = 0;
};

}  // namespace rvd::tune

#endif  // RVD_SELF_IMPROVE_TUNE_LOOP_H_

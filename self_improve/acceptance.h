// The acceptance rules of the tuning worker (self_improve/, public): whether
// a candidate replaces the current best, as a pure function of the evidence
// the verifier and the benchmark gathered. The one place these rules live;
// the loop (tune_loop.h) only gathers evidence and follows the decision.
//
// Thread-safe: pure functions.
#ifndef RVD_SELF_IMPROVE_ACCEPTANCE_H_
#define RVD_SELF_IMPROVE_ACCEPTANCE_H_

#include <string>
#include <vector>

#include "kernels/pr_check.h"
#include "self_improve/generator.h"

namespace rvd::tune {

struct AcceptanceRules {
  // Faster than the best by at least this fraction beyond the spread.
  double min_improvement = 0.01;
  // The engine's exact tolerance, on every PR and every per-job sum.
  Tolerance tolerance = kExactPrTolerance;
  // At least this many fresh inputs per check.
  int min_inputs = 20;
  // A speedup above this is measured again, longer, before it can count.
  double long_claim_speedup = 2.0;
};

// What the verifier saw on one input set (fresh inputs from the job's secret
// seed; outputs poisoned; the float64 reference recomputed on the host).
struct CorrectnessEvidence {
  int inputs = 0;                // inputs checked
  int64_t pr_mismatches = 0;     // PRs outside the tolerance (NaN counts)
  double max_pr_rel_error = 0;   // over every finite input's matrices
  int64_t sum_mismatches = 0;    // per-job sums (g2, trace) outside the tolerance
  double max_sum_rel_error = 0;
  int64_t nonfinite_hidden = 0;  // NaN/Inf inputs not reported as non-finite
  int64_t outputs_unwritten = 0; // output slots still holding the poison
  bool inputs_unchanged = true;  // the inputs equal their private copy afterwards
  bool deterministic = true;     // two runs on the same inputs gave the same bits
  std::string first_mismatches;  // CheckPR's report: the first ten, one per line
};

// What the benchmark measured: interleaved blocks, candidate and best
// alternating (A-B-A-B) in one run, each block's median launch time.
struct TimingEvidence {
  std::vector<double> candidate_seconds;  // per block
  std::vector<double> best_seconds;       // per block, interleaved with the above
  // The memory-bandwidth floor: the bytes every launch must read over the
  // device's measured DRAM ceiling (L2 flushed between launches); 0: unknown.
  double floor_seconds = 0;
  bool long_measurement = false;  // this is the second, longer measurement
};

struct Decision {
  Verdict verdict = Verdict::kSlower;
  // The speed claim is too good to take from one measurement: measure
  // again with TimingEvidence::long_measurement set and decide again.
  bool measure_longer = false;
  std::string reason;       // a sentence with the numbers, for the log and the API
  double speedup = 0;       // median best / median candidate (0: not timed)
  double spread = 0;        // the larger relative spread of the two series
  double candidate_seconds = 0;  // median
  double best_seconds = 0;       // median
};

// The median of `v` (0 for none).
double Median(std::vector<double> v);
// (max - min) / median of `v` (0 for fewer than two).
double RelativeSpread(const std::vector<double>& v);

// The correctness part alone: kAccepted (meaning "correct") or the verdict
// that rejects it (kIncorrect, kNondeterministic), with the reason.
Decision JudgeCorrectness(const AcceptanceRules& rules, const CorrectnessEvidence& c);

// The whole decision for a candidate against the current best: correct
// (JudgeCorrectness), not faster than the floor (kImpossible), a claim above
// long_claim_speedup measured longer first (measure_longer), and faster
// than the best by min_improvement beyond the spread:
//   median(candidate) <= median(best) * (1 - min_improvement - spread).
Decision Judge(const AcceptanceRules& rules, const CorrectnessEvidence& c,
               const TimingEvidence& t);

// The final check on the held-out input set, drawn after the search:
// kAccepted or kHeldOutFailed; `reason` logs the gap between the search's
// and the held-out set's largest errors.
Decision JudgeHeldOut(const AcceptanceRules& rules, const CorrectnessEvidence& search,
                      const CorrectnessEvidence& held_out);

}  // namespace rvd::tune

#endif  // RVD_SELF_IMPROVE_ACCEPTANCE_H_

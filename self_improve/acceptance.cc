#include "self_improve/acceptance.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace rvd::tune {

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 == 1 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

double RelativeSpread(const std::vector<double>& v) {
  if (v.size() < 2) return 0;
  const auto [lo, hi] = std::minmax_element(v.begin(), v.end());
  const double med = Median(v);
  return med > 0 ? (*hi - *lo) / med : 0;
}

Decision JudgeCorrectness(const AcceptanceRules& rules, const CorrectnessEvidence& c) {
  Decision d;
  d.verdict = Verdict::kIncorrect;
  if (c.inputs < rules.min_inputs) {
    d.reason = absl::StrCat("checked on ", c.inputs, " inputs, fewer than the ",
                            rules.min_inputs, " required");
  } else if (!c.inputs_unchanged) {
    d.reason = "wrote to its input matrices";
  } else if (c.outputs_unwritten > 0) {
    d.reason = absl::StrCat(c.outputs_unwritten, " output slots left unwritten (poison)");
  } else if (c.nonfinite_hidden > 0) {
    d.reason = absl::StrCat(c.nonfinite_hidden,
                            " matrices with NaN/Inf not reported as non-finite");
  } else if (c.pr_mismatches > 0 || c.max_pr_rel_error > rules.tolerance.rtol) {
    d.reason = absl::StrFormat("%d PRs outside %.1e relative (max error %.3g)%s%s",
                               c.pr_mismatches, rules.tolerance.rtol, c.max_pr_rel_error,
                               c.first_mismatches.empty() ? "" : ": ",
                               c.first_mismatches);
  } else if (c.sum_mismatches > 0 || c.max_sum_rel_error > rules.tolerance.rtol) {
    d.reason = absl::StrFormat("%d per-job sums outside %.1e relative (max error %.3g)",
                               c.sum_mismatches, rules.tolerance.rtol, c.max_sum_rel_error);
  } else if (!c.deterministic) {
    d.verdict = Verdict::kNondeterministic;
    d.reason = "two runs on the same inputs gave different bits";
  } else {
    d.verdict = Verdict::kAccepted;
    d.reason = absl::StrFormat("correct on %d inputs (max PR error %.3g, sums %.3g)", c.inputs,
                               c.max_pr_rel_error, c.max_sum_rel_error);
  }
  return d;
}

Decision Judge(const AcceptanceRules& rules, const CorrectnessEvidence& c,
               const TimingEvidence& t) {
  Decision d = JudgeCorrectness(rules, c);
  if (d.verdict != Verdict::kAccepted) return d;
  const std::string correct = d.reason;
  d.candidate_seconds = Median(t.candidate_seconds);
  d.best_seconds = Median(t.best_seconds);
  d.spread = std::max(RelativeSpread(t.candidate_seconds), RelativeSpread(t.best_seconds));
  if (d.candidate_seconds <= 0 || d.best_seconds <= 0 ||
      t.candidate_seconds.size() != t.best_seconds.size()) {
    d.verdict = Verdict::kLaunchError;
    d.reason = absl::StrCat("no usable timing (", t.candidate_seconds.size(), " and ",
                            t.best_seconds.size(), " blocks)");
    return d;
  }
  d.speedup = d.best_seconds / d.candidate_seconds;
  if (t.floor_seconds > 0 && d.candidate_seconds < t.floor_seconds) {
    d.verdict = Verdict::kImpossible;
    d.reason = absl::StrFormat(
        "%.4g s is below the memory-bandwidth floor of %.4g s: the timing missed work",
        d.candidate_seconds, t.floor_seconds);
    return d;
  }
  const double limit = d.best_seconds * (1 - rules.min_improvement - d.spread);
  const std::string numbers =
      absl::StrFormat("%.4g s vs best %.4g s (%.3fx, spread %.2f%%, needed <= %.4g s)",
                      d.candidate_seconds, d.best_seconds, d.speedup, 100 * d.spread, limit);
  if (d.candidate_seconds > limit) {
    d.verdict = Verdict::kSlower;
    d.reason = absl::StrCat("not faster by ", 100 * rules.min_improvement,
                            "% beyond the spread: ", numbers);
    return d;
  }
  if (d.speedup > rules.long_claim_speedup && !t.long_measurement) {
    d.measure_longer = true;
    d.verdict = Verdict::kSlower;  // until the longer measurement says otherwise
    d.reason = absl::StrCat("claims more than ", rules.long_claim_speedup,
                            "x: measuring again, longer: ", numbers);
    return d;
  }
  d.verdict = Verdict::kAccepted;
  d.reason = absl::StrCat(correct, "; faster: ", numbers,
                          t.long_measurement ? " (long measurement)" : "");
  return d;
}

Decision JudgeHeldOut(const AcceptanceRules& rules, const CorrectnessEvidence& search,
                      const CorrectnessEvidence& held_out) {
  Decision d = JudgeCorrectness(rules, held_out);
  const std::string gap = absl::StrFormat(
      "held-out gap: PR error %.3g vs %.3g in the search (%+.3g), sums %.3g vs %.3g (%+.3g)",
      held_out.max_pr_rel_error, search.max_pr_rel_error,
      held_out.max_pr_rel_error - search.max_pr_rel_error, held_out.max_sum_rel_error,
      search.max_sum_rel_error, held_out.max_sum_rel_error - search.max_sum_rel_error);
  if (d.verdict != Verdict::kAccepted) {
    d.verdict = Verdict::kHeldOutFailed;
    d.reason = absl::StrCat("held-out set: ", d.reason, "; ", gap);
  } else {
    d.reason = gap;
  }
  return d;
}

}  // namespace rvd::tune

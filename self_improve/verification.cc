#include "self_improve/verification.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "self_improve/seed_mix.h"

namespace rvd::tune {
namespace {

// A stream of draws from one seed.
struct Draws {
  uint64_t state;
  uint64_t Next() { return state = SplitMix64(state); }
  int Below(int n) { return static_cast<int>(Next() % static_cast<uint64_t>(n)); }
};

constexpr MatrixKind kRegular[] = {MatrixKind::kFlat, MatrixKind::kPowerLaw, MatrixKind::kRankOne,
                                   MatrixKind::kSpiked, MatrixKind::kGaussian};
constexpr MatrixKind kSpecial[kSpecialKinds] = {MatrixKind::kZeros, MatrixKind::kNaN,
                                                MatrixKind::kInf,   MatrixKind::kHuge,
                                                MatrixKind::kTiny,  MatrixKind::kSubnormal};

double RelError(double got, double ref) {
  if (got == ref) return 0;
  if (std::isnan(got) || std::isnan(ref)) return std::numeric_limits<double>::infinity();
  return ref == 0 ? std::numeric_limits<double>::infinity() : std::fabs(got - ref) / std::fabs(ref);
}

bool SameBits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }
bool SameBits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

void Note(CorrectnessEvidence* e, int* notes, const std::string& line) {
  if ((*notes)++ >= 10) return;
  if (!e->first_mismatches.empty()) e->first_mismatches += "\n";
  e->first_mismatches += line;
}

}  // namespace

const char* MatrixKindName(MatrixKind k) {
  switch (k) {
    case MatrixKind::kFlat: return "flat";
    case MatrixKind::kPowerLaw: return "powerlaw";
    case MatrixKind::kRankOne: return "rank1";
    case MatrixKind::kSpiked: return "spiked";
    case MatrixKind::kGaussian: return "gaussian";
    case MatrixKind::kZeros: return "zeros";
    case MatrixKind::kNaN: return "nan";
    case MatrixKind::kInf: return "inf";
    case MatrixKind::kHuge: return "huge";
    case MatrixKind::kTiny: return "tiny";
    case MatrixKind::kSubnormal: return "subnormal";
  }
  return "unknown";
}

std::vector<InputPlan> PlanInputs(const TuneTarget& target, uint64_t seed, int inputs,
                                  int checked_per_shape) {
  std::vector<InputPlan> plans;
  Draws d{SplitMix64(seed ^ 0x1badb002ull)};
  for (int i = 0; i < inputs; ++i) {
    InputPlan p;
    for (const TuneShape& s : target.shapes) {
      for (int m = 0; m < s.count; ++m) {
        MatrixPlan mp;
        mp.rows = s.rows;
        mp.cols = s.cols;
        mp.kind = kRegular[d.Below(5)];
        mp.seed = d.Next();
        p.matrices.push_back(mp);
      }
    }
    // The checked ones: per shape, a drawn subset (a shape's matrices are
    // contiguous), and one special matrix in a drawn place of the batch.
    size_t first = 0;
    for (const TuneShape& s : target.shapes) {
      const int n = std::min(checked_per_shape, s.count);
      for (int c = 0, tries = 0; c < n && tries < 64 * n; ++tries) {
        MatrixPlan& mp = p.matrices[first + static_cast<size_t>(d.Below(s.count))];
        if (!mp.checked) {
          mp.checked = true;
          ++c;
        }
      }
      first += static_cast<size_t>(s.count);
    }
    if (!p.matrices.empty()) {
      MatrixPlan& special = p.matrices[static_cast<size_t>(d.Below(static_cast<int>(p.matrices.size())))];
      special.kind = kSpecial[i % kSpecialKinds];
      special.checked = true;
      special.bad_row = d.Below(special.rows);
      special.bad_col = d.Below(special.cols);
    }
    plans.push_back(std::move(p));
  }
  return plans;
}

uint64_t PoisonBits64(int run) {
  return 0x7ff8000000000000ull | (0x5eed0000ull + static_cast<uint32_t>(run));
}
uint32_t PoisonBits32(int run) { return 0x7fc00000u | ((0x5e0000u + static_cast<uint32_t>(run)) & 0x3fffffu); }

bool IsPoison(double v, int run) {
  uint64_t b;
  std::memcpy(&b, &v, sizeof b);
  return b == PoisonBits64(run);
}
bool IsPoison(float v, int run) {
  uint32_t b;
  std::memcpy(&b, &v, sizeof b);
  return b == PoisonBits32(run);
}

bool TrustedMagnitude(double maxabs, int64_t k) {
  const double mx2 = maxabs * maxabs;
  return mx2 >= 1e-30 && mx2 * static_cast<double>(k) <= 1e36;
}

void Evaluate(absl::Span<const MatrixReference> refs, const RunOutputs& first,
              const RunOutputs& second, int first_run, int second_run, bool inputs_unchanged,
              const Tolerance& tol, CorrectnessEvidence* e) {
  ++e->inputs;
  e->inputs_unchanged = e->inputs_unchanged && inputs_unchanged;
  int notes = 0;
  for (const MatrixReference& ref : refs) {
    double g = 0, t = 0, mx = 0;
    double ref_mx = 0;
    bool unwritten = false;
    for (size_t q = 0; q < ref.jobs.size(); ++q) {
      const size_t j = static_cast<size_t>(ref.jobs[q]);
      if (j >= first.g2.size() || j >= second.g2.size()) {
        unwritten = true;
        continue;
      }
      for (const RunOutputs* o : {&first, &second}) {
        const int run = o == &first ? first_run : second_run;
        unwritten |= IsPoison(o->g2[j], run) || IsPoison(o->trace[j], run) ||
                     IsPoison(o->maxabs[j], run);
      }
      if (!SameBits(first.g2[j], second.g2[j]) || !SameBits(first.trace[j], second.trace[j]) ||
          !SameBits(first.maxabs[j], second.maxabs[j])) {
        e->deterministic = false;
      }
      g += first.g2[j];
      t += first.trace[j];
      mx = std::isnan(first.maxabs[j]) ? first.maxabs[j] : std::max(mx, double{first.maxabs[j]});
      ref_mx = std::isnan(ref.sums[q].maxabs) ? ref.sums[q].maxabs
                                              : std::max(ref_mx, ref.sums[q].maxabs);
    }
    const std::string where =
        absl::StrCat("matrix ", ref.matrix, " (", MatrixKindName(ref.kind), ")");
    if (unwritten) {
      ++e->outputs_unwritten;
      Note(e, &notes, absl::StrCat(where, ": output slots left with the poison"));
      continue;
    }
    if (ref.kind == MatrixKind::kNaN || ref.kind == MatrixKind::kInf) {
      // The finalize reports a matrix non-finite from its trace.
      if (std::isfinite(t)) {
        ++e->nonfinite_hidden;
        Note(e, &notes, absl::StrFormat("%s: finite trace %.6g for a matrix with a %s", where, t,
                                        MatrixKindName(ref.kind)));
      }
      continue;
    }
    // The largest magnitude must be exact: the trust rule reads it.
    if (!(mx == static_cast<double>(static_cast<float>(ref_mx)))) {
      ++e->sum_mismatches;
      e->max_sum_rel_error = std::max(e->max_sum_rel_error, RelError(mx, ref_mx));
      Note(e, &notes, absl::StrFormat("%s: maxabs %.9g, reference %.9g", where, mx, ref_mx));
      continue;
    }
    if (ref.untrusted) continue;  // recomputed by the oracle: the sums do not count
    for (size_t q = 0; q < ref.jobs.size(); ++q) {
      const size_t j = static_cast<size_t>(ref.jobs[q]);
      for (const auto& [got, want, name] :
           {std::tuple<double, double, const char*>{first.g2[j], ref.sums[q].g2, "g2"},
            std::tuple<double, double, const char*>{first.trace[j], ref.sums[q].trace, "trace"}}) {
        const double err = RelError(got, want);
        e->max_sum_rel_error = std::max(e->max_sum_rel_error, err);
        if (!WithinTolerance(got, want, tol)) {
          ++e->sum_mismatches;
          Note(e, &notes, absl::StrFormat("%s job %d: %s %.17g, reference %.17g", where,
                                          ref.jobs[q], name, got, want));
        }
      }
    }
    const double pr = t == 0 ? 0 : t * t / g;
    const double err = RelError(pr, ref.pr);
    if (std::isfinite(err)) e->max_pr_rel_error = std::max(e->max_pr_rel_error, err);
    if (!WithinTolerance(pr, ref.pr, tol)) {
      ++e->pr_mismatches;
      Note(e, &notes, absl::StrFormat("%s: PR %.17g, oracle %.17g", where, pr, ref.pr));
    }
  }
}

}  // namespace rvd::tune

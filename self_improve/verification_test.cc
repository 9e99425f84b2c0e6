// The verifier's CPU side: the input plans, and Evaluate against every
// exploit the issue lists, each as a deliberate mutant of a correct
// candidate's outputs (the candidate simulated on the host: the float64
// reference sums, rounded as a kernel summing in float64 would).
#include "self_improve/verification.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/test_matrices.h"
#include "self_improve/space.h"

namespace rvd::tune {
namespace {

TuneTarget SmallTarget() {
  TuneTarget t;
  t.dtype = DType::kBF16;
  t.shape_class = "triangle";
  t.shapes = {{6, 32, 96}, {3, 40, 64}};
  return t;
}

TEST(PlanInputsTest, SeededCoveredAndChecked) {
  const TuneTarget t = SmallTarget();
  const std::vector<InputPlan> a = PlanInputs(t, 11, 20), b = PlanInputs(t, 11, 20),
                               c = PlanInputs(t, 12, 20);
  ASSERT_EQ(a.size(), 20u);
  std::set<MatrixKind> kinds;
  bool differ = false;
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].matrices.size(), 9u);  // every shape's whole batch
    int checked[2] = {0, 0}, special = 0;
    for (size_t m = 0; m < a[i].matrices.size(); ++m) {
      const MatrixPlan& p = a[i].matrices[m];
      EXPECT_EQ(p.kind, b[i].matrices[m].kind);
      EXPECT_EQ(p.seed, b[i].matrices[m].seed);
      differ |= p.seed != c[i].matrices[m].seed;
      kinds.insert(p.kind);
      EXPECT_EQ(p.rows, m < 6 ? 32 : 40);
      checked[m < 6 ? 0 : 1] += p.checked;
      if (p.kind >= MatrixKind::kZeros) {
        ++special;
        EXPECT_TRUE(p.checked);
        EXPECT_LT(p.bad_row, p.rows);
        EXPECT_LT(p.bad_col, p.cols);
      }
    }
    EXPECT_EQ(special, 1);
    EXPECT_GE(checked[0], 4);
    EXPECT_GE(checked[1], 3);  // a shape of 3 matrices: all of them
  }
  EXPECT_TRUE(differ);
  // 20 inputs hold every kind, the six special ones included.
  EXPECT_EQ(kinds.size(), 11u);
}

TEST(PoisonTest, DistinctPerRunAndNotArithmetic) {
  double d;
  uint64_t b = PoisonBits64(1);
  std::memcpy(&d, &b, sizeof d);
  EXPECT_TRUE(std::isnan(d));
  EXPECT_TRUE(IsPoison(d, 1));
  EXPECT_FALSE(IsPoison(d, 2));
  EXPECT_FALSE(IsPoison(std::numeric_limits<double>::quiet_NaN(), 1));
  EXPECT_FALSE(IsPoison(0.0 / std::numeric_limits<double>::infinity() * 0, 1));
  float f;
  uint32_t fb = PoisonBits32(3);
  std::memcpy(&f, &fb, sizeof f);
  EXPECT_TRUE(std::isnan(f));
  EXPECT_TRUE(IsPoison(f, 3));
  EXPECT_FALSE(IsPoison(std::nanf(""), 3));
}

TEST(TrustTest, TheFinalizesRule) {
  EXPECT_TRUE(TrustedMagnitude(1.0, 4096));
  EXPECT_FALSE(TrustedMagnitude(1e19, 4096));   // squares overflow f32
  EXPECT_FALSE(TrustedMagnitude(1e-20, 4096));  // products underflow
}

// One input realized on the host: its matrices, their jobs, the reference
// of its checked matrices, and a correct candidate's outputs.
struct Realized {
  std::vector<StoredMatrix> stored;
  std::vector<TuneJob> jobs;
  std::vector<MatrixReference> refs;
  RunOutputs good;
};

std::vector<double> Values(const MatrixPlan& p) {
  std::mt19937_64 rng(p.seed);
  const int n = std::min(p.rows, p.cols);
  std::vector<double> w;
  switch (p.kind) {
    case MatrixKind::kFlat: return MakeMatrix(rng, p.rows, p.cols, Spectrum::kFlat);
    case MatrixKind::kPowerLaw: return MakeMatrix(rng, p.rows, p.cols, Spectrum::kPowerLaw);
    case MatrixKind::kRankOne: return MakeMatrix(rng, p.rows, p.cols, Spectrum::kRankOne);
    case MatrixKind::kGaussian: return MakeMatrix(rng, p.rows, p.cols, Spectrum::kGaussian);
    case MatrixKind::kSpiked: {
      std::vector<double> s(static_cast<size_t>(n), 0.01);
      s[0] = 1.0;
      return MakeMatrixWithSingularValues(rng, p.rows, p.cols, s);
    }
    default: break;
  }
  w = MakeMatrix(rng, p.rows, p.cols, Spectrum::kGaussian);
  double scale = 1;
  if (p.kind == MatrixKind::kZeros) scale = 0;
  if (p.kind == MatrixKind::kHuge) scale = kHugeScale;
  if (p.kind == MatrixKind::kTiny) scale = kTinyScale;
  if (p.kind == MatrixKind::kSubnormal) scale = 1e-39;
  for (double& x : w) x *= scale;
  if (p.kind == MatrixKind::kNaN) w[p.bad_row * p.cols + p.bad_col] = std::nan("");
  if (p.kind == MatrixKind::kInf) w[p.bad_row * p.cols + p.bad_col] = -INFINITY;
  return w;
}

Realized Realize(const InputPlan& plan, DType dtype, int tile) {
  Realized r;
  for (size_t m = 0; m < plan.matrices.size(); ++m) {
    const MatrixPlan& p = plan.matrices[m];
    r.stored.push_back(Store(Values(p), p.rows, p.cols, dtype, 0, MatrixKindName(p.kind)));
    const int first = static_cast<int>(r.jobs.size());
    const int n = std::min(p.rows, p.cols);
    EnumerateTuneJobs(static_cast<int32_t>(m), n, CandidateLaunch{128, 0, tile, tile}, &r.jobs);
    MatrixReference ref;
    ref.matrix = static_cast<int>(m);
    ref.kind = p.kind;
    for (int j = first; j < static_cast<int>(r.jobs.size()); ++j) ref.jobs.push_back(j);
    ref.sums = ReferenceMatrixSums(r.stored.back().view,
                                   absl::MakeConstSpan(r.jobs).subspan(static_cast<size_t>(first)));
    double mx = 0;
    for (const JobSums& s : ref.sums) mx = std::max(mx, s.maxabs);
    ref.untrusted = !TrustedMagnitude(mx, std::max(p.rows, p.cols)) && mx > 0;
    absl::StatusOr<double> pr = OraclePR(r.stored.back().view);
    ref.pr = pr.ok() ? *pr : std::nan("");
    for (const JobSums& s : ref.sums) {
      // The candidate: float64 sums, off in the last bits.
      r.good.g2.push_back(s.g2 * (1 + 3e-16));
      r.good.trace.push_back(s.trace);
      r.good.maxabs.push_back(static_cast<float>(s.maxabs));
    }
    if (p.checked) r.refs.push_back(std::move(ref));
  }
  return r;
}

class EvaluateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    plans_ = PlanInputs(SmallTarget(), 0xabcdef, kSpecialKinds);
    for (const InputPlan& p : plans_) inputs_.push_back(Realize(p, DType::kBF16, 16));
  }
  // Applies `mutate` to a copy of each input's good outputs (the second run
  // as the first unless `second` mutates it too) and judges all inputs.
  Decision JudgeAll(const std::function<void(const Realized&, RunOutputs*)>& mutate,
                    bool mutate_second = true, bool inputs_unchanged = true,
                    CorrectnessEvidence* out = nullptr) {
    CorrectnessEvidence e;
    for (int rep = 0; rep < 4; ++rep) {  // 24 inputs in all
      for (const Realized& r : inputs_) {
        RunOutputs a = r.good, b = r.good;
        mutate(r, &a);
        if (mutate_second) mutate(r, &b);
        Evaluate(r.refs, a, b, 1, 2, inputs_unchanged, kExactPrTolerance, &e);
      }
    }
    if (out != nullptr) *out = e;
    return JudgeCorrectness(AcceptanceRules{}, e);
  }
  std::vector<InputPlan> plans_;
  std::vector<Realized> inputs_;
};

TEST_F(EvaluateTest, ACorrectCandidatePasses) {
  CorrectnessEvidence e;
  Decision d = JudgeAll([](const Realized&, RunOutputs*) {}, true, true, &e);
  EXPECT_EQ(d.verdict, Verdict::kAccepted) << d.reason << "\n" << e.first_mismatches;
  EXPECT_EQ(e.inputs, 24);
  EXPECT_LT(e.max_pr_rel_error, 1e-12);
}

TEST_F(EvaluateTest, AStaleOutputIsUnwritten) {
  // One slot keeps what the buffer held: the poison.
  CorrectnessEvidence e;
  Decision d = JudgeAll(
      [](const Realized& r, RunOutputs* o) {
        const int j = r.refs[0].jobs[0];
        uint64_t bits = PoisonBits64(1);
        std::memcpy(&o->g2[j], &bits, sizeof bits);
      },
      false, true, &e);
  EXPECT_EQ(d.verdict, Verdict::kIncorrect);
  EXPECT_GT(e.outputs_unwritten, 0);
  EXPECT_NE(d.reason.find("unwritten"), std::string::npos) << d.reason;
}

TEST_F(EvaluateTest, PartialWorkIsIncorrect) {
  // Only the first job of each matrix computed, the others zero.
  Decision d = JudgeAll([](const Realized& r, RunOutputs* o) {
    for (const MatrixReference& ref : r.refs) {
      for (size_t q = 1; q < ref.jobs.size(); ++q) {
        o->g2[ref.jobs[q]] = 0;
        o->trace[ref.jobs[q]] = 0;
      }
    }
  });
  EXPECT_EQ(d.verdict, Verdict::kIncorrect) << d.reason;
}

TEST_F(EvaluateTest, LowerPrecisionInsideALooseToleranceIsIncorrect) {
  // A 1e-5 relative error: inside seed 000's |dPR| < 1e-3, outside 2e-6.
  CorrectnessEvidence e;
  Decision d = JudgeAll(
      [](const Realized&, RunOutputs* o) {
        for (double& g : o->g2) g *= 1 + 1e-5;
      },
      true, true, &e);
  EXPECT_EQ(d.verdict, Verdict::kIncorrect) << d.reason;
  EXPECT_GT(e.sum_mismatches, 0);
  EXPECT_NEAR(e.max_sum_rel_error, 1e-5, 1e-7);
}

TEST_F(EvaluateTest, AHiddenNanIsIncorrect) {
  CorrectnessEvidence e;
  Decision d = JudgeAll(
      [](const Realized& r, RunOutputs* o) {
        for (const MatrixReference& ref : r.refs) {
          if (ref.kind != MatrixKind::kNaN && ref.kind != MatrixKind::kInf) continue;
          for (int j : ref.jobs) {
            o->trace[j] = 1.0;  // NaN and Inf treated as 0
            o->g2[j] = 1.0;
          }
        }
      },
      true, true, &e);
  EXPECT_EQ(d.verdict, Verdict::kIncorrect) << d.reason;
  EXPECT_GT(e.nonfinite_hidden, 0);
}

TEST_F(EvaluateTest, ReplayByPointerIsIncorrect) {
  // Outputs of another input (same layout: the plan's shapes) replayed.
  CorrectnessEvidence e;
  for (int rep = 0; rep < 4; ++rep) {
    for (size_t i = 0; i < inputs_.size(); ++i) {
      const Realized& r = inputs_[i];
      const Realized& other = inputs_[(i + 1) % inputs_.size()];
      Evaluate(r.refs, other.good, other.good, 1, 2, true, kExactPrTolerance, &e);
    }
  }
  EXPECT_EQ(JudgeCorrectness(AcceptanceRules{}, e).verdict, Verdict::kIncorrect);
}

TEST_F(EvaluateTest, ADifferentSecondRunIsNondeterministic) {
  CorrectnessEvidence e;
  for (int rep = 0; rep < 4; ++rep) {
    for (const Realized& r : inputs_) {
      RunOutputs b = r.good;
      b.g2[r.refs[0].jobs[0]] = std::nextafter(b.g2[r.refs[0].jobs[0]], 0.0);
      Evaluate(r.refs, r.good, b, 1, 2, true, kExactPrTolerance, &e);
    }
  }
  EXPECT_FALSE(e.deterministic);
  EXPECT_EQ(JudgeCorrectness(AcceptanceRules{}, e).verdict, Verdict::kNondeterministic);
}

TEST_F(EvaluateTest, WritingTheInputIsIncorrect) {
  Decision d = JudgeAll([](const Realized&, RunOutputs*) {}, true, /*inputs_unchanged=*/false);
  EXPECT_EQ(d.verdict, Verdict::kIncorrect);
  EXPECT_NE(d.reason.find("input"), std::string::npos) << d.reason;
}

TEST_F(EvaluateTest, AWrongMaxabsOnHugeDataIsIncorrect) {
  // Saturating the largest magnitude hides the overflow from the trust rule.
  CorrectnessEvidence e;
  Decision d = JudgeAll(
      [](const Realized& r, RunOutputs* o) {
        for (const MatrixReference& ref : r.refs) {
          if (!ref.untrusted) continue;
          for (int j : ref.jobs) o->maxabs[j] = 1.0f;
        }
      },
      true, true, &e);
  EXPECT_EQ(d.verdict, Verdict::kIncorrect) << d.reason;
  EXPECT_NE(e.first_mismatches.find("maxabs"), std::string::npos) << e.first_mismatches;
}

}  // namespace
}  // namespace rvd::tune

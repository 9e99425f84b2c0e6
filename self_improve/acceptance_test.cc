#include "self_improve/acceptance.h"

#include <vector>

#include "gtest/gtest.h"

namespace rvd::tune {
namespace {

CorrectnessEvidence Correct() {
  CorrectnessEvidence c;
  c.inputs = 20;
  c.max_pr_rel_error = 1e-7;
  c.max_sum_rel_error = 2e-7;
  return c;
}

TimingEvidence Timing(std::vector<double> cand, std::vector<double> best) {
  TimingEvidence t;
  t.candidate_seconds = std::move(cand);
  t.best_seconds = std::move(best);
  t.floor_seconds = 1e-4;
  return t;
}

TEST(MedianTest, OddEvenEmpty) {
  EXPECT_EQ(Median({}), 0);
  EXPECT_EQ(Median({3, 1, 2}), 2);
  EXPECT_EQ(Median({4, 1, 3, 2}), 2.5);
  EXPECT_EQ(RelativeSpread({1}), 0);
  EXPECT_NEAR(RelativeSpread({1.0, 1.02, 0.98}), 0.04, 1e-15);
}

TEST(JudgeTest, CorrectAndFasterBeyondSpreadIsAccepted) {
  // Best 1.00 ms with a 1% spread; candidate 0.95 ms: 5% faster > 1% + 1%.
  Decision d = Judge({}, Correct(), Timing({0.95e-3, 0.95e-3, 0.95e-3, 0.95e-3},
                                           {1.0e-3, 1.01e-3, 1.0e-3, 1.0e-3}));
  EXPECT_EQ(d.verdict, Verdict::kAccepted) << d.reason;
  EXPECT_FALSE(d.measure_longer);
  EXPECT_NEAR(d.speedup, 1.0 / 0.95, 1e-12);
  EXPECT_NEAR(d.spread, 0.01, 1e-12);
}

TEST(JudgeTest, FasterWithinSpreadIsSlower) {
  // 1.5% faster, but the best's blocks spread by 1%: 1.5 < 1 + 1.
  Decision d = Judge({}, Correct(), Timing({0.985e-3, 0.985e-3}, {1.0e-3, 1.01e-3}));
  EXPECT_EQ(d.verdict, Verdict::kSlower) << d.reason;
  // Without the spread the same candidate passes the 1% rule.
  d = Judge({}, Correct(), Timing({0.985e-3, 0.985e-3}, {1.0e-3, 1.0e-3}));
  EXPECT_EQ(d.verdict, Verdict::kAccepted) << d.reason;
}

TEST(JudgeTest, CandidateSpreadCountsToo) {
  Decision d = Judge({}, Correct(), Timing({0.95e-3, 0.99e-3, 0.95e-3}, {1e-3, 1e-3, 1e-3}));
  EXPECT_NEAR(d.spread, 0.04 / 0.95, 1e-9);
  EXPECT_EQ(d.verdict, Verdict::kSlower) << d.reason;
}

TEST(JudgeTest, MinImprovementIsTheRule) {
  AcceptanceRules r;
  r.min_improvement = 0.10;
  Decision d = Judge(r, Correct(), Timing({0.95e-3}, {1e-3}));
  EXPECT_EQ(d.verdict, Verdict::kSlower);
  d = Judge(r, Correct(), Timing({0.89e-3}, {1e-3}));
  EXPECT_EQ(d.verdict, Verdict::kAccepted) << d.reason;
}

TEST(JudgeTest, BelowTheBandwidthFloorIsImpossible) {
  TimingEvidence t = Timing({0.5e-4}, {1e-3});
  t.long_measurement = true;
  Decision d = Judge({}, Correct(), t);
  EXPECT_EQ(d.verdict, Verdict::kImpossible) << d.reason;
  EXPECT_NE(d.reason.find("floor"), std::string::npos);
}

TEST(JudgeTest, ClaimAboveTwiceIsMeasuredLongerFirst) {
  Decision d = Judge({}, Correct(), Timing({0.4e-3, 0.4e-3}, {1e-3, 1e-3}));
  EXPECT_TRUE(d.measure_longer);
  EXPECT_NE(d.verdict, Verdict::kAccepted);
  TimingEvidence t = Timing({0.45e-3, 0.45e-3}, {1e-3, 1e-3});
  t.long_measurement = true;
  d = Judge({}, Correct(), t);
  EXPECT_FALSE(d.measure_longer);
  EXPECT_EQ(d.verdict, Verdict::kAccepted) << d.reason;
  // Exactly 2x is not above 2x.
  d = Judge({}, Correct(), Timing({0.5e-3}, {1e-3}));
  EXPECT_FALSE(d.measure_longer);
  EXPECT_EQ(d.verdict, Verdict::kAccepted);
}

TEST(JudgeTest, ToleranceIsTheEnginesOnPrAndSums) {
  CorrectnessEvidence c = Correct();
  c.max_pr_rel_error = 2.1e-6;  // seed 000's absolute 1e-3 would pass this
  EXPECT_EQ(Judge({}, c, Timing({0.5e-3}, {1e-3})).verdict, Verdict::kIncorrect);
  c = Correct();
  c.max_pr_rel_error = 2e-6;  // the boundary is inside, as WithinTolerance
  EXPECT_EQ(JudgeCorrectness({}, c).verdict, Verdict::kAccepted);
  c = Correct();
  c.max_sum_rel_error = 3e-6;
  Decision d = JudgeCorrectness({}, c);
  EXPECT_EQ(d.verdict, Verdict::kIncorrect);
  EXPECT_NE(d.reason.find("per-job sums"), std::string::npos);
  c = Correct();
  c.pr_mismatches = 1;  // a NaN PR has no error to compare but is a mismatch
  EXPECT_EQ(JudgeCorrectness({}, c).verdict, Verdict::kIncorrect);
}

TEST(JudgeTest, EveryHarnessFindingRejects) {
  struct Case {
    const char* what;
    void (*spoil)(CorrectnessEvidence*);
    Verdict want;
  } cases[] = {
      {"few inputs", [](CorrectnessEvidence* c) { c->inputs = 19; }, Verdict::kIncorrect},
      {"wrote input", [](CorrectnessEvidence* c) { c->inputs_unchanged = false; },
       Verdict::kIncorrect},
      {"poison left", [](CorrectnessEvidence* c) { c->outputs_unwritten = 3; },
       Verdict::kIncorrect},
      {"NaN hidden", [](CorrectnessEvidence* c) { c->nonfinite_hidden = 1; },
       Verdict::kIncorrect},
      {"bits differ", [](CorrectnessEvidence* c) { c->deterministic = false; },
       Verdict::kNondeterministic},
  };
  for (const Case& k : cases) {
    CorrectnessEvidence c = Correct();
    k.spoil(&c);
    Decision d = Judge({}, c, Timing({0.5e-3}, {1e-3}));
    EXPECT_EQ(d.verdict, k.want) << k.what << ": " << d.reason;
    EXPECT_FALSE(d.reason.empty());
  }
}

TEST(JudgeTest, NoTimingIsALaunchError) {
  EXPECT_EQ(Judge({}, Correct(), Timing({}, {})).verdict, Verdict::kLaunchError);
  EXPECT_EQ(Judge({}, Correct(), Timing({1e-3, 1e-3}, {1e-3})).verdict,
            Verdict::kLaunchError);
}

TEST(JudgeHeldOutTest, LogsTheGapAndRejectsAFailure) {
  CorrectnessEvidence search = Correct();
  CorrectnessEvidence held = Correct();
  held.max_pr_rel_error = 3e-7;
  Decision d = JudgeHeldOut({}, search, held);
  EXPECT_EQ(d.verdict, Verdict::kAccepted);
  EXPECT_NE(d.reason.find("held-out gap"), std::string::npos) << d.reason;
  EXPECT_NE(d.reason.find("+2e-07"), std::string::npos) << d.reason;
  held.pr_mismatches = 2;
  held.max_pr_rel_error = 1e-3;
  d = JudgeHeldOut({}, search, held);
  EXPECT_EQ(d.verdict, Verdict::kHeldOutFailed) << d.reason;
}

}  // namespace
}  // namespace rvd::tune

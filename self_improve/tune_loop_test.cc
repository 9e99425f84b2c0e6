#include "self_improve/tune_loop.h"

#include <atomic>
#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "self_improve/fake_tools.h"
#include "self_improve/space.h"

namespace rvd::tune {
namespace {

using testing::FakeBenchmarker;
using testing::FakeCompiler;
using testing::FakeGenerator;
using testing::FakeVerifier;
using testing::RecordingObserver;

struct Rig {
  FakeCompiler compiler;
  FakeVerifier verifier;
  FakeBenchmarker bench;
  FakeGenerator gen;
  RecordingObserver observer;
  LoopConfig config;
  std::atomic<bool> cancelled{false};
  Rig() {
    config.target.dtype = DType::kBF16;
    config.target.shape_class = "triangle";
    config.target.arch = "sm_90a";
    config.target.shapes = {{480, 128, 4096}};
    config.secret_seed = 0xfeedfacecafebeefull;
  }
  absl::StatusOr<LoopOutcome> Run() {
    TuneLoop loop(config, compiler, verifier, bench, gen, observer);
    return loop.Run(cancelled);
  }
  std::vector<std::string> Verdicts() {
    std::vector<std::string> v;
    for (const IterationRecord& r : observer.records) v.push_back(VerdictName(r.verdict));
    return v;
  }
};

TEST(TuneLoopTest, StartsFromTheNaivePointAndStopsOnPatience) {
  Rig rig;
  for (int i = 0; i < 10; ++i) rig.gen.Add("slow" + std::to_string(i), 1.2e-3);
  absl::StatusOr<LoopOutcome> out = rig.Run();
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->stop, StopReason::kPatience) << out->why;
  EXPECT_EQ(rig.gen.requests().size(), 3u);  // patience 3
  ASSERT_EQ(rig.observer.records.size(), 4u);
  const IterationRecord& start = rig.observer.records[0];
  EXPECT_EQ(start.iteration, 0);
  EXPECT_EQ(KeyOfDescription(start.description), PointKey(NaivePoint()));
  EXPECT_EQ(rig.compiler.compiled().front(), start.source);
  EXPECT_EQ(rig.Verdicts(), (std::vector<std::string>{"accepted", "slower", "slower", "slower"}));
  EXPECT_EQ(out->baseline_seconds, 1e-3);
  EXPECT_EQ(out->best_seconds, 1e-3);
  // The generator saw the naive source as the best, and the history grow.
  const std::vector<CandidateRequest> reqs = rig.gen.requests();
  EXPECT_EQ(reqs[0].best_source, start.source);
  EXPECT_EQ(reqs[0].signature, kCandidateSignature);
  EXPECT_EQ(reqs[2].history.size(), 2u);
  EXPECT_EQ(reqs[2].history[1].verdict, Verdict::kSlower);
  EXPECT_FALSE(reqs[0].bottleneck.signals.empty());
}

TEST(TuneLoopTest, AnAcceptedCandidateResetsThePatienceAndBecomesTheBest) {
  Rig rig;
  rig.gen.Add("a", 0.9e-3);   // accepted
  rig.gen.Add("b", 0.95e-3);  // slower than a
  rig.gen.Add("c", 0.95e-3);
  rig.gen.Add("d", 0.8e-3);   // accepted
  rig.gen.Add("e", 0.8e-3);   // not faster by 1%
  rig.gen.Add("f", 0.85e-3);
  rig.gen.Add("g", 0.79e-3);  // 1.25% faster, within 1% + 0.2% spread? spread 0.2%: 0.8*(1-0.012)=0.7904: accepted
  absl::StatusOr<LoopOutcome> out = rig.Run();
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(rig.Verdicts(), (std::vector<std::string>{"accepted", "accepted", "slower", "slower",
                                                      "accepted", "slower", "slower", "accepted"}));
  EXPECT_EQ(out->stop, StopReason::kExhausted);  // the script ran out
  EXPECT_NEAR(out->best_seconds, 0.79e-3, 1e-12);
  EXPECT_EQ(KeyOfDescription(out->best_description), "");
  EXPECT_EQ(out->best_description, "g: fake");
  // Iteration 2 compared b against a, not against the naive start.
  const std::vector<CandidateRequest> reqs = rig.gen.requests();
  EXPECT_EQ(reqs[1].best_description, "a: fake");
  EXPECT_EQ(rig.observer.records[2].best_seconds, 0.9e-3);
  // Each accepted candidate was re-checked on a held-out set.
  int held_out = 0;
  for (const VerifyRequest& v : rig.verifier.requests()) held_out += v.held_out;
  EXPECT_EQ(held_out, 3);
  EXPECT_NE(rig.observer.records[1].held_out.find("held-out gap"), std::string::npos);
}

TEST(TuneLoopTest, MaxIterIsTheBudget) {
  Rig rig;
  rig.config.budget.max_iter = 4;
  for (int i = 0; i < 10; ++i) rig.gen.Add("f" + std::to_string(i), 1e-3 * (0.9 - 0.05 * i));
  absl::StatusOr<LoopOutcome> out = rig.Run();
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->stop, StopReason::kBudget);
  EXPECT_EQ(rig.gen.requests().size(), 4u);
  EXPECT_EQ(rig.observer.records.back().iteration, 4);
}

TEST(TuneLoopTest, CompileErrorsGoBackToTheGeneratorThreeTimes) {
  Rig rig;
  rig.gen.Add("x1", 0.5e-3, "broken");
  rig.gen.Add("x2", 0.5e-3, "broken");
  rig.gen.Add("ok", 0.9e-3);
  for (int i = 0; i < 4; ++i) rig.gen.Add("y" + std::to_string(i), 0.5e-3, "broken");
  rig.config.budget.max_iter = 2;
  absl::StatusOr<LoopOutcome> out = rig.Run();
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(rig.observer.records.size(), 3u);
  EXPECT_EQ(rig.observer.records[1].verdict, Verdict::kAccepted);
  EXPECT_EQ(rig.observer.records[1].compile_attempts, 3);
  EXPECT_EQ(rig.observer.records[2].verdict, Verdict::kCompileError);
  EXPECT_EQ(rig.observer.records[2].compile_attempts, 4);  // the first try and 3 retries
  EXPECT_NE(rig.observer.records[2].reason.find("y3 does not compile"), std::string::npos)
      << rig.observer.records[2].reason;
  const std::vector<CandidateRequest> reqs = rig.gen.requests();
  ASSERT_EQ(reqs.size(), 7u);
  EXPECT_EQ(reqs[0].attempt, 0);
  EXPECT_TRUE(reqs[0].failed_source.empty());
  EXPECT_EQ(reqs[1].attempt, 1);
  EXPECT_NE(reqs[1].failed_source.find("key=x1"), std::string::npos);
  EXPECT_NE(reqs[1].compile_log.find("x1 does not compile"), std::string::npos);
  EXPECT_EQ(reqs[2].attempt, 2);
  EXPECT_NE(reqs[2].compile_log.find("x2"), std::string::npos);
  EXPECT_EQ(reqs[3].attempt, 0);  // a new iteration starts clean
  EXPECT_TRUE(reqs[3].compile_log.empty());
}

TEST(TuneLoopTest, AMissingAnnotationIsACompileErrorWithItsMessage) {
  Rig rig;
  rig.config.budget.max_iter = 1;
  rig.config.compile_retries = 0;
  // A source without the annotation line.
  struct NoAnnotation final : Generator {
    std::string Name() const override { return "x"; }
    absl::StatusOr<Candidate> Generate(const CandidateRequest&) override {
      return Candidate{"__global__ void rvd_tune_candidate() {}", "bare"};
    }
  } gen;
  TuneLoop loop(rig.config, rig.compiler, rig.verifier, rig.bench, gen, rig.observer);
  absl::StatusOr<LoopOutcome> out = loop.Run(rig.cancelled);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(rig.observer.records.back().verdict, Verdict::kCompileError);
  EXPECT_NE(rig.observer.records.back().reason.find("no launch annotation"), std::string::npos);
}

TEST(TuneLoopTest, EachRejectionHasItsVerdict) {
  Rig rig;
  rig.config.budget.patience = 100;
  rig.gen.Add("wrong", 0.5e-3, "wrong");
  rig.gen.Add("fault", 0.5e-3, "fault");
  rig.gen.Add("nondet", 0.5e-3, "nondet");
  rig.gen.Add("tooFast", 1e-6);  // below the 1e-5 s floor
  rig.gen.Add("heldout", 0.9e-3, "heldout_wrong");
  rig.gen.AddError(absl::UnavailableError("provider down"));
  absl::StatusOr<LoopOutcome> out = rig.Run();
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(rig.Verdicts(),
            (std::vector<std::string>{"accepted", "incorrect", "launch_error", "nondeterministic",
                                      "impossible", "held_out_failed", "generator_error"}));
  EXPECT_EQ(out->best_seconds, 1e-3);  // nothing replaced the start
  EXPECT_NE(rig.observer.records[2].reason.find("illegal memory access"), std::string::npos);
  EXPECT_NE(rig.observer.records[6].reason.find("provider down"), std::string::npos);
}

TEST(TuneLoopTest, AClaimAboveTwiceIsMeasuredLongerFirst) {
  Rig rig;
  rig.config.budget.patience = 100;
  rig.gen.Add("inflated", 0.3e-3);  // the long measurement reads 0.9 ms: 1.11x, accepted
  // 3x of the inflated kernel's own 0.3 ms (what the fake times it at),
  // confirmed by the long measurement.
  rig.gen.Add("real", 0.1e-3);
  absl::StatusOr<LoopOutcome> out = rig.Run();
  ASSERT_TRUE(out.ok()) << out.status();
  const std::vector<BenchRequest> br = rig.bench.requests();
  ASSERT_EQ(br.size(), 4u);
  EXPECT_FALSE(br[0].long_measurement);
  EXPECT_TRUE(br[1].long_measurement);
  EXPECT_EQ(br[1].rounds, rig.config.long_bench_rounds);
  EXPECT_NE(br[1].seed, br[0].seed);  // fresh inputs for the second measurement
  EXPECT_EQ(rig.observer.records[1].verdict, Verdict::kAccepted);
  EXPECT_NEAR(rig.observer.records[1].candidate_seconds, 0.9e-3, 1e-9);
  EXPECT_NE(rig.observer.records[1].reason.find("long measurement"), std::string::npos);
  EXPECT_TRUE(br[3].long_measurement);
  EXPECT_EQ(rig.observer.records[2].verdict, Verdict::kAccepted);
  EXPECT_NEAR(out->best_seconds, 0.1e-3, 1e-9);
}

TEST(TuneLoopTest, ToolFailuresEndTheJob) {
  {
    Rig rig;
    rig.gen.Add("a", 0.9e-3);
    rig.verifier.FailWith(absl::UnavailableError("device lost"));
    absl::StatusOr<LoopOutcome> out = rig.Run();
    EXPECT_EQ(out.status().code(), absl::StatusCode::kUnavailable);
  }
  {
    Rig rig;
    rig.compiler.FailWith(absl::FailedPreconditionError("no NVRTC"));
    EXPECT_EQ(rig.Run().status().code(), absl::StatusCode::kFailedPrecondition);
  }
}

TEST(TuneLoopTest, AWrongStartIsRefused) {
  Rig rig;
  rig.config.start = "product";
  struct WrongVerifier final : Verifier {
    absl::StatusOr<CorrectnessEvidence> Verify(const TuneTarget&, const CompiledKernel&,
                                               const VerifyRequest& r) override {
      CorrectnessEvidence e;
      e.inputs = r.inputs;
      e.outputs_unwritten = 5;
      return e;
    }
  } wrong;
  TuneLoop loop(rig.config, rig.compiler, wrong, rig.bench, rig.gen, rig.observer);
  absl::StatusOr<LoopOutcome> out = loop.Run(rig.cancelled);
  EXPECT_EQ(out.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(out.status().message().find("is not correct"), std::string::npos) << out.status();
  rig.config.start = "best guess";
  EXPECT_EQ(rig.Run().status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(TuneLoopTest, StartsFromTheProductKernel) {
  Rig rig;
  rig.config.start = "product";
  rig.gen.Add("a", 0.19e-3);
  absl::StatusOr<LoopOutcome> out = rig.Run();
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->baseline_seconds, 0.2e-3);
  EXPECT_EQ(rig.observer.records[0].source, "");
  EXPECT_EQ(rig.observer.records[1].verdict, Verdict::kAccepted);
}

TEST(TuneLoopTest, CancelStopsAtTheNextStep) {
  Rig rig;
  rig.gen.Add("a", 0.9e-3);
  rig.gen.AddError(absl::CancelledError("cancelled while waiting"),
                   [&rig](const CandidateRequest&) { rig.cancelled.store(true); });
  rig.gen.Add("never", 0.1e-3);
  absl::StatusOr<LoopOutcome> out = rig.Run();
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->stop, StopReason::kCancelled);
  EXPECT_EQ(rig.gen.requests().size(), 2u);
  EXPECT_EQ(rig.observer.records.size(), 2u);  // the cancelled iteration is not logged
  EXPECT_NEAR(out->best_seconds, 0.9e-3, 1e-12);
}

TEST(TuneLoopTest, SeedsAreFreshPerIterationAndPurpose) {
  Rig rig;
  rig.config.budget.patience = 100;
  for (int i = 0; i < 5; ++i) rig.gen.Add("a" + std::to_string(i), 1e-3 * (0.9 - 0.1 * i));
  ASSERT_TRUE(rig.Run().ok());
  std::set<uint64_t> seeds;
  int n = 0;
  for (const VerifyRequest& v : rig.verifier.requests()) {
    seeds.insert(v.seed);
    ++n;
    EXPECT_GE(v.inputs, 20);
  }
  for (const BenchRequest& b : rig.bench.requests()) {
    seeds.insert(b.seed);
    ++n;
  }
  EXPECT_EQ(seeds.size(), static_cast<size_t>(n));
  EXPECT_EQ(seeds.count(rig.config.secret_seed), 0u);
  // A function of the secret only: another job with another secret differs.
  EXPECT_NE(TuneLoop::DeriveSeed(1, 3, 1), TuneLoop::DeriveSeed(2, 3, 1));
  EXPECT_EQ(TuneLoop::DeriveSeed(1, 3, 1), TuneLoop::DeriveSeed(1, 3, 1));
}

TEST(TuneLoopTest, RestoreContinuesTheJob) {
  Rig first;
  first.config.budget.patience = 100;
  first.config.budget.max_iter = 3;
  first.gen.Add("a", 0.9e-3);
  first.gen.Add("b", 0.95e-3);
  first.gen.Add("c", 0.95e-3);
  ASSERT_TRUE(first.Run().ok());
  ASSERT_EQ(first.observer.records.size(), 4u);

  Rig second;
  second.config.budget = first.config.budget;
  second.config.budget.max_iter = 5;
  second.config.budget.patience = 3;
  second.gen.Add("d", 0.95e-3);
  second.gen.Add("e", 0.95e-3);
  TuneLoop loop(second.config, second.compiler, second.verifier, second.bench, second.gen,
                second.observer);
  loop.Restore(first.observer.records);
  absl::StatusOr<LoopOutcome> out = loop.Run(second.cancelled);
  ASSERT_TRUE(out.ok()) << out.status();
  // Two trailing rejections were restored: one more reaches patience 3.
  EXPECT_EQ(out->stop, StopReason::kPatience) << out->why;
  ASSERT_EQ(second.observer.records.size(), 1u);
  EXPECT_EQ(second.observer.records[0].iteration, 4);
  // The best is a's source again, compiled and verified before use.
  EXPECT_NE(second.compiler.compiled().front().find("key=a"), std::string::npos);
  EXPECT_EQ(second.gen.requests()[0].best_description, "a: fake");
  EXPECT_EQ(second.gen.requests()[0].history.size(), 3u);
  EXPECT_EQ(out->baseline_seconds, 1e-3);
}

}  // namespace
}  // namespace rvd::tune

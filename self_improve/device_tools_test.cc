// The device tools (device_tools.h) over a host fake of the device
// (fake_tune_device.h, which computes a candidate's per-job sums with the
// float64 reference and then misbehaves as its source says): the evidence
// they gather makes Judge accept the honest kernel and reject each
// misbehaviour for its own reason; the inputs are fresh per seed, cover
// every shape, are run twice with distinct poison; the comparison is
// interleaved A-B-A-B; a candidate's fault is ABORTED, the best's is not;
// start "product" is refused with its reason. The realized inputs have
// the spectra their plans name (against the SVD oracle).
#include "self_improve/device_tools.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "self_improve/acceptance.h"
#include "self_improve/fake_tune_device.h"
#include "self_improve/space.h"
#include "self_improve/tune_loop.h"

namespace rvd::tune {
namespace {

using ::testing::HasSubstr;
using testing::FakeDeviceSource;
using testing::FakeTuneDevice;

TuneTarget SmallTarget() {
  TuneTarget t;
  t.dtype = DType::kBF16;
  t.shape_class = "triangle";
  t.arch = "sm_90a";
  t.shapes = {{5, 32, 80}, {3, 48, 64}};
  return t;
}

class DeviceToolsTest : public ::testing::Test {
 protected:
  void SetUp() override { tools_ = MakeDeviceTools(device_); }

  // Compiles a fake candidate with the 16 x 16 tile annotation.
  std::shared_ptr<const CompiledKernel> Kernel(double seconds, const std::string& flags = "") {
    const CandidateLaunch launch{128, 0, 16, 16};
    absl::StatusOr<CompileResult> c = tools_.compiler->Compile(
        target_, FakeDeviceSource(seconds, flags, FormatLaunchAnnotation(launch)), launch);
    EXPECT_TRUE(c.ok()) << c.status();
    EXPECT_NE(c->kernel, nullptr) << c->log;
    return c.ok() ? c->kernel : nullptr;
  }

  // The whole decision for `flags` against an honest best twice as slow.
  Decision JudgeCandidate(const std::string& flags, CorrectnessEvidence* evidence = nullptr) {
    auto candidate = Kernel(0.5e-3, flags);
    auto best = Kernel(1e-3);
    VerifyRequest vr;
    vr.seed = 1234;
    vr.inputs = 20;
    absl::StatusOr<CorrectnessEvidence> e = tools_.verifier->Verify(target_, *candidate, vr);
    EXPECT_TRUE(e.ok()) << e.status();
    if (!e.ok()) return Decision{};
    if (evidence != nullptr) *evidence = *e;
    BenchRequest br;
    br.seed = 99;
    absl::StatusOr<TimingEvidence> t = tools_.benchmarker->Compare(target_, *candidate, *best, br);
    EXPECT_TRUE(t.ok()) << t.status();
    if (!t.ok()) return Decision{};
    return Judge(AcceptanceRules{}, *e, *t);
  }

  FakeTuneDevice device_;
  TuneTarget target_ = SmallTarget();
  TuneBackend::Tools tools_;
};

TEST_F(DeviceToolsTest, TheHonestKernelIsAccepted) {
  CorrectnessEvidence e;
  const Decision d = JudgeCandidate("", &e);
  EXPECT_EQ(d.verdict, Verdict::kAccepted) << d.reason << "\n" << e.first_mismatches;
  EXPECT_EQ(e.inputs, 20);
  EXPECT_EQ(e.pr_mismatches, 0);
  EXPECT_LT(e.max_pr_rel_error, 1e-12);
  EXPECT_NEAR(d.speedup, 2.0, 0.01);
}

TEST_F(DeviceToolsTest, EachMisbehaviourIsRejectedForItsReason) {
  struct Case {
    const char* flags;
    Verdict verdict;
    const char* reason;
  };
  const Case cases[] = {
      {"stale", Verdict::kIncorrect, "unwritten"},
      {"wrong", Verdict::kIncorrect, "outside"},
      {"writes_input", Verdict::kIncorrect, "wrote to its input"},
      {"hides_nan", Verdict::kIncorrect, "not reported as non-finite"},
      {"nondet", Verdict::kNondeterministic, "different bits"},
  };
  for (const Case& c : cases) {
    CorrectnessEvidence e;
    const Decision d = JudgeCandidate(c.flags, &e);
    EXPECT_EQ(d.verdict, c.verdict) << c.flags << ": " << d.reason;
    EXPECT_THAT(d.reason, HasSubstr(c.reason)) << c.flags;
  }
}

TEST_F(DeviceToolsTest, VerifyRunsFreshInputsOfEveryShapeTwiceWithDistinctPoison) {
  auto k = Kernel(1e-3);
  VerifyRequest vr;
  vr.seed = 7;
  vr.inputs = 20;
  ASSERT_TRUE(tools_.verifier->Verify(target_, *k, vr).ok());
  const std::vector<FakeTuneDevice::RunRecord> runs = device_.runs();
  ASSERT_EQ(runs.size(), 40u);
  std::set<uint64_t> inputs, poison;
  for (size_t i = 0; i < runs.size(); ++i) {
    const FakeTuneDevice::RunRecord& r = runs[i];
    ASSERT_EQ(r.batch.size(), 8u);  // every shape's whole batch
    for (size_t m = 0; m < r.batch.size(); ++m) {
      EXPECT_EQ(r.batch[m].rows, m < 5 ? 32 : 48);
      EXPECT_EQ(r.batch[m].cols, m < 5 ? 80 : 64);
      EXPECT_EQ(r.batch[m].dtype, DType::kBF16);
    }
    // 16 x 16 tiles: 32 -> 3 jobs, 48 -> 6 jobs per matrix.
    EXPECT_EQ(r.num_jobs, 5u * 3 + 3u * 6);
    EXPECT_LT(r.spec.grid, r.num_jobs) << "fewer blocks than jobs exercise the job loop";
    EXPECT_EQ(r.spec.threads, 128u);
    EXPECT_EQ(r.spec.timed_launches, 0u);
    poison.insert(r.spec.poison64);
    if (i % 2 == 1) {
      EXPECT_EQ(r.inputs_hash, runs[i - 1].inputs_hash) << "the second run sees the same inputs";
    }
    inputs.insert(r.inputs_hash);
  }
  EXPECT_EQ(inputs.size(), 20u) << "every input fresh";
  EXPECT_FALSE(runs[0].regular_inputs) << "every input holds a special matrix";
  EXPECT_EQ(poison.size(), 40u) << "every run its own poison";
  // Another seed, other inputs; the same seed, the same ones.
  device_.ClearRuns();
  ASSERT_TRUE(tools_.verifier->Verify(target_, *k, vr).ok());
  EXPECT_EQ(device_.runs()[0].inputs_hash, runs[0].inputs_hash);
  device_.ClearRuns();
  vr.seed = 8;
  ASSERT_TRUE(tools_.verifier->Verify(target_, *k, vr).ok());
  EXPECT_EQ(inputs.count(device_.runs()[0].inputs_hash), 0u);
}

TEST_F(DeviceToolsTest, HostThreadsChangeNoInputAndNoEvidence) {
  VerifyRequest vr;
  vr.seed = 11;
  vr.inputs = 6;
  std::vector<uint64_t> hashes[2];
  CorrectnessEvidence evidence[2];
  for (int threads : {1, 4}) {
    FakeTuneDevice device;
    DeviceToolsOptions o;
    o.host_threads = threads;
    TuneBackend::Tools tools = MakeDeviceTools(device, o);
    const CandidateLaunch launch{128, 0, 16, 16};
    absl::StatusOr<CompileResult> c = tools.compiler->Compile(
        target_, FakeDeviceSource(1e-3, "wrong", FormatLaunchAnnotation(launch)), launch);
    ASSERT_TRUE(c.ok() && c->kernel != nullptr);
    absl::StatusOr<CorrectnessEvidence> e = tools.verifier->Verify(target_, *c->kernel, vr);
    ASSERT_TRUE(e.ok()) << e.status();
    evidence[threads == 1 ? 0 : 1] = *e;
    for (const FakeTuneDevice::RunRecord& r : device.runs()) {
      hashes[threads == 1 ? 0 : 1].push_back(r.inputs_hash);
    }
  }
  EXPECT_EQ(hashes[0], hashes[1]);
  EXPECT_EQ(evidence[0].sum_mismatches, evidence[1].sum_mismatches);
  EXPECT_GT(evidence[0].sum_mismatches, 0);
  EXPECT_EQ(evidence[0].max_sum_rel_error, evidence[1].max_sum_rel_error);
  EXPECT_EQ(evidence[0].max_pr_rel_error, evidence[1].max_pr_rel_error);
  EXPECT_EQ(evidence[0].first_mismatches, evidence[1].first_mismatches);
}

TEST_F(DeviceToolsTest, CompareInterleavesCandidateAndBest) {
  auto candidate = Kernel(0.5e-3);
  auto best = Kernel(1e-3);
  device_.ClearRuns();
  BenchRequest br;
  br.seed = 5;
  br.rounds = 4;
  absl::StatusOr<TimingEvidence> t = tools_.benchmarker->Compare(target_, *candidate, *best, br);
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->candidate_seconds.size(), 4u);
  ASSERT_EQ(t->best_seconds.size(), 4u);
  for (double s : t->candidate_seconds) EXPECT_NEAR(s, 0.5e-3, 1e-6);
  for (double s : t->best_seconds) EXPECT_NEAR(s, 1e-3, 2e-6);
  EXPECT_FALSE(t->long_measurement);
  EXPECT_DOUBLE_EQ(t->floor_seconds, TargetBytes(target_) / device_.info.dram_bytes_per_second);
  const std::vector<FakeTuneDevice::RunRecord> runs = device_.runs();
  ASSERT_EQ(runs.size(), 8u);
  for (size_t i = 0; i < runs.size(); ++i) {
    EXPECT_EQ(runs[i].module, runs[i % 2].module) << "A-B-A-B";
    EXPECT_EQ(runs[i].spec.timed_launches, 5u);
    EXPECT_EQ(runs[i].inputs_hash, runs[0].inputs_hash);
  }
  EXPECT_NE(runs[0].module, runs[1].module);
  // Timed on regular matrices only: none all zero, none with NaN or Inf.
  for (const FakeTuneDevice::RunRecord& r : runs) EXPECT_TRUE(r.regular_inputs);
  // A long measurement: longer blocks, said so.
  device_.ClearRuns();
  br.long_measurement = true;
  t = tools_.benchmarker->Compare(target_, *candidate, *best, br);
  ASSERT_TRUE(t.ok());
  EXPECT_TRUE(t->long_measurement);
  EXPECT_EQ(device_.runs()[0].spec.timed_launches, 20u);
}

TEST_F(DeviceToolsTest, ProfileTimesOneKernelAgainstTheCeilings) {
  auto k = Kernel(2e-3);
  absl::StatusOr<KernelProfile> p = tools_.benchmarker->Profile(target_, *k, 3);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_NEAR(p->seconds, 2e-3, 1e-5);
  EXPECT_DOUBLE_EQ(p->bytes, 2.0 * (5 * 32 * 80 + 3 * 48 * 64));
  EXPECT_DOUBLE_EQ(p->flops, 5.0 * 32 * 33 * 80 + 3.0 * 48 * 49 * 64);
  EXPECT_EQ(p->peak_bytes_per_second, device_.info.dram_bytes_per_second);
  EXPECT_EQ(p->peak_flops_per_second, device_.info.fp32_flops_per_second);
  EXPECT_GT(device_.runs().back().spec.timed_launches, 1u);
}

TEST_F(DeviceToolsTest, ACandidateFaultIsAbortedTheBestsIsNot) {
  auto fault = Kernel(1e-3, "fault");
  auto honest = Kernel(1e-3);
  VerifyRequest vr;
  absl::StatusOr<CorrectnessEvidence> e = tools_.verifier->Verify(target_, *fault, vr);
  EXPECT_EQ(e.status().code(), absl::StatusCode::kAborted) << e.status();
  BenchRequest br;
  absl::StatusOr<TimingEvidence> t = tools_.benchmarker->Compare(target_, *fault, *honest, br);
  EXPECT_EQ(t.status().code(), absl::StatusCode::kAborted) << t.status();
  t = tools_.benchmarker->Compare(target_, *honest, *fault, br);
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInternal) << t.status();
  EXPECT_THAT(t.status().message(), HasSubstr("best kernel failed"));
}

TEST_F(DeviceToolsTest, CompileErrorsArchAndProduct) {
  const CandidateLaunch launch{128, 0, 16, 16};
  absl::StatusOr<CompileResult> c = tools_.compiler->Compile(
      target_, FakeDeviceSource(1e-3, "broken", FormatLaunchAnnotation(launch)), launch);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->kernel, nullptr);
  EXPECT_THAT(c->log, HasSubstr("error"));
  TuneTarget other = target_;
  other.arch = "sm_100a";
  c = tools_.compiler->Compile(other, FakeDeviceSource(1e-3, "", ""), launch);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(c.status().message(), HasSubstr("sm_90a"));
  absl::StatusOr<std::shared_ptr<const CompiledKernel>> p = tools_.compiler->Product(target_);
  EXPECT_EQ(p.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(p.status().message(), HasSubstr("per-job contract"));
}

TEST_F(DeviceToolsTest, KernelsReleaseTheirModulesOnce) {
  {
    auto a = Kernel(1e-3);
    auto b = Kernel(1e-3);
    EXPECT_EQ(device_.live_modules(), 2);
  }
  EXPECT_EQ(device_.live_modules(), 0);
  EXPECT_EQ(device_.releases(), 2);
}

// The loop itself over the device tools: from the naive start, an honest
// faster candidate is accepted and a wrong one rejected.
TEST_F(DeviceToolsTest, ALoopOverTheDeviceToolsAcceptsAndRejects) {
  class Script final : public Generator {
   public:
    std::string Name() const override { return "script"; }
    absl::StatusOr<Candidate> Generate(const CandidateRequest& r) override {
      const std::string annotation = FormatLaunchAnnotation(CandidateLaunch{128, 0, 16, 16});
      if (r.iteration == 1) return Candidate{FakeDeviceSource(0.4e-3, "", annotation), "fast"};
      if (r.iteration == 2) return Candidate{FakeDeviceSource(0.1e-3, "wrong", annotation), "wrong"};
      return absl::OutOfRangeError("script exhausted");
    }
  } script;
  class Records final : public LoopObserver {
   public:
    void OnPhase(int, const char*) override {}
    void OnRecord(const IterationRecord& r) override { records.push_back(r); }
    std::vector<IterationRecord> records;
  } observer;
  // The naive start's source runs as an honest kernel of 1 ms (the fake's rule).
  LoopConfig config;
  config.target = target_;
  config.secret_seed = 42;
  config.budget.max_iter = 5;
  TuneLoop loop(config, *tools_.compiler, *tools_.verifier, *tools_.benchmarker, script, observer);
  std::atomic<bool> cancelled{false};
  absl::StatusOr<LoopOutcome> out = loop.Run(cancelled);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->stop, StopReason::kExhausted);
  ASSERT_EQ(observer.records.size(), 3u);
  EXPECT_EQ(observer.records[1].verdict, Verdict::kAccepted) << observer.records[1].reason;
  EXPECT_EQ(observer.records[2].verdict, Verdict::kIncorrect) << observer.records[2].reason;
  EXPECT_NEAR(out->best_seconds, 0.4e-3, 1e-5);
}

// The realized inputs are what their plans say (f32, against the oracle).
// A clock that stands still but for what the test (or `tick` per Now()
// call) advances it, recording every sleep.
class FakeClock final : public DutyCycle::Clock {
 public:
  explicit FakeClock(absl::Duration tick = absl::ZeroDuration()) : tick_(tick) {}
  absl::Time Now() override {
    now_ += tick_;
    return now_;
  }
  void SleepFor(absl::Duration d) override {
    sleeps.push_back(d);
    now_ += d;
  }
  void Advance(absl::Duration d) { now_ += d; }
  std::vector<absl::Duration> sleeps;

 private:
  const absl::Duration tick_;
  absl::Time now_ = absl::UnixEpoch();
};

// After work of t the next work waits t (1 - d) / d, less the time that
// passed since (host work between device runs counts as idle).
TEST(DutyCycleTest, IdlesInProportionToWork) {
  FakeClock clock;
  DutyCycle half(0.5, clock);
  const auto work = [&](absl::Duration t) {
    return half.Run([&] {
      clock.Advance(t);
      return 0;
    });
  };
  work(absl::Seconds(2));
  EXPECT_TRUE(clock.sleeps.empty());  // nothing owed before the first
  work(absl::Seconds(1));
  ASSERT_EQ(clock.sleeps.size(), 1u);
  EXPECT_EQ(clock.sleeps[0], absl::Seconds(2));
  clock.Advance(absl::Milliseconds(400));  // the host's own work
  work(absl::Seconds(3));
  ASSERT_EQ(clock.sleeps.size(), 2u);
  EXPECT_EQ(clock.sleeps[1], absl::Milliseconds(600));
  clock.Advance(absl::Seconds(5));  // longer than owed: no wait
  work(absl::Seconds(1));
  EXPECT_EQ(clock.sleeps.size(), 2u);

  FakeClock quarter_clock;
  DutyCycle quarter(0.25, quarter_clock);
  absl::Duration busy;
  const absl::Time start = quarter_clock.Now();
  for (int i = 0; i < 10; ++i) {
    const absl::Duration t = absl::Milliseconds(100 * (i % 3 + 1));
    quarter.Run([&] {
      quarter_clock.Advance(t);
      return 0;
    });
    busy += t;
    if (i > 0) {
      EXPECT_EQ(quarter_clock.sleeps.back(), absl::Milliseconds(300 * ((i - 1) % 3 + 1))) << i;
    }
  }
  // Busy a quarter of the time up to the last run's end (its own idle not yet owed).
  const absl::Duration last = absl::Milliseconds(100 * (9 % 3 + 1));
  EXPECT_DOUBLE_EQ(absl::FDivDuration(busy - last, quarter_clock.Now() - start - last), 0.25);

  FakeClock full_clock;
  DutyCycle full(1.0, full_clock);
  for (int i = 0; i < 3; ++i) full.Run([&] {
    full_clock.Advance(absl::Seconds(1));
    return 0;
  });
  EXPECT_TRUE(full_clock.sleeps.empty());

  EXPECT_EQ(DutyCycle(2.0, clock).duty(), 1.0);
  EXPECT_EQ(DutyCycle(0.0, clock).duty(), 0.01);
  EXPECT_EQ(DutyCycle(-1.0, clock).duty(), 0.01);
  EXPECT_EQ(DutyCycle(std::nan(""), clock).duty(), 0.01);
  EXPECT_EQ(DutyCycle(0.001, clock).duty(), 0.01);
}

// The tools pace every device run, the verifier's and the benchmarker's
// together, at the options' duty cycle: each run takes one 10 ms tick of
// the fake clock (from its start to its end), so at d = 0.25 it owes 30 ms
// of idle, of which the tick of the next run's first look at the clock has
// passed: each run after the first waits 20 ms.
TEST(DutyCycleTest, TheToolsPaceEveryDeviceRun) {
  FakeClock clock(absl::Milliseconds(10));
  FakeTuneDevice device;
  DeviceToolsOptions o;
  o.duty_cycle = 0.25;
  o.clock = &clock;
  TuneBackend::Tools tools = MakeDeviceTools(device, o);
  const TuneTarget target = SmallTarget();
  const CandidateLaunch launch{128, 0, 16, 16};
  std::shared_ptr<const CompiledKernel> k[2];
  for (int i = 0; i < 2; ++i) {
    absl::StatusOr<CompileResult> c = tools.compiler->Compile(
        target, FakeDeviceSource(1e-3 * (i + 1), "", FormatLaunchAnnotation(launch)), launch);
    ASSERT_TRUE(c.ok() && c->kernel != nullptr);
    k[i] = c->kernel;
  }
  VerifyRequest vr;
  vr.seed = 5;
  vr.inputs = 3;
  ASSERT_TRUE(tools.verifier->Verify(target, *k[0], vr).ok());
  BenchRequest br;
  br.seed = 6;
  br.rounds = 3;
  ASSERT_TRUE(tools.benchmarker->Compare(target, *k[0], *k[1], br).ok());
  ASSERT_TRUE(tools.benchmarker->Profile(target, *k[1], 7).ok());
  const size_t runs = device.runs().size();
  EXPECT_EQ(runs, 3u * 2 + 3u * 2 + 1);
  ASSERT_EQ(clock.sleeps.size(), runs - 1);
  for (absl::Duration d : clock.sleeps) EXPECT_EQ(d, absl::Milliseconds(20));
}

TEST(RealizeMatrixTest, SpectraAndSpecialKinds) {
  const auto view = [](const std::vector<uint8_t>& b, int rows, int cols) {
    MatrixView v;
    v.data = b.data();
    v.rows = rows;
    v.cols = cols;
    v.ld = cols;
    v.dtype = DType::kF32;
    return v;
  };
  for (const auto& [rows, cols] : {std::pair{24, 70}, std::pair{70, 24}}) {
    MatrixPlan p;
    p.rows = rows;
    p.cols = cols;
    p.seed = 17;
    p.kind = MatrixKind::kFlat;
    std::vector<uint8_t> flat = RealizeMatrix(p, DType::kF32);
    absl::StatusOr<double> pr = OraclePR(view(flat, rows, cols));
    ASSERT_TRUE(pr.ok());
    EXPECT_NEAR(*pr, 24.0, 24.0 * 1e-5) << rows << "x" << cols;
    p.kind = MatrixKind::kRankOne;
    pr = OraclePR(view(RealizeMatrix(p, DType::kF32), rows, cols));
    EXPECT_NEAR(*pr, 1.0, 1e-5);
    p.kind = MatrixKind::kPowerLaw;
    double s2 = 0, s4 = 0;
    for (int i = 1; i <= 24; ++i) {
      s2 += std::pow(i, -1.4);
      s4 += std::pow(i, -2.8);
    }
    pr = OraclePR(view(RealizeMatrix(p, DType::kF32), rows, cols));
    EXPECT_NEAR(*pr, s2 * s2 / s4, 1e-4 * s2 * s2 / s4);
    // Dense: no entry of a flat matrix is left at zero.
    const float* f = reinterpret_cast<const float*>(flat.data());
    EXPECT_EQ(std::count(f, f + rows * cols, 0.0f), 0);
    // The bad entry where the plan puts it, in the stored orientation.
    p.kind = MatrixKind::kNaN;
    p.bad_row = rows - 1;
    p.bad_col = 3;
    std::vector<uint8_t> nan = RealizeMatrix(p, DType::kF32);
    const float* g = reinterpret_cast<const float*>(nan.data());
    EXPECT_TRUE(std::isnan(g[(rows - 1) * cols + 3]));
    EXPECT_EQ(std::count_if(g, g + rows * cols, [](float x) { return std::isnan(x); }), 1);
    p.kind = MatrixKind::kZeros;
    std::vector<uint8_t> z = RealizeMatrix(p, DType::kF32);
    EXPECT_EQ(std::count(z.begin(), z.end(), 0), static_cast<long>(z.size()));
  }
}

}  // namespace
}  // namespace rvd::tune

// A tuning job end to end on the GPU (label gpu; on the H200 host:
// build/bin/cuda_tune_job_test, with RVD_TUNE_NVRTC_INCLUDE=$PWD:/usr/local/
// cuda/include when the build's source tree is not there; run from the
// repository root it is set to that). The CUDA engine comes from the
// dlopen'ed module as in the daemon (CreateEngine, backend cuda), rvd's
// tuning backend is MakeTuneBackend over it (Engine::Tune(): the module's
// tuning table), and a job manager runs a short job from the naive start
// with the built-in generator on a small bf16 triangle target: it must
// finish (budget, patience or exhausted), with a verdict and a reason for
// every iteration, the start verified, the best no slower than the start,
// and the best's source correct again on fresh inputs of another seed
// (compiled and verified by the device tools directly, judged by
// JudgeCorrectness against the float64 reference and the SVD oracle).
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "kernels/engine.h"
#include "kernels/tune_device.h"
#include "self_improve/acceptance.h"
#include "self_improve/device_tools.h"
#include "self_improve/generator.h"
#include "self_improve/job_manager.h"
#include "server/backend.h"
#include "server/tune_service.h"

namespace rvd {
namespace {

TEST(CudaTuneJobTest, AShortJobFromTheNaiveStartFinishesWithAVerifiedBest) {
  std::string why;
  absl::StatusOr<std::unique_ptr<Engine>> engine = CreateEngine("cuda", 0, {}, &why);
  if (!engine.ok() && absl::IsUnavailable(engine.status())) {
    GTEST_SKIP() << "no CUDA engine: " << engine.status();
  }
  ASSERT_TRUE(engine.ok()) << engine.status();
  ASSERT_NE((*engine)->Tune(), nullptr) << "the module has no tuning table";
  // NVRTC's include path: the source tree (descriptors.h, candidate_abi.h).
  if (std::getenv("RVD_TUNE_NVRTC_INCLUDE") == nullptr &&
      std::filesystem::exists("self_improve/candidate_abi.h")) {
    const std::string dirs =
        absl::StrCat(std::filesystem::current_path().string(), ":/usr/local/cuda/include");
    setenv("RVD_TUNE_NVRTC_INCLUDE", dirs.c_str(), 1);
  }
  std::printf("RVD_TUNE_NVRTC_INCLUDE=%s\n",
              std::getenv("RVD_TUNE_NVRTC_INCLUDE") ? std::getenv("RVD_TUNE_NVRTC_INCLUDE") : "");

  std::unique_ptr<tune::TuneBackend> backend = MakeTuneBackend(**engine);
  ASSERT_TRUE(backend->Available().ok()) << backend->Available();
  {
    tune::JobManagerOptions o;
    o.backend = backend.get();
    tune::JobManager jobs(std::move(o));
    tune::JobSpec spec;
    spec.target.shape_class = "triangle";
    spec.target.dtype = DType::kBF16;
    spec.target.shapes = {{6, 64, 512}, {2, 96, 200}};
    spec.generator = "builtin";
    spec.start = "naive";
    spec.budget.max_iter = 4;
    spec.seed = 17;
    absl::StatusOr<tune::JobInfo> info = jobs.Start(spec);
    ASSERT_TRUE(info.ok()) << info.status();
    std::printf("job %s on %s\n", info->id.c_str(), info->spec.target.arch.c_str());
    // Inside gpu_host_run.sh's 120 s per test binary, with room to stop.
    const absl::Time deadline = absl::Now() + absl::Seconds(100);
    while (!tune::IsTerminal(info->state) && absl::Now() < deadline) {
      info = jobs.WaitForChange(info->id, info->version, absl::Seconds(30));
      ASSERT_TRUE(info.ok()) << info.status();
    }
    ASSERT_TRUE(tune::IsTerminal(info->state)) << "still " << info->progress.phase;
    ASSERT_EQ(info->state, tune::JobState::kSucceeded) << info->message;
    EXPECT_TRUE(info->stop == "budget" || info->stop == "patience" || info->stop == "exhausted")
        << info->stop;

    std::vector<tune::IterationRecord> records;
    std::string best_source;
    ASSERT_TRUE(jobs.Iterations(info->id, &records, &best_source).ok());
    ASSERT_GE(records.size(), 2u) << "the start and at least one candidate";
    int64_t counted = 0;
    for (const auto& [verdict, n] : info->progress.candidates) counted += n;
    EXPECT_EQ(counted, static_cast<int64_t>(records.size()) - 1);
    for (const tune::IterationRecord& r : records) {
      std::printf("iteration %d: %s (%s) %s: %s\n", r.iteration, tune::VerdictName(r.verdict),
                  r.bottleneck.c_str(), r.description.c_str(), r.reason.c_str());
      EXPECT_FALSE(r.reason.empty()) << r.iteration;
    }
    EXPECT_EQ(records[0].verdict, tune::Verdict::kAccepted);
    EXPECT_NE(records[0].reason.find("correct on 20 inputs"), std::string::npos)
        << records[0].reason;
    EXPECT_GT(info->progress.baseline_seconds, 0);
    EXPECT_GT(info->progress.best_seconds, 0);
    EXPECT_LE(info->progress.best_seconds, info->progress.baseline_seconds);
    if (best_source.empty()) best_source = records[0].source;  // nothing accepted: the start

    // The best again, on inputs of a seed the job never used.
    tune::TuneBackend::Tools tools = tune::MakeDeviceTools(*(*engine)->Tune());
    absl::StatusOr<tune::CandidateLaunch> launch = tune::ParseLaunchAnnotation(best_source);
    ASSERT_TRUE(launch.ok()) << launch.status();
    absl::StatusOr<tune::CompileResult> compiled =
        tools.compiler->Compile(info->spec.target, best_source, *launch);
    ASSERT_TRUE(compiled.ok()) << compiled.status();
    ASSERT_NE(compiled->kernel, nullptr) << compiled->log;
    tune::VerifyRequest vr;
    vr.seed = 0x5eed5eedull;
    vr.inputs = 20;
    absl::StatusOr<tune::CorrectnessEvidence> e =
        tools.verifier->Verify(info->spec.target, *compiled->kernel, vr);
    ASSERT_TRUE(e.ok()) << e.status();
    const tune::Decision d = tune::JudgeCorrectness(tune::AcceptanceRules{}, *e);
    EXPECT_EQ(d.verdict, tune::Verdict::kAccepted) << d.reason << "\n" << e->first_mismatches;
    std::printf("best re-verified: %s\n", d.reason.c_str());
  }
}

}  // namespace
}  // namespace rvd

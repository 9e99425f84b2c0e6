#include "self_improve/job_manager.h"

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "self_improve/fake_tools.h"
#include "self_improve/job_log.h"

namespace rvd::tune {
namespace {

using testing::FakeBenchmarker;
using testing::FakeCompiler;
using testing::FakeGenerator;
using testing::FakeVerifier;

class FakeBackend final : public TuneBackend {
 public:
  absl::Status available = absl::OkStatus();
  int devices = 2;
  absl::Status Available() const override { return available; }
  int Devices() const override { return devices; }
  absl::Status Complete(int, TuneTarget* t) const override {
    if (t->arch.empty()) t->arch = "sm_90a";
    if (t->shapes.empty()) t->shapes = {{480, 128, 4096}};
    return absl::OkStatus();
  }
  absl::StatusOr<Tools> ToolsFor(int, const TuneTarget&) override {
    Tools t;
    t.compiler = std::make_unique<FakeCompiler>();
    t.verifier = std::make_unique<FakeVerifier>();
    t.benchmarker = std::make_unique<FakeBenchmarker>();
    return t;
  }
};

// A job's generator forwarding to a script the test keeps.
class Forward final : public Generator {
 public:
  explicit Forward(std::shared_ptr<FakeGenerator> g) : g_(std::move(g)) {}
  std::string Name() const override { return "fake"; }
  absl::StatusOr<Candidate> Generate(const CandidateRequest& r) override { return g_->Generate(r); }

 private:
  std::shared_ptr<FakeGenerator> g_;
};

// A job's script is found by its search seed (the spec is all a factory
// sees).
struct Rig {
  FakeBackend backend;
  absl::Mutex mu;
  std::map<uint64_t, std::shared_ptr<FakeGenerator>> scripts ABSL_GUARDED_BY(mu);
  std::string data_dir;

  JobManagerOptions Options() {
    JobManagerOptions o;
    o.backend = &backend;
    o.data_dir = data_dir;
    o.generators["fake"] = [this](const JobSpec& spec) -> absl::StatusOr<std::unique_ptr<Generator>> {
      absl::MutexLock lock(&mu);
      auto it = scripts.find(spec.seed);
      if (it == scripts.end()) return absl::InternalError("no script for this job");
      return std::unique_ptr<Generator>(new Forward(it->second));
    };
    return o;
  }
  std::shared_ptr<FakeGenerator> Script(uint64_t seed = 1) {
    absl::MutexLock lock(&mu);
    scripts[seed] = std::make_shared<FakeGenerator>();
    return scripts[seed];
  }
};

JobSpec Spec(int device = 0, uint64_t seed = 1) {
  JobSpec s;
  s.target.dtype = DType::kBF16;
  s.target.shape_class = "triangle";
  s.generator = "fake";
  s.device = device;
  s.seed = seed;
  return s;
}

// Blocks a generator until its job is cancelled (or rvd stops), as an HTTP
// generator waits, then says so.
void WaitForStop(const CandidateRequest& r) {
  while (!r.cancelled->load()) absl::SleepFor(absl::Milliseconds(1));
}

JobInfo WaitDone(JobManager& m, const std::string& id) {
  for (int i = 0; i < 2000; ++i) {
    absl::StatusOr<JobInfo> info = m.Get(id);
    EXPECT_TRUE(info.ok());
    if (IsTerminal(info->state)) return *info;
    (void)m.WaitForChange(id, info->version, absl::Milliseconds(10));
  }
  ADD_FAILURE() << id << " did not finish";
  return *m.Get(id);
}

std::string TempDir() {
  std::string tmpl = ::testing::TempDir() + "/tune_jobs_XXXXXX";
  EXPECT_NE(::mkdtemp(tmpl.data()), nullptr);
  return tmpl;
}

TEST(JobManagerTest, WithoutAGpuStartIsFailedPrecondition) {
  Rig rig;
  rig.backend.available = absl::FailedPreconditionError(
      "tuning needs the CUDA engine; this rvd serves on the CPU engine");
  JobManager m(rig.Options());
  absl::StatusOr<JobInfo> info = m.Start(Spec());
  EXPECT_EQ(info.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(info.status().message().find("CUDA engine"), std::string::npos);
  EXPECT_TRUE(m.List().empty());
}

TEST(JobManagerTest, BadSpecsNameTheirField) {
  Rig rig;
  JobManager m(rig.Options());
  struct Case {
    void (*spoil)(JobSpec*);
    const char* says;
  } cases[] = {
      {[](JobSpec* s) { s->device = 2; }, "device 2"},
      {[](JobSpec* s) { s->device = -1; }, "device -1"},
      {[](JobSpec* s) { s->generator = "gpt-9"; }, "generator \"gpt-9\""},
      {[](JobSpec* s) { s->start = "best"; }, "start \"best\""},
      {[](JobSpec* s) { s->budget.max_iter = 0; }, "max_iter 0"},
      {[](JobSpec* s) { s->budget.patience = 0; }, "patience 0"},
      {[](JobSpec* s) { s->budget.min_improvement = 0.9; }, "min_improvement"},
      {[](JobSpec* s) { s->target.variant = "algebraic"; }, "only fused"},
      {[](JobSpec* s) { s->target.shape_class = "round"; }, "shape class \"round\""},
      {[](JobSpec* s) { s->target.shapes = {{0, 128, 4096}}; }, "count in [1, 4096]"},
  };
  for (const Case& c : cases) {
    JobSpec s = Spec();
    c.spoil(&s);
    absl::StatusOr<JobInfo> info = m.Start(s);
    ASSERT_EQ(info.status().code(), absl::StatusCode::kInvalidArgument) << c.says;
    EXPECT_NE(info.status().message().find(c.says), std::string::npos) << info.status();
  }
}

TEST(JobManagerTest, AJobRunsToItsPatienceWithProgressAndStats) {
  Rig rig;
  auto script = rig.Script();
  script->Add("a", 0.8e-3);
  for (int i = 0; i < 5; ++i) script->Add("s" + std::to_string(i), 0.9e-3);
  JobManager m(rig.Options());
  absl::StatusOr<JobInfo> started = m.Start(Spec());
  ASSERT_TRUE(started.ok()) << started.status();
  EXPECT_EQ(started->id, "tune-1");
  JobSpec unseeded = Spec();
  unseeded.seed = 0;
  rig.Script(0)->AddError(absl::OutOfRangeError("none"));
  absl::StatusOr<JobInfo> drawn = m.Start(unseeded);
  ASSERT_TRUE(drawn.ok());
  EXPECT_NE(drawn->spec.seed, 0u);  // drawn at start
  (void)m.Cancel(drawn->id);
  const JobInfo done = WaitDone(m, started->id);
  EXPECT_EQ(done.state, JobState::kSucceeded) << done.message;
  EXPECT_EQ(done.stop, "patience");
  EXPECT_EQ(done.progress.iteration, 4);
  EXPECT_EQ(done.progress.baseline_seconds, 1e-3);
  EXPECT_NEAR(done.progress.best_seconds, 0.8e-3, 1e-12);
  EXPECT_EQ(done.progress.best_description, "a: fake");
  EXPECT_EQ(done.progress.last_verdict, "slower");
  EXPECT_FALSE(done.progress.last_reason.empty());
  EXPECT_EQ(done.progress.candidates.at("accepted"), 1);
  EXPECT_EQ(done.progress.candidates.at("slower"), 3);
  EXPECT_TRUE(done.progress.phase.empty());
  EXPECT_NE(done.message.find("1.25x the start"), std::string::npos) << done.message;
  std::vector<IterationRecord> its;
  std::string best_source;
  ASSERT_TRUE(m.Iterations(started->id, &its, &best_source).ok());
  ASSERT_EQ(its.size(), 5u);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(its[i].iteration, i);
  EXPECT_EQ(its[1].verdict, Verdict::kAccepted);
  EXPECT_TRUE(its[1].source.empty());  // kept in the log, not in memory
  EXPECT_NE(best_source.find("key=a"), std::string::npos);
  EXPECT_EQ(m.Iterations("tune-9", &its, &best_source).code(), absl::StatusCode::kNotFound);
  WaitDone(m, drawn->id);
  const TuneStats stats = m.Stats();
  EXPECT_EQ(stats.iterations_total, 4);
  EXPECT_EQ(stats.candidates_total.at("slower"), 3);
  ASSERT_EQ(stats.best_seconds.size(), 1u);
  EXPECT_EQ(stats.best_seconds[0].first, "tune-1");
}

TEST(JobManagerTest, OneJobPerGpuAtATime) {
  Rig rig;
  absl::Notification first_running, release;
  auto s1 = rig.Script(1);
  s1->AddError(absl::UnavailableError("waits"), [&](const CandidateRequest&) {
    first_running.Notify();
    release.WaitForNotification();
  });
  auto s2 = rig.Script(2);  // device 0, after the first
  auto s3 = rig.Script(3);  // device 1, at once
  absl::Notification third_ran;
  s3->AddError(absl::UnavailableError("ran"),
               [&](const CandidateRequest&) { third_ran.Notify(); });
  JobManager m(rig.Options());
  const JobInfo j1 = *m.Start(Spec(0, 1));
  first_running.WaitForNotification();
  const JobInfo j2 = *m.Start(Spec(0, 2));
  EXPECT_EQ(m.Get(j2.id)->state, JobState::kQueued);
  const JobInfo j3 = *m.Start(Spec(1, 3));
  EXPECT_TRUE(third_ran.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_EQ(m.Get(j1.id)->state, JobState::kRunning);
  EXPECT_EQ(m.Get(j2.id)->state, JobState::kQueued);  // still waiting for GPU 0
  release.Notify();
  EXPECT_EQ(WaitDone(m, j1.id).state, JobState::kSucceeded);
  EXPECT_EQ(WaitDone(m, j2.id).state, JobState::kSucceeded);
  EXPECT_EQ(WaitDone(m, j3.id).state, JobState::kSucceeded);
  EXPECT_EQ(s2->requests().size(), 1u);
  EXPECT_GE(m.Get(j2.id)->started, m.Get(j1.id)->finished);  // after job 1, not beside it
  EXPECT_EQ(m.List().size(), 3u);
  EXPECT_EQ(m.List()[0].id, "tune-1");
}

TEST(JobManagerTest, CancelQueuedRunningAndFinished) {
  Rig rig;
  absl::Notification running;
  auto s1 = rig.Script(1);
  s1->AddError(absl::CancelledError("cancelled while generating"),
               [&](const CandidateRequest& r) {
                 running.Notify();
                 WaitForStop(r);
               });
  s1->Add("never", 1e-4);
  rig.Script(2);
  JobManager m(rig.Options());
  const JobInfo j1 = *m.Start(Spec(0, 1));
  const JobInfo j2 = *m.Start(Spec(0, 2));
  // j2 waits behind j1: cancelled at once.
  absl::StatusOr<JobInfo> c2 = m.Cancel(j2.id);
  ASSERT_TRUE(c2.ok());
  EXPECT_EQ(c2->state, JobState::kCancelled);
  EXPECT_EQ(m.Cancel(j2.id).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(m.Cancel("tune-99").status().code(), absl::StatusCode::kNotFound);
  running.WaitForNotification();
  ASSERT_TRUE(m.Cancel(j1.id).ok());
  const JobInfo done = WaitDone(m, j1.id);
  // Cancelled whether the cancel came before or after the generator's answer.
  EXPECT_EQ(done.state, JobState::kCancelled) << done.message;
  EXPECT_EQ(done.stop, "cancelled");
  EXPECT_EQ(s1->requests().size(), 1u);  // "never" was never asked for
}

TEST(JobManagerTest, WatchSeesEveryChangeThenCloses) {
  Rig rig;
  auto s = rig.Script();
  s->Add("a", 0.9e-3);
  s->Add("b", 0.95e-3);
  absl::Notification go;
  s->AddError(absl::OutOfRangeError("done"),
              [&](const CandidateRequest&) { go.WaitForNotification(); });
  JobManager m(rig.Options());
  const JobInfo j = *m.Start(Spec());
  std::atomic<int> notified{0};
  absl::StatusOr<std::unique_ptr<JobWatch>> w = m.Watch(j.id, 0, [&] { ++notified; });
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(m.Watch("tune-7", 0, [] {}).status().code(), absl::StatusCode::kNotFound);
  go.Notify();
  WaitDone(m, j.id);
  EXPECT_GT(notified.load(), 3);
  JobInfo info;
  uint64_t last = 0;
  EXPECT_FALSE((*w)->closed());  // the final state not given yet
  ASSERT_TRUE((*w)->Next(&info));
  EXPECT_GT(info.version, last);
  EXPECT_EQ(info.state, JobState::kSucceeded);
  EXPECT_FALSE((*w)->Next(&info));  // nothing new
  EXPECT_TRUE((*w)->closed());
  (*w)->Detach();
  const int before = notified.load();
  EXPECT_EQ(notified.load(), before);
}

TEST(JobManagerTest, TheBuiltInGeneratorIsRegistered) {
  Rig rig;
  JobManager m(rig.Options());
  JobSpec s = Spec();
  s.generator = "builtin";
  s.seed = 42;
  const JobInfo j = *m.Start(s);
  const JobInfo done = WaitDone(m, j.id);
  // The fakes time every built-in point alike: no improvement, patience.
  EXPECT_EQ(done.state, JobState::kSucceeded) << done.message;
  EXPECT_EQ(done.stop, "patience");
  EXPECT_EQ(done.spec.seed, 42u);
  EXPECT_EQ(done.progress.candidates.at("slower"), 3);
}

TEST(JobManagerTest, ToolFailureFailsTheJob) {
  Rig rig;
  struct NoTools final : TuneBackend {
    absl::Status Available() const override { return absl::OkStatus(); }
    int Devices() const override { return 1; }
    absl::Status Complete(int, TuneTarget* t) const override {
      t->shapes = {{1, 128, 128}};
      return absl::OkStatus();
    }
    absl::StatusOr<Tools> ToolsFor(int, const TuneTarget&) override {
      return absl::UnavailableError("NVRTC not found");
    }
  } none;
  JobManagerOptions o = rig.Options();
  o.backend = &none;
  JobManager m(std::move(o));
  const JobInfo done = WaitDone(m, m.Start(Spec())->id);
  EXPECT_EQ(done.state, JobState::kFailed);
  EXPECT_NE(done.message.find("NVRTC not found"), std::string::npos);
}

TEST(JobManagerTest, ALoggedJobResumesAfterARestart) {
  Rig rig;
  rig.data_dir = TempDir();
  auto s1 = rig.Script();
  s1->Add("a", 0.9e-3);
  absl::Notification in_second;
  // Iteration 2 is under way when rvd stops: it waits for the stop.
  s1->AddError(absl::CancelledError("stopped"), [&](const CandidateRequest& r) {
    in_second.Notify();
    WaitForStop(r);
  });
  std::string id;
  {
    JobManager m(rig.Options());
    id = m.Start(Spec())->id;
    in_second.WaitForNotification();
  }  // the shutdown: the job stops unfinished
  const std::string path = rig.data_dir + "/tune/" + id + ".jsonl";
  absl::StatusOr<JobLogContents> logged = ReadJobLog(path);
  ASSERT_TRUE(logged.ok()) << logged.status();
  EXPECT_FALSE(IsTerminal(logged->state));
  ASSERT_EQ(logged->records.size(), 2u);  // the start and iteration 1
  EXPECT_NE(logged->secret_seed, 0u);

  // A torn line from a crash mid-write is dropped at recovery.
  { std::ofstream(path, std::ios::app) << "{\"type\":\"iterat"; }

  auto s2 = rig.Script();
  for (int i = 0; i < 5; ++i) s2->Add("r" + std::to_string(i), 0.95e-3);
  JobManager m(rig.Options());
  ASSERT_TRUE(m.Recover().ok());
  const JobInfo done = WaitDone(m, id);
  EXPECT_TRUE(done.resumed);
  EXPECT_EQ(done.state, JobState::kSucceeded) << done.message;
  EXPECT_EQ(done.stop, "patience");
  EXPECT_EQ(done.progress.iteration, 4);  // 2, 3, 4 after the restart
  EXPECT_EQ(done.progress.best_description, "a: fake");
  const std::vector<CandidateRequest> reqs = s2->requests();
  ASSERT_FALSE(reqs.empty());
  EXPECT_EQ(reqs[0].iteration, 2);
  EXPECT_EQ(reqs[0].history.size(), 1u);
  EXPECT_EQ(reqs[0].best_description, "a: fake");
  // The log now holds every iteration once and ends with the final state.
  absl::StatusOr<JobLogContents> after = ReadJobLog(path);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_FALSE(after->torn_tail);
  ASSERT_EQ(after->records.size(), 5u);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(after->records[i].iteration, i);
  EXPECT_EQ(after->state, JobState::kSucceeded);
  EXPECT_EQ(after->secret_seed, logged->secret_seed);  // the same secret inputs
  std::vector<IterationRecord> its;
  std::string best_source;
  ASSERT_TRUE(m.Iterations(id, &its, &best_source).ok());
  EXPECT_EQ(its.size(), 5u);  // the logged ones and the new ones
  EXPECT_NE(best_source.find("key=a"), std::string::npos);

  // Another restart lists it finished, and numbers the next job after it.
  JobManager again(rig.Options());
  ASSERT_TRUE(again.Recover().ok());
  ASSERT_EQ(again.List().size(), 1u);
  EXPECT_EQ(again.List()[0].state, JobState::kSucceeded);
  rig.Script(5)->Add("n", 1e-3);
  EXPECT_EQ(again.Start(Spec(0, 5))->id, "tune-2");
  std::filesystem::remove_all(rig.data_dir);
}

TEST(JobManagerTest, ADamagedLogIsReportedAndSkipped) {
  Rig rig;
  rig.data_dir = TempDir();
  std::filesystem::create_directories(rig.data_dir + "/tune");
  { std::ofstream(rig.data_dir + "/tune/tune-3.jsonl") << "not json\n{\"type\":\"state\"}\n"; }
  JobManager m(rig.Options());
  absl::Status s = m.Recover();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_NE(s.message().find("line 1"), std::string::npos) << s;
  EXPECT_TRUE(m.List().empty());
  std::filesystem::remove_all(rig.data_dir);
}

TEST(JobLogTest, SpecRoundTrips) {
  JobSpec s = Spec(1);
  s.target.arch = "sm_90a";
  s.target.shapes = {{480, 128, 4096}, {32, 1024, 4096}};
  s.budget = {17, 4, 0.02};
  s.seed = 0xffffffffffffffffull;
  s.start = "product";
  absl::StatusOr<JobSpec> back = SpecFromJson(SpecToJson(s));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(SpecToJson(*back), SpecToJson(s));
  EXPECT_EQ(back->seed, s.seed);
  EXPECT_EQ(back->target.shapes, s.target.shapes);
  EXPECT_FALSE(SpecFromJson("{}").ok());
  EXPECT_FALSE(SpecFromJson("[").ok());
}

}  // namespace
}  // namespace rvd::tune

// The tuning RPCs: the API's conversions, the refusal on the CPU engine,
// and the handlers over gRPC (a loopback server of just these methods)
// driving a job manager with the CPU fakes of self_improve/fake_tools.h;
// the /metrics families read from it.
#include "server/tune_service.h"

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "rvd/v1/rvd.grpc.pb.h"
#include "self_improve/fake_tools.h"
#include "self_improve/fake_tune_device.h"
#include "server/fake_engine.h"
#include "server/tune_metrics.h"

namespace rvd {
namespace {

using tune::testing::FakeBenchmarker;
using tune::testing::FakeCompiler;
using tune::testing::FakeGenerator;
using tune::testing::FakeVerifier;

class FakeBackend final : public tune::TuneBackend {
 public:
  absl::Status Available() const override { return absl::OkStatus(); }
  int Devices() const override { return 1; }
  absl::Status Complete(int, tune::TuneTarget* t) const override {
    if (t->arch.empty()) t->arch = "sm_90a";
    if (t->shapes.empty()) t->shapes = {{480, 128, 4096}};
    return absl::OkStatus();
  }
  absl::StatusOr<Tools> ToolsFor(int, const tune::TuneTarget&) override {
    Tools t;
    t.compiler = std::make_unique<FakeCompiler>();
    t.verifier = std::make_unique<FakeVerifier>();
    t.benchmarker = std::make_unique<FakeBenchmarker>();
    return t;
  }
};

TEST(TuneServiceTest, SpecFromProtoFillsTheDefaults) {
  rvd::v1::StartTuneJobRequest r;
  r.mutable_target()->set_shape_class("triangle");
  absl::StatusOr<tune::JobSpec> s = SpecFromProto(r);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->target.variant, "fused");
  EXPECT_EQ(s->target.dtype, DType::kBF16);
  EXPECT_EQ(s->generator, "builtin");
  EXPECT_EQ(s->start, "naive");
  EXPECT_EQ(s->budget.max_iter, 30);
  EXPECT_EQ(s->budget.patience, 3);
  EXPECT_EQ(s->budget.min_improvement, 0.01);
  // Set fields are taken as given, zero included.
  r.mutable_budget()->set_min_improvement(0);
  r.mutable_budget()->set_patience(5);
  r.mutable_target()->set_dtype(rvd::v1::DTYPE_F32);
  auto* sh = r.mutable_target()->add_shapes();
  sh->set_count(32);
  sh->set_rows(1024);
  sh->set_cols(4096);
  s = SpecFromProto(r);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->budget.min_improvement, 0);
  EXPECT_EQ(s->budget.patience, 5);
  EXPECT_EQ(s->target.dtype, DType::kF32);
  ASSERT_EQ(s->target.shapes.size(), 1u);
  EXPECT_EQ(s->target.shapes[0], (tune::TuneShape{32, 1024, 4096}));
  r.mutable_target()->set_dtype(static_cast<rvd::v1::DType>(17));
  EXPECT_EQ(SpecFromProto(r).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(TuneServiceTest, OnTheCpuEngineAStartIsFailedPrecondition) {
  FakeEngine engine;
  std::unique_ptr<tune::TuneBackend> backend = MakeTuneBackend(engine);
  tune::JobManagerOptions o;
  o.backend = backend.get();
  tune::JobManager jobs(std::move(o));
  TuneHandlers h(&jobs);
  grpc::ServerContext context;
  rvd::v1::StartTuneJobRequest r;
  r.mutable_target()->set_shape_class("triangle");
  rvd::v1::TuneJob out;
  const grpc::Status s = h.StartTuneJob(&context, &r, &out);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(s.error_message().find("kernel tuning needs a GPU"), std::string::npos)
      << s.error_message();
  EXPECT_NE(s.error_message().find("cpu engine"), std::string::npos) << s.error_message();
  rvd::v1::GetTuneJobRequest g;
  g.set_id("tune-1");
  EXPECT_EQ(h.GetTuneJob(&context, &g, &out).error_code(), grpc::StatusCode::NOT_FOUND);
  rvd::v1::ListTuneJobsResponse list;
  EXPECT_TRUE(h.ListTuneJobs(&context, nullptr, &list).ok());
  EXPECT_EQ(list.jobs_size(), 0);
}

// A CUDA-like engine whose TuneDevice is the host fake (or none: a module
// without the tuning table).
class TuneEngine final : public Engine {
 public:
  explicit TuneEngine(TuneDevice* device) : device_(device) {}
  std::string Backend() const override { return "cuda"; }
  std::string Version() const override { return "fake-cuda-1"; }
  std::string DefaultVariant() const override { return "fused"; }
  using Engine::ComputePR;
  absl::Status ComputePR(absl::Span<const MatrixView>, const VariantSpec&, absl::Span<double>,
                         const CallOptions&) override {
    return absl::UnimplementedError("fake");
  }
  EngineStats Stats() const override { return {}; }
  TuneDevice* Tune() override { return device_; }

 private:
  TuneDevice* const device_;
};

TEST(TuneServiceTest, WithoutATuningTableAStartIsFailedPrecondition) {
  TuneEngine engine(nullptr);
  std::unique_ptr<tune::TuneBackend> backend = MakeTuneBackend(engine);
  EXPECT_EQ(backend->Available().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(backend->Available().message().find("tuning table is NULL"), std::string::npos)
      << backend->Available();
}

TEST(TuneServiceTest, OverATuneDeviceTheBackendCompletesAndRunsJobs) {
  tune::testing::FakeTuneDevice device;
  TuneEngine engine(&device);
  std::unique_ptr<tune::TuneBackend> backend = MakeTuneBackend(engine);
  ASSERT_TRUE(backend->Available().ok()) << backend->Available();
  EXPECT_EQ(backend->Devices(), 1);
  const std::pair<const char*, tune::TuneShape> defaults[] = {
      {"square", {32, 1024, 4096}},
      {"triangle", {480, 128, 4096}},
      {"wide", {32, 1024, 4098}},
      {"tall", {480, 4096, 128}}};
  for (const auto& [shape_class, shape] : defaults) {
    tune::TuneTarget t;
    t.shape_class = shape_class;
    ASSERT_TRUE(backend->Complete(0, &t).ok()) << shape_class;
    EXPECT_EQ(t.arch, "sm_90a");
    ASSERT_EQ(t.shapes.size(), 1u);
    EXPECT_EQ(t.shapes[0], shape) << shape_class;
  }
  tune::TuneTarget t;
  t.shape_class = "triangle";
  t.arch = "sm_80";
  EXPECT_EQ(backend->Complete(0, &t).code(), absl::StatusCode::kFailedPrecondition);
  t.arch = "";
  t.shapes = {{4, 64, 32}};  // tall, not a triangle
  EXPECT_EQ(backend->Complete(0, &t).code(), absl::StatusCode::kInvalidArgument);

  // A short job from the naive start with the built-in generator: every
  // candidate runs on the fake as an honest kernel of 1 ms, none faster.
  tune::JobManagerOptions o;
  o.backend = backend.get();
  tune::JobManager jobs(std::move(o));
  tune::JobSpec spec;
  spec.target.shape_class = "triangle";
  spec.target.dtype = DType::kF32;
  spec.target.shapes = {{3, 32, 64}};
  spec.budget.max_iter = 2;
  spec.seed = 3;
  absl::StatusOr<tune::JobInfo> info = jobs.Start(spec);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->spec.target.arch, "sm_90a");
  while (!tune::IsTerminal(info->state)) {
    info = jobs.WaitForChange(info->id, info->version, absl::Seconds(60));
    ASSERT_TRUE(info.ok()) << info.status();
  }
  EXPECT_EQ(info->state, tune::JobState::kSucceeded) << info->message;
  EXPECT_EQ(info->stop, "budget");
  EXPECT_EQ(info->progress.iteration, 2);
  EXPECT_EQ(info->progress.candidates.at("slower"), 2);
  EXPECT_NEAR(info->progress.best_seconds, 1e-3, 1e-5);
  EXPECT_EQ(device.live_modules(), 0) << "every compiled module released";

  // Start "product": refused when the job runs, with the reason.
  spec.start = "product";
  info = jobs.Start(spec);
  ASSERT_TRUE(info.ok()) << info.status();
  while (!tune::IsTerminal(info->state)) {
    info = jobs.WaitForChange(info->id, info->version, absl::Seconds(60));
    ASSERT_TRUE(info.ok()) << info.status();
  }
  EXPECT_EQ(info->state, tune::JobState::kFailed);
  EXPECT_NE(info->message.find("per-job contract"), std::string::npos) << info->message;
}

// Just the tuning methods of rvd.v1.Rvd, forwarded as RvdService does.
class TuneOnlyService final : public rvd::v1::Rvd::Service {
 public:
  explicit TuneOnlyService(TuneHandlers* h) : h_(h) {}
  grpc::Status StartTuneJob(grpc::ServerContext* c, const rvd::v1::StartTuneJobRequest* r,
                            rvd::v1::TuneJob* o) override {
    return h_->StartTuneJob(c, r, o);
  }
  grpc::Status GetTuneJob(grpc::ServerContext* c, const rvd::v1::GetTuneJobRequest* r,
                          rvd::v1::TuneJob* o) override {
    return h_->GetTuneJob(c, r, o);
  }
  grpc::Status ListTuneJobs(grpc::ServerContext* c, const rvd::v1::ListTuneJobsRequest* r,
                            rvd::v1::ListTuneJobsResponse* o) override {
    return h_->ListTuneJobs(c, r, o);
  }
  grpc::Status WatchTuneJob(grpc::ServerContext* c, const rvd::v1::WatchTuneJobRequest* r,
                            grpc::ServerWriter<rvd::v1::TuneJob>* w) override {
    return h_->WatchTuneJob(c, r, w);
  }
  grpc::Status CancelTuneJob(grpc::ServerContext* c, const rvd::v1::CancelTuneJobRequest* r,
                             rvd::v1::TuneJob* o) override {
    return h_->CancelTuneJob(c, r, o);
  }

 private:
  TuneHandlers* h_;
};

TEST(TuneServiceTest, StartWatchGetListCancelOverGrpc) {
  FakeBackend backend;
  auto script = std::make_shared<FakeGenerator>();
  script->Add("a", 0.8e-3);
  for (int i = 0; i < 3; ++i) script->Add("s" + std::to_string(i), 0.9e-3);
  tune::JobManagerOptions o;
  o.backend = &backend;
  o.generators["fake"] = [script](const tune::JobSpec&)
      -> absl::StatusOr<std::unique_ptr<tune::Generator>> {
    struct Forward final : tune::Generator {
      std::shared_ptr<FakeGenerator> g;
      std::string Name() const override { return "fake"; }
      absl::StatusOr<tune::Candidate> Generate(const tune::CandidateRequest& r) override {
        return g->Generate(r);
      }
    };
    auto f = std::make_unique<Forward>();
    f->g = script;
    return std::unique_ptr<tune::Generator>(std::move(f));
  };
  tune::JobManager jobs(std::move(o));
  TuneHandlers handlers(&jobs);
  TuneOnlyService service(&handlers);
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  auto stub = rvd::v1::Rvd::NewStub(
      grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials()));

  rvd::v1::StartTuneJobRequest start;
  start.mutable_target()->set_shape_class("triangle");
  start.set_generator("fake");
  start.set_seed(9);
  rvd::v1::TuneJob job;
  {
    grpc::ClientContext c;
    ASSERT_TRUE(stub->StartTuneJob(&c, start, &job).ok());
  }
  EXPECT_EQ(job.id(), "tune-1");
  EXPECT_EQ(job.spec().seed(), 9u);
  EXPECT_EQ(job.spec().target().arch(), "sm_90a");  // filled in by the backend

  // The watch streams every change and ends OK after the final state.
  std::vector<rvd::v1::TuneJob> seen;
  {
    grpc::ClientContext c;
    rvd::v1::WatchTuneJobRequest w;
    w.set_id(job.id());
    auto reader = stub->WatchTuneJob(&c, w);
    rvd::v1::TuneJob e;
    while (reader->Read(&e)) seen.push_back(e);
    const grpc::Status s = reader->Finish();
    EXPECT_TRUE(s.ok()) << s.error_message();
  }
  ASSERT_FALSE(seen.empty());
  for (size_t i = 1; i < seen.size(); ++i) EXPECT_GT(seen[i].version(), seen[i - 1].version());
  const rvd::v1::TuneJob& last = seen.back();
  EXPECT_EQ(last.state(), rvd::v1::TUNE_JOB_SUCCEEDED) << last.message();
  EXPECT_EQ(last.stop(), "patience");
  EXPECT_EQ(last.progress().iteration(), 4u);
  EXPECT_NEAR(last.progress().best_seconds(), 0.8e-3, 1e-12);
  EXPECT_EQ(last.progress().baseline_seconds(), 1e-3);
  EXPECT_EQ(last.progress().candidates().at("slower"), 3u);
  EXPECT_EQ(last.progress().last_verdict(), "slower");
  EXPECT_TRUE(last.has_finished());

  // A watch after the final version ends at once.
  {
    grpc::ClientContext c;
    rvd::v1::WatchTuneJobRequest w;
    w.set_id(job.id());
    w.set_after_version(last.version());
    auto reader = stub->WatchTuneJob(&c, w);
    rvd::v1::TuneJob e;
    EXPECT_FALSE(reader->Read(&e));
    EXPECT_TRUE(reader->Finish().ok());
  }
  {
    grpc::ClientContext c;
    rvd::v1::GetTuneJobRequest g;
    g.set_id(job.id());
    rvd::v1::TuneJob got;
    ASSERT_TRUE(stub->GetTuneJob(&c, g, &got).ok());
    EXPECT_EQ(got.version(), last.version());
    EXPECT_EQ(got.iterations_size(), 0);  // only when asked
  }
  {
    grpc::ClientContext c;
    rvd::v1::GetTuneJobRequest g;
    g.set_id(job.id());
    g.set_include_iterations(true);
    rvd::v1::TuneJob got;
    ASSERT_TRUE(stub->GetTuneJob(&c, g, &got).ok());
    ASSERT_EQ(got.iterations_size(), 5);
    EXPECT_EQ(got.iterations(0).iteration(), 0u);
    EXPECT_EQ(got.iterations(1).verdict(), "accepted");
    EXPECT_EQ(got.iterations(1).description(), "a: fake");
    EXPECT_NEAR(got.iterations(1).candidate_seconds(), 0.8e-3, 1e-12);
    EXPECT_EQ(got.iterations(4).verdict(), "slower");
    EXPECT_NE(got.best_source().find("key=a"), std::string::npos);
  }
  {
    grpc::ClientContext c;
    rvd::v1::ListTuneJobsResponse list;
    ASSERT_TRUE(stub->ListTuneJobs(&c, rvd::v1::ListTuneJobsRequest(), &list).ok());
    ASSERT_EQ(list.jobs_size(), 1);
  }
  {
    grpc::ClientContext c;
    rvd::v1::CancelTuneJobRequest cancel;
    cancel.set_id(job.id());
    rvd::v1::TuneJob got;
    EXPECT_EQ(stub->CancelTuneJob(&c, cancel, &got).error_code(),
              grpc::StatusCode::FAILED_PRECONDITION);
  }
  {
    grpc::ClientContext c;
    rvd::v1::WatchTuneJobRequest w;
    w.set_id("tune-404");
    auto reader = stub->WatchTuneJob(&c, w);
    rvd::v1::TuneJob e;
    EXPECT_FALSE(reader->Read(&e));
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::NOT_FOUND);
  }

  // /metrics: the three families, every verdict a series.
  TuneMetrics metrics(&jobs);
  const std::vector<prometheus::MetricFamily> families = metrics.Collect();
  ASSERT_EQ(families.size(), 3u);
  EXPECT_EQ(families[0].name, "rvd_tuning_iterations_total");
  EXPECT_EQ(families[0].metric[0].counter.value, 4);
  EXPECT_EQ(families[1].name, "rvd_tuning_candidates_total");
  EXPECT_EQ(families[1].metric.size(), 9u);
  double slower = -1;
  for (const auto& m : families[1].metric) {
    if (m.label[0].value == "slower") slower = m.counter.value;
  }
  EXPECT_EQ(slower, 3);
  EXPECT_EQ(families[2].name, "rvd_tuning_best_seconds");
  ASSERT_EQ(families[2].metric.size(), 1u);
  EXPECT_EQ(families[2].metric[0].label[0].value, "tune-1");
  EXPECT_NEAR(families[2].metric[0].gauge.value, 0.8e-3, 1e-12);

  handlers.StopWatches();
  server->Shutdown();
}

}  // namespace
}  // namespace rvd

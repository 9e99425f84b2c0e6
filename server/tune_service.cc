#include "server/tune_service.h"

#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "google/protobuf/util/time_util.h"
#include "kernels/tune_device.h"
#include "self_improve/device_tools.h"

namespace rvd {
namespace {

grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

// Jobs cannot run on this rvd; the reason says what is missing.
class UnavailableBackend final : public tune::TuneBackend {
 public:
  explicit UnavailableBackend(std::string why) : why_(std::move(why)) {}
  absl::Status Available() const override { return absl::FailedPreconditionError(why_); }
  int Devices() const override { return 0; }
  absl::Status Complete(int, tune::TuneTarget*) const override {
    return absl::FailedPreconditionError(why_);
  }
  absl::StatusOr<Tools> ToolsFor(int, const tune::TuneTarget&) override {
    return absl::FailedPreconditionError(why_);
  }

 private:
  const std::string why_;
};

// Jobs on the engine's one GPU (device 0), with the device tools over its
// TuneDevice, which the engine owns and which outlives the job manager.
class DeviceBackend final : public tune::TuneBackend {
 public:
  DeviceBackend(TuneDevice& device, double duty_cycle) : device_(device), duty_cycle_(duty_cycle) {}
  absl::Status Available() const override { return absl::OkStatus(); }
  int Devices() const override { return 1; }

  // The exact architecture is the device's (a target naming another is
  // refused); no shapes: the class's defaults, the shapes the issue's
  // convergence proof names for square and triangle (480 x 128x4096 and
  // 32 x 1024x4096), and like-sized ones for wide (rows not 16-byte
  // aligned in any dtype: v3's class) and tall (v1's).
  absl::Status Complete(int, tune::TuneTarget* target) const override {
    absl::StatusOr<TuneDevice::Info> info = device_.Device();
    if (!info.ok()) return info.status();
    if (target->arch.empty()) target->arch = info->arch;
    if (target->arch != info->arch) {
      return absl::FailedPreconditionError(absl::StrCat(
          "target arch ", target->arch, " is not this GPU's exact architecture ", info->arch));
    }
    if (target->shapes.empty()) {
      const std::string& c = target->shape_class;
      if (c == "square") target->shapes = {{32, 1024, 4096}};
      if (c == "triangle") target->shapes = {{480, 128, 4096}};
      if (c == "wide") target->shapes = {{32, 1024, 4098}};
      if (c == "tall") target->shapes = {{480, 4096, 128}};
    }
    const bool tall = target->shape_class == "tall";
    for (const tune::TuneShape& s : target->shapes) {
      if ((s.rows > s.cols) != tall) {
        return absl::InvalidArgumentError(absl::StrCat(
            "shape ", s.count, " x ", s.rows, "x", s.cols, " is not of shape class ",
            target->shape_class, tall ? " (rows > cols)" : " (rows <= cols)"));
      }
    }
    return absl::OkStatus();
  }

  absl::StatusOr<Tools> ToolsFor(int, const tune::TuneTarget&) override {
    tune::DeviceToolsOptions options;
    options.duty_cycle = duty_cycle_;
    return tune::MakeDeviceTools(device_, options);
  }

 private:
  TuneDevice& device_;
  const double duty_cycle_;
};

absl::StatusOr<DType> DTypeOf(rvd::v1::DType d) {
  switch (d) {
    case rvd::v1::DTYPE_UNSPECIFIED:
    case rvd::v1::DTYPE_BF16: return DType::kBF16;
    case rvd::v1::DTYPE_F16: return DType::kF16;
    case rvd::v1::DTYPE_F32: return DType::kF32;
    default: return absl::InvalidArgumentError(absl::StrCat("target.dtype ", d, " is unknown"));
  }
}

rvd::v1::DType ProtoDType(DType d) {
  switch (d) {
    case DType::kF32: return rvd::v1::DTYPE_F32;
    case DType::kF16: return rvd::v1::DTYPE_F16;
    case DType::kBF16: return rvd::v1::DTYPE_BF16;
  }
  return rvd::v1::DTYPE_UNSPECIFIED;
}

rvd::v1::TuneJobState ProtoState(tune::JobState s) {
  switch (s) {
    case tune::JobState::kQueued: return rvd::v1::TUNE_JOB_QUEUED;
    case tune::JobState::kRunning: return rvd::v1::TUNE_JOB_RUNNING;
    case tune::JobState::kSucceeded: return rvd::v1::TUNE_JOB_SUCCEEDED;
    case tune::JobState::kFailed: return rvd::v1::TUNE_JOB_FAILED;
    case tune::JobState::kCancelled: return rvd::v1::TUNE_JOB_CANCELLED;
  }
  return rvd::v1::TUNE_JOB_STATE_UNSPECIFIED;
}

void SetTime(absl::Time t, google::protobuf::Timestamp* out) {
  *out = google::protobuf::util::TimeUtil::NanosecondsToTimestamp(absl::ToUnixNanos(t));
}

}  // namespace

std::unique_ptr<tune::TuneBackend> MakeTuneBackend(Engine& engine, double duty_cycle) {
  if (TuneDevice* device = engine.Tune(); device != nullptr) {
    return std::make_unique<DeviceBackend>(*device, duty_cycle);
  }
  if (engine.Backend() != "cuda") {
    return std::make_unique<UnavailableBackend>(absl::StrCat(
        "kernel tuning needs a GPU: this rvd computes on the ", engine.Backend(),
        " engine, which has no kernels of rvd's own to tune (start rvd with --backend cuda on "
        "a host with a GPU)"));
  }
  return std::make_unique<UnavailableBackend>(
      "kernel tuning is not available with this CUDA module: its tuning table is NULL (it "
      "cannot compile and run candidates; install the librvd_cuda.so built with this rvd)");
}

absl::StatusOr<tune::JobSpec> SpecFromProto(const rvd::v1::StartTuneJobRequest& r) {
  tune::JobSpec s;
  const rvd::v1::TuneTarget& t = r.target();
  s.target.variant = t.variant().empty() ? "fused" : t.variant();
  absl::StatusOr<DType> dtype = DTypeOf(t.dtype());
  if (!dtype.ok()) return dtype.status();
  s.target.dtype = *dtype;
  s.target.shape_class = t.shape_class();
  s.target.arch = t.arch();
  for (const rvd::v1::TuneShape& sh : t.shapes()) {
    // Sides beyond int are refused by the manager's ranges; clamp so they
    // arrive as such rather than wrapped.
    const auto clamp = [](uint32_t v) { return static_cast<int>(std::min<uint32_t>(v, 1u << 30)); };
    s.target.shapes.push_back({clamp(sh.count()), clamp(sh.rows()), clamp(sh.cols())});
  }
  s.generator = r.generator().empty() ? "builtin" : r.generator();
  const rvd::v1::TuneBudget& b = r.budget();
  if (b.has_max_iter()) s.budget.max_iter = static_cast<int>(std::min<uint32_t>(b.max_iter(), 1u << 30));
  if (b.has_patience()) s.budget.patience = static_cast<int>(std::min<uint32_t>(b.patience(), 1u << 30));
  if (b.has_min_improvement()) s.budget.min_improvement = b.min_improvement();
  s.seed = r.seed();
  s.start = r.start().empty() ? "naive" : r.start();
  s.device = static_cast<int>(std::min<uint32_t>(r.device(), 1u << 30));
  return s;
}

void JobToProto(const tune::JobInfo& info, rvd::v1::TuneJob* out) {
  out->Clear();
  out->set_id(info.id);
  rvd::v1::StartTuneJobRequest* spec = out->mutable_spec();
  rvd::v1::TuneTarget* t = spec->mutable_target();
  t->set_variant(info.spec.target.variant);
  t->set_dtype(ProtoDType(info.spec.target.dtype));
  t->set_shape_class(info.spec.target.shape_class);
  t->set_arch(info.spec.target.arch);
  for (const tune::TuneShape& sh : info.spec.target.shapes) {
    rvd::v1::TuneShape* p = t->add_shapes();
    p->set_count(static_cast<uint32_t>(sh.count));
    p->set_rows(static_cast<uint32_t>(sh.rows));
    p->set_cols(static_cast<uint32_t>(sh.cols));
  }
  spec->set_generator(info.spec.generator);
  spec->mutable_budget()->set_max_iter(static_cast<uint32_t>(info.spec.budget.max_iter));
  spec->mutable_budget()->set_patience(static_cast<uint32_t>(info.spec.budget.patience));
  spec->mutable_budget()->set_min_improvement(info.spec.budget.min_improvement);
  spec->set_seed(info.spec.seed);
  spec->set_start(info.spec.start);
  spec->set_device(static_cast<uint32_t>(info.spec.device));
  out->set_state(ProtoState(info.state));
  out->set_message(info.message);
  out->set_stop(info.stop);
  const tune::JobProgress& p = info.progress;
  rvd::v1::TuneProgress* pp = out->mutable_progress();
  pp->set_iteration(static_cast<uint32_t>(p.iteration));
  pp->set_phase(p.phase);
  pp->set_baseline_seconds(p.baseline_seconds);
  pp->set_best_seconds(p.best_seconds);
  pp->set_best_description(p.best_description);
  pp->set_last_verdict(p.last_verdict);
  pp->set_last_reason(p.last_reason);
  pp->set_without_improvement(static_cast<uint32_t>(p.without_improvement));
  for (const auto& [verdict, n] : p.candidates) {
    (*pp->mutable_candidates())[verdict] = static_cast<uint64_t>(n);
  }
  SetTime(info.created, out->mutable_created());
  if (info.started != absl::InfinitePast()) SetTime(info.started, out->mutable_started());
  if (info.finished != absl::InfinitePast()) SetTime(info.finished, out->mutable_finished());
  out->set_version(info.version);
  out->set_resumed(info.resumed);
}

grpc::Status TuneHandlers::StartTuneJob(grpc::ServerContext*,
                                        const rvd::v1::StartTuneJobRequest* request,
                                        rvd::v1::TuneJob* response) {
  absl::StatusOr<tune::JobSpec> spec = SpecFromProto(*request);
  if (!spec.ok()) return ToGrpc(spec.status());
  absl::StatusOr<tune::JobInfo> info = jobs_->Start(*std::move(spec));
  if (!info.ok()) return ToGrpc(info.status());
  JobToProto(*info, response);
  return grpc::Status::OK;
}

grpc::Status TuneHandlers::GetTuneJob(grpc::ServerContext*,
                                      const rvd::v1::GetTuneJobRequest* request,
                                      rvd::v1::TuneJob* response) {
  absl::StatusOr<tune::JobInfo> info = jobs_->Get(request->id());
  if (!info.ok()) return ToGrpc(info.status());
  JobToProto(*info, response);
  if (request->include_iterations()) {
    std::vector<tune::IterationRecord> records;
    std::string best_source;
    if (absl::Status s = jobs_->Iterations(request->id(), &records, &best_source); !s.ok()) {
      return ToGrpc(s);
    }
    for (const tune::IterationRecord& r : records) {
      rvd::v1::TuneIteration* it = response->add_iterations();
      it->set_iteration(static_cast<uint32_t>(r.iteration));
      it->set_description(r.description);
      it->set_verdict(tune::VerdictName(r.verdict));
      it->set_reason(r.reason);
      it->set_bottleneck(r.bottleneck);
      it->set_compile_attempts(static_cast<uint32_t>(r.compile_attempts));
      it->set_candidate_seconds(r.candidate_seconds);
      it->set_best_seconds(r.best_seconds);
      it->set_speedup(r.speedup);
      it->set_spread(r.spread);
      it->set_held_out(r.held_out);
      it->set_best_after(r.best_after);
    }
    response->set_best_source(best_source);
  }
  return grpc::Status::OK;
}

grpc::Status TuneHandlers::ListTuneJobs(grpc::ServerContext*, const rvd::v1::ListTuneJobsRequest*,
                                        rvd::v1::ListTuneJobsResponse* response) {
  for (const tune::JobInfo& info : jobs_->List()) JobToProto(info, response->add_jobs());
  return grpc::Status::OK;
}

grpc::Status TuneHandlers::CancelTuneJob(grpc::ServerContext*,
                                         const rvd::v1::CancelTuneJobRequest* request,
                                         rvd::v1::TuneJob* response) {
  absl::StatusOr<tune::JobInfo> info = jobs_->Cancel(request->id());
  if (!info.ok()) return ToGrpc(info.status());
  JobToProto(*info, response);
  return grpc::Status::OK;
}

void TuneHandlers::StopWatches() {
  absl::MutexLock lock(&mu_);
  stopping_ = true;
}

// A sync stream: the job's changes wake it through the watch's notify; it
// also looks at the client's cancellation and rvd's shutdown every 100 ms
// (a sync handler has no callback for either).
grpc::Status TuneHandlers::WatchTuneJob(grpc::ServerContext* context,
                                        const rvd::v1::WatchTuneJobRequest* request,
                                        grpc::ServerWriter<rvd::v1::TuneJob>* writer) {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "rvd is shutting down");
    if (watches_ >= kMaxTuneWatches) {
      return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                          absl::StrCat(kMaxTuneWatches, " tuning job watches are open"));
    }
    ++watches_;
  }
  struct Leave {
    TuneHandlers* h;
    ~Leave() {
      absl::MutexLock lock(&h->mu_);
      --h->watches_;
    }
  } leave{this};

  struct Wake {
    absl::Mutex mu;
    bool changed ABSL_GUARDED_BY(mu) = true;
  };
  auto wake = std::make_shared<Wake>();
  absl::StatusOr<std::unique_ptr<tune::JobWatch>> watch =
      jobs_->Watch(request->id(), request->after_version(), [wake] {
        absl::MutexLock lock(&wake->mu);
        wake->changed = true;
      });
  if (!watch.ok()) return ToGrpc(watch.status());
  bool final_sent = false;
  while (true) {
    {
      absl::MutexLock lock(&wake->mu);
      const auto changed = [&wake]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(wake->mu) {
        return wake->changed;
      };
      wake->mu.AwaitWithTimeout(absl::Condition(&changed), absl::Milliseconds(100));
      wake->changed = false;
    }
    if (context->IsCancelled()) {
      return grpc::Status(grpc::StatusCode::CANCELLED, "the tuning job watch was cancelled");
    }
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) {
        return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                            absl::StrCat("rvd is shutting down; resume with after_version ",
                                         (*watch)->cursor()));
      }
    }
    tune::JobInfo info;
    while ((*watch)->Next(&info)) {
      rvd::v1::TuneJob out;
      JobToProto(info, &out);
      if (!writer->Write(out)) {
        return grpc::Status(grpc::StatusCode::CANCELLED, "the client went away");
      }
      final_sent = tune::IsTerminal(info.state);
    }
    if ((*watch)->closed()) {
      absl::StatusOr<tune::JobInfo> now = jobs_->Get(request->id());
      if (final_sent || !now.ok() || tune::IsTerminal(now->state)) return grpc::Status::OK;
      // Closed before the job finished: the manager is shutting down.
      return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                          absl::StrCat("rvd is shutting down; resume with after_version ",
                                       (*watch)->cursor()));
    }
  }
}

}  // namespace rvd

// The tuning jobs' RPCs (StartTuneJob, GetTuneJob, ListTuneJobs,
// WatchTuneJob, CancelTuneJob): RvdService forwards them here, where the
// job manager's statuses become grpc::Status and its JobInfo the API's
// TuneJob. Also rvd's TuneBackend: over the engine's TuneDevice (the CUDA
// module's tuning table) with the device tools (self_improve/
// device_tools.h); on the CPU engine, or a module without the table, it
// says why jobs cannot run (FAILED_PRECONDITION), so that a start is
// refused with that reason.
//
// Thread-safe (gRPC's sync threads). WatchTuneJob holds its thread while
// the stream is open, at most kMaxTuneWatches at once.
#ifndef RVD_SERVER_TUNE_SERVICE_H_
#define RVD_SERVER_TUNE_SERVICE_H_

#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/support/sync_stream.h"
#include "kernels/engine.h"
#include "rvd/v1/rvd.pb.h"
#include "self_improve/job_manager.h"

namespace rvd {

inline constexpr int kMaxTuneWatches = 16;

// rvd's TuneBackend for `engine` (which must outlive it and its jobs):
// when engine.Tune() is there, jobs on its one GPU (device 0: the exact
// architecture and the shape class's default shapes filled in, the device
// tools); else every start is FAILED_PRECONDITION with the reason. The one
// place that decides. `duty_cycle`: the share of time a job's device work
// may take (config key tune_duty_cycle; tune::DutyCycle).
std::unique_ptr<tune::TuneBackend> MakeTuneBackend(Engine& engine, double duty_cycle = 0.5);

// Conversions between the API and the manager (tested alone).
absl::StatusOr<tune::JobSpec> SpecFromProto(const rvd::v1::StartTuneJobRequest& r);
void JobToProto(const tune::JobInfo& info, rvd::v1::TuneJob* out);

class TuneHandlers {
 public:
  // `jobs` must outlive this.
  explicit TuneHandlers(tune::JobManager* jobs) : jobs_(jobs) {}

  grpc::Status StartTuneJob(grpc::ServerContext* context,
                            const rvd::v1::StartTuneJobRequest* request,
                            rvd::v1::TuneJob* response);
  grpc::Status GetTuneJob(grpc::ServerContext* context, const rvd::v1::GetTuneJobRequest* request,
                          rvd::v1::TuneJob* response);
  grpc::Status ListTuneJobs(grpc::ServerContext* context,
                            const rvd::v1::ListTuneJobsRequest* request,
                            rvd::v1::ListTuneJobsResponse* response);
  grpc::Status WatchTuneJob(grpc::ServerContext* context,
                            const rvd::v1::WatchTuneJobRequest* request,
                            grpc::ServerWriter<rvd::v1::TuneJob>* writer);
  grpc::Status CancelTuneJob(grpc::ServerContext* context,
                             const rvd::v1::CancelTuneJobRequest* request,
                             rvd::v1::TuneJob* response);

  // Ends every WatchTuneJob stream (UNAVAILABLE) and refuses new ones;
  // called before the gRPC server shuts down.
  void StopWatches();

 private:
  tune::JobManager* const jobs_;
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  int watches_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace rvd

#endif  // RVD_SERVER_TUNE_SERVICE_H_

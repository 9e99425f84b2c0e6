// The tuning jobs of one rvd (self_improve/, public): start, get, list,
// watch and cancel; one job per GPU at a time (others wait their turn,
// queued in start order); each job a thread running a TuneLoop over the
// tools its backend gives it; its progress (iteration, phase, best time,
// last verdict and why) readable at any time; with a data_dir, every job
// logged (job_log.h) and resumed after a restart.
//
// The scheduler is LevelDB's compaction pattern: MaybeSchedule is an
// if/else ladder under mu_ (shutting down / device busy / nothing queued /
// start one), called when a job is queued and when one ends; the destructor
// sets shutting_down_, stops every loop at its next step (unfinished jobs
// stay resumable: their logs end without a final state) and joins.
//
// Thread-safe. Watch notifications run on the thread that changed the job,
// with no lock of the manager held.
#ifndef RVD_SELF_IMPROVE_JOB_MANAGER_H_
#define RVD_SELF_IMPROVE_JOB_MANAGER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "self_improve/generator.h"
#include "self_improve/job_log.h"
#include "self_improve/tune_loop.h"

namespace rvd::tune {

// What a job's progress looks like from outside.
struct JobProgress {
  int iteration = 0;             // the last iteration logged (0: the start measured)
  std::string phase;             // what it is doing now ("" when not running)
  double baseline_seconds = 0;   // the starting point's time
  double best_seconds = 0;       // the best's time now
  std::string best_description;
  std::string last_verdict;      // VerdictName of the last iteration, "" before one
  std::string last_reason;       // and why
  int without_improvement = 0;   // against the patience
  std::map<std::string, int64_t> candidates;  // by verdict, this job
};

struct JobInfo {
  std::string id;  // "tune-<n>"
  JobSpec spec;    // the search seed filled in; never the secret seed
  JobState state = JobState::kQueued;
  std::string message;  // why it ended (a failure's error, the stop reason's words)
  std::string stop;     // StopReasonName when it finished
  JobProgress progress;
  absl::Time created = absl::InfinitePast();
  absl::Time started = absl::InfinitePast();   // last start (or resume)
  absl::Time finished = absl::InfinitePast();
  uint64_t version = 0;  // bumps at every change; a watcher's cursor
  bool resumed = false;  // continued from its log after a restart
};

// The host's side of tuning: whether jobs can run, how many GPUs, and a
// job's tools. Implemented over the CUDA engine's module; fakes in tests.
class TuneBackend {
 public:
  struct Tools {
    std::unique_ptr<Compiler> compiler;
    std::unique_ptr<Verifier> verifier;
    std::unique_ptr<Benchmarker> benchmarker;
  };
  virtual ~TuneBackend() = default;
  // OK when jobs can run; else FAILED_PRECONDITION saying why (the CPU
  // engine: no GPU to tune).
  virtual absl::Status Available() const = 0;
  virtual int Devices() const = 0;
  // Checks `target` against device `device` and fills what it leaves out
  // (the exact architecture, the shape class's default shapes).
  virtual absl::Status Complete(int device, TuneTarget* target) const = 0;
  virtual absl::StatusOr<Tools> ToolsFor(int device, const TuneTarget& target) = 0;
};

// Makes a job's generator; `seed` is the search's (JobSpec::seed).
using GeneratorFactory =
    std::function<absl::StatusOr<std::unique_ptr<Generator>>(const JobSpec& spec)>;

struct JobManagerOptions {
  std::string data_dir;            // "": jobs are not logged and do not survive a restart
  TuneBackend* backend = nullptr;  // required; outlives the manager
  // Generators by name; "builtin" (SearchGenerator) is there unless replaced.
  std::map<std::string, GeneratorFactory> generators;
  size_t max_jobs = 256;           // jobs held (finished ones beyond it are forgotten first)
  std::function<uint64_t()> random;  // seeds; default: std::random_device
  std::function<absl::Time()> now;   // default: absl::Now
};

class JobWatch;
// A watch's notify, shared with the manager's list so that a notify
// collected under the manager's lock and run after it never reaches a
// destroyed watch: JobWatch::Detach clears it under the cell's lock.
struct JobWatchCell {
  absl::Mutex mu;
  std::function<void()> notify ABSL_GUARDED_BY(mu);
  void Run() {
    absl::MutexLock lock(&mu);
    if (notify) notify();
  }
};

// Counts for /metrics (read at scrape time).
struct TuneStats {
  int64_t iterations_total = 0;                       // iterations run in this process
  std::map<std::string, int64_t> candidates_total;    // by verdict, this process
  std::vector<std::pair<std::string, double>> best_seconds;  // per held job with a best
};

class JobManager {
 public:
  explicit JobManager(JobManagerOptions options);
  ~JobManager();
  JobManager(const JobManager&) = delete;
  JobManager& operator=(const JobManager&) = delete;

  // Reads data_dir/tune/*.jsonl: finished jobs are listed, unfinished ones
  // queued again to resume from their logs. Call once, before Start.
  absl::Status Recover();

  // Queues a job (it starts when its GPU is free). INVALID_ARGUMENT for a
  // bad spec (naming the field), FAILED_PRECONDITION when jobs cannot run
  // here (the backend's reason), RESOURCE_EXHAUSTED when max_jobs are held
  // and none is finished.
  absl::StatusOr<JobInfo> Start(JobSpec spec);
  absl::StatusOr<JobInfo> Get(const std::string& id) const;  // NOT_FOUND
  // Job `id`'s iterations so far (0 first; the candidates' sources left
  // out: they are in the job log) and its best kernel's source ("" for the
  // product kernel). NOT_FOUND.
  absl::Status Iterations(const std::string& id, std::vector<IterationRecord>* out,
                          std::string* best_source) const;
  std::vector<JobInfo> List() const;                          // in start order
  // Cancels a queued or running job (a running one stops at its next step;
  // the state says CANCELLED when it has). A finished job: FAILED_PRECONDITION.
  absl::StatusOr<JobInfo> Cancel(const std::string& id);

  // A watch of job `id` from version `after` on: `notify` runs whenever the
  // job changes (or the manager shuts down). NOT_FOUND for an unknown job.
  absl::StatusOr<std::unique_ptr<JobWatch>> Watch(const std::string& id, uint64_t after,
                                                  std::function<void()> notify);

  // Blocks until job `id` is past `version` or `timeout` passes; its info
  // then (tests, and callers without a reactor).
  absl::StatusOr<JobInfo> WaitForChange(const std::string& id, uint64_t version,
                                        absl::Duration timeout) const;

  TuneStats Stats() const;

 private:
  struct Job;
  class Observer;
  friend class JobWatch;

  absl::Status Validate(JobSpec* spec) const;
  void MaybeSchedule() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RunJob(Job* job);
  // Bumps the job's version and collects its watchers' notifies (run
  // them after releasing mu_).
  using Notifies = std::vector<std::shared_ptr<JobWatchCell>>;
  Notifies Changed(Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static void RunNotifies(const Notifies& n) {
    for (const auto& cell : n) cell->Run();
  }
  void Forget(std::vector<std::shared_ptr<JobWatchCell>>* gone) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string LogPath(const std::string& id) const;

  const JobManagerOptions options_;
  mutable absl::Mutex mu_;
  // Start order; shared so that a waiter keeps a job it waits on.
  std::vector<std::shared_ptr<Job>> jobs_ ABSL_GUARDED_BY(mu_);
  std::map<int, Job*> running_ ABSL_GUARDED_BY(mu_);             // by device
  int64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  TuneStats stats_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> finished_threads_ ABSL_GUARDED_BY(mu_);
};

// A watch on one job (JobManager::Watch). Next gives the job's state when
// it changed since the last one given; closed() once the job is finished
// and its final state given, or is forgotten, or the manager is shutting
// down. Thread-safe; destroyed before the manager.
class JobWatch {
 public:
  ~JobWatch();
  // True with the job's info when it is past the last version given.
  bool Next(JobInfo* out);
  bool closed() const;
  uint64_t cursor() const;  // the last version given
  // No notify runs once it returns (one in progress is waited out).
  void Detach();

 private:
  friend class JobManager;
  JobWatch(JobManager* manager, std::string id, uint64_t after, std::shared_ptr<JobWatchCell> cell)
      : manager_(manager), id_(std::move(id)), cell_(std::move(cell)), cursor_(after) {}

  JobManager* const manager_;
  const std::string id_;
  const std::shared_ptr<JobWatchCell> cell_;
  mutable absl::Mutex mu_;  // taken before the manager's
  uint64_t cursor_ ABSL_GUARDED_BY(mu_);
  bool detached_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace rvd::tune

#endif  // RVD_SELF_IMPROVE_JOB_MANAGER_H_

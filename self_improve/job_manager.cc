#include "self_improve/job_manager.h"

#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "self_improve/search_generator.h"

namespace rvd::tune {

struct JobManager::Job {
  JobInfo info;
  uint64_t secret_seed = 0;
  std::atomic<bool> stop{false};     // the loop's cancelled flag: a cancel or the shutdown
  bool cancel_requested = false;     // a user's cancel (not the shutdown)
  std::vector<IterationRecord> restored;  // a resumed job's logged iterations
  std::unique_ptr<JobLog> log;       // null without a data_dir
  std::thread thread;
  bool thread_done = false;          // RunJob returned (the thread may be joined)
  std::vector<std::shared_ptr<JobWatchCell>> watchers;
  std::vector<IterationRecord> records;  // every iteration, sources left out
  std::string best_source;               // the last accepted source
};

namespace {

constexpr const char* kShapeClasses[] = {"square", "triangle", "wide", "tall"};

// A record's effect on the progress a job shows.
void Apply(const IterationRecord& r, JobProgress* p) {
  p->iteration = r.iteration;
  if (r.iteration == 0) {
    p->baseline_seconds = r.candidate_seconds;
    p->best_seconds = r.best_after;
    p->best_description = r.description;
    p->without_improvement = 0;
    return;
  }
  p->last_verdict = VerdictName(r.verdict);
  p->last_reason = r.reason;
  ++p->candidates[p->last_verdict];
  if (r.verdict == Verdict::kAccepted) {
    p->best_description = r.description;
    p->without_improvement = 0;
  } else {
    ++p->without_improvement;
  }
  p->best_seconds = r.best_after;
}

int64_t UnixNanos(absl::Time t) { return absl::ToUnixNanos(t); }

}  // namespace

// A record kept in memory for Iterations: its source only as the best's.
template <typename J>
void Keep(const IterationRecord& r, J* job) {
  if (r.verdict == Verdict::kAccepted) job->best_source = r.source;
  job->records.push_back(r);
  job->records.back().source.clear();
}

// The loop's observer for one job: logs each record, then publishes it.
class JobManager::Observer final : public LoopObserver {
 public:
  Observer(JobManager* m, Job* job) : m_(m), job_(job) {}

  void OnPhase(int iteration, const char* phase) override {
    Notifies n;
    {
      absl::MutexLock lock(&m_->mu_);
      job_->info.progress.phase = absl::StrCat("iteration ", iteration, ": ", phase);
      n = m_->Changed(*job_);
    }
    RunNotifies(n);
  }

  void OnRecord(const IterationRecord& r) override {
    if (job_->log != nullptr && log_error_.ok()) {
      log_error_ = job_->log->AddIteration(r);
      // A job whose log cannot be written cannot resume: stop it.
      if (!log_error_.ok()) job_->stop.store(true);
    }
    Notifies n;
    {
      absl::MutexLock lock(&m_->mu_);
      Apply(r, &job_->info.progress);
      Keep(r, job_);
      if (r.iteration > 0) {
        ++m_->stats_.iterations_total;
        ++m_->stats_.candidates_total[VerdictName(r.verdict)];
      }
      n = m_->Changed(*job_);
    }
    RunNotifies(n);
  }

  const absl::Status& log_error() const { return log_error_; }

 private:
  JobManager* const m_;
  Job* const job_;
  absl::Status log_error_;
};

JobManager::JobManager(JobManagerOptions options) : options_([&] {
  JobManagerOptions o = std::move(options);
  if (o.generators.count("builtin") == 0) {
    o.generators["builtin"] = [](const JobSpec& spec) -> absl::StatusOr<std::unique_ptr<Generator>> {
      return std::unique_ptr<Generator>(new SearchGenerator(spec.seed));
    };
  }
  if (!o.random) {
    o.random = [] {
      std::random_device rd;
      return (static_cast<uint64_t>(rd()) << 32) ^ rd();
    };
  }
  if (!o.now) o.now = [] { return absl::Now(); };
  return o;
}()) {}

JobManager::~JobManager() {
  std::vector<Notifies> notifies;
  {
    absl::MutexLock lock(&mu_);
    shutting_down_ = true;
    for (auto& job : jobs_) {
      job->stop.store(true);
      notifies.push_back(Changed(*job));
    }
  }
  for (const Notifies& n : notifies) RunNotifies(n);
  // Unfinished jobs end at their loop's next step, their logs without a
  // final state: the next start resumes them.
  std::vector<std::thread> threads;
  {
    absl::MutexLock lock(&mu_);
    for (auto& job : jobs_) {
      if (job->thread.joinable()) threads.push_back(std::move(job->thread));
    }
    for (std::thread& t : finished_threads_) threads.push_back(std::move(t));
    finished_threads_.clear();
  }
  for (std::thread& t : threads) t.join();
}

std::string JobManager::LogPath(const std::string& id) const {
  return absl::StrCat(options_.data_dir, "/tune/", id, ".jsonl");
}

absl::Status JobManager::Validate(JobSpec* spec) const {
  if (options_.backend == nullptr) return absl::FailedPreconditionError("no tuning backend");
  if (absl::Status s = options_.backend->Available(); !s.ok()) return s;
  const int devices = options_.backend->Devices();
  if (spec->device < 0 || spec->device >= devices) {
    return absl::InvalidArgumentError(absl::StrCat("device ", spec->device, " is not one of the ",
                                                   devices, " GPUs (0 .. ", devices - 1, ")"));
  }
  if (options_.generators.count(spec->generator) == 0) {
    std::string known;
    for (const auto& [name, f] : options_.generators) absl::StrAppend(&known, known.empty() ? "" : ", ", name);
    return absl::InvalidArgumentError(
        absl::StrCat("generator \"", spec->generator, "\" is not one of: ", known));
  }
  if (spec->start != "naive" && spec->start != "product") {
    return absl::InvalidArgumentError(
        absl::StrCat("start \"", spec->start, "\" is not naive or product"));
  }
  const TuneBudget& b = spec->budget;
  if (b.max_iter < 1 || b.max_iter > 1000) {
    return absl::InvalidArgumentError(absl::StrCat("max_iter ", b.max_iter, " is outside [1, 1000]"));
  }
  if (b.patience < 1 || b.patience > 1000) {
    return absl::InvalidArgumentError(absl::StrCat("patience ", b.patience, " is outside [1, 1000]"));
  }
  if (!(b.min_improvement >= 0 && b.min_improvement <= 0.5)) {
    return absl::InvalidArgumentError(
        absl::StrCat("min_improvement ", b.min_improvement, " is outside [0, 0.5]"));
  }
  TuneTarget& t = spec->target;
  if (t.variant != "fused") {
    return absl::InvalidArgumentError(
        absl::StrCat("variant \"", t.variant, "\": only fused has kernels to tune"));
  }
  if (std::find_if(std::begin(kShapeClasses), std::end(kShapeClasses),
                   [&](const char* c) { return t.shape_class == c; }) == std::end(kShapeClasses)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shape class \"", t.shape_class, "\" is not square, triangle, wide or tall"));
  }
  for (const TuneShape& s : t.shapes) {
    if (s.count < 1 || s.count > 4096 || s.rows < 1 || s.rows > 65536 || s.cols < 1 ||
        s.cols > 65536) {
      return absl::InvalidArgumentError(absl::StrCat("shape ", s.count, " x ", s.rows, "x", s.cols,
                                                     ": count in [1, 4096], sides in [1, 65536]"));
    }
  }
  if (absl::Status s = options_.backend->Complete(spec->device, &t); !s.ok()) return s;
  if (t.shapes.empty()) return absl::InvalidArgumentError("the target has no shapes");
  return absl::OkStatus();
}

absl::Status JobManager::Recover() {
  if (options_.data_dir.empty()) return absl::OkStatus();
  const std::string dir = absl::StrCat(options_.data_dir, "/tune");
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) return absl::OkStatus();
  struct Found {
    int64_t number;
    JobLogContents contents;
  };
  std::vector<Found> found;
  std::vector<std::string> damaged;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    absl::string_view stem = name;
    int64_t number = 0;
    if (!absl::ConsumePrefix(&stem, "tune-") || !absl::ConsumeSuffix(&stem, ".jsonl") ||
        !absl::SimpleAtoi(stem, &number)) {
      continue;
    }
    absl::StatusOr<JobLogContents> c = ReadJobLog(entry.path().string());
    if (!c.ok()) {
      damaged.push_back(c.status().ToString());
      continue;
    }
    found.push_back({number, *std::move(c)});
  }
  if (ec) return absl::InternalError(absl::StrCat("cannot list ", dir, ": ", ec.message()));
  std::sort(found.begin(), found.end(),
            [](const Found& a, const Found& b) { return a.number < b.number; });
  absl::MutexLock lock(&mu_);
  for (Found& f : found) {
    auto job = std::make_shared<Job>();
    JobInfo& info = job->info;
    info.id = f.contents.id;
    info.spec = f.contents.spec;
    info.created = absl::FromUnixNanos(f.contents.created_unix_nanos);
    info.state = f.contents.state;
    info.message = f.contents.message;
    info.stop = f.contents.stop;
    for (const IterationRecord& r : f.contents.records) {
      Apply(r, &info.progress);
      Keep(r, job.get());
    }
    job->secret_seed = f.contents.secret_seed;
    next_id_ = std::max(next_id_, f.number + 1);
    if (!IsTerminal(info.state)) {
      // Unfinished: queued again, to continue from its log.
      absl::StatusOr<JobLog> log = JobLog::Append(LogPath(info.id));
      if (!log.ok()) {
        damaged.push_back(log.status().ToString());
        continue;
      }
      job->log = std::make_unique<JobLog>(*std::move(log));
      job->restored = std::move(f.contents.records);
      info.state = JobState::kQueued;
      info.resumed = true;
    }
    jobs_.push_back(std::move(job));
  }
  MaybeSchedule();
  if (!damaged.empty()) {
    return absl::DataLossError(absl::StrCat(damaged.size(), " tuning job log(s) not resumed: ",
                                            damaged.front()));
  }
  return absl::OkStatus();
}

absl::StatusOr<JobInfo> JobManager::Start(JobSpec spec) {
  if (absl::Status s = Validate(&spec); !s.ok()) return s;
  // Join the threads of jobs forgotten since (they have returned).
  std::vector<std::thread> done;
  {
    absl::MutexLock lock(&mu_);
    done.swap(finished_threads_);
  }
  for (std::thread& t : done) t.join();

  Notifies n;
  JobInfo out;
  {
    absl::MutexLock lock(&mu_);
    if (shutting_down_) return absl::UnavailableError("rvd is shutting down");
    if (jobs_.size() >= options_.max_jobs) Forget(&n);
    if (jobs_.size() >= options_.max_jobs) {
      return absl::ResourceExhaustedError(absl::StrCat(
          options_.max_jobs, " tuning jobs are held and none has finished; cancel one first"));
    }
    if (spec.seed == 0) spec.seed = options_.random() | 1;
    auto job = std::make_shared<Job>();
    job->info.id = absl::StrCat("tune-", next_id_++);
    job->info.spec = spec;
    job->info.created = options_.now();
    job->secret_seed = options_.random();
    if (!options_.data_dir.empty()) {
      const std::string dir = absl::StrCat(options_.data_dir, "/tune");
      if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
        return absl::InternalError(absl::StrCat("cannot create ", dir, ": ", std::strerror(errno)));
      }
      absl::StatusOr<JobLog> log = JobLog::Create(LogPath(job->info.id), job->info.id, spec,
                                                  job->secret_seed, UnixNanos(job->info.created));
      if (!log.ok()) return log.status();
      job->log = std::make_unique<JobLog>(*std::move(log));
      if (absl::Status s = job->log->AddState(JobState::kQueued, "", "", UnixNanos(job->info.created));
          !s.ok()) {
        return s;
      }
    }
    Job* j = job.get();
    jobs_.push_back(std::move(job));
    MaybeSchedule();
    Notifies started = Changed(*j);
    n.insert(n.end(), started.begin(), started.end());
    out = j->info;
  }
  RunNotifies(n);
  return out;
}

// Drops the oldest finished jobs until fewer than max_jobs are held (their
// logs stay on disk).
void JobManager::Forget(Notifies* gone) {
  for (auto it = jobs_.begin(); it != jobs_.end() && jobs_.size() >= options_.max_jobs;) {
    Job& job = **it;
    if (IsTerminal(job.info.state) && (job.thread_done || !job.thread.joinable())) {
      if (job.thread.joinable()) finished_threads_.push_back(std::move(job.thread));
      // Their watches see it gone (closed) when notified after the lock.
      gone->insert(gone->end(), job.watchers.begin(), job.watchers.end());
      it = jobs_.erase(it);
    } else {
      ++it;
    }
  }
}

void JobManager::MaybeSchedule() {
  if (shutting_down_) return;
  for (auto& job : jobs_) {
    if (job->info.state != JobState::kQueued) continue;
    const int device = job->info.spec.device;
    if (running_.count(device) != 0) continue;  // one job per GPU
    job->info.state = JobState::kRunning;
    job->info.started = options_.now();
    running_[device] = job.get();
    Job* j = job.get();
    job->thread = std::thread([this, j] { RunJob(j); });
  }
}

JobManager::Notifies JobManager::Changed(Job& job) {
  ++job.info.version;
  return job.watchers;
}

void JobManager::RunJob(Job* job) {
  JobSpec spec;
  std::vector<IterationRecord> restored;
  bool resumed = false;
  {
    absl::MutexLock lock(&mu_);
    spec = job->info.spec;
    restored = std::move(job->restored);
    resumed = job->info.resumed;
  }
  if (job->log != nullptr) {
    (void)job->log->AddState(JobState::kRunning, resumed ? "resumed" : "", "",
                             UnixNanos(options_.now()));
  }
  absl::StatusOr<LoopOutcome> outcome = absl::UnknownError("not run");
  Observer observer(this, job);
  absl::StatusOr<TuneBackend::Tools> tools = options_.backend->ToolsFor(spec.device, spec.target);
  absl::StatusOr<std::unique_ptr<Generator>> generator =
      tools.ok() ? options_.generators.at(spec.generator)(spec)
                 : absl::StatusOr<std::unique_ptr<Generator>>(tools.status());
  if (!tools.ok()) {
    outcome = tools.status();
  } else if (!generator.ok()) {
    outcome = generator.status();
  } else {
    LoopConfig config;
    config.target = spec.target;
    config.budget = spec.budget;
    config.secret_seed = job->secret_seed;
    config.start = spec.start;
    TuneLoop loop(config, *tools->compiler, *tools->verifier, *tools->benchmarker, **generator,
                  observer);
    if (!restored.empty()) loop.Restore(std::move(restored));
    outcome = loop.Run(job->stop);
  }

  Notifies n;
  {
    absl::MutexLock lock(&mu_);
    JobInfo& info = job->info;
    const bool interrupted = shutting_down_ && !job->cancel_requested;
    info.progress.phase.clear();
    if (!observer.log_error().ok()) {
      info.state = JobState::kFailed;
      info.message = absl::StrCat("the job log: ", observer.log_error().ToString());
    } else if (interrupted && (!outcome.ok() ? absl::IsCancelled(outcome.status())
                                             : outcome->stop == StopReason::kCancelled)) {
      // Shutdown: left unfinished on purpose, resumed at the next start.
      info.state = JobState::kQueued;
      info.message = "interrupted by the shutdown; resumes at the next start";
    } else if (!outcome.ok()) {
      info.state = JobState::kFailed;
      info.message = outcome.status().ToString();
    } else if (outcome->stop == StopReason::kCancelled) {
      info.state = JobState::kCancelled;
      info.message = "cancelled";
      info.stop = StopReasonName(outcome->stop);
    } else {
      info.state = JobState::kSucceeded;
      info.stop = StopReasonName(outcome->stop);
      const double speedup = outcome->best_seconds > 0
                                 ? outcome->baseline_seconds / outcome->best_seconds
                                 : 0;
      info.message = absl::StrCat(outcome->why, "; best ", outcome->best_seconds, " s (",
                                  speedup, "x the start): ", outcome->best_description);
    }
    if (IsTerminal(info.state)) {
      info.finished = options_.now();
      if (job->log != nullptr && observer.log_error().ok()) {
        (void)job->log->AddState(info.state, info.message, info.stop, UnixNanos(info.finished));
      }
    }
    running_.erase(spec.device);
    MaybeSchedule();
    n = Changed(*job);
  }
  RunNotifies(n);
  absl::MutexLock lock(&mu_);
  job->thread_done = true;
}

absl::StatusOr<JobInfo> JobManager::Get(const std::string& id) const {
  absl::MutexLock lock(&mu_);
  for (const auto& job : jobs_) {
    if (job->info.id == id) return job->info;
  }
  return absl::NotFoundError(absl::StrCat("no tuning job ", id));
}

absl::Status JobManager::Iterations(const std::string& id, std::vector<IterationRecord>* out,
                                    std::string* best_source) const {
  absl::MutexLock lock(&mu_);
  for (const auto& job : jobs_) {
    if (job->info.id != id) continue;
    *out = job->records;
    *best_source = job->best_source;
    return absl::OkStatus();
  }
  return absl::NotFoundError(absl::StrCat("no tuning job ", id));
}

std::vector<JobInfo> JobManager::List() const {
  absl::MutexLock lock(&mu_);
  std::vector<JobInfo> out;
  for (const auto& job : jobs_) out.push_back(job->info);
  return out;
}

absl::StatusOr<JobInfo> JobManager::Cancel(const std::string& id) {
  Notifies n;
  JobInfo out;
  {
    absl::MutexLock lock(&mu_);
    Job* job = nullptr;
    for (auto& j : jobs_) {
      if (j->info.id == id) job = j.get();
    }
    if (job == nullptr) return absl::NotFoundError(absl::StrCat("no tuning job ", id));
    if (IsTerminal(job->info.state)) {
      return absl::FailedPreconditionError(
          absl::StrCat("job ", id, " has finished (", JobStateName(job->info.state), ")"));
    }
    job->cancel_requested = true;
    job->stop.store(true);
    if (job->info.state == JobState::kQueued) {
      job->info.state = JobState::kCancelled;
      job->info.message = "cancelled before it started";
      job->info.stop = StopReasonName(StopReason::kCancelled);
      job->info.finished = options_.now();
      if (job->log != nullptr) {
        (void)job->log->AddState(JobState::kCancelled, job->info.message, job->info.stop,
                                 UnixNanos(job->info.finished));
      }
    }
    n = Changed(*job);
    out = job->info;
  }
  RunNotifies(n);
  return out;
}

absl::StatusOr<std::unique_ptr<JobWatch>> JobManager::Watch(const std::string& id, uint64_t after,
                                                            std::function<void()> notify) {
  auto cell = std::make_shared<JobWatchCell>();
  {
    absl::MutexLock lock(&cell->mu);
    cell->notify = std::move(notify);
  }
  absl::MutexLock lock(&mu_);
  for (auto& job : jobs_) {
    if (job->info.id == id) {
      job->watchers.push_back(cell);
      return std::unique_ptr<JobWatch>(new JobWatch(this, id, after, cell));
    }
  }
  return absl::NotFoundError(absl::StrCat("no tuning job ", id));
}

absl::StatusOr<JobInfo> JobManager::WaitForChange(const std::string& id, uint64_t version,
                                                  absl::Duration timeout) const {
  const absl::Time deadline = absl::Now() + timeout;
  absl::MutexLock lock(&mu_);
  std::shared_ptr<const Job> job;
  for (const auto& j : jobs_) {
    if (j->info.id == id) job = j;
  }
  if (job == nullptr) return absl::NotFoundError(absl::StrCat("no tuning job ", id));
  // `job` is held here even if the manager forgets it meanwhile.
  const Job* held = job.get();
  const auto changed = [held, version]() { return held->info.version > version; };
  mu_.AwaitWithDeadline(absl::Condition(&changed), deadline);
  return job->info;
}

TuneStats JobManager::Stats() const {
  absl::MutexLock lock(&mu_);
  TuneStats s = stats_;
  for (const auto& job : jobs_) {
    if (job->info.progress.best_seconds > 0) {
      s.best_seconds.emplace_back(job->info.id, job->info.progress.best_seconds);
    }
  }
  return s;
}

JobWatch::~JobWatch() { Detach(); }

void JobWatch::Detach() {
  {
    absl::MutexLock lock(&mu_);
    if (detached_) return;
    detached_ = true;
  }
  {
    absl::MutexLock lock(&manager_->mu_);
    for (auto& job : manager_->jobs_) {
      if (job->info.id != id_) continue;
      auto& w = job->watchers;
      w.erase(std::remove(w.begin(), w.end(), cell_), w.end());
    }
  }
  absl::MutexLock lock(&cell_->mu);  // waits out a notify in progress
  cell_->notify = nullptr;
}

bool JobWatch::Next(JobInfo* out) {
  absl::MutexLock lock(&mu_);
  absl::MutexLock mlock(&manager_->mu_);
  for (const auto& job : manager_->jobs_) {
    if (job->info.id != id_) continue;
    if (job->info.version <= cursor_) return false;
    *out = job->info;
    cursor_ = job->info.version;
    return true;
  }
  return false;
}

bool JobWatch::closed() const {
  absl::MutexLock lock(&mu_);
  absl::MutexLock mlock(&manager_->mu_);
  if (manager_->shutting_down_) return true;
  for (const auto& job : manager_->jobs_) {
    if (job->info.id != id_) continue;
    return IsTerminal(job->info.state) && job->info.version <= cursor_;
  }
  return true;  // forgotten
}

uint64_t JobWatch::cursor() const {
  absl::MutexLock lock(&mu_);
  return cursor_;
}

}  // namespace rvd::tune

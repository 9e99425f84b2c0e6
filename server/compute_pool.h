// A fixed set of threads that run measurements, so that gRPC's threads only
// receive bytes and wait, with a bounded queue in front of them.
//
// A job beyond the workers waits in a FIFO queue of at most `max_queued`
// jobs. It waits until a worker takes it, until its deadline passes
// (DEADLINE_EXCEEDED) or until its caller gives up (CANCELLED); a job that
// finds the queue full is refused at once (RESOURCE_EXHAUSTED). A job that
// leaves the queue without a worker never runs. Run() blocks its caller
// until the job has run or has been refused, so a job may reference the
// caller's stack. Thread-safe.
#ifndef RVD_SERVER_COMPUTE_POOL_H_
#define RVD_SERVER_COMPUTE_POOL_H_

#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace rvd {

// A snapshot of the pool (ComputePool::Stats), read at scrape time.
struct ComputePoolStats {
  int64_t queued = 0;              // jobs waiting for a worker now
  int64_t running = 0;             // jobs on a worker now
  double wait_seconds_total = 0;   // queue time of every job that got a worker
  int64_t waits_total = 0;         // jobs that got a worker
  int64_t rejected_total = 0;      // queue full, deadline passed or cancelled
};

class ComputePool {
 public:
  // How often a queued job looks at its caller's cancellation: gRPC offers
  // no wake-up on cancellation to a synchronous handler.
  static constexpr absl::Duration kCancelPoll = absl::Milliseconds(50);

  ComputePool(int workers, int max_queued) : workers_(workers), max_queued_(max_queued) {
    for (int i = 0; i < workers; ++i) threads_.emplace_back([this] { Loop(); });
  }
  // Lets the running jobs finish, refuses the queued ones (CANCELLED), then
  // joins the workers.
  ~ComputePool() {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
    }
    for (std::thread& t : threads_) t.join();
  }

  ComputePool(const ComputePool&) = delete;
  ComputePool& operator=(const ComputePool&) = delete;

  // Runs `job` on a worker and waits for it. Returns OK once the job ran;
  // otherwise the job did not run: RESOURCE_EXHAUSTED (queue full),
  // DEADLINE_EXCEEDED (no worker before `deadline`), CANCELLED (`cancelled`
  // returned true while queued, or the pool is stopping). `cancelled` may
  // be empty; it is called on the caller's thread only.
  absl::Status Run(std::function<void()> job,
                   absl::Time deadline = absl::InfiniteFuture(),
                   const std::function<bool()>& cancelled = {}) {
    auto entry = std::make_shared<Entry>();
    entry->job = std::move(job);
    const absl::Time enqueued = absl::Now();
    absl::MutexLock lock(&mu_);
    if (stopping_) {
      ++rejected_total_;
      return absl::CancelledError("rvd is shutting down");
    }
    if (static_cast<int64_t>(queue_.size()) >= max_queued_) {
      ++rejected_total_;
      return absl::ResourceExhaustedError(absl::StrCat(
          "rvd's compute queue is full (", max_queued_,
          " measurements waiting for ", threads_.size(),
          " compute workers); retry later"));
    }
    queue_.push_back(entry);
    auto taken = [&entry]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return entry->state != State::kQueued;
    };
    while (!taken()) {
      const absl::Time now = absl::Now();
      if (now >= deadline || (cancelled && cancelled()) || stopping_) {
        queue_.remove(entry);
        ++rejected_total_;
        if (stopping_) return absl::CancelledError("rvd is shutting down");
        if (now >= deadline) {
          return absl::DeadlineExceededError(absl::StrCat(
              "the deadline passed after ",
              absl::FormatDuration(now - enqueued),
              " waiting for a compute worker; nothing was computed"));
        }
        return absl::CancelledError(
            "the client cancelled while waiting for a compute worker");
      }
      const absl::Time wake = std::min(deadline, now + kCancelPoll);
      mu_.AwaitWithDeadline(absl::Condition(&taken), wake);
    }
    wait_seconds_total_ += absl::ToDoubleSeconds(entry->started - enqueued);
    ++waits_total_;
    mu_.Await(absl::Condition(
        +[](Entry* e) { return e->state == State::kDone; }, entry.get()));
    return absl::OkStatus();
  }

  // As Run, except that a job that finds a worker idle and none queued
  // runs on the caller's thread in that worker's stead: a hand-off fewer
  // (the live dispatcher's, whose snapshots are measured in well under a
  // millisecond). Only for few, long-lived callers: a job's per-thread
  // state (the CPU engine's scratch) then lives on the caller's thread too.
  absl::Status RunHereIfIdle(std::function<void()> job,
                             absl::Time deadline = absl::InfiniteFuture(),
                             const std::function<bool()>& cancelled = {}) {
    bool here = false;
    {
      absl::MutexLock lock(&mu_);
      here = !stopping_ && queue_.empty() && running_ < workers_;
      if (here) {
        ++running_;
        ++waits_total_;
      }
    }
    if (!here) return Run(std::move(job), deadline, cancelled);
    job();
    absl::MutexLock lock(&mu_);
    --running_;
    return absl::OkStatus();
  }

  ComputePoolStats Stats() const {
    absl::MutexLock lock(&mu_);
    ComputePoolStats s;
    s.queued = queue_.size();
    s.running = running_;
    s.wait_seconds_total = wait_seconds_total_;
    s.waits_total = waits_total_;
    s.rejected_total = rejected_total_;
    return s;
  }

 private:
  enum class State { kQueued, kRunning, kDone };
  struct Entry {
    std::function<void()> job;
    State state = State::kQueued;  // guarded by the pool's mu_
    absl::Time started;            // when a worker took it
  };

  void Loop() {
    while (true) {
      std::shared_ptr<Entry> entry;
      {
        absl::MutexLock lock(&mu_);
        // A job run on its caller's thread takes a worker's place.
        mu_.Await(absl::Condition(
            +[](ComputePool* p) ABSL_SHARED_LOCKS_REQUIRED(p->mu_) {
              return p->stopping_ || (!p->queue_.empty() && p->running_ < p->workers_);
            },
            this));
        if (stopping_) return;  // queued callers see stopping_ and leave
        entry = queue_.front();
        queue_.pop_front();
        entry->state = State::kRunning;
        entry->started = absl::Now();
        ++running_;
      }
      entry->job();
      absl::MutexLock lock(&mu_);
      entry->state = State::kDone;
      --running_;
    }
  }

  const int64_t workers_;  // threads_.size(), once they all started
  const int64_t max_queued_;
  mutable absl::Mutex mu_;
  std::list<std::shared_ptr<Entry>> queue_ ABSL_GUARDED_BY(mu_);
  int64_t running_ ABSL_GUARDED_BY(mu_) = 0;
  double wait_seconds_total_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t waits_total_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t rejected_total_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace rvd

#endif  // RVD_SERVER_COMPUTE_POOL_H_

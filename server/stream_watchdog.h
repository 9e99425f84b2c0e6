// Cancels streams that receive nothing for too long, so that a client that
// opens a stream and stalls holds its thread and its bytes for at most the
// idle timeout. A synchronous gRPC read cannot time out by itself; one
// thread here checks every registered stream a few times per timeout and
// calls its cancel function (ServerContext::TryCancel, which ends the
// pending read). Only the wait on the client counts: once a stream has
// received all its bytes, Stop() takes it out of the watch, so the time rvd
// spends on it afterwards (the compute queue, a group's peers, each bounded
// by its own deadline) never cancels it. Thread-safe.
#ifndef RVD_SERVER_STREAM_WATCHDOG_H_
#define RVD_SERVER_STREAM_WATCHDOG_H_

#include <algorithm>
#include <atomic>
#include <functional>
#include <list>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace rvd {

class StreamWatchdog {
 private:
  struct Entry {
    std::function<void()> cancel;
    std::atomic<int64_t> last_ns;  // absl::GetCurrentTimeNanos() of the last data
    std::atomic<bool> fired{false};
    std::atomic<bool> stopped{false};  // received everything: no longer watched
  };

 public:
  // Registers one stream for its lifetime.
  class Watch {
   public:
    Watch(StreamWatchdog& dog, std::function<void()> cancel) : dog_(dog) {
      absl::MutexLock lock(&dog_.mu_);
      entry_ = dog_.entries_.emplace(dog_.entries_.end());
      entry_->cancel = std::move(cancel);
      entry_->last_ns = absl::GetCurrentTimeNanos();
    }
    ~Watch() {
      absl::MutexLock lock(&dog_.mu_);
      dog_.entries_.erase(entry_);
    }
    Watch(const Watch&) = delete;
    Watch& operator=(const Watch&) = delete;

    // The stream received something: its idle time starts again.
    void Touch() { entry_->last_ns = absl::GetCurrentTimeNanos(); }
    // The stream received all it will: from here rvd waits on itself, not
    // on the client, which is not idling.
    void Stop() { entry_->stopped = true; }
    // Whether the watchdog cancelled the stream for idling.
    bool timed_out() const { return entry_->fired; }

   private:
    StreamWatchdog& dog_;
    std::list<Entry>::iterator entry_;  // stable: entries_ is a list
  };

  explicit StreamWatchdog(absl::Duration idle_timeout)
      : idle_timeout_(idle_timeout),
        period_(std::clamp(idle_timeout / 4, absl::Milliseconds(10),
                           absl::Seconds(1))),
        thread_([this] { Loop(); }) {}
  ~StreamWatchdog() {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
    }
    thread_.join();
  }
  StreamWatchdog(const StreamWatchdog&) = delete;
  StreamWatchdog& operator=(const StreamWatchdog&) = delete;

  absl::Duration idle_timeout() const { return idle_timeout_; }

 private:
  void Loop() {
    absl::MutexLock lock(&mu_);
    while (!mu_.AwaitWithTimeout(absl::Condition(&stopping_), period_)) {
      const int64_t now = absl::GetCurrentTimeNanos();
      const int64_t limit = absl::ToInt64Nanoseconds(idle_timeout_);
      // Cancelling under the lock keeps the entry alive while it is used;
      // TryCancel only marks the call and wakes its reader.
      for (Entry& e : entries_) {
        if (!e.fired && !e.stopped && now - e.last_ns.load() > limit) {
          e.fired = true;
          e.cancel();
        }
      }
    }
  }

  const absl::Duration idle_timeout_;
  const absl::Duration period_;  // how often streams are checked
  absl::Mutex mu_;
  std::list<Entry> entries_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: starts after the members it reads
};

}  // namespace rvd

#endif  // RVD_SERVER_STREAM_WATCHDOG_H_

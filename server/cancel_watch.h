// Turns "the caller has gone" into the cancellation flag an engine call
// looks at (CallOptions::cancel). A synchronous gRPC handler is told of
// nothing: its ServerContext must be asked (IsCancelled, true once the
// client cancels, its deadline passes or the server shuts it down). One
// thread here asks every registered call a few times per second and sets
// its flag when the answer is yes; CancelAll sets every flag at once (the
// shutdown grace deadline), and any call registered after it starts
// cancelled. Thread-safe.
#ifndef RVD_SERVER_CANCEL_WATCH_H_
#define RVD_SERVER_CANCEL_WATCH_H_

#include <atomic>
#include <functional>
#include <list>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace rvd {

class CancelWatch {
 private:
  struct Entry {
    std::function<bool()> gone;
    std::atomic<bool>* flag;
  };

 public:
  // Registers one call for the Watch's lifetime: while it lives, `flag` is
  // set once `gone()` returns true (called on the watch's thread) or
  // CancelAll is called. `gone` and `flag` must outlive the Watch.
  class Watch {
   public:
    Watch(CancelWatch& w, std::function<bool()> gone, std::atomic<bool>* flag) : w_(w) {
      absl::MutexLock lock(&w_.mu_);
      if (w_.all_cancelled_) flag->store(true);
      entry_ = w_.entries_.insert(w_.entries_.end(), Entry{std::move(gone), flag});
    }
    ~Watch() {
      absl::MutexLock lock(&w_.mu_);
      w_.entries_.erase(entry_);
    }
    Watch(const Watch&) = delete;
    Watch& operator=(const Watch&) = delete;

   private:
    CancelWatch& w_;
    std::list<Entry>::iterator entry_;  // stable: entries_ is a list
  };

  // `period`: how often each registered call is asked.
  explicit CancelWatch(absl::Duration period = absl::Milliseconds(20))
      : period_(period), thread_([this] { Loop(); }) {}
  ~CancelWatch() {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
    }
    thread_.join();
  }
  CancelWatch(const CancelWatch&) = delete;
  CancelWatch& operator=(const CancelWatch&) = delete;

  // Sets the flag of every call registered now and of every later one.
  void CancelAll() {
    absl::MutexLock lock(&mu_);
    all_cancelled_ = true;
    for (Entry& e : entries_) e.flag->store(true);
  }

 private:
  void Loop() {
    absl::MutexLock lock(&mu_);
    // `gone` runs under mu_, so a Watch cannot be destroyed (and its
    // context freed) while its predicate runs.
    while (!mu_.AwaitWithTimeout(absl::Condition(&stopping_), period_)) {
      for (Entry& e : entries_) {
        if (!e.flag->load(std::memory_order_relaxed) && e.gone()) e.flag->store(true);
      }
    }
  }

  const absl::Duration period_;
  absl::Mutex mu_;
  std::list<Entry> entries_ ABSL_GUARDED_BY(mu_);
  bool all_cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: starts once the members above exist
};

}  // namespace rvd

#endif  // RVD_SERVER_CANCEL_WATCH_H_

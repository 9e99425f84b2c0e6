// A fixed set of threads that run measurements, so that gRPC's threads only
// receive bytes and wait. Run() blocks its caller until the job is done.
// Thread-safe.
#ifndef RVD_SERVER_COMPUTE_POOL_H_
#define RVD_SERVER_COMPUTE_POOL_H_

#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"

namespace rvd {

class ComputePool {
 public:
  explicit ComputePool(int workers) {
    for (int i = 0; i < workers; ++i) threads_.emplace_back([this] { Loop(); });
  }
  // Finishes queued jobs, then joins the workers.
  ~ComputePool() {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
    }
    for (std::thread& t : threads_) t.join();
  }

  // Runs `job` on a worker and waits for it.
  void Run(std::function<void()> job) {
    absl::Notification done;
    {
      absl::MutexLock lock(&mu_);
      jobs_.push_back([&] {
        job();
        done.Notify();
      });
    }
    done.WaitForNotification();
  }

 private:
  void Loop() {
    while (true) {
      std::function<void()> job;
      {
        absl::MutexLock lock(&mu_);
        mu_.Await(absl::Condition(
            +[](ComputePool* p) ABSL_SHARED_LOCKS_REQUIRED(p->mu_) {
              return p->stopping_ || !p->jobs_.empty();
            },
            this));
        if (jobs_.empty()) return;  // stopping, and nothing left to do
        job = std::move(jobs_.front());
        jobs_.pop_front();
      }
      job();
    }
  }

  absl::Mutex mu_;
  std::deque<std::function<void()>> jobs_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace rvd

#endif  // RVD_SERVER_COMPUTE_POOL_H_

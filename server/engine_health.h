// Health follows the engine: when the engine reports it can no longer serve
// (a sticky CUDA error leaves the process's device context unusable; see
// kernels/cuda/cuda_check.h), gRPC health turns NOT_SERVING and the reason is
// logged once, so that a probe restarts rvd instead of it staying SERVING
// while every call fails. rvd does not recreate the engine in-process: a
// lost CUDA context is lost for the whole process.
//
// Thread-safe. The watch runs on its own thread, checking every `period`;
// CheckNow() checks on the caller's thread.
#ifndef RVD_SERVER_ENGINE_HEALTH_H_
#define RVD_SERVER_ENGINE_HEALTH_H_

#include <functional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "kernels/engine.h"

namespace rvd {

class EngineHealthWatch {
 public:
  // `set_serving(false)` is called once, when the engine first reports
  // itself unhealthy. period <= 0: no thread (CheckNow only).
  EngineHealthWatch(const Engine& engine, std::function<void(bool)> set_serving,
                    absl::Duration period);
  ~EngineHealthWatch();  // stops the thread
  EngineHealthWatch(const EngineHealthWatch&) = delete;
  EngineHealthWatch& operator=(const EngineHealthWatch&) = delete;

  // Returns whether the engine is healthy; turns health off if not.
  bool CheckNow();
  // Why the engine stopped serving ("" while healthy).
  std::string reason() const;

 private:
  const Engine& engine_;
  const std::function<void(bool)> set_serving_;
  absl::Notification stop_;
  mutable absl::Mutex mu_;
  std::string reason_ ABSL_GUARDED_BY(mu_);  // set once
  std::thread thread_;
};

}  // namespace rvd

#endif  // RVD_SERVER_ENGINE_HEALTH_H_

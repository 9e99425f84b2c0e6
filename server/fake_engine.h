// Test-only: an Engine whose stats a test sets (metrics_test,
// engine_health_test). It computes nothing.
#ifndef RVD_SERVER_FAKE_ENGINE_H_
#define RVD_SERVER_FAKE_ENGINE_H_

#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "kernels/engine.h"

namespace rvd {

class FakeEngine final : public Engine {
 public:
  std::string Backend() const override { return "cpu"; }
  std::string Version() const override { return "fake-1"; }
  std::string DefaultVariant() const override { return "algebraic"; }
  using Engine::ComputePR;
  absl::Status ComputePR(absl::Span<const MatrixView>, const VariantSpec&,
                         absl::Span<double>, const CallOptions&) override {
    return absl::UnimplementedError("fake");
  }
  EngineStats Stats() const override {
    absl::MutexLock lock(&mu);
    return stats;
  }
  mutable absl::Mutex mu;
  EngineStats stats ABSL_GUARDED_BY(mu);
};

}  // namespace rvd

#endif  // RVD_SERVER_FAKE_ENGINE_H_

#include "server/engine_health.h"

#include <utility>

#include "server/log_text.h"
#include "spdlog/spdlog.h"

namespace rvd {

EngineHealthWatch::EngineHealthWatch(const Engine& engine,
                                     std::function<void(bool)> set_serving,
                                     absl::Duration period)
    : engine_(engine), set_serving_(std::move(set_serving)) {
  if (period <= absl::ZeroDuration()) return;
  thread_ = std::thread([this, period] {
    while (!stop_.WaitForNotificationWithTimeout(period)) {
      if (!CheckNow()) return;  // once unhealthy, nothing more to watch
    }
  });
}

EngineHealthWatch::~EngineHealthWatch() {
  stop_.Notify();
  if (thread_.joinable()) thread_.join();
}

bool EngineHealthWatch::CheckNow() {
  {
    absl::MutexLock lock(&mu_);
    if (!reason_.empty()) return false;
  }
  const EngineStats stats = engine_.Stats();
  if (stats.healthy) return true;
  {
    absl::MutexLock lock(&mu_);
    if (!reason_.empty()) return false;  // another caller got here first
    reason_ = stats.unhealthy_reason.empty() ? "the engine cannot serve"
                                             : stats.unhealthy_reason;
  }
  spdlog::error("{} engine lost: {}; health is NOT_SERVING, restart rvd", engine_.Backend(),
                LogEscape(reason()));
  set_serving_(false);
  return false;
}

std::string EngineHealthWatch::reason() const {
  absl::MutexLock lock(&mu_);
  return reason_;
}

}  // namespace rvd

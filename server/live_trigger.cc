#include "server/live_trigger.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace rvd {

absl::StatusOr<TriggerConfig> TriggerConfigFromProto(const rvd::v1::TriggerPolicy& policy) {
  TriggerConfig c;
  switch (policy.mode()) {
    case rvd::v1::TriggerPolicy::MODE_UNSPECIFIED:
    case rvd::v1::TriggerPolicy::MODE_TRAINING:
      c.inference = false;
      break;
    case rvd::v1::TriggerPolicy::MODE_INFERENCE:
      c.inference = true;
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("policy: unknown mode ", static_cast<int>(policy.mode()),
                       " (inference or training)"));
  }
  if (policy.measurement_interval() > 0) c.interval = policy.measurement_interval();
  c.adaptive = policy.adaptive();
  const double t = policy.delta_threshold();
  if (!std::isfinite(t) || t < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "policy: delta_threshold ", t, " must be a finite number >= 0 (0: 0.01)"));
  }
  if (t > 0) c.threshold = t;
  return c;
}

TriggerDecision Trigger::Decide(int64_t step, bool force) const {
  if (force) return {TriggerAction::kMeasure, "forced"};
  if (config_.inference) return {TriggerAction::kInference, "inference"};
  if (!last_measured_.has_value()) return {TriggerAction::kMeasure, "first"};
  // Steps may be notified sparsely: the first step at least `interval`
  // after the last measured one is due.
  if (step - *last_measured_ >= static_cast<int64_t>(config_.interval)) {
    return {TriggerAction::kMeasure, "interval"};
  }
  if (config_.adaptive) return {TriggerAction::kCheck, "adaptive_check"};
  return {TriggerAction::kSkip, "skipped"};
}

bool Trigger::Exceeds(double delta_sq, double last_sq) const {
  return std::sqrt(delta_sq) > config_.threshold * std::sqrt(last_sq);
}

}  // namespace rvd

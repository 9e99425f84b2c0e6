// When a live model is measured: the TriggerPolicy of rvd.v1 (seed 000's
// RVMonitor modes) as pure logic, so that the recorded history's agreement
// with the policy can be tested step for step without a device.
//
//   inference: measured once at registration; a notification takes no
//              snapshot (kInference) unless forced.
//   training:  the first notified step, then any step at least
//              measurement_interval after the last measured one; with
//              adaptive, every other step is a check (kCheck): a snapshot
//              whose weight delta against the last measured snapshot,
//              sqrt(sum delta_sq) / sqrt(sum last_sq) over the whole V set,
//              decides (Exceeds) whether it is measured.
//   force:     measured whatever the rest says.
//
// The caller tells the trigger which steps were measured (Measured): a
// check that did not exceed, or a snapshot that could not be taken, is not
// one, so the interval counts from the last step really measured.
// Thread-compatible (the registry holds it under its model's lock).
#ifndef RVD_SERVER_LIVE_TRIGGER_H_
#define RVD_SERVER_LIVE_TRIGGER_H_

#include <cstdint>
#include <optional>

#include "absl/status/statusor.h"
#include "rvd/v1/rvd.pb.h"

namespace rvd {

struct TriggerConfig {
  bool inference = false;
  uint32_t interval = 100;  // steps
  bool adaptive = false;
  double threshold = 0.01;  // relative Frobenius delta
};

// The policy of a RegisterLiveModelRequest with the proto's defaults
// (MODE_UNSPECIFIED: training; interval 0: 100; threshold 0: 0.01).
// INVALID_ARGUMENT for an unknown mode, or a negative or non-finite
// threshold.
absl::StatusOr<TriggerConfig> TriggerConfigFromProto(const rvd::v1::TriggerPolicy& policy);

enum class TriggerAction {
  kSkip,       // nothing read
  kInference,  // inference mode: answered from the registration's measurement
  kMeasure,    // take a snapshot and measure it
  kCheck,      // take a snapshot; measure it if the delta exceeds (adaptive)
};

struct TriggerDecision {
  TriggerAction action = TriggerAction::kSkip;
  // NotifyStepResponse.reason: "skipped", "inference", "forced", "first",
  // "interval", "adaptive_check".
  const char* reason = "skipped";
};

class Trigger {
 public:
  explicit Trigger(const TriggerConfig& config) : config_(config) {}

  // What a notification of `step` gets. Steps are the caller's to order.
  TriggerDecision Decide(int64_t step, bool force) const;
  // Whether a check's sums cross the threshold: sqrt(delta_sq) >
  // threshold * sqrt(last_sq) (an all-zero reference with any change
  // crosses; no change never does).
  bool Exceeds(double delta_sq, double last_sq) const;
  // `step` was measured: the interval counts from it.
  void Measured(int64_t step) { last_measured_ = step; }
  // Nothing measured counts any more (the reference snapshot was lost): the
  // next notification is "first" again.
  void Reset() { last_measured_.reset(); }

  std::optional<int64_t> last_measured() const { return last_measured_; }
  const TriggerConfig& config() const { return config_; }

 private:
  const TriggerConfig config_;
  std::optional<int64_t> last_measured_;
};

}  // namespace rvd

#endif  // RVD_SERVER_LIVE_TRIGGER_H_

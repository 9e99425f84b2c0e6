// Alert rules: what rvd watches in every measurement, read from their own
// YAML file (config key `alert_rules_file`) and validated as a whole, so that
// a file is either taken entirely or refused with an error naming the rule,
// the field and the line (config/alert_rules.yaml documents the format).
//
//   rules:
//     - name: rv_floor          # [A-Za-z0-9_.:-]{1,64}, unique
//       model: "llama-*"        # glob over model ids (fnmatch); default "*"
//       value: rv               # rv | layer_pr (then `layer: N`)
//       below: 0.5              # exactly one of below, above, drop, change
//       for: 3                  # consecutive measurements before firing
//       resolve_for: 1          # consecutive clear measurements to resolve
//       hysteresis: 0.05        # resolves only past threshold + this
//       severity: critical
//       labels: {team: ml}      # passed through to WatchAlerts
//       annotations: {summary: "R_V collapsed"}
//
// Conditions (v is the rule's value in a measurement):
//   below: X         v < X
//   above: X         v > X
//   drop:  {baseline: first|ema|max, fraction: F, measurements: N, alpha: A}
//                    (b - v) / b > F, b the mean of the model's first N
//                    values (not evaluated themselves), their EMA with
//                    weight A, or their running maximum
//   change: {per: measurement|step, below: X, above: Y}
//                    d < X or d > Y, d = v - previous v, divided by the
//                    step difference with `per: step`
// A rule holds when its condition is met; once firing it resolves when the
// value is back past the threshold by `hysteresis` (in the units of the
// compared quantity: the value, the drop fraction, the change) for
// `resolve_for` measurements, so that a value hovering at the threshold
// does not flap.
//
// Thread-compatible values; parsing has no global state.
#ifndef RVD_SERVER_ALERT_RULES_H_
#define RVD_SERVER_ALERT_RULES_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace rvd {

// The most rules one file may hold, and the largest file read: the
// (rule, model) states are bounded by kMaxAlertRules x max_models.
inline constexpr size_t kMaxAlertRules = 256;
inline constexpr size_t kMaxAlertRulesFileBytes = 1 << 20;
// Labels and annotations per rule, and their value lengths.
inline constexpr size_t kMaxAlertLabels = 32;
inline constexpr size_t kMaxAlertLabelValue = 1024;
inline constexpr size_t kMaxAlertAnnotationValue = 4096;
// The name of the rule rv_alert_threshold stands for.
inline constexpr char kThresholdRuleName[] = "rv_alert_threshold";

struct AlertRule {
  enum class Value { kRv, kLayerPr };
  enum class Condition { kBelow, kAbove, kDrop, kChange };
  enum class Baseline { kFirst, kEma, kMax };

  std::string name;         // the `alert` label; unique in a rule set
  std::string model = "*";  // fnmatch glob over model ids
  Value value = Value::kRv;
  uint32_t layer = 0;       // kLayerPr: the layer whose PR is watched
  Condition condition = Condition::kBelow;
  double threshold = 0;     // kBelow, kAbove: X
  // kDrop
  Baseline baseline = Baseline::kFirst;
  uint32_t baseline_measurements = 1;  // kFirst: values averaged (N >= 1)
  double ema_alpha = 0.1;              // kEma: weight of a new value (0, 1]
  double fraction = 0;                 // fires above this drop, (0, 1)
  // kChange
  bool per_step = false;               // divide by the step difference
  std::optional<double> change_below;  // fires when d < this
  std::optional<double> change_above;  // fires when d > this
  uint32_t for_count = 1;    // consecutive holding measurements to fire
  uint32_t resolve_for = 1;  // consecutive clear measurements to resolve
  double hysteresis = 0;     // >= 0; see the file comment
  std::string severity = "warning";
  std::map<std::string, std::string> labels;
  std::map<std::string, std::string> annotations;

  // Everything that decides when the rule fires, as canonical text: a
  // reload keeps the state of a rule whose fingerprint did not change.
  std::string Fingerprint() const;
  // "R_V below 0.5", "layer 3 PR drop > 20% from the mean of the first 5".
  std::string Describe() const;
  // Whether the rule applies to `model_id`.
  bool Matches(const std::string& model_id) const;
};

// Parses and validates a whole rules document. INVALID_ARGUMENT naming the
// rule (index and name), the field and its line for: YAML syntax, unknown or
// repeated fields, missing or ill-typed values, a bad name or glob, a
// repeated name, no condition or two, impossible values (a threshold that
// can never hold, a fraction outside (0, 1), for < 1, a negative
// hysteresis, NaN or infinity anywhere), too many rules, labels or bytes.
// An empty document, or `rules: []`, is an empty set.
absl::StatusOr<std::vector<AlertRule>> ParseAlertRules(
    const std::string& yaml_text);
// Reads and parses a file (NOT_FOUND if absent); errors start with the path.
absl::StatusOr<std::vector<AlertRule>> LoadAlertRules(const std::string& path);

// The rule that the global rv_alert_threshold stands for: R_V below it, for
// every model, firing on the first measurement.
AlertRule ThresholdRule(double threshold);

// What rvd runs: the rules of `path` (none when empty) plus, when
// rv_alert_threshold > 0, ThresholdRule. INVALID_ARGUMENT when the file
// names a rule kThresholdRuleName while the threshold is set.
absl::StatusOr<std::vector<AlertRule>> BuildAlertRules(const std::string& path,
                                                       double rv_alert_threshold);

}  // namespace rvd

#endif  // RVD_SERVER_ALERT_RULES_H_

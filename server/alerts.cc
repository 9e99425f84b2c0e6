#include "server/alerts.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "prometheus/client_metric.h"
#include "prometheus/metric_type.h"
#include "server/log_text.h"
#include "server/metric_family.h"
#include "spdlog/spdlog.h"

namespace rvd {

using rvd::v1::AlertState;

// The state of one (rule, model) pair.
struct AlertEngine::Pair {
  AlertState state = rvd::v1::ALERT_STATE_INACTIVE;
  google::protobuf::Timestamp since;  // when `state` began (unset: never)
  uint32_t streak = 0;        // consecutive holding measurements
  uint32_t clear_streak = 0;  // consecutive clear ones while firing
  uint64_t fired_total = 0;   // times it went FIRING
  bool exported = false;      // within the series budget
  // drop: the baseline, ready once baseline_n values formed it.
  uint64_t baseline_n = 0;
  double baseline_sum = 0;
  double baseline = 0;
  bool baseline_ready = false;
  // change: the previous value and its step.
  bool have_previous = false;
  double previous = 0;
  int64_t previous_step = 0;
};

namespace {

const char* StateName(AlertState s) {
  switch (s) {
    case rvd::v1::ALERT_STATE_INACTIVE:
      return "inactive";
    case rvd::v1::ALERT_STATE_PENDING:
      return "pending";
    case rvd::v1::ALERT_STATE_FIRING:
      return "firing";
    case rvd::v1::ALERT_STATE_RESOLVED:
      return "resolved";
    default:
      return "unspecified";
  }
}

bool Active(AlertState s) {
  return s == rvd::v1::ALERT_STATE_PENDING || s == rvd::v1::ALERT_STATE_FIRING;
}

// The rule's value in `m`, if it has one.
std::optional<double> ValueOf(const AlertRule& r, const rvd::v1::Measurement& m) {
  if (r.value == AlertRule::Value::kRv) {
    if (!m.has_rv()) return std::nullopt;
    return m.rv();
  }
  for (const rvd::v1::LayerPR& l : m.layers()) {
    if (l.layer() == r.layer) return l.pr();
  }
  return std::nullopt;
}

google::protobuf::Timestamp Now() {
  const absl::Time t = absl::Now();
  google::protobuf::Timestamp ts;
  ts.set_seconds(absl::ToUnixSeconds(t));
  ts.set_nanos(static_cast<int32_t>(
      absl::ToInt64Nanoseconds(t - absl::FromUnixSeconds(ts.seconds()))));
  return ts;
}

rvd::v1::AlertEvent NewEvent(const AlertRule& r, const std::string& model_id,
                             AlertState from, AlertState to,
                             const google::protobuf::Timestamp& since) {
  rvd::v1::AlertEvent e;
  e.set_alert(r.name);
  e.set_model_id(model_id);
  e.set_previous_state(from);
  e.set_state(to);
  *e.mutable_since() = since;
  e.set_severity(r.severity);
  e.mutable_labels()->insert(r.labels.begin(), r.labels.end());
  e.mutable_annotations()->insert(r.annotations.begin(), r.annotations.end());
  return e;
}

}  // namespace

// ---------------------------------------------------------------------------
// AlertWatch

void AlertWatch::Notifier::Call() {
  absl::MutexLock lock(&mu);
  if (fn) fn();
}

AlertWatch::AlertWatch(AlertEngine& engine, std::string model_id,
                       uint64_t cursor, uint64_t subscribed_at,
                       std::shared_ptr<Notifier> notifier)
    : engine_(engine),
      model_id_(std::move(model_id)),
      cursor_(cursor),
      subscribed_at_(subscribed_at),
      notifier_(std::move(notifier)) {}

AlertWatch::~AlertWatch() {
  Detach();
  engine_.Remove(notifier_);
}

std::optional<AlertStreamEvent> AlertWatch::Next() {
  return engine_.NextAfter(model_id_, &cursor_, subscribed_at_);
}

bool AlertWatch::closed() const {
  absl::MutexLock lock(&engine_.mu_);
  return engine_.closed_;
}

void AlertWatch::Detach() {
  absl::MutexLock lock(&notifier_->mu);
  notifier_->fn = nullptr;
}

// ---------------------------------------------------------------------------
// AlertEngine

AlertEngine::AlertEngine(const Options& options, std::vector<AlertRule> rules)
    : options_(options) {
  SetRules(std::move(rules));
}

AlertEngine::~AlertEngine() { CloseWatches(); }

size_t AlertEngine::num_rules() const {
  absl::MutexLock lock(&mu_);
  return rules_.size();
}

uint64_t AlertEngine::last_sequence() const {
  absl::MutexLock lock(&mu_);
  return next_sequence_ - 1;
}

void AlertEngine::NoteReloadFailure() {
  absl::MutexLock lock(&mu_);
  ++reload_failures_total_;
}

void AlertEngine::Observe(const rvd::v1::Measurement& m) {
  std::vector<AlertEventPtr> events;
  {
    absl::MutexLock lock(&mu_);
    for (RuleSlot& slot : rules_) Evaluate(slot, m, &events);
  }
  Publish(events);
}

void AlertEngine::Evaluate(RuleSlot& slot, const rvd::v1::Measurement& m,
                           std::vector<AlertEventPtr>* events) {
  const AlertRule& r = *slot.rule;
  if (!r.Matches(m.model_id())) return;
  std::unique_ptr<Pair>& pair_ptr = slot.pairs[m.model_id()];
  if (pair_ptr == nullptr) {
    pair_ptr = std::make_unique<Pair>();
    // Two series per pair; a pair beyond the budget is still evaluated.
    if (2 * (exported_pairs_ + 1) <= options_.max_series) {
      pair_ptr->exported = true;
      ++exported_pairs_;
    } else {
      series_dropped_total_ += 2;
      if (!overflow_logged_) {
        overflow_logged_ = true;
        spdlog::warn(
            "alerts: the series budget (max_metric_series {}) is spent: alert "
            "{} of model {} is evaluated and streamed but not exported, nor "
            "later pairs beyond it (counted in rvd_alert_series_dropped_total; "
            "logged once)",
            options_.max_series, r.name, LogEscape(m.model_id()));
      }
    }
  }
  Pair& p = *pair_ptr;
  const std::optional<double> value = ValueOf(r, m);
  if (!value.has_value()) return;
  const double v = *value;

  double observed = v;
  double threshold = r.threshold;
  bool holds = false;
  bool clear = false;
  switch (r.condition) {
    case AlertRule::Condition::kBelow:
      holds = v < r.threshold;
      clear = v >= r.threshold + r.hysteresis;
      break;
    case AlertRule::Condition::kAbove:
      holds = v > r.threshold;
      clear = v <= r.threshold - r.hysteresis;
      break;
    case AlertRule::Condition::kDrop:
      if (!p.baseline_ready) {
        // The first N values (one for ema and max) form the baseline and
        // are not evaluated against it.
        p.baseline_sum += v;
        ++p.baseline_n;
        const uint64_t n = r.baseline == AlertRule::Baseline::kFirst
                               ? r.baseline_measurements
                               : 1;
        if (p.baseline_n >= n) {
          p.baseline = p.baseline_sum / static_cast<double>(p.baseline_n);
          p.baseline_ready = true;
        }
        return;
      }
      if (!(p.baseline > 0)) return;  // no drop from nothing
      observed = (p.baseline - v) / p.baseline;
      threshold = r.fraction;
      holds = observed > r.fraction;
      clear = observed <= r.fraction - r.hysteresis;
      break;
    case AlertRule::Condition::kChange: {
      const bool had = p.have_previous;
      const double previous = p.previous;
      const int64_t previous_step = p.previous_step;
      p.have_previous = true;
      p.previous = v;
      p.previous_step = m.step();
      if (!had) return;
      double d = v - previous;
      if (r.per_step) {
        // A step that did not advance (a re-measurement, a restarted
        // counter) has no rate.
        if (m.step() <= previous_step) return;
        d /= static_cast<double>(m.step() - previous_step);
      }
      observed = d;
      const bool low = r.change_below && d < *r.change_below;
      const bool high = r.change_above && d > *r.change_above;
      holds = low || high;
      clear = (!r.change_below || d >= *r.change_below + r.hysteresis) &&
              (!r.change_above || d <= *r.change_above - r.hysteresis);
      threshold = r.change_below && (!r.change_above || !high)
                      ? *r.change_below
                      : *r.change_above;
      break;
    }
  }

  const AlertState from = p.state;
  AlertState to = from;
  if (holds) {
    p.clear_streak = 0;
    if (!Active(from)) {
      p.streak = 1;
    } else if (from == rvd::v1::ALERT_STATE_PENDING) {
      ++p.streak;
    }
    if (from != rvd::v1::ALERT_STATE_FIRING) {
      to = p.streak >= r.for_count ? rvd::v1::ALERT_STATE_FIRING
                                   : rvd::v1::ALERT_STATE_PENDING;
    }
  } else {
    p.streak = 0;
    if (from == rvd::v1::ALERT_STATE_PENDING) {
      to = rvd::v1::ALERT_STATE_INACTIVE;
    } else if (from == rvd::v1::ALERT_STATE_FIRING) {
      // Inside the hysteresis band a firing alert stays firing and its
      // count of clear measurements starts again.
      p.clear_streak = clear ? p.clear_streak + 1 : 0;
      if (p.clear_streak >= r.resolve_for) {
        p.clear_streak = 0;
        to = rvd::v1::ALERT_STATE_RESOLVED;
      }
    }
  }
  if (to != from) {
    p.state = to;
    p.since = m.timestamp();
    if (to == rvd::v1::ALERT_STATE_FIRING) ++p.fired_total;
    rvd::v1::AlertEvent e = NewEvent(r, m.model_id(), from, to, m.timestamp());
    e.set_value(v);
    e.set_observed(observed);
    e.set_threshold(threshold);
    if (r.condition == AlertRule::Condition::kDrop) e.set_baseline(p.baseline);
    e.set_measurement_sequence(m.sequence());
    e.set_step(m.step());
    // What was seen, then the rule: "R_V 0.41; rule: R_V below 0.5".
    std::string text = absl::StrCat(
        r.value == AlertRule::Value::kRv ? "R_V" : absl::StrCat("layer ", r.layer, " PR"),
        " ", v);
    if (r.condition == AlertRule::Condition::kDrop) {
      absl::StrAppend(&text, ", a drop of ", observed, " from baseline ", p.baseline);
    } else if (r.condition == AlertRule::Condition::kChange) {
      absl::StrAppend(&text, ", a change of ", observed);
    }
    absl::StrAppend(&text, "; rule: ", r.Describe());
    if (r.for_count > 1) absl::StrAppend(&text, " for ", r.for_count, " measurements");
    e.set_description(std::move(text));
    events->push_back(Append(std::move(e)));
  }
  // The moving baselines take only the values of a quiet pair.
  if (r.condition == AlertRule::Condition::kDrop && !Active(p.state)) {
    if (r.baseline == AlertRule::Baseline::kEma) {
      p.baseline = r.ema_alpha * v + (1 - r.ema_alpha) * p.baseline;
    } else if (r.baseline == AlertRule::Baseline::kMax) {
      p.baseline = std::max(p.baseline, v);
    }
  }
}

AlertEventPtr AlertEngine::Append(rvd::v1::AlertEvent e) {
  e.set_sequence(next_sequence_++);
  auto shared = std::make_shared<const rvd::v1::AlertEvent>(std::move(e));
  log_.push_back(shared);
  while (log_.size() > std::max<size_t>(options_.retained_events, 1)) {
    log_.pop_front();
  }
  return shared;
}

void AlertEngine::Publish(const std::vector<AlertEventPtr>& events) {
  if (events.empty()) return;
  for (const AlertEventPtr& e : events) {
    // Rule names and model ids are validated; escaped all the same, as every
    // line quoting a client's text is.
    const std::string line = absl::StrCat(
        "alert ", StateName(e->state()), " alert=", e->alert(),
        " model=", LogEscape(e->model_id()), " seq=", e->sequence(),
        " measurement_seq=", e->measurement_sequence(), " step=", e->step(),
        " severity=", e->severity(), " value=", e->value(),
        " observed=", e->observed(), " threshold=", e->threshold(),
        " was=", StateName(e->previous_state()), ": ",
        LogEscape(e->description()));
    if (e->state() == rvd::v1::ALERT_STATE_FIRING) {
      spdlog::warn("{}", line);
    } else {
      spdlog::info("{}", line);
    }
  }
  std::vector<std::shared_ptr<AlertWatch::Notifier>> watches;
  {
    absl::MutexLock lock(&mu_);
    watches = watches_;
  }
  for (const auto& w : watches) w->Call();
}

void AlertEngine::SetRules(std::vector<AlertRule> rules) {
  std::vector<AlertEventPtr> events;
  {
    absl::MutexLock lock(&mu_);
    std::vector<RuleSlot> next;
    next.reserve(rules.size());
    for (AlertRule& r : rules) {
      RuleSlot slot;
      slot.fingerprint = r.Fingerprint();
      for (RuleSlot& old : rules_) {
        if (old.rule != nullptr && old.rule->name == r.name &&
            old.fingerprint == slot.fingerprint) {
          slot.pairs = std::move(old.pairs);
          old.rule = nullptr;  // taken over
          break;
        }
      }
      slot.rule = std::make_shared<const AlertRule>(std::move(r));
      next.push_back(std::move(slot));
    }
    // What is left of the old rules ends: its active pairs get a closing
    // event, its series leave the budget.
    const google::protobuf::Timestamp now = Now();
    for (RuleSlot& old : rules_) {
      if (old.rule == nullptr) continue;
      for (auto& [model_id, p] : old.pairs) {
        if (p->exported) --exported_pairs_;
        if (!Active(p->state)) continue;
        rvd::v1::AlertEvent e = NewEvent(*old.rule, model_id, p->state,
                                         rvd::v1::ALERT_STATE_INACTIVE, now);
        e.set_description(absl::StrCat(old.rule->Describe(),
                                        ": the rule was removed or changed by a "
                                        "reload"));
        events.push_back(Append(std::move(e)));
      }
    }
    rules_ = std::move(next);
  }
  Publish(events);
}

absl::StatusOr<std::unique_ptr<AlertWatch>> AlertEngine::Subscribe(
    const std::string& model_id, std::optional<uint64_t> after_sequence,
    std::function<void()> notify) {
  auto notifier = std::make_shared<AlertWatch::Notifier>();
  {
    absl::MutexLock lock(&notifier->mu);
    notifier->fn = std::move(notify);
  }
  uint64_t cursor = 0;
  uint64_t newest = 0;
  {
    absl::MutexLock lock(&mu_);
    if (closed_) return absl::UnavailableError("rvd is shutting down");
    newest = next_sequence_ - 1;
    if (after_sequence.has_value() && *after_sequence > newest) {
      return absl::OutOfRangeError(absl::StrCat(
          "after_sequence ", *after_sequence, " is above the newest alert event (",
          newest, "): a cursor from before rvd restarted? Resume with 0"));
    }
    if (watches_.size() >= options_.max_watchers) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "rvd serves at most ", options_.max_watchers,
          " WatchAlerts streams at once (max_watchers); retry later"));
    }
    cursor = after_sequence.value_or(newest);
    watches_.push_back(notifier);
  }
  // An event logged from here on is above the cursor: the watch reads it.
  return std::unique_ptr<AlertWatch>(
      new AlertWatch(*this, model_id, cursor, newest, std::move(notifier)));
}

void AlertEngine::Remove(const std::shared_ptr<AlertWatch::Notifier>& notifier) {
  absl::MutexLock lock(&mu_);
  watches_.erase(std::remove(watches_.begin(), watches_.end(), notifier),
                 watches_.end());
}

void AlertEngine::CloseWatches() {
  std::vector<std::shared_ptr<AlertWatch::Notifier>> watches;
  {
    absl::MutexLock lock(&mu_);
    closed_ = true;
    watches = watches_;
  }
  for (const auto& w : watches) w->Call();
}

std::optional<AlertStreamEvent> AlertEngine::NextAfter(
    const std::string& model_id, uint64_t* cursor, uint64_t subscribed_at) const {
  absl::MutexLock lock(&mu_);
  if (log_.empty()) return std::nullopt;
  const uint64_t oldest = log_.front()->sequence();
  if (*cursor + 1 < oldest) {
    GapMarker gap;
    gap.first_sequence = *cursor + 1;
    gap.last_sequence = oldest - 1;
    gap.missed = model_id.empty() ? gap.last_sequence - gap.first_sequence + 1 : 0;
    gap.reason = gap.first_sequence <= subscribed_at
                     ? GapMarker::Reason::kNotRetained
                     : GapMarker::Reason::kSlowConsumer;
    *cursor = oldest - 1;
    return gap;
  }
  for (size_t i = *cursor + 1 - oldest; i < log_.size(); ++i) {
    *cursor = log_[i]->sequence();
    if (model_id.empty() || log_[i]->model_id() == model_id) return log_[i];
  }
  return std::nullopt;
}

std::vector<AlertEngine::PairState> AlertEngine::States() const {
  std::vector<PairState> out;
  absl::MutexLock lock(&mu_);
  for (const RuleSlot& slot : rules_) {
    for (const auto& [model_id, p] : slot.pairs) {
      out.push_back(PairState{slot.rule->name, model_id, p->state,
                              p->since.seconds(), p->fired_total});
    }
  }
  return out;
}

void AlertEngine::CollectMetrics(std::vector<prometheus::MetricFamily>* out) const {
  using prometheus::MetricType;
  prometheus::MetricFamily active = NewFamily(
      "rvd_alert_active",
      "1 while an alert rule fires for a model, else 0 (pending counts as 0).",
      MetricType::Gauge);
  prometheus::MetricFamily fired = NewFamily(
      "rvd_alerts_fired_total",
      "Times an alert rule went to firing for a model (since the rule was "
      "loaded or last changed).",
      MetricType::Counter);
  prometheus::MetricFamily rules = NewFamily(
      "rvd_alert_rules", "Alert rules loaded (rv_alert_threshold included).",
      MetricType::Gauge);
  prometheus::MetricFamily dropped = NewFamily(
      "rvd_alert_series_dropped_total",
      "rvd_alert_active and rvd_alerts_fired_total series not exported "
      "because the series budget (max_metric_series) was spent; those alerts "
      "are still evaluated, logged and streamed.",
      MetricType::Counter);
  prometheus::MetricFamily failures = NewFamily(
      "rvd_alert_reload_failures_total",
      "SIGHUP reloads of the alert rules file that were refused (the old "
      "rules stay).",
      MetricType::Counter);
  {
    absl::MutexLock lock(&mu_);
    for (const RuleSlot& slot : rules_) {
      for (const auto& [model_id, p] : slot.pairs) {
        if (!p->exported) continue;
        AddSample(active, {{"alert", slot.rule->name}, {"model_id", model_id}},
                  p->state == rvd::v1::ALERT_STATE_FIRING ? 1 : 0);
        AddSample(fired, {{"alert", slot.rule->name}, {"model_id", model_id}},
                  static_cast<double>(p->fired_total));
      }
    }
    AddSample(rules, {}, static_cast<double>(rules_.size()));
    AddSample(dropped, {}, static_cast<double>(series_dropped_total_));
    AddSample(failures, {}, static_cast<double>(reload_failures_total_));
  }
  for (prometheus::MetricFamily* f : {&active, &fired, &rules, &dropped, &failures}) {
    if (!f->metric.empty()) out->push_back(std::move(*f));
  }
}

}  // namespace rvd

#include "server/event_bus.h"

#include <algorithm>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace rvd {

// ---------------------------------------------------------------------------
// BusSubscription

BusSubscription::BusSubscription(std::string model_id, size_t max_queued,
                                 std::function<void()> notify)
    : model_id_(std::move(model_id)),
      max_queued_(std::max<size_t>(max_queued, 1)),
      notify_(std::move(notify)) {}

std::optional<BusEvent> BusSubscription::Pop() {
  absl::MutexLock lock(&mu_);
  if (queue_.empty()) return std::nullopt;
  BusEvent e = std::move(queue_.front());
  queue_.pop_front();
  if (std::holds_alternative<MeasurementLog::Entry>(e)) --queued_;
  return e;
}

bool BusSubscription::closed() const {
  absl::MutexLock lock(&mu_);
  return closed_;
}

uint64_t BusSubscription::missed() const {
  absl::MutexLock lock(&mu_);
  return missed_;
}

size_t BusSubscription::queued() const {
  absl::MutexLock lock(&mu_);
  return queued_;
}

bool BusSubscription::Push(const MeasurementLog::Entry& e, bool* missed) {
  absl::MutexLock lock(&mu_);
  *missed = false;
  if (closed_) return false;
  if (queued_ < max_queued_) {
    queue_.push_back(e);
    ++queued_;
    return true;
  }
  // Full: the entry joins the gap at the tail, or opens one. Gaps take no
  // measurement slot, and two gaps are never adjacent, so the queue holds
  // at most 2 * max_queued_ + 1 events.
  *missed = true;
  ++missed_;
  if (!queue_.empty()) {
    if (auto* gap = std::get_if<GapMarker>(&queue_.back())) {
      gap->last_sequence = e->sequence();
      ++gap->missed;
      return true;
    }
  }
  queue_.push_back(GapMarker{e->sequence(), e->sequence(), 1,
                             GapMarker::Reason::kSlowConsumer});
  return true;
}

void BusSubscription::Close() {
  absl::MutexLock lock(&mu_);
  closed_ = true;
}

void BusSubscription::Notify() {
  absl::MutexLock lock(&notify_mu_);
  if (notify_) notify_();
}

void BusSubscription::Detach() {
  absl::MutexLock lock(&notify_mu_);
  notify_ = nullptr;
}

// ---------------------------------------------------------------------------
// EventBus

EventBus::EventBus(const Options& options) : options_(options) {}

EventBus::~EventBus() { Close(); }

absl::StatusOr<std::shared_ptr<BusSubscription>> EventBus::Subscribe(
    std::string model_id, std::function<void()> notify) {
  auto sub = std::make_shared<BusSubscription>(
      std::move(model_id), options_.max_queued, std::move(notify));
  absl::MutexLock lock(&mu_);
  if (closed_) return absl::UnavailableError("rvd is shutting down");
  if (subs_.size() >= options_.max_subscribers) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "rvd serves at most ", options_.max_subscribers,
        " watch streams at once (max_watchers); retry later"));
  }
  subs_.push_back(sub);
  return sub;
}

void EventBus::Unsubscribe(const std::shared_ptr<BusSubscription>& sub) {
  if (sub == nullptr) return;
  {
    absl::MutexLock lock(&mu_);
    subs_.erase(std::remove(subs_.begin(), subs_.end(), sub), subs_.end());
  }
  sub->Close();
  sub->Detach();
}

void EventBus::Publish(const MeasurementLog::Entry& e) {
  if (e == nullptr) return;
  std::vector<std::shared_ptr<BusSubscription>> notify;
  uint64_t missed_here = 0;
  {
    absl::MutexLock lock(&mu_);
    for (const std::shared_ptr<BusSubscription>& sub : subs_) {
      if (!sub->Matches(e->model_id())) continue;
      bool missed = false;
      if (sub->Push(e, &missed)) notify.push_back(sub);
      if (missed) ++missed_here;
    }
  }
  if (missed_here > 0) gap_entries_total_.fetch_add(missed_here);
  for (const std::shared_ptr<BusSubscription>& sub : notify) sub->Notify();
}

void EventBus::Close() {
  std::vector<std::shared_ptr<BusSubscription>> subs;
  {
    absl::MutexLock lock(&mu_);
    closed_ = true;
    subs = subs_;  // they stay registered until their owners unsubscribe
  }
  for (const std::shared_ptr<BusSubscription>& sub : subs) {
    sub->Close();
    sub->Notify();
  }
}

size_t EventBus::num_subscribers() const {
  absl::MutexLock lock(&mu_);
  return subs_.size();
}

}  // namespace rvd

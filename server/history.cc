#include "server/history.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace rvd {

// ---------------------------------------------------------------------------
// MeasurementRing

MeasurementRing::MeasurementRing(size_t capacity)
    : capacity_(std::max<size_t>(capacity, 1)) {}

void MeasurementRing::Push(rvd::v1::Measurement m) {
  if (slots_.size() < capacity_) {
    // Still filling: slots are appended in order, so next_ == slots_.size().
    slots_.push_back(std::move(m));
  } else {
    slots_[next_] = std::move(m);
  }
  next_ = (next_ + 1) % capacity_;
  size_ = std::min(size_ + 1, capacity_);
  ++total_pushed_;
}

std::vector<rvd::v1::Measurement> MeasurementRing::Newest(size_t limit) const {
  const size_t n = (limit == 0) ? size_ : std::min(limit, size_);
  std::vector<rvd::v1::Measurement> out;
  out.reserve(n);
  // The oldest of the n newest sits n slots before next_ (mod capacity_).
  // While filling, slots_.size() == size_ == next_ and no index wraps.
  size_t i = (next_ + capacity_ - n) % capacity_;
  for (size_t k = 0; k < n; ++k) {
    out.push_back(slots_[i]);
    i = (i + 1) % capacity_;
  }
  return out;
}

const rvd::v1::Measurement* MeasurementRing::Latest() const {
  if (size_ == 0) return nullptr;
  return &slots_[(next_ + capacity_ - 1) % capacity_];
}

// ---------------------------------------------------------------------------
// Subscription

std::optional<rvd::v1::Measurement> Subscription::Next(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return closed_ || !queue_.empty();
  };
  mu_.AwaitWithTimeout(absl::Condition(&ready), timeout);
  if (closed_ || queue_.empty()) return std::nullopt;
  rvd::v1::Measurement m = std::move(queue_.front());
  queue_.pop_front();
  return m;
}

void Subscription::Push(const rvd::v1::Measurement& m) {
  absl::MutexLock lock(&mu_);
  if (closed_) return;
  if (queue_.size() >= max_queued_) {
    queue_.pop_front();
    ++dropped_;
  }
  queue_.push_back(m);
}

void Subscription::Close() {
  absl::MutexLock lock(&mu_);
  closed_ = true;
  queue_.clear();
}

bool Subscription::closed() const {
  absl::MutexLock lock(&mu_);
  return closed_;
}

uint64_t Subscription::dropped() const {
  absl::MutexLock lock(&mu_);
  return dropped_;
}

// ---------------------------------------------------------------------------
// History

History::History(size_t capacity_per_model, size_t max_models)
    : capacity_per_model_(std::max<size_t>(capacity_per_model, 1)),
      max_models_(std::max<size_t>(max_models, 1)) {}

History::~History() { CloseAllSubscriptions(); }

absl::Status History::Add(const rvd::v1::Measurement& m) {
  if (m.model_id().empty()) {
    return absl::InvalidArgumentError("measurement without a model_id");
  }
  absl::MutexLock lock(&mu_);
  auto it = rings_.find(m.model_id());
  if (it == rings_.end()) {
    if (rings_.size() >= max_models_) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "rvd keeps at most ", max_models_, " models (max_models); model '",
          m.model_id(), "' is new"));
    }
    it = rings_.emplace(m.model_id(), MeasurementRing(capacity_per_model_))
             .first;
  }
  it->second.Push(m);
  // Pushed under mu_ so that watchers see the ring's order.
  for (const std::shared_ptr<Subscription>& sub : subs_) {
    if (sub->Matches(m.model_id())) sub->Push(m);
  }
  return absl::OkStatus();
}

std::optional<rvd::v1::Measurement> History::Latest(
    const std::string& model_id) const {
  absl::MutexLock lock(&mu_);
  auto it = rings_.find(model_id);
  if (it == rings_.end()) return std::nullopt;
  const rvd::v1::Measurement* latest = it->second.Latest();
  if (latest == nullptr) return std::nullopt;
  return *latest;
}

absl::StatusOr<std::vector<rvd::v1::Measurement>> History::Get(
    const std::string& model_id, size_t limit) const {
  absl::MutexLock lock(&mu_);
  auto it = rings_.find(model_id);
  if (it == rings_.end()) {
    return absl::NotFoundError(
        absl::StrCat("no measurements of model '", model_id, "'"));
  }
  return it->second.Newest(limit);
}

std::vector<rvd::v1::ModelSummary> History::Models() const {
  absl::MutexLock lock(&mu_);
  std::vector<rvd::v1::ModelSummary> out;
  out.reserve(rings_.size());
  for (const auto& [id, ring] : rings_) {  // std::map: sorted by id
    rvd::v1::ModelSummary& s = out.emplace_back();
    s.set_model_id(id);
    s.set_measurements(ring.size());
    if (const rvd::v1::Measurement* latest = ring.Latest()) {
      *s.mutable_latest() = *latest;
    }
  }
  return out;
}

std::shared_ptr<Subscription> History::Subscribe(const std::string& model_id) {
  auto sub = std::make_shared<Subscription>(model_id);
  absl::MutexLock lock(&mu_);
  if (closed_) {
    sub->Close();
  } else {
    subs_.push_back(sub);
  }
  return sub;
}

void History::Unsubscribe(const std::shared_ptr<Subscription>& sub) {
  if (sub == nullptr) return;
  {
    absl::MutexLock lock(&mu_);
    subs_.erase(std::remove(subs_.begin(), subs_.end(), sub), subs_.end());
  }
  sub->Close();
}

void History::CloseAllSubscriptions() {
  std::vector<std::shared_ptr<Subscription>> subs;
  {
    absl::MutexLock lock(&mu_);
    closed_ = true;
    subs.swap(subs_);
  }
  for (const std::shared_ptr<Subscription>& sub : subs) sub->Close();
}

size_t History::num_subscriptions() const {
  absl::MutexLock lock(&mu_);
  return subs_.size();
}

}  // namespace rvd

#include "server/measurement_index.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"

namespace rvd {

// ---------------------------------------------------------------------------
// MeasurementRing

MeasurementRing::MeasurementRing(size_t capacity)
    : capacity_(std::max<size_t>(capacity, 1)) {}

MeasurementRing::Entry MeasurementRing::Push(Entry e) {
  Entry dropped;
  if (slots_.size() < capacity_) {
    // Still filling: slots are appended in order, so next_ == slots_.size().
    slots_.push_back(std::move(e));
  } else {
    dropped = std::exchange(slots_[next_], std::move(e));
  }
  next_ = (next_ + 1) % capacity_;
  size_ = std::min(size_ + 1, capacity_);
  ++total_pushed_;
  return dropped;
}

std::vector<MeasurementRing::Entry> MeasurementRing::Newest(
    size_t limit) const {
  const size_t n = (limit == 0) ? size_ : std::min(limit, size_);
  std::vector<Entry> out;
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

MeasurementRing::Entry MeasurementRing::Latest() const {
  if (size_ == 0) return nullptr;
  return slots_[(next_ + capacity_ - 1) % capacity_];
}

// ---------------------------------------------------------------------------
// MeasurementIndex

MeasurementIndex::MeasurementIndex(size_t capacity_per_model,
                                   size_t max_models)
    : capacity_per_model_(std::max<size_t>(capacity_per_model, 1)),
      max_models_(std::max<size_t>(max_models, 1)) {}

absl::Status MeasurementIndex::Reserve(const std::string& model_id) {
  if (model_id.empty()) {
    return absl::InvalidArgumentError("measurement without a model_id");
  }
  absl::MutexLock lock(&mu_);
  if (rings_.count(model_id) != 0) return absl::OkStatus();
  if (rings_.size() >= max_models_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("rvd keeps at most ", max_models_,
                     " models (max_models); model '", model_id, "' is new"));
  }
  rings_.emplace(model_id, MeasurementRing(capacity_per_model_));
  return absl::OkStatus();
}

absl::Status MeasurementIndex::Insert(Entry e) {
  if (e == nullptr) return absl::InvalidArgumentError("null entry");
  Entry dropped;  // the entry the ring overwrites, destroyed unlocked
  absl::MutexLock lock(&mu_);
  auto it = rings_.find(e->model_id());
  if (it == rings_.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat("model '", e->model_id(), "' was not reserved"));
  }
  dropped = it->second.Push(std::move(e));
  return absl::OkStatus();
}

bool MeasurementIndex::Remove(const std::string& model_id) {
  std::optional<MeasurementRing> removed;  // destroyed after unlocking
  absl::MutexLock lock(&mu_);
  auto it = rings_.find(model_id);
  if (it == rings_.end()) return false;
  removed.emplace(std::move(it->second));
  rings_.erase(it);
  return true;
}

MeasurementIndex::Entry MeasurementIndex::Latest(
    const std::string& model_id) const {
  absl::MutexLock lock(&mu_);
  auto it = rings_.find(model_id);
  if (it == rings_.end()) return nullptr;
  return it->second.Latest();
}

absl::StatusOr<std::vector<MeasurementIndex::Entry>> MeasurementIndex::Get(
    const std::string& model_id, size_t limit) const {
  absl::MutexLock lock(&mu_);
  auto it = rings_.find(model_id);
  if (it == rings_.end() || it->second.size() == 0) {
    return absl::NotFoundError(
        absl::StrCat("no measurements of model '", model_id, "'"));
  }
  return it->second.Newest(limit);
}

std::vector<MeasurementIndex::ModelState> MeasurementIndex::Models() const {
  std::vector<ModelState> out;
  absl::MutexLock lock(&mu_);
  out.reserve(rings_.size());
  for (const auto& [id, ring] : rings_) {  // std::map: sorted by id
    if (ring.size() == 0) continue;
    out.push_back(ModelState{id, ring.size(), ring.Latest()});
  }
  return out;
}

}  // namespace rvd

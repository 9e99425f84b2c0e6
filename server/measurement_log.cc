#include "server/measurement_log.h"

#include <algorithm>
#include <deque>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace rvd {
namespace {

class MemLog final : public MeasurementLog {
 public:
  explicit MemLog(size_t retained) : retained_(std::max<size_t>(retained, 1)) {}

  absl::StatusOr<Entry> Append(rvd::v1::Measurement m) override {
    // Allocated outside the lock; the sequence number is set under it.
    auto entry = std::make_shared<rvd::v1::Measurement>(std::move(m));
    Entry evicted;  // destroyed after the lock is released
    absl::MutexLock lock(&mu_);
    entry->set_sequence(last_ + 1);
    ++last_;
    if (entries_.size() == retained_) {
      evicted = std::move(entries_.front());
      entries_.pop_front();
      ++first_;
    }
    entries_.push_back(entry);
    return Entry(std::move(entry));
  }

  uint64_t LastSequence() const override {
    absl::MutexLock lock(&mu_);
    return last_;
  }

  absl::StatusOr<std::vector<Entry>> Read(uint64_t after, uint64_t through,
                                          size_t max) const override {
    std::vector<Entry> out;
    absl::MutexLock lock(&mu_);
    if (entries_.empty() || through <= after || max == 0) return out;
    // The entry with sequence s sits at s - first_ (null once deleted).
    const uint64_t from = std::max(after + 1, first_);
    const uint64_t to = std::min(through, last_);
    for (uint64_t s = from; s <= to && out.size() < max; ++s) {
      if (entries_[s - first_] != nullptr) out.push_back(entries_[s - first_]);
    }
    return out;
  }

  absl::StatusOr<uint64_t> DeleteModel(const std::string& model_id) override {
    std::vector<Entry> removed;  // destroyed after the lock is released
    absl::MutexLock lock(&mu_);
    for (Entry& e : entries_) {
      if (e != nullptr && e->model_id() == model_id) {
        removed.push_back(std::move(e));  // leaves a null slot
      }
    }
    return removed.size();
  }

 private:
  const size_t retained_;  // most entries kept
  mutable absl::Mutex mu_;
  std::deque<Entry> entries_ ABSL_GUARDED_BY(mu_);  // oldest first, dense
  uint64_t last_ ABSL_GUARDED_BY(mu_) = 0;          // newest sequence assigned
  uint64_t first_ ABSL_GUARDED_BY(mu_) = 1;  // sequence of entries_.front()
};

}  // namespace

std::unique_ptr<MeasurementLog> NewMemLog(size_t retained) {
  return std::make_unique<MemLog>(retained);
}

}  // namespace rvd

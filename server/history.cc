#include "server/history.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace rvd {

// ---------------------------------------------------------------------------
// Watch

Watch::Watch(const MeasurementLog& log, EventBus& bus,
             std::shared_ptr<BusSubscription> sub, uint64_t after,
             uint64_t through)
    : log_(log),
      bus_(bus),
      sub_(std::move(sub)),
      cursor_(after),
      replay_through_(through) {}

Watch::~Watch() { bus_.Unsubscribe(sub_); }

void Watch::Detach() { bus_.Unsubscribe(sub_); }

absl::StatusOr<std::optional<BusEvent>> Watch::Next() {
  // Replay: (cursor_, replay_through_] from the log, one page at a time.
  while (cursor_ < replay_through_) {
    if (page_next_ == page_.size()) {
      absl::StatusOr<std::vector<MeasurementLog::Entry>> page =
          log_.Read(cursor_, replay_through_, kReplayPage);
      if (!page.ok()) return page.status();
      page_ = *std::move(page);
      page_next_ = 0;
      // Dense sequence numbers: what is missing below the first entry read
      // (or everything, when none is) is no longer retained.
      const uint64_t first =
          page_.empty() ? replay_through_ + 1 : page_.front()->sequence();
      if (first > cursor_ + 1) {
        GapMarker gap{cursor_ + 1, first - 1, 0,
                      GapMarker::Reason::kNotRetained};
        cursor_ = first - 1;
        return std::optional<BusEvent>(gap);
      }
    }
    MeasurementLog::Entry e = page_[page_next_];
    // A number the log skips (a deleted model, the durable log's retention)
    // is reported, as one below the first entry is.
    if (e->sequence() > cursor_ + 1) {
      GapMarker gap{cursor_ + 1, e->sequence() - 1, 0,
                    GapMarker::Reason::kNotRetained};
      cursor_ = e->sequence() - 1;
      return std::optional<BusEvent>(gap);
    }
    ++page_next_;
    cursor_ = e->sequence();
    if (sub_->Matches(e->model_id())) return std::optional<BusEvent>(e);
  }
  page_.clear();
  // Live: everything the bus queued, all above replay_through_.
  std::optional<BusEvent> e = sub_->Pop();
  if (e.has_value()) {
    if (const auto* m = std::get_if<MeasurementLog::Entry>(&*e)) {
      cursor_ = (*m)->sequence();
    } else {
      cursor_ = std::get<GapMarker>(*e).last_sequence;
    }
  }
  return e;
}

// ---------------------------------------------------------------------------
// History

History::History(std::unique_ptr<MeasurementLog> log, const Options& options)
    : log_(std::move(log)),
      index_(options.capacity_per_model, options.max_models),
      bus_(EventBus::Options{options.watch_queue, options.max_watchers}),
      on_append_(options.on_append) {}

History::~History() { CloseWatches(); }

absl::StatusOr<MeasurementLog::Entry> History::Add(rvd::v1::Measurement m) {
  absl::MutexLock lock(&append_mu_);
  if (absl::Status s = index_.Reserve(m.model_id()); !s.ok()) return s;
  absl::StatusOr<MeasurementLog::Entry> e = log_->Append(std::move(m));
  if (!e.ok()) return e.status();
  // Reserved above under append_mu_, so Insert cannot fail.
  if (absl::Status s = index_.Insert(*e); !s.ok()) return s;
  bus_.Publish(*e);
  if (on_append_) on_append_(*e);
  return e;
}

size_t History::Restore(const std::vector<MeasurementLog::Entry>& entries) {
  absl::MutexLock lock(&append_mu_);
  size_t left_out = 0;
  for (const MeasurementLog::Entry& e : entries) {
    if (!index_.Reserve(e->model_id()).ok() || !index_.Insert(e).ok()) {
      ++left_out;
    }
  }
  return left_out;
}

absl::StatusOr<uint64_t> History::DeleteModel(const std::string& model_id) {
  absl::MutexLock lock(&append_mu_);
  absl::StatusOr<uint64_t> n = log_->DeleteModel(model_id);
  if (!n.ok()) return n.status();
  const bool indexed = index_.Remove(model_id);
  if (*n == 0 && !indexed) {
    return absl::NotFoundError(
        absl::StrCat("no measurements of model '", model_id, "'"));
  }
  return n;
}

absl::StatusOr<std::unique_ptr<Watch>> History::Subscribe(
    const std::string& model_id, std::optional<uint64_t> after_sequence,
    std::function<void()> notify) {
  // Under append_mu_, no Add is between its log append and its publish:
  // every entry up to `last` is in the log, every later one reaches `sub`.
  absl::MutexLock lock(&append_mu_);
  const uint64_t last = log_->LastSequence();
  if (after_sequence.has_value() && *after_sequence > last) {
    return absl::OutOfRangeError(absl::StrCat(
        "after_sequence ", *after_sequence, " is above rvd's newest sequence "
        "number ", last, " (a cursor from an earlier run of rvd without "
        "data_dir, whose in-memory log started again at 1, or from another "
        "rvd?)"));
  }
  absl::StatusOr<std::shared_ptr<BusSubscription>> sub =
      bus_.Subscribe(model_id, std::move(notify));
  if (!sub.ok()) return sub.status();
  const uint64_t after = after_sequence.value_or(last);
  return std::unique_ptr<Watch>(
      new Watch(*log_, bus_, *std::move(sub), after, last));
}

void History::CloseWatches() { bus_.Close(); }

}  // namespace rvd

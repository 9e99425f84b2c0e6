#include "server/history_query.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

namespace rvd {
namespace {

absl::StatusOr<absl::Time> ToTime(const google::protobuf::Timestamp& t,
                                  const char* field) {
  if (t.nanos() < 0 || t.nanos() > 999999999) {
    return absl::InvalidArgumentError(
        absl::StrCat("GetHistoryRequest.", field, ": nanos out of range"));
  }
  return absl::FromUnixSeconds(t.seconds()) + absl::Nanoseconds(t.nanos());
}

absl::Time TimeOf(const rvd::v1::Measurement& m) {
  return absl::FromUnixSeconds(m.timestamp().seconds()) +
         absl::Nanoseconds(m.timestamp().nanos());
}

bool Matches(const rvd::v1::Measurement& m, const StoreQuery& q) {
  if (q.from_step && m.step() < *q.from_step) return false;
  if (q.to_step && m.step() > *q.to_step) return false;
  if (q.since && TimeOf(m) < *q.since) return false;
  if (q.until && TimeOf(m) >= *q.until) return false;
  if (q.after_sequence && m.sequence() <= *q.after_sequence) return false;
  return true;
}

}  // namespace

bool IsRangeRequest(const rvd::v1::GetHistoryRequest& r) {
  return r.has_from_step() || r.has_to_step() || r.has_since() ||
         r.has_until() || r.has_after_sequence();
}

absl::StatusOr<StoreQuery> ToStoreQuery(const rvd::v1::GetHistoryRequest& r) {
  StoreQuery q;
  if (r.has_from_step()) q.from_step = r.from_step();
  if (r.has_to_step()) q.to_step = r.to_step();
  if (r.has_since()) {
    absl::StatusOr<absl::Time> t = ToTime(r.since(), "since");
    if (!t.ok()) return t.status();
    q.since = *t;
  }
  if (r.has_until()) {
    absl::StatusOr<absl::Time> t = ToTime(r.until(), "until");
    if (!t.ok()) return t.status();
    q.until = *t;
  }
  if (r.has_after_sequence()) q.after_sequence = r.after_sequence();
  q.limit = (r.limit() == 0 || r.limit() > kMaxHistoryPage) ? kMaxHistoryPage
                                                            : r.limit();
  return q;
}

absl::Status SelectHistory(const MeasurementIndex& index,
                           const SqliteStore* store,
                           const rvd::v1::GetHistoryRequest& r,
                           rvd::v1::GetHistoryResponse* out) {
  absl::StatusOr<StoreQuery> q = ToStoreQuery(r);
  if (!q.ok()) return q.status();
  std::vector<MeasurementLog::Entry> selected;
  bool more = false;
  if (store != nullptr) {
    absl::StatusOr<std::vector<MeasurementLog::Entry>> rows =
        store->Query(r.model_id(), *q, &more);
    if (!rows.ok()) return rows.status();
    selected = *std::move(rows);
    if (selected.empty() && index.Latest(r.model_id()) == nullptr) {
      return absl::NotFoundError(
          absl::StrCat("no measurements of model '", r.model_id(), "'"));
    }
  } else {
    absl::StatusOr<std::vector<MeasurementLog::Entry>> ring =
        index.Get(r.model_id(), 0);
    if (!ring.ok()) return ring.status();
    for (const MeasurementLog::Entry& e : *ring) {
      if (Matches(*e, *q)) selected.push_back(e);
    }
    if (selected.size() > q->limit) {
      more = true;
      if (q->after_sequence) {
        selected.resize(q->limit);  // the oldest after the cursor
      } else {
        selected.erase(selected.begin(), selected.end() - q->limit);
      }
    }
  }
  for (const MeasurementLog::Entry& e : selected) {
    *out->add_measurements() = *e;
  }
  out->set_more(more);
  return absl::OkStatus();
}

}  // namespace rvd

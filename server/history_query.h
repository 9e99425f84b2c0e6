// GetHistory's range requests (from_step, to_step, since, until,
// after_sequence): answered from the durable store when rvd has one (all it
// retains on disk), else from the model's in-memory ring, with the same
// selection either way. A request without range fields does not come here:
// it is answered from the ring as before the ranges existed.
#ifndef RVD_SERVER_HISTORY_QUERY_H_
#define RVD_SERVER_HISTORY_QUERY_H_

#include <cstddef>

#include "absl/status/status.h"
#include "rvd/v1/rvd.pb.h"
#include "server/measurement_index.h"
#include "server/sqlite_store.h"

namespace rvd {

// Most measurements one range reply holds (GetHistoryResponse.more says
// whether more match; a client pages on with after_sequence).
inline constexpr size_t kMaxHistoryPage = 1000;

// True when `r` sets any range field.
bool IsRangeRequest(const rvd::v1::GetHistoryRequest& r);

// The request as a store selection; INVALID_ARGUMENT for a malformed
// timestamp.
absl::StatusOr<StoreQuery> ToStoreQuery(const rvd::v1::GetHistoryRequest& r);

// Fills `out` for a range request. `store` may be null (in memory only).
// NOT_FOUND when the model has no measurements at all.
absl::Status SelectHistory(const MeasurementIndex& index,
                           const SqliteStore* store,
                           const rvd::v1::GetHistoryRequest& r,
                           rvd::v1::GetHistoryResponse* out);

}  // namespace rvd

#endif  // RVD_SERVER_HISTORY_QUERY_H_

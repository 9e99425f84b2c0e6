// /metrics for the durable history: a prometheus::Collectable that reads the
// store's counters at scrape time, registered beside Metrics when data_dir is
// set (without a store these families do not exist).
//
//   rvd_store_rows                     gauge, measurements on disk now
//   rvd_store_damaged                  gauge 0/1, the file found at start
//                                      was damaged and replaced
//   rvd_store_lost_measurements        gauge, rows of that file that could
//                                      not be read (0 when not damaged)
//   rvd_store_recovered_measurements   gauge, rows copied from it
//   rvd_store_append_errors_total{reason}  counter, measurements refused
//                                      because the store failed (disk_full,
//                                      io)
//   rvd_store_expired_total            counter, removed by retention
//   rvd_store_deleted_total            counter, removed by DeleteModelHistory
//   rvd_store_syncs_total              counter, interval fsyncs
#ifndef RVD_SERVER_STORE_METRICS_H_
#define RVD_SERVER_STORE_METRICS_H_

#include <vector>

#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"
#include "server/sqlite_store.h"

namespace rvd {

class StoreMetrics final : public prometheus::Collectable {
 public:
  // `store` must outlive this and every scrape of it.
  explicit StoreMetrics(const SqliteStore* store) : store_(store) {}
  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  const SqliteStore* store_;
};

}  // namespace rvd

#endif  // RVD_SERVER_STORE_METRICS_H_

#include "server/store_metrics.h"

#include <string>
#include <utility>

#include "server/metric_family.h"

namespace rvd {

std::vector<prometheus::MetricFamily> StoreMetrics::Collect() const {
  using prometheus::MetricType;
  const StoreStats s = store_->Stats();
  const StoreOpenReport& r = store_->open_report();
  std::vector<prometheus::MetricFamily> out;
  auto add = [&](const char* name, const char* help, MetricType type,
                 double v) { out.push_back(SingleSample(name, help, type, v)); };
  add("rvd_store_rows", "Measurements in the durable store now.",
      MetricType::Gauge, static_cast<double>(s.rows));
  add("rvd_store_damaged",
      "1 when the store file found at start was damaged and replaced.",
      MetricType::Gauge, r.damaged ? 1 : 0);
  add("rvd_store_lost_measurements",
      "Rows of the damaged store file found at start that could not be "
      "read (an upper bound when the file could not be counted).",
      MetricType::Gauge, static_cast<double>(r.lost));
  add("rvd_store_recovered_measurements",
      "Rows copied from the damaged store file found at start.",
      MetricType::Gauge, static_cast<double>(r.recovered));
  out.push_back(NewFamily("rvd_store_append_errors_total",
                          "Measurements refused because the store could not "
                          "commit them, by reason.",
                          MetricType::Counter));
  AddSample(out.back(), {{"reason", "disk_full"}}, static_cast<double>(s.disk_full_errors));
  AddSample(out.back(), {{"reason", "io"}},
            static_cast<double>(s.append_errors - s.disk_full_errors));
  add("rvd_store_expired_total",
      "Measurements removed from the store by retention (count or age).",
      MetricType::Counter, static_cast<double>(s.expired_total));
  add("rvd_store_deleted_total",
      "Measurements removed from the store by DeleteModelHistory.",
      MetricType::Counter, static_cast<double>(s.deleted_total));
  add("rvd_store_syncs_total",
      "fsyncs of the store's WAL by the store_sync interval.",
      MetricType::Counter, static_cast<double>(s.syncs_total));
  return out;
}

}  // namespace rvd

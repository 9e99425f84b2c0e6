#include "server/durable_history.h"

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "spdlog/spdlog.h"

namespace rvd {

absl::StatusOr<MeasurementLogChoice> OpenMeasurementLog(
    const Config& config, size_t memory_retained) {
  MeasurementLogChoice out;
  if (config.data_dir.empty()) {
    spdlog::info(
        "history in memory only (data_dir is empty): measurements are lost "
        "at restart");
    out.log = NewMemLog(memory_retained);
    return out;
  }
  absl::StatusOr<StoreOptions> options = ParseStoreSync(config.store_sync);
  if (!options.ok()) return options.status();
  options->retention_count = config.retention_per_model;
  options->retention_age = absl::Seconds(config.retention_max_age_seconds);
  options->memory_window = memory_retained;
  const absl::Time start = absl::Now();
  absl::StatusOr<std::unique_ptr<SqliteStore>> store =
      SqliteStore::Open(config.data_dir, *options);
  if (!store.ok()) return store.status();
  const StoreOpenReport& r = (*store)->open_report();
  if (r.damaged) {
    spdlog::warn(
        "store {} was damaged ({}): moved to {}; {} measurements recovered, "
        "{}{} lost (rvd_store_lost_measurements); serving with what was "
        "recovered",
        r.path, r.damage, r.moved_to, r.recovered,
        r.lost_is_upper_bound ? "at most " : "", r.lost);
  }
  spdlog::info(
      "store {}: {} measurements, sequence numbers continue after {}, {} "
      "removed by retention at start, store_sync {} (opened and checked in "
      "{:.3f} s)",
      r.path, r.rows, r.last_sequence, r.expired, config.store_sync,
      absl::ToDoubleSeconds(absl::Now() - start));
  out.store = store->get();
  out.log = *std::move(store);
  return out;
}

absl::Status RestoreHistory(const SqliteStore& store, size_t per_model,
                            History& history, Metrics& metrics) {
  absl::StatusOr<std::vector<MeasurementLog::Entry>> entries =
      store.LoadRecent(per_model);
  if (!entries.ok()) return entries.status();
  const size_t left_out = history.Restore(*entries);
  // Each model's newest, in sequence order: the series budget admits them
  // as their measurements were admitted when they arrived.
  std::map<std::string, MeasurementLog::Entry> newest;
  for (const MeasurementLog::Entry& e : *entries) newest[e->model_id()] = e;
  std::vector<MeasurementLog::Entry> order;
  for (auto& [id, e] : newest) order.push_back(e);
  std::sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
    return a->sequence() < b->sequence();
  });
  for (const MeasurementLog::Entry& e : order) metrics.AdmitSeries(*e);
  spdlog::info("history rebuilt from the store: {} measurements of {} models{}",
               entries->size() - left_out, newest.size(),
               left_out == 0 ? std::string()
                             : " (" + std::to_string(left_out) +
                                   " left out: beyond max_models)");
  return absl::OkStatus();
}

}  // namespace rvd

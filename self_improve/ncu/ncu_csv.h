// Nsight Compute's CSV output, parsed by column name (self_improve/ncu/):
// `ncu --csv` with the details page (the default: one row per launch and
// metric, columns "ID", "Kernel Name", ..., "Section Name", "Metric Name",
// "Metric Unit", "Metric Value", then the rule columns of newer versions)
// or with `--page raw` (one row per launch, one column per metric, the
// units in the row under the header). Columns are found by their names in
// the header, in any order, so a version that adds or moves columns reads
// the same; profiler lines (==PROF==, ==WARNING==, ==ERROR==) and the
// application's own output around the table are set aside.
//
// Values are read in the C locale ncu prints when LC_ALL=C (the runner sets
// it): '.' the decimal point, ',' grouping thousands ("1,215,000,000.00");
// "n/a" and other text leave the number absent.
//
// Thread-safe: pure functions.
#ifndef RVD_SELF_IMPROVE_NCU_NCU_CSV_H_
#define RVD_SELF_IMPROVE_NCU_NCU_CSV_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "self_improve/profile.h"

namespace rvd::tune {

struct NcuMetric {
  std::string section;  // "GPU Speed Of Light Throughput"; "" on the raw page
  std::string name;     // as printed: a metric name, or a section's label ("DRAM Throughput")
  std::string unit;     // as printed: "%", "nsecond", "Kbyte", "byte/second", ...
  std::string text;     // the value as printed
  std::optional<double> value;  // the number in `unit`, when it is one
  // The number in the unit's base (seconds, bytes, bytes/second, hertz;
  // other units as they are): ncu's prefixes n u m K M G T scale by 1000,
  // on long unit names ("usecond", "Kbyte") and short ones ("us", "KB").
  std::optional<double> BaseValue() const;
};

// One profiled kernel launch.
struct NcuLaunch {
  int64_t id = -1;          // ncu's launch id ("ID")
  std::string kernel_name;  // "Kernel Name" (demangled unless asked otherwise)
  std::string block_size;   // "(256, 1, 1)"
  std::string grid_size;
  std::string device;
  std::string cc;  // compute capability, "9.0"
  std::string stream;
  std::string process_name;
  std::vector<NcuMetric> metrics;  // in the order printed
  // The first metric with this name (a metric name, or a label), or null.
  const NcuMetric* Find(absl::string_view name) const;
};

struct NcuReport {
  std::vector<NcuLaunch> launches;    // in the order of their ids' first rows
  std::vector<std::string> errors;    // the ==ERROR== lines, without the prefix
  std::vector<std::string> warnings;  // the ==WARNING== lines
  int skipped_lines = 0;              // lines neither profiler messages nor table rows
};

// Errors: INVALID_ARGUMENT when no header names "ID" and "Kernel Name" (the
// message quotes ncu's ==ERROR== lines when there are any), or when a
// details header lacks "Metric Name" or "Metric Value".
absl::StatusOr<NcuReport> ParseNcuCsv(absl::string_view text);

// The metrics the tuning worker asks ncu for (--metrics): every name
// NcuMetrics (profile.h) is filled from.
const std::vector<std::string>& NcuMetricNames();

// The worker's metrics of one launch, by metric name, or on the details
// page by the section labels that show the same metric ("Compute (SM)
// Throughput", "DRAM Throughput", "L2 Hit Rate", "L1/TEX Hit Rate",
// "Achieved Occupancy", "Registers Per Thread", "SM Active Cycles" over
// "Elapsed Cycles"). memory_stall_pct: long-scoreboard stall cycles per
// issued instruction over all warp cycles per issued instruction.
NcuMetrics ToNcuMetrics(const NcuLaunch& launch);

// The median of each field over the launches of the function
// `kernel_name` (ncu prints an extern "C" name bare, a C++ kernel's with
// its namespaces, template arguments and parameters: "FusedKernel" names
// "void rvd::cuda::FusedKernel<8>(const float *)"), or NOT_FOUND naming
// the kernels the report has.
absl::StatusOr<NcuMetrics> SummarizeLaunches(const NcuReport& report,
                                             absl::string_view kernel_name);

}  // namespace rvd::tune

#endif  // RVD_SELF_IMPROVE_NCU_NCU_CSV_H_

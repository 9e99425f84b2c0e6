#include "self_improve/ncu/ncu_csv.h"

#include <algorithm>
#include <map>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace rvd::tune {
namespace {

// One CSV line's fields (RFC 4180 quoting: "a ""b""" is a "b"), or nothing
// when a quote is left open (a line that is not CSV).
std::optional<std::vector<std::string>> SplitCsvLine(absl::string_view line) {
  std::vector<std::string> fields;
  std::string field;
  bool quoted = false, in_quotes = false;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (in_quotes) {
      if (c == '"' && i + 1 < line.size() && line[i + 1] == '"') {
        field.push_back('"');
        ++i;
      } else if (c == '"') {
        in_quotes = false;
      } else {
        field.push_back(c);
      }
    } else if (c == '"' && field.empty() && !quoted) {
      in_quotes = quoted = true;
    } else if (c == ',') {
      fields.push_back(std::move(field));
      field.clear();
      quoted = false;
    } else {
      field.push_back(c);
    }
  }
  if (in_quotes) return std::nullopt;
  fields.push_back(std::move(field));
  return fields;
}

// "1,215,000,000.50" -> 1215000000.5; "n/a", "" -> nothing.
std::optional<double> ParseNumber(absl::string_view text) {
  std::string digits;
  for (char c : absl::StripAsciiWhitespace(text)) {
    if (c != ',') digits.push_back(c);
  }
  double v = 0;
  if (digits.empty() || !absl::SimpleAtod(digits, &v)) return std::nullopt;
  return v;
}

// The columns that describe a launch, not a metric (raw page: every other
// column is a metric).
bool IsLaunchColumn(absl::string_view name) {
  static constexpr absl::string_view kColumns[] = {"ID",
                                                   "Process ID",
                                                   "Process Name",
                                                   "Host Name",
                                                   "Kernel Name",
                                                   "Kernel Time",
                                                   "Context",
                                                   "Stream",
                                                   "Block Size",
                                                   "Grid Size",
                                                   "Device",
                                                   "CC",
                                                   "Section Name",
                                                   "Metric Name",
                                                   "Metric Unit",
                                                   "Metric Value",
                                                   "Rule Name",
                                                   "Rule Type",
                                                   "Rule Description",
                                                   "Estimated Speedup Type",
                                                   "Estimated Speedup"};
  return std::find(std::begin(kColumns), std::end(kColumns), name) != std::end(kColumns);
}

// Column positions by name (the first of a repeated name).
class Columns {
 public:
  explicit Columns(const std::vector<std::string>& header) {
    for (size_t i = 0; i < header.size(); ++i) index_.try_emplace(header[i], i);
  }
  std::optional<size_t> Find(absl::string_view name) const {
    auto it = index_.find(name);
    if (it == index_.end()) return std::nullopt;
    return it->second;
  }
  // The field of `row` under `name`, "" when the column is absent.
  std::string Get(const std::vector<std::string>& row, absl::string_view name) const {
    const std::optional<size_t> i = Find(name);
    return i && *i < row.size() ? row[*i] : "";
  }

 private:
  absl::flat_hash_map<std::string, size_t> index_;
};

bool IsHeader(const std::vector<std::string>& fields) {
  const Columns c(fields);
  return c.Find("ID") && c.Find("Kernel Name");
}

NcuLaunch LaunchFrom(const Columns& c, const std::vector<std::string>& row, int64_t id) {
  NcuLaunch l;
  l.id = id;
  l.kernel_name = c.Get(row, "Kernel Name");
  l.block_size = c.Get(row, "Block Size");
  l.grid_size = c.Get(row, "Grid Size");
  l.device = c.Get(row, "Device");
  l.cc = c.Get(row, "CC");
  l.stream = c.Get(row, "Stream");
  l.process_name = c.Get(row, "Process Name");
  return l;
}

NcuMetric MakeMetric(std::string section, std::string name, std::string unit, std::string text) {
  NcuMetric m;
  m.section = std::move(section);
  m.name = std::move(name);
  m.unit = std::move(unit);
  m.value = ParseNumber(text);
  m.text = std::move(text);
  return m;
}

// The launch's id: the "ID" field as a number (ids are small integers; a
// field that is not one keys the launch by its text's order of appearance).
int64_t LaunchId(const std::string& text, absl::flat_hash_map<std::string, int64_t>* ids) {
  int64_t id = 0;
  if (absl::SimpleAtoi(text, &id)) return id;
  auto [it, fresh] = ids->try_emplace(text, -1 - static_cast<int64_t>(ids->size()));
  return it->second;
}

// The median of the values present (nothing when none is).
std::optional<double> Median(std::vector<double> v) {
  if (v.empty()) return std::nullopt;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// A metric of `launch` by its name, else by any of its details-page labels.
std::optional<double> Lookup(const NcuLaunch& launch, absl::string_view name,
                             std::initializer_list<absl::string_view> labels = {}) {
  if (const NcuMetric* m = launch.Find(name); m != nullptr && m->value) return m->BaseValue();
  for (absl::string_view label : labels) {
    if (const NcuMetric* m = launch.Find(label); m != nullptr && m->value) return m->BaseValue();
  }
  return std::nullopt;
}

// `printed` (ncu's demangled name: "rvd_tune_candidate", "void
// ns::K<256>(float *)") names the function `name`: bare or after a
// namespace qualification, followed by nothing, its template arguments or
// its parameters.
bool KernelNameIs(absl::string_view printed, absl::string_view name) {
  absl::ConsumePrefix(&printed, "void ");
  const size_t at = printed.find(name);
  if (at == absl::string_view::npos) return false;
  const absl::string_view qualifier = printed.substr(0, at);
  if (!qualifier.empty() && (!absl::EndsWith(qualifier, "::") ||
                             qualifier.find_first_of("(< ") != absl::string_view::npos)) {
    return false;
  }
  const absl::string_view rest = printed.substr(at + name.size());
  return rest.empty() || rest[0] == '(' || rest[0] == '<';
}

}  // namespace

std::optional<double> NcuMetric::BaseValue() const {
  if (!value) return std::nullopt;
  // "Kbyte/second" scales by its first part; "cycle/nsecond" by 1/1e-9.
  const std::vector<absl::string_view> parts = absl::StrSplit(unit, '/');
  static constexpr std::pair<char, double> kPrefixes[] = {
      {'n', 1e-9}, {'u', 1e-6}, {'m', 1e-3}, {'K', 1e3}, {'M', 1e6}, {'G', 1e9}, {'T', 1e12}};
  // Long names (older ncu: "nsecond", "Kbyte/second") and short ones
  // (newer: "ns", "KB/s", "GHz") alike.
  static constexpr absl::string_view kBases[] = {"second", "s",      "byte",   "B",    "hz",
                                                 "Hz",     "cycle",  "inst",   "warp", "thread",
                                                 "block",  "sector", "request"};
  auto scale = [&](absl::string_view u) {
    if (u.size() < 2) return 1.0;
    const absl::string_view base = u.substr(1);
    if (std::find(std::begin(kBases), std::end(kBases), base) == std::end(kBases)) return 1.0;
    for (const auto& [p, f] : kPrefixes) {
      if (u[0] == p) return f;
    }
    return 1.0;
  };
  double v = *value;
  if (!parts.empty()) v *= scale(parts[0]);
  if (parts.size() == 2) v /= scale(parts[1]);
  return v;
}

const NcuMetric* NcuLaunch::Find(absl::string_view name) const {
  for (const NcuMetric& m : metrics) {
    if (m.name == name) return &m;
  }
  return nullptr;
}

absl::StatusOr<NcuReport> ParseNcuCsv(absl::string_view text) {
  NcuReport report;
  std::optional<Columns> columns;
  size_t width = 0;
  bool details = false;
  std::vector<std::string> header;
  std::vector<std::string> units;   // raw page: the row under the header
  std::map<int64_t, size_t> by_id;  // launch id -> index in report.launches
  absl::flat_hash_map<std::string, int64_t> text_ids;

  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    absl::ConsumeSuffix(&line, "\r");
    const absl::string_view stripped = absl::StripAsciiWhitespace(line);
    if (stripped.empty()) continue;
    if (absl::ConsumePrefix(&line, "==ERROR==")) {
      report.errors.emplace_back(absl::StripAsciiWhitespace(line));
      continue;
    }
    if (absl::ConsumePrefix(&line, "==WARNING==")) {
      report.warnings.emplace_back(absl::StripAsciiWhitespace(line));
      continue;
    }
    if (absl::StartsWith(stripped, "==")) continue;  // ==PROF== and the like
    std::optional<std::vector<std::string>> fields = SplitCsvLine(line);
    if (!columns) {
      if (fields && IsHeader(*fields)) {
        header = *fields;
        columns.emplace(header);
        width = header.size();
        details =
            columns->Find("Metric Name").has_value() || columns->Find("Metric Value").has_value();
        if (details && !(columns->Find("Metric Name") && columns->Find("Metric Value"))) {
          return absl::InvalidArgumentError(
              "ncu csv: the details header needs both \"Metric Name\" and \"Metric Value\"");
        }
      } else {
        ++report.skipped_lines;
      }
      continue;
    }
    if (!fields || fields->size() != width) {
      ++report.skipped_lines;  // the application's output between the rows
      continue;
    }
    const std::vector<std::string>& row = *fields;
    const std::string id_text = columns->Get(row, "ID");
    if (!details && id_text.empty() && units.empty() && report.launches.empty()) {
      units = row;  // the raw page's units
      continue;
    }
    const int64_t id = LaunchId(id_text, &text_ids);
    auto [it, fresh] = by_id.try_emplace(id, report.launches.size());
    if (fresh) report.launches.push_back(LaunchFrom(*columns, row, id));
    NcuLaunch& launch = report.launches[it->second];
    if (details) {
      std::string name = columns->Get(row, "Metric Name");
      if (name.empty()) continue;  // a rule's row
      launch.metrics.push_back(MakeMetric(columns->Get(row, "Section Name"), std::move(name),
                                          columns->Get(row, "Metric Unit"),
                                          columns->Get(row, "Metric Value")));
    } else {
      for (size_t i = 0; i < width; ++i) {
        if (IsLaunchColumn(header[i])) continue;
        launch.metrics.push_back(
            MakeMetric("", header[i], i < units.size() ? units[i] : "", row[i]));
      }
    }
  }
  if (!columns) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ncu csv: no header with \"ID\" and \"Kernel Name\"",
        report.errors.empty() ? "" : absl::StrCat(": ncu: ", absl::StrJoin(report.errors, "; "))));
  }
  return report;
}

const std::vector<std::string>& NcuMetricNames() {
  static const std::vector<std::string> kNames = {
      "gpu__time_duration.sum",
      "sm__throughput.avg.pct_of_peak_sustained_elapsed",
      "sm__cycles_active.avg",
      "sm__cycles_elapsed.avg",
      "dram__throughput.avg.pct_of_peak_sustained_elapsed",
      "lts__t_sector_hit_rate.pct",
      "l1tex__t_sector_hit_rate.pct",
      "sm__warps_active.avg.pct_of_peak_sustained_active",
      "smsp__average_warp_latency_per_inst_issued.ratio",
      "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio",
      "launch__registers_per_thread",
  };
  return kNames;
}

NcuMetrics ToNcuMetrics(const NcuLaunch& l) {
  NcuMetrics m;
  m.sm_throughput_pct =
      Lookup(l, "sm__throughput.avg.pct_of_peak_sustained_elapsed", {"Compute (SM) Throughput"});
  m.dram_throughput_pct =
      Lookup(l, "dram__throughput.avg.pct_of_peak_sustained_elapsed", {"DRAM Throughput"});
  m.l2_hit_rate_pct = Lookup(l, "lts__t_sector_hit_rate.pct", {"L2 Hit Rate"});
  m.l1_hit_rate_pct = Lookup(l, "l1tex__t_sector_hit_rate.pct", {"L1/TEX Hit Rate"});
  m.achieved_occupancy_pct =
      Lookup(l, "sm__warps_active.avg.pct_of_peak_sustained_active", {"Achieved Occupancy"});
  m.registers_per_thread = Lookup(l, "launch__registers_per_thread", {"Registers Per Thread"});
  const std::optional<double> active = Lookup(l, "sm__cycles_active.avg", {"SM Active Cycles"});
  const std::optional<double> elapsed = Lookup(l, "sm__cycles_elapsed.avg", {"Elapsed Cycles"});
  if (active && elapsed && *elapsed > 0) m.sm_active_cycles_pct = 100.0 * *active / *elapsed;
  const std::optional<double> stall =
      Lookup(l, "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio");
  const std::optional<double> cycles = Lookup(l, "smsp__average_warp_latency_per_inst_issued.ratio",
                                              {"Warp Cycles Per Issued Instruction"});
  if (stall && cycles && *cycles > 0) m.memory_stall_pct = 100.0 * *stall / *cycles;
  return m;
}

absl::StatusOr<NcuMetrics> SummarizeLaunches(const NcuReport& report,
                                             absl::string_view kernel_name) {
  std::vector<NcuMetrics> each;
  std::vector<std::string> names;
  for (const NcuLaunch& l : report.launches) {
    if (KernelNameIs(l.kernel_name, kernel_name)) {
      each.push_back(ToNcuMetrics(l));
    } else if (std::find(names.begin(), names.end(), l.kernel_name) == names.end()) {
      names.push_back(l.kernel_name);
    }
  }
  if (each.empty()) {
    return absl::NotFoundError(absl::StrCat("ncu: no launch of ", kernel_name, " in the report",
                                            names.empty() ? "" : " (it has ",
                                            absl::StrJoin(names, ", "), names.empty() ? "" : ")"));
  }
  NcuMetrics out;
  auto median = [&](std::optional<double> NcuMetrics::*field) {
    std::vector<double> v;
    for (const NcuMetrics& m : each) {
      if (m.*field) v.push_back(*(m.*field));
    }
    out.*field = Median(std::move(v));
  };
  for (auto field : {&NcuMetrics::sm_throughput_pct, &NcuMetrics::sm_active_cycles_pct,
                     &NcuMetrics::dram_throughput_pct, &NcuMetrics::l2_hit_rate_pct,
                     &NcuMetrics::l1_hit_rate_pct, &NcuMetrics::achieved_occupancy_pct,
                     &NcuMetrics::memory_stall_pct, &NcuMetrics::registers_per_thread}) {
    median(field);
  }
  return out;
}

}  // namespace rvd::tune

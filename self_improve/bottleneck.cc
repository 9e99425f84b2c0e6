// The bottleneck classifier: seed 000's table as thresholds on a profile.
#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "self_improve/profile.h"

namespace rvd::tune {
namespace {

// Seed 000's thresholds, in percent.
constexpr double kComputeBusyPct = 90;   // SM active cycles / throughput
constexpr double kRoofPct = 80;          // achieved rate against the measured ceiling
constexpr double kDramBusyPct = 80;      // DRAM throughput
constexpr double kMissRatePct = 50;      // L1 or L2 misses
constexpr double kMemoryStallPct = 50;   // warp cycles stalled on memory
constexpr double kOccupancyPct = 50;     // achieved occupancy
constexpr double kIdlePct = 50;          // both rates under this: latency

std::string Pct(double v) { return absl::StrFormat("%.1f%%", v); }

}  // namespace

const char* BottleneckName(Bottleneck b) {
  switch (b) {
    case Bottleneck::kUnknown: return "unknown";
    case Bottleneck::kCompute: return "compute";
    case Bottleneck::kMemoryBandwidth: return "memory_bandwidth";
    case Bottleneck::kMemoryLatency: return "memory_latency";
    case Bottleneck::kOccupancy: return "occupancy";
    case Bottleneck::kMixed: return "mixed";
  }
  return "unknown";
}

BottleneckReport ClassifyBottleneck(const KernelProfile& p) {
  BottleneckReport r;
  if (p.seconds <= 0) {
    r.signals.push_back("no timing");
    return r;
  }
  const NcuMetrics& n = p.ncu;
  // Percent of the measured ceilings (negative: no ceiling known).
  const double bw_pct = p.peak_bytes_per_second > 0
                            ? 100 * p.BytesPerSecond() / p.peak_bytes_per_second
                            : -1;
  const double flop_pct = p.peak_flops_per_second > 0
                              ? 100 * p.FlopsPerSecond() / p.peak_flops_per_second
                              : -1;
  // The ridge: flops per byte where the two roofs meet.
  const bool below_ridge = p.peak_bytes_per_second > 0 && p.peak_flops_per_second > 0 &&
                           p.bytes > 0 &&
                           p.flops / p.bytes <
                               p.peak_flops_per_second / p.peak_bytes_per_second;

  const bool any_ncu = n.sm_throughput_pct || n.sm_active_cycles_pct ||
                       n.dram_throughput_pct || n.l2_hit_rate_pct || n.l1_hit_rate_pct ||
                       n.achieved_occupancy_pct || n.memory_stall_pct;
  bool compute = false, bandwidth = false, latency = false, occupancy = false;

  if (n.sm_active_cycles_pct && *n.sm_active_cycles_pct > kComputeBusyPct) {
    compute = true;
    r.signals.push_back(absl::StrCat("SM active cycles ", Pct(*n.sm_active_cycles_pct),
                                     " (> ", Pct(kComputeBusyPct), ")"));
  }
  if (n.sm_throughput_pct && *n.sm_throughput_pct > kComputeBusyPct) {
    compute = true;
    r.signals.push_back(absl::StrCat("SM throughput ", Pct(*n.sm_throughput_pct),
                                     " of peak (> ", Pct(kComputeBusyPct), ")"));
  }
  if (flop_pct >= kRoofPct) {
    compute = true;
    r.signals.push_back(absl::StrCat("flops at ", Pct(flop_pct),
                                     " of the measured roof (>= ", Pct(kRoofPct), ")"));
  }

  const double dram = n.dram_throughput_pct ? *n.dram_throughput_pct : bw_pct;
  if (dram > kDramBusyPct || bw_pct >= kRoofPct) {
    // Seed 000: DRAM busy with the intensity below the ridge. Above the
    // ridge a busy DRAM is read as a side effect of compute (not a class).
    if (below_ridge || p.peak_flops_per_second <= 0) {
      bandwidth = true;
      r.signals.push_back(absl::StrCat("DRAM at ", Pct(std::max(dram, bw_pct)),
                                       " of peak (> ", Pct(kDramBusyPct),
                                       "), intensity below the ridge"));
    }
  }

  const double l1_miss = n.l1_hit_rate_pct ? 100 - *n.l1_hit_rate_pct : -1;
  const double l2_miss = n.l2_hit_rate_pct ? 100 - *n.l2_hit_rate_pct : -1;
  const double miss = std::max(l1_miss, l2_miss);
  if (miss > kMissRatePct && n.memory_stall_pct && *n.memory_stall_pct > kMemoryStallPct &&
      !bandwidth) {
    latency = true;
    r.signals.push_back(absl::StrCat("cache miss rate ", Pct(miss), " (> ", Pct(kMissRatePct),
                                     ") with ", Pct(*n.memory_stall_pct),
                                     " of warp cycles stalled on memory"));
  }

  if (n.achieved_occupancy_pct && *n.achieved_occupancy_pct < kOccupancyPct) {
    occupancy = true;
    r.signals.push_back(absl::StrCat("achieved occupancy ", Pct(*n.achieved_occupancy_pct),
                                     " (< ", Pct(kOccupancyPct), ")"));
  }

  const int fired = compute + bandwidth + latency + occupancy;
  if (fired > 1) {
    r.bottleneck = Bottleneck::kMixed;
  } else if (compute) {
    r.bottleneck = Bottleneck::kCompute;
  } else if (bandwidth) {
    r.bottleneck = Bottleneck::kMemoryBandwidth;
  } else if (latency) {
    r.bottleneck = Bottleneck::kMemoryLatency;
  } else if (occupancy) {
    r.bottleneck = Bottleneck::kOccupancy;
  } else if (!any_ncu && bw_pct >= 0 && flop_pct >= 0 && bw_pct < kIdlePct &&
             flop_pct < kIdlePct) {
    // Neither roof is near and no counters say why: what leaves both idle is
    // waiting. (With ncu, its stall and miss signals decide instead.)
    r.bottleneck = Bottleneck::kMemoryLatency;
    r.signals.push_back(absl::StrCat("bandwidth at ", Pct(bw_pct), " and flops at ",
                                     Pct(flop_pct), " of their ceilings (both < ",
                                     Pct(kIdlePct), "): latency-bound"));
  } else {
    r.signals.push_back("no signal above its threshold");
  }
  return r;
}

}  // namespace rvd::tune

// What the tuning worker knows about a kernel's speed (self_improve/,
// public): the profile of the current best and the bottleneck it is
// classified into. Plain data and one pure function, no CUDA: the GPU side
// fills a KernelProfile, generators read it, the CPU tests build one by hand.
//
// Thread-safe: plain values and a pure function.
#ifndef RVD_SELF_IMPROVE_PROFILE_H_
#define RVD_SELF_IMPROVE_PROFILE_H_

#include <optional>
#include <string>
#include <vector>

namespace rvd::tune {

// Nsight Compute metrics of one launch, in percent (0 .. 100) unless said
// otherwise; absent when ncu is not installed, not enabled or did not
// report the metric. The ncu CSV parser (self_improve/providers/, helper
// `llm`) fills them by the ncu metric name given on each field.
struct NcuMetrics {
  // sm__throughput.avg.pct_of_peak_sustained_elapsed: the busiest SM unit's
  // share of its peak (compute pipes, issue).
  std::optional<double> sm_throughput_pct;
  // sm__cycles_active.avg / elapsed, as a percentage: SMs with work.
  std::optional<double> sm_active_cycles_pct;
  // dram__throughput.avg.pct_of_peak_sustained_elapsed.
  std::optional<double> dram_throughput_pct;
  // lts__t_sector_hit_rate.pct: L2 hit rate.
  std::optional<double> l2_hit_rate_pct;
  // l1tex__t_sector_hit_rate.pct: L1 hit rate.
  std::optional<double> l1_hit_rate_pct;
  // sm__warps_active.avg.pct_of_peak_sustained_active: achieved occupancy.
  std::optional<double> achieved_occupancy_pct;
  // Share of warp cycles stalled on memory (long scoreboard + barrier waits
  // on loads: smsp__average_warp_latency_issue_stalled_long_scoreboard over
  // all stall reasons), as a percentage.
  std::optional<double> memory_stall_pct;
  // launch__registers_per_thread (a count, not a percentage).
  std::optional<double> registers_per_thread;
};

// One kernel's measured speed on the target's shapes (CUDA-event timing,
// median of the timed launches) against the device's measured ceilings.
struct KernelProfile {
  double seconds = 0;                  // one launch over the target's batch
  double bytes = 0;                    // bytes the launch must read (the matrices)
  double flops = 0;                    // useful flops (2 n^2 k per matrix, symmetric half)
  double peak_bytes_per_second = 0;    // measured DRAM ceiling of this device
  double peak_flops_per_second = 0;    // measured tensor-core ceiling for the dtype
  NcuMetrics ncu;

  // Achieved rates (0 when seconds is 0).
  double BytesPerSecond() const { return seconds > 0 ? bytes / seconds : 0; }
  double FlopsPerSecond() const { return seconds > 0 ? flops / seconds : 0; }
};

// Seed 000's bottleneck classes.
enum class Bottleneck {
  kUnknown,          // nothing to go on (no timing)
  kCompute,          // SMs busy, flops near the roof
  kMemoryBandwidth,  // DRAM near its peak, intensity below the ridge
  kMemoryLatency,    // caches missing, warps stalled on memory, bandwidth not used
  kOccupancy,        // too few warps resident to hide anything
  kMixed,            // more than one of the above at once
};

// "compute", "memory_bandwidth", "memory_latency", "occupancy", "mixed",
// "unknown": the names the API, the log and the prompts use.
const char* BottleneckName(Bottleneck b);

// The classification and the signals that led to it, each a sentence with
// its number ("DRAM at 86% of peak (> 80%)"), for the log and the prompts.
struct BottleneckReport {
  Bottleneck bottleneck = Bottleneck::kUnknown;
  std::vector<std::string> signals;
};

// Classifies `p` with seed 000's thresholds (bottleneck.cc):
//   compute:          SM active > 90% or SM throughput > 90%, or flops >= 80% of the roof
//   memory_bandwidth: DRAM > 80% (ncu) or bytes/s >= 80% of the measured ceiling,
//                     with arithmetic intensity below the ridge
//   memory_latency:   L1 or L2 miss rate > 50% with memory stalls > 50%, DRAM < 80%
//   occupancy:        achieved occupancy < 50%
//   mixed:            more than one class fires
// Without ncu, only the roofline signals (rates against the ceilings) are
// used; below every threshold with ncu absent, the farther-from-roof side
// is not guessed: kMemoryLatency when both rates are under 50% of their
// ceilings (latency is what leaves both idle), else kUnknown.
BottleneckReport ClassifyBottleneck(const KernelProfile& p);

}  // namespace rvd::tune

#endif  // RVD_SELF_IMPROVE_PROFILE_H_

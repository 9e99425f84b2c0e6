// Running Nsight Compute on a profiling target (self_improve/ncu/): where
// ncu is, the command line the worker runs it with, and the run itself (a
// child process in its own process group, a deadline, the CSV from ncu's
// log file parsed by ncu_csv.h). The worker profiles only when ncu is
// present and enabled; the target is a process that launches the kernel
// (ncu profiles another process, never rvd itself).
//
// Thread-safety: FindNcu and NcuCommandLine are pure; RunNcu may run in
// several threads at once (each run has its own temporary directory).
#ifndef RVD_SELF_IMPROVE_NCU_NCU_RUNNER_H_
#define RVD_SELF_IMPROVE_NCU_NCU_RUNNER_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "self_improve/ncu/ncu_csv.h"

namespace rvd::tune {

struct NcuRunOptions {
  std::string ncu;  // the executable; "" = FindNcu("")
  // The kernels profiled: an exact name (ncu's --kernel-name), or a
  // regular expression with the "regex:" prefix.
  std::string kernel_name = "rvd_tune_candidate";
  int launch_skip = 1;   // launches of it not profiled first (the warm-up)
  int launch_count = 3;  // launches profiled (SummarizeLaunches takes the median)
  std::vector<std::string> metrics = NcuMetricNames();
  absl::Duration timeout = absl::Minutes(5);  // ncu replays each launch per metric pass
};

// `explicit_path` when it is an executable file; else (explicit_path "")
// the first ncu on PATH, /usr/local/cuda/bin/ncu, or the newest
// /opt/nvidia/nsight-compute/*/ncu. NOT_FOUND says where it looked.
absl::StatusOr<std::string> FindNcu(const std::string& explicit_path);

// ncu's argv for `target` (its argv[0] and arguments): the raw page as CSV
// in base units, the named metrics, the kernel filter and launch window,
// caches flushed and clocks at base between passes (ncu's defaults, said
// explicitly), every process of the target, the output in `log_file`.
std::vector<std::string> NcuCommandLine(const NcuRunOptions& options, const std::string& ncu_path,
                                        const std::string& log_file,
                                        const std::vector<std::string>& target);

// Runs ncu on `target` with LC_ALL=C and parses its CSV. Errors:
// NOT_FOUND (no ncu), DEADLINE_EXCEEDED (the process group is killed at
// the timeout), PERMISSION_DENIED (ERR_NVGPUCTRPERM: the GPU's performance
// counters are restricted to root), INTERNAL (ncu failed: its ==ERROR==
// lines or the end of its output), and ParseNcuCsv's.
absl::StatusOr<NcuReport> RunNcu(const NcuRunOptions& options,
                                 const std::vector<std::string>& target);

}  // namespace rvd::tune

#endif  // RVD_SELF_IMPROVE_NCU_NCU_RUNNER_H_

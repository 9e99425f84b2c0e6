// The tuning loop's GPU tools (self_improve/, public): Compiler, Verifier
// and Benchmarker (tune_loop.h) over a TuneDevice (kernels/tune_device.h),
// which compiles a candidate and runs it under rvd's harness. What these
// add is the evidence the acceptance rules read (acceptance.h):
//   Verify  fresh inputs from the request's seed (PlanInputs: every shape
//           of the target, every spectrum and special kind), realized on the
//           host in the target's dtype; each input run twice, each run with
//           its own poison and fresh outputs, the float64 reference
//           (reference.h) and the SVD oracle's PR computed between the two
//           runs, then Evaluate.
//   Compare interleaved blocks, candidate then best, `rounds` times, each
//           block a run of timed launches (L2 flushed, device synchronized)
//           and its median; the floor is the batch's bytes over the
//           device's measured DRAM ceiling (0 when not measured).
//   Profile timed launches of one kernel: the median, bytes and flops of
//           the batch, the device's measured ceilings.
// Timing inputs are regular matrices only (never zeros, NaN or special
// magnitudes). A candidate failing at run time is ABORTED (tune_loop.h's
// rule); the best kernel failing is the harness's error (INTERNAL).
//
// Thread-compatible: one job's thread uses its tools; the TuneDevice (the
// engine's) outlives them and every kernel they compiled.
#ifndef RVD_SELF_IMPROVE_DEVICE_TOOLS_H_
#define RVD_SELF_IMPROVE_DEVICE_TOOLS_H_

#include <cstdint>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

#include "kernels/engine.h"
#include "kernels/tune_device.h"
#include "self_improve/generator.h"
#include "self_improve/job_manager.h"
#include "self_improve/verification.h"

namespace rvd::tune {

// Paces one job's device work to a duty cycle d in (0, 1] (issue 17 §1:
// live measurements come first): after device work that took t seconds,
// the next starts no sooner than t (1 - d) / d later, so a job holds the
// device at most a fraction d of its time (1: no idle). A job's Verifier
// and Benchmarker share one (MakeDeviceTools); t is the wall time of a
// whole TuneDevice::Run (its copies, launches and checks), an
// overestimate of the device's busy time. Thread-safe.
class DutyCycle {
 public:
  // The time source and the wait: the system's (Real()), or a test's fake.
  class Clock {
   public:
    virtual ~Clock() = default;
    virtual absl::Time Now() = 0;
    virtual void SleepFor(absl::Duration d) = 0;
    static Clock& Real();
  };

  // `duty` outside (0, 1] is clamped into [0.01, 1] (ValidateConfig
  // refuses such a tune_duty_cycle with an error).
  DutyCycle(double duty, Clock& clock);

  // Waits out the idle that earlier work left owed, then runs `work` and
  // records how long it took.
  template <typename F>
  auto Run(F&& work) {
    const absl::Time start = WaitTurn();
    auto result = work();
    Done(start);
    return result;
  }

  double duty() const { return duty_; }

 private:
  absl::Time WaitTurn();
  void Done(absl::Time start);

  const double duty_;
  Clock& clock_;
  absl::Mutex mu_;
  absl::Time next_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

struct DeviceToolsOptions {
  int block_launches = 5;       // timed launches per A-B block (their median is the block's)
  int long_block_factor = 4;    // a long measurement's blocks are this many times longer
  int profile_launches = 9;     // timed launches of a profile
  // Host threads realizing inputs and computing the reference (each matrix
  // independent: the results do not depend on it); 0: half the cores, at
  // most 8. A 480 x 128x4096 bf16 input takes about 1 s on one core to
  // realize; the reference sums of a checked 1024x4096 matrix about 0.15 s
  // and its SVD oracle about 0.5 s.
  int host_threads = 0;
  // The share of time the job's device work may take (DutyCycle): config
  // key tune_duty_cycle. The clock: nullptr for the system's.
  double duty_cycle = 0.5;
  DutyCycle::Clock* clock = nullptr;
};

// The compiler, verifier and benchmark over `device` (which must outlive
// them and every kernel they return).
TuneBackend::Tools MakeDeviceTools(TuneDevice& device, DeviceToolsOptions options = {});

// The values of planned matrix `plan` stored in `dtype` (row-major, ld =
// cols), a function of the plan alone:
//   flat, powerlaw, spiked: U diag(s) V^T exactly, V^T n distinct rows of
//     the k-point DCT-II with random column signs, U a Householder
//     reflection (dense factors, no QR);
//   rank1: u v^T; gaussian: i.i.d. near-normal entries (sum of four
//     uniforms, variance 1);
//   zeros; nan, inf: a gaussian matrix with one NaN or -Inf at (bad_row,
//     bad_col); huge, tiny, subnormal: a gaussian one scaled by 1e19,
//     1e-20, 1e-39 (f32's trust rule fires on the first two).
std::vector<uint8_t> RealizeMatrix(const MatrixPlan& plan, DType dtype);

// The bytes one launch over `target`'s batch must read (every matrix once)
// and its useful flops: n (n + 1) k per matrix (the Gram's upper triangle
// with its diagonal, a multiply and an add per term).
double TargetBytes(const TuneTarget& target);
double TargetFlops(const TuneTarget& target);

}  // namespace rvd::tune

#endif  // RVD_SELF_IMPROVE_DEVICE_TOOLS_H_

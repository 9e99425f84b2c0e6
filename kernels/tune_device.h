// The device side of kernel tuning (issue 17): what self_improve/'s tools
// need from a GPU to compile a candidate and run it under rvd's harness,
// reached as Engine::Tune().
//
// A candidate is device code only (self_improve/generator.h's contract):
// Compile turns its source into a loaded module for the device's exact
// architecture; Run uploads a batch of host matrices into buffers of the
// call's own, fills fresh output buffers with the caller's poison, launches
// the candidate once (the checked run, whose per-job sums come back), then
// `timed_launches` more with the L2 flushed before each and the whole
// device synchronized before each end event, and finally compares the
// inputs on the device with a private copy. The implementation owns every
// launch, buffer and timer; the caller owns the inputs and the verdicts.
//
// The CUDA engine implements it over the module's table (kernels/
// cuda_module.h, rvd_cuda_tune; server/backend.cc); the CPU engine has none
// (Engine::Tune() is nullptr). CPU tests substitute a host fake
// (self_improve/fake_tune_device.h).
//
// Thread-safe: every member may be called from any thread. A Module is the
// implementation's; each is released exactly once, after its last Run.
#ifndef RVD_KERNELS_TUNE_DEVICE_H_
#define RVD_KERNELS_TUNE_DEVICE_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/engine.h"

namespace rvd {

class TuneDevice {
 public:
  struct Module;  // opaque: one loaded candidate

  // The bytes of one job record Run passes to the candidate: self_improve/
  // candidate_abi.h's TuneJob (six int32s). kernels/ does not depend on
  // self_improve/, so the record travels as bytes; its user checks the size.
  static constexpr size_t kJobBytes = 6 * sizeof(int32_t);

  struct Info {
    int sm = 0;                         // exact architecture: 90 for sm_90
    std::string arch;                   // what NVRTC is given, e.g. "sm_90a"
    double dram_bytes_per_second = 0;   // measured ceilings; 0: not measured
    double fp32_flops_per_second = 0;
    uint64_t l2_bytes = 0;
  };

  // A compiled source: `module` null when it does not compile (or defines
  // no entry), `log` then says why (NVRTC's log and the reason).
  struct Compiled {
    Module* module = nullptr;
    std::string log;
  };

  // How one Run launches and what it fills the outputs with.
  struct RunSpec {
    uint32_t threads = 0;     // threads per block (the candidate's annotation)
    uint32_t smem_bytes = 0;  // dynamic shared memory per block
    uint32_t grid = 0;        // blocks; 0: one per job
    uint32_t timed_launches = 0;  // after the checked run (0: the checked run only)
    uint64_t poison64 = 0;    // the bits of every g2 and trace slot before the checked run
    uint32_t poison32 = 0;    // of every maxabs slot
  };

  struct RunResult {
    // The checked run's per-job sums (one per job), read from output
    // buffers allocated for this call only.
    std::vector<double> g2;
    std::vector<double> trace;
    std::vector<float> maxabs;
    std::vector<double> seconds;  // each timed launch's, timed_launches of them
    bool input_written = false;   // the inputs differ from their private copy afterwards
  };

  virtual ~TuneDevice() = default;

  virtual absl::StatusOr<Info> Device() = 0;

  // Compiles `source` for the device's exact architecture and loads it. A
  // source that does not compile is a Compiled without module; an error is
  // the compiler or the device failing (UNAVAILABLE: no NVRTC here).
  virtual absl::StatusOr<Compiled> Compile(const std::string& source) = 0;

  // Runs `module` on `batch` (host matrices, not blocked) and `jobs`
  // (num_jobs records of kJobBytes each). Errors: ABORTED when the
  // candidate itself failed (the launch was refused, or the kernel faulted
  // during this call; the device may be lost afterwards); any other code is
  // the harness or the device failing (FAILED_PRECONDITION: the device was
  // lost before the call).
  virtual absl::StatusOr<RunResult> Run(Module* module, absl::Span<const MatrixView> batch,
                                        const void* jobs, size_t num_jobs,
                                        const RunSpec& spec) = 0;

  // Unloads `module`, after every launch of it has finished.
  virtual void Release(Module* module) = 0;
};

}  // namespace rvd

#endif  // RVD_KERNELS_TUNE_DEVICE_H_

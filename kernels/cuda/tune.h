// The CUDA module's tuning table (rvd_cuda_tune, kernels/cuda_module.h):
// NVRTC compile of a tuning candidate for the device's exact architecture,
// its CUBIN loaded through the driver API (driver_api.h), and runs under
// the module's harness: the module owns every launch, buffer and timer.
#ifndef RVD_KERNELS_CUDA_TUNE_H_
#define RVD_KERNELS_CUDA_TUNE_H_

#include "kernels/cuda_module.h"

namespace rvd::cuda {

// The table module.cc puts in rvd_cuda_module::tune.
extern const rvd_cuda_tune kTuneTable;

// Defined in module.cc: the CUDA device an engine runs on, and its SM cap
// (rvd_cuda_options::max_sms; 0: every SM), which caps a run's grid.
int TuneDeviceOf(rvd_cuda_engine* engine);
int TuneMaxSmsOf(rvd_cuda_engine* engine);

}  // namespace rvd::cuda

#endif  // RVD_KERNELS_CUDA_TUNE_H_

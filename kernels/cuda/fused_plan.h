// Planning a fused call (private to kernels/cuda/; the engine and the GPU
// benchmark both plan with it, so the benchmark times what rvd runs).
//
// A fused call of m matrices is planned on the host once: which fused kernel
// serves each matrix, the jobs of each, one launch per run of matrices with
// the same (dtype, kernel), fused v4's schedules, and a blob of descriptors
// (matrix descriptors, job lists, per-matrix job offsets, v4's tensor maps)
// to upload. LaunchFusedCall then runs it on device memory laid out as the
// plan says. A plan depends only on the views (pointers, shapes, strides,
// dtypes) and the device: the same call gives the same bits, and a call with
// the same views may launch the same plan again.
#ifndef RVD_KERNELS_CUDA_FUSED_PLAN_H_
#define RVD_KERNELS_CUDA_FUSED_PLAN_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "kernels/cuda/kernel_registry.h"
#include "kernels/cuda/kernels.h"
#include "kernels/cuda/launch_policy.h"
#include "kernels/engine.h"

namespace rvd::cuda {

// What planning needs of the device.
struct DeviceInfo {
  int sm_major = 0, sm_minor = 0;
  int sms = 0;          // multiprocessors rvd's kernels may occupy: the device's, or the cap
  bool capped = false;  // sms is a cap below the device's count (CudaEngineOptions::max_sms)
};

// The device as the engine and the benchmark plan for it: `device_sms`
// multiprocessors, capped at `max_sms` (0: no cap).
DeviceInfo PlanningDevice(int sm_major, int sm_minor, int device_sms, int max_sms);

// The grid of a fused call's launch that needs `blocks` blocks (a block per
// job, or per 4 matrices for the finalize): all of them, or under the SM
// cap at most `device.sms`, the kernels taking their jobs round-robin. The
// hardware spreads a grid's blocks over every SM it can, so the grid's
// size, not the blocks one SM could hold, bounds the SMs a launch occupies.
// (Fused v4's persistent grid, FusedV4Plan, is min(jobs, sms) either way.)
int ProductGrid(int blocks, const DeviceInfo& device);

// A planned fused call.
struct FusedCall {
  std::vector<MatrixView> views;  // what was planned; empty: no plan
  uint64_t generation = 0;        // the kernel table's it was planned for
  std::vector<size_t> order;      // result slot s holds matrix order[s]
  struct Launch {
    DType dtype = DType::kF32;
    FusedKernel kernel = FusedKernel::kV3;
    int64_t matrices = 0;
    int j0 = 0, jobs = 0;  // the launch's first job (g2, trace, maxabs) and count
    int list0 = 0;         // its first job in the v1 or v2 job list
    bool offdiag = false;
    bool pairs = false;    // v4's f32 of Gram side > 128 (FusedV4Pairs)
    bool tall = false;     // v4 triangle's tall 16-bit (FusedV4TallRuns)
    int grid = 0;          // blocks: ProductGrid(jobs) for v1 and v3, plan.grid for v4
    FusedV4Plan plan;
  };
  std::vector<Launch> launches;
  bool finished = true;      // fused v4 writes every PR itself: no finalize
  int finalize_grid = 0;     // the finalize's blocks (ProductGrid)
  bool needs_tickets = false;  // a cut v4 plan: tickets and partial Grams
  // The descriptors blob (upload it to `descriptors` memory) and its parts.
  std::vector<unsigned char> upload;
  uint64_t o_desc = 0, o_jobs = 0, o_jobs2 = 0, o_jb = 0, o_maps = 0;
  // Work memory: per-job sums, results (ResultsBytes(m) at o_pr, PRs then
  // statuses at o_st), v4's partial Grams.
  uint64_t work_bytes = 0;
  uint64_t o_g2 = 0, o_tr = 0, o_mx = 0, o_pr = 0, o_st = 0, o_part = 0;
};

// Plans `views` (device pointers). Matrices are ordered by dtype, then
// kernel (v4, v4 triangle, v3 wide, v1 tall; v4's f32 of Gram side > 128
// after its other f32), stably, so that each launch's
// jobs are contiguous; job indices (g2, trace, maxabs) run over all launches
// in slot order, so the finalize sums each matrix's jobs in order.
// `encode` writes v4's tensor maps (a stand-in where no driver is: the
// planning tests).
using TensorMapEncoder = cudaError_t (*)(DType, const MatrixDesc&, void*);
absl::Status PlanFusedCall(absl::Span<const MatrixView> views, const DeviceInfo& device,
                           FusedCall* call, TensorMapEncoder encode = &EncodeFusedV4Map);

// Tests only (fused_mutant.cu, linked into the GPU test binary alone): the
// deliberately wrong fused kernels that prove the checks can fail.
const FusedLaunchers& FusedMutantLaunchers();

// Queues `call` on `stream` with `table`'s kernels: its descriptors already
// at `descriptors` (the uploaded blob), its work memory at `work`, `tickets`
// zeroed (a cut plan's). The results land at work + o_pr.
cudaError_t LaunchFusedCall(const FusedCall& call, const KernelTable& table,
                            const void* descriptors, void* work, int32_t* tickets,
                            cudaStream_t stream);

}  // namespace rvd::cuda

#endif  // RVD_KERNELS_CUDA_FUSED_PLAN_H_

// Test build only: deliberately wrong fused kernels, the product's kernel
// templates instantiated with a hook struct that breaks one point (the
// product module holds no mutant instance). v1 (tall) and v2
// (wide): the B operand of every warp tile is read from the row block
// instead of the column block; v4: the B operand's K offset is one k-step
// off (bf16); f32, a scale that does not fit is kept, and a block's first
// copy of each job after its first reads the matrix of the job before
// (two faults, each met by its own GPU test: F32MagnitudeJumpsBetweenSlices
// has one job per block, F32ManyJobsPerBlockOddSliceCounts no scale that
// does not fit). cuda_engine_test runs the same checker against them and
// expects mismatches, proving that the checker can fail.
#include "kernels/cuda/fused_launch.cuh"
#include "kernels/cuda/fused_plan.h"
#include "kernels/cuda/fused_v4_launch.cuh"

namespace rvd::cuda {
namespace mutant {

// v1: the warp tile (wi, wj) reads B at its row tile wi: one wrong index.
struct V1 {
  static __device__ __forceinline__ int BTile(int wi, int /*wj*/) { return wi; }
};

// v2/v3: every slot reads B at its row strip's rows (masked into the B
// tile), and RoleSliceMma's slots all at the strip's first: one wrong index.
struct V2 : fused_v2::Product {
  static __device__ __forceinline__ int BGroup(int strip, int /*grp*/, bool diag) {
    return strip & (diag ? 7 : 3);
  }
  static constexpr int kBStride = 0;
};

}  // namespace mutant

namespace {

cudaError_t LaunchFusedMutant(DType dtype, const MatrixDesc* mats,
                              const FusedJob* jobs, int num_jobs,
                              bool any_offdiagonal, double* g2, double* trace,
                              float* maxabs, cudaStream_t stream, int grid) {
  if (dtype != DType::kBF16) return cudaErrorNotSupported;  // one instance
  return fused::LaunchFusedT<__nv_bfloat16, mutant::V1>(
      mats, jobs, num_jobs, any_offdiagonal, g2, trace, maxabs, grid, stream);
}

cudaError_t LaunchFusedV2Mutant(DType dtype, const MatrixDesc* mats,
                                const FusedJobV2* jobs, int num_jobs,
                                bool any_offdiagonal, double* g2,
                                double* trace, float* maxabs,
                                cudaStream_t stream, int grid) {
  if (dtype != DType::kBF16) return cudaErrorNotSupported;  // one instance
  return fused_v2::LaunchFusedV2T<__nv_bfloat16, mutant::V2>(
      mats, jobs, num_jobs, any_offdiagonal, g2, trace, maxabs, grid, stream);
}

cudaError_t LaunchFusedV4Mutant(DType dtype, const FusedV4Launch& launch, cudaStream_t stream) {
  if (dtype == DType::kF16) return cudaErrorNotSupported;  // bf16 and f32 instances
  namespace v4 = fused_v4;
  if (dtype == DType::kF32) return v4::LaunchFusedV4T<float, v4::kMutant>(launch, stream);
  return v4::LaunchFusedV4T<__nv_bfloat16, v4::kMutant>(launch, stream);
}

}  // namespace

const FusedLaunchers& FusedMutantLaunchers() {
  static constexpr FusedLaunchers kMutants{&LaunchFusedMutant, &LaunchFusedV2Mutant,
                                           &LaunchFusedV4Mutant};
  return kMutants;
}

}  // namespace rvd::cuda

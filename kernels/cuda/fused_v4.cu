// The fused kernel v4's launcher and tensor maps (fused_v4_kernel.cuh).
// Compiled for sm_90a only (CMakeLists.txt: rvd_cuda_sm90a).
#include <cudaTypedefs.h>

#include "kernels/cuda/fused_v4_launch.cuh"
#include "kernels/cuda/kernels.h"

namespace rvd::cuda {

static_assert(sizeof(CUtensorMap) == kTensorMapBytes, "CUtensorMap size");
static_assert(sizeof(TensorMap) == sizeof(CUtensorMap) && alignof(TensorMap) == alignof(CUtensorMap),
              "the kernel's TensorMap is a CUtensorMap");

namespace {

// The driver's encoder, through the runtime (no link against libcuda).
PFN_cuTensorMapEncodeTiled_v12000 TensorMapEncoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000,
                                         cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
      return static_cast<PFN_cuTensorMapEncodeTiled_v12000>(nullptr);
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  }();
  return fn;
}

}  // namespace

cudaError_t EncodeFusedV4Map(DType dtype, const MatrixDesc& d, void* map) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = TensorMapEncoder();
  if (encode == nullptr) return cudaErrorNotSupported;
  // (A tall 16-bit matrix: the triangle's MN-major tiles, which the
  // benchmark's "v4-tall" runs whether or not the policy serves them.)
  const bool tall = FusedV4TallRuns(dtype, d.rows, d.cols, d.aligned != 0);
  if (!tall && !IsFusedV4(ChooseFusedKernel(9, 0, dtype, d.rows, d.cols, d.aligned != 0))) {
    return cudaErrorInvalidValue;
  }
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(d.cols),
                              static_cast<cuuint64_t>(d.rows)};
  const bool f32 = dtype == DType::kF32;
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(d.ld) * (f32 ? 4 : 2)};
  // A K-slice: 64 elements of each of 128 rows (wide), or of 64 rows
  // and half the columns (tall: two copies per 128-column tile).
  const cuuint32_t box[2] = {fused_v4::kSliceK,
                             tall ? static_cast<cuuint32_t>(fused_v4::kSliceK) : fused_v4::kTile};
  const cuuint32_t element_strides[2] = {1, 1};
  // 16-bit tiles land in the 128B-swizzle layout wgmma reads; f32 tiles
  // plainly (256-byte rows), for the consumers to convert.
  const CUtensorMapDataType type = f32                      ? CU_TENSOR_MAP_DATA_TYPE_FLOAT32
                                   : dtype == DType::kBF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                                            : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  const CUresult r = encode(static_cast<CUtensorMap*>(map), type, 2, const_cast<void*>(d.data),
                            dims, strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                            f32 ? CU_TENSOR_MAP_SWIZZLE_NONE : CU_TENSOR_MAP_SWIZZLE_128B,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

cudaError_t LaunchFusedV4(DType dtype, const FusedV4Launch& launch, cudaStream_t stream) {
  return fused_v4::LaunchFusedV4Dispatch<fused_v4::kLive>(dtype, launch, stream);
}

}  // namespace rvd::cuda

// A sticky CUDA error (label gpu, its own process: the CUDA context is
// unusable afterwards). A kernel that traps leaves every later call of the
// process failing; the engine must notice at its next call, answer
// UNAVAILABLE from then on without touching the device, count the error by
// name and say it is unhealthy (the daemon turns health NOT_SERVING).
#include <cuda_runtime.h>

#include <random>

#include "gtest/gtest.h"
#include "kernels/cuda/cuda_engine.h"
#include "kernels/test_matrices.h"

namespace rvd::cuda {
namespace {

__global__ void Trap() { asm volatile("trap;"); }

TEST(CudaDeviceLost, StickyErrorMakesTheEngineUnhealthy) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) GTEST_SKIP() << "no CUDA device";
  absl::StatusOr<std::unique_ptr<CudaEngine>> engine = CudaEngine::Create({});
  ASSERT_TRUE(engine.ok()) << engine.status();
  std::mt19937_64 rng(std::random_device{}());
  const StoredMatrix m =
      Store(MakeMatrix(rng, 64, 256, Spectrum::kGaussian), 64, 256, DType::kF32, 0, "g");
  std::vector<double> out(1);
  ASSERT_TRUE((*engine)->ComputePR({m.view}, {}, absl::MakeSpan(out)).ok());
  EXPECT_TRUE((*engine)->Stats().healthy);

  Trap<<<1, 1>>>();
  const cudaError_t fault = cudaDeviceSynchronize();
  ASSERT_NE(fault, cudaSuccess);

  absl::Status s = (*engine)->ComputePR({m.view}, {}, absl::MakeSpan(out));
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  const EngineStats stats = (*engine)->Stats();
  EXPECT_FALSE(stats.healthy);
  EXPECT_FALSE(stats.unhealthy_reason.empty());
  int64_t errors = 0;
  for (const auto& [name, n] : stats.device_errors) errors += n;
  EXPECT_GT(errors, 0);
  // Later calls fail fast with the reason, and keep failing.
  const absl::Status again = (*engine)->ComputePR({m.view}, {}, absl::MakeSpan(out));
  EXPECT_EQ(again.code(), absl::StatusCode::kUnavailable) << again;
  EXPECT_NE(again.message().find("lost"), std::string::npos) << again;
}

}  // namespace
}  // namespace rvd::cuda

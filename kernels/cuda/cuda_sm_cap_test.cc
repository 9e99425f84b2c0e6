// GPU test of the SM cap (label gpu; skips without a device): an engine
// capped at a few SMs (CudaEngineOptions::max_sms) serves every fused
// technique, with more jobs than blocks in every launch and more matrices
// than the finalize's blocks, and still matches the float64 oracle; v1 and
// v3 give the uncapped engine's bits (the grid changes no sum), v4 its own
// plan's (a cut plan depends on the SM count).
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/cuda/cuda_engine.h"
#include "kernels/cuda/kernel_registry.h"
#include "kernels/cuda/launch_policy.h"
#include "kernels/engine.h"
#include "kernels/pr_check.h"
#include "kernels/test_matrices.h"

namespace rvd::cuda {
namespace {

struct Family {
  DType dtype;
  int64_t rows, cols;
  bool unaligned;  // device views one element off: v3 serves wide ones
  int count;
};

// More matrices of each family than 4 x the cap (the finalize's blocks),
// and more jobs than the cap.
constexpr int kCap = 3;
const Family kFamilies[] = {
    {DType::kBF16, 128, 512, false, 16},  // v4 triangle (sm_90), else v3
    {DType::kF32, 128, 512, false, 16},   // v4 square f32
    {DType::kBF16, 300, 1000, false, 6},  // v4 square, off-diagonal jobs
    {DType::kF32, 200, 700, false, 13},   // v4 square f32, paired tiles (side > 128)
    {DType::kF32, 200, 700, true, 13},    // v3 on f32 (unaligned rows)
    {DType::kBF16, 128, 512, true, 16},   // v3, 16-bit (unaligned rows)
    {DType::kF16, 200, 700, true, 13},    // v3 with off-diagonal jobs
    {DType::kBF16, 1000, 200, false, 16}, // v1 tall, off-diagonal jobs
    {DType::kF32, 700, 60, false, 16},    // v1 tall f32
};

class CudaSmCapTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
      GTEST_SKIP() << "no CUDA device";
    }
    cudaDeviceProp prop;
    ASSERT_EQ(cudaGetDeviceProperties(&prop, 0), cudaSuccess);
    v4_ = FusedV4Runs(prop.major, prop.minor);
    ASSERT_GT(prop.multiProcessorCount, kCap);
    CudaEngineOptions o;
    auto free_engine = CudaEngine::Create(o);
    o.max_sms = kCap;
    auto capped = CudaEngine::Create(o);
    if (!free_engine.ok() || !capped.ok()) GTEST_SKIP() << "no usable CUDA device";
    free_ = std::move(*free_engine);
    capped_ = std::move(*capped);
  }

  // What serves the family on this device.
  FusedKernel KernelOf(const Family& f) const {
    if (f.rows > f.cols) return FusedKernel::kV1Tall;
    if (!v4_ || f.unaligned) return FusedKernel::kV3;
    if (f.dtype == DType::kF32) return FusedKernel::kV4;
    return f.rows <= 128 ? FusedKernel::kV4Triangle : FusedKernel::kV4;
  }

  bool v4_ = false;
  std::unique_ptr<CudaEngine> free_, capped_;
  const uint64_t seed_ = TestSeed();
  std::mt19937_64 rng_ = SeededRng(
      ::testing::UnitTest::GetInstance()->current_test_info()->name());
  ::testing::ScopedTrace seed_trace_{__FILE__, __LINE__,
                                     absl::StrCat("replay with RVD_TEST_SEED=", seed_)};
};

TEST_F(CudaSmCapTest, CappedEngineMatchesOracleForEveryTechnique) {
  std::map<std::string, int64_t> expected;
  for (const Family& f : kFamilies) {
    std::vector<StoredMatrix> suite;
    for (int i = 0; i < f.count; ++i) {
      const Spectrum sp = kAllSpectra[i % std::size(kAllSpectra)];
      suite.push_back(Store(MakeMatrix(rng_, f.rows, f.cols, sp), f.rows, f.cols, f.dtype, 0,
                            SpectrumName(sp)));
    }
    std::vector<void*> buffers;
    std::vector<MatrixView> views;
    for (const StoredMatrix& s : suite) {
      MatrixView v = s.view;
      if (f.unaligned) {
        const size_t es = DTypeSize(f.dtype);
        void* p = nullptr;
        ASSERT_EQ(cudaMalloc(&p, s.bytes.size() + 64), cudaSuccess);
        buffers.push_back(p);
        v.data = static_cast<uint8_t*>(p) + es;
        ASSERT_EQ(cudaMemcpy(const_cast<void*>(v.data), s.bytes.data(), s.bytes.size(),
                             cudaMemcpyHostToDevice),
                  cudaSuccess);
      }
      views.push_back(v);
    }
    const FusedKernel kernel = KernelOf(f);
    const std::string what = absl::StrCat(f.count, " x ", f.rows, "x", f.cols, " ",
                                          DTypeName(f.dtype), f.unaligned ? " unaligned" : "",
                                          " (", FusedTechnique(kernel, f.dtype), ")");
    auto run = [&](CudaEngine& e) {
      std::vector<double> out(views.size());
      std::memset(out.data(), 0xFF, out.size() * sizeof(double));  // NaN
      absl::Status s = f.unaligned
                           ? e.ComputePRDevice(views, {}, absl::MakeSpan(out), nullptr)
                           : e.ComputePR(views, {}, absl::MakeSpan(out));
      EXPECT_TRUE(s.ok()) << what << ": " << s;
      return out;
    };
    const int64_t fallbacks = capped_->Stats().events["oracle_fallback"];
    const std::vector<double> capped = run(*capped_);
    const std::vector<double> free = run(*free_);
    for (void* p : buffers) cudaFree(p);
    EXPECT_EQ(capped_->Stats().events["oracle_fallback"], fallbacks) << what;
    for (size_t i = 0; i < suite.size(); ++i) {
      absl::StatusOr<double> ref = OraclePR(suite[i].view);
      ASSERT_TRUE(ref.ok()) << ref.status();
      EXPECT_TRUE(WithinTolerance(capped[i], *ref, kExactPrTolerance))
          << what << " " << suite[i].label << ": capped " << capped[i] << " ref " << *ref;
      if (!IsFusedV4(kernel)) {
        EXPECT_EQ(std::memcmp(&capped[i], &free[i], sizeof(double)), 0)
            << what << " " << suite[i].label << ": capped " << capped[i] << " uncapped "
            << free[i];
      }
    }
    expected[absl::StrCat("fused/", FusedTechnique(kernel, f.dtype))] += f.count;
  }
  // Each technique served the capped engine's calls.
  const auto served = capped_->Stats().served;
  for (const auto& [path, n] : expected) {
    const auto it = served.find(path);
    EXPECT_EQ(it == served.end() ? 0 : it->second, n) << path;
  }
}

}  // namespace
}  // namespace rvd::cuda

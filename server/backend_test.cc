// The CUDA module boundary (kernels/cuda_module.h, server/backend.h): a
// module of another ABI is refused before any of its functions runs, a
// module without a device says so, and backend auto on a host without a GPU
// serves on the CPU and says why. The fake modules are built by CMake next
// to this test (FAKE_MODULE_DIR).
#include "server/backend.h"

#include <dlfcn.h>

#include <atomic>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cuda_module.h"

namespace rvd {
namespace {

using ::testing::HasSubstr;

std::string Fake(const char* name) { return std::string(FAKE_MODULE_DIR) + "/" + name; }

int CreatedCount(const std::string& path) {
  void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_NOLOAD);
  if (h == nullptr) return -1;
  auto created = reinterpret_cast<int (*)()>(dlsym(h, "fake_module_created"));
  return created == nullptr ? -1 : created();
}

TEST(CudaModule, OtherAbiIsRefusedBeforeAnythingIsCreated) {
  const std::string path = Fake("libfake_cuda_abi999.so");
  absl::StatusOr<std::unique_ptr<Engine>> e = LoadCudaModule(path, {});
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), absl::StatusCode::kFailedPrecondition) << e.status();
  EXPECT_THAT(e.status().message(), HasSubstr("ABI 999"));
  EXPECT_THAT(e.status().message(), HasSubstr("install the librvd_cuda.so built with this rvd"));
  EXPECT_EQ(CreatedCount(path), 0);
}

TEST(CudaModule, SameAbiWithoutDeviceIsUnavailable) {
  const std::string path = Fake("libfake_cuda_abi_ok.so");
  absl::StatusOr<std::unique_ptr<Engine>> e = LoadCudaModule(path, {});
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), absl::StatusCode::kUnavailable) << e.status();
  EXPECT_THAT(e.status().message(), HasSubstr("fake module: no CUDA device"));
  EXPECT_EQ(CreatedCount(path), 1);
}

// What ModuleEngine hands the module (ABI 3): each matrix's shape, memory
// kind and blocking (a blocked device view: block_rows, block_stride), the
// caller's event and its cancellation flag, through the fake's echo engine.
TEST(CudaModule, CallsCarryBlockingEventAndCancellationAcrossTheTable) {
  CudaEngineOptions o;
  o.device = 7;  // the fake's echo engine
  absl::StatusOr<std::unique_ptr<Engine>> e = LoadCudaModule(Fake("libfake_cuda_abi_ok.so"), o);
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ((*e)->Version(), "fake-echo-1");
  const float w[12] = {};
  MatrixView blocked{w, 4, 1, 1, DType::kF32};
  blocked.block_rows = 2;
  blocked.block_stride = 3;
  std::vector<double> out(2);
  int event = 0;  // any non-null pointer stands for a cudaEvent_t here
  ASSERT_TRUE((*e)->ComputePRDevice({MatrixView{w, 3, 4, 4, DType::kF32}, blocked}, {},
                                    absl::MakeSpan(out), &event)
                  .ok());
  EXPECT_EQ(out[0], 3 + 1000 * RVD_MEMORY_DEVICE + 0.5);
  EXPECT_EQ(out[1], 4 + 1000 * RVD_MEMORY_DEVICE + 2e6 + 1e9 + 0.5);
  ASSERT_TRUE((*e)->ComputePR({MatrixView{w, 3, 4, 4, DType::kF32}}, {},
                              absl::MakeSpan(out).subspan(0, 1))
                  .ok());
  EXPECT_EQ(out[0], 3 + 1000 * RVD_MEMORY_HOST);
  std::atomic<bool> cancel{true};
  CallOptions call;
  call.cancel = &cancel;
  const absl::Status s = (*e)->ComputePR({MatrixView{w, 3, 4, 4, DType::kF32}}, {},
                                         absl::MakeSpan(out).subspan(0, 1), call);
  EXPECT_TRUE(absl::IsCancelled(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("fake module: cancelled"));
  cancel = false;
  EXPECT_TRUE((*e)->ComputePRDevice({blocked}, {}, absl::MakeSpan(out).subspan(0, 1), nullptr,
                                    call)
                  .ok());
}

// A module whose table has no gram_eigenvalues (ABI 4 allows NULL):
// ModuleEngine answers UNIMPLEMENTED without calling into it.
TEST(CudaModule, NullGramEigenvaluesIsUnimplemented) {
  CudaEngineOptions o;
  o.device = 7;  // the fake's echo engine
  absl::StatusOr<std::unique_ptr<Engine>> e = LoadCudaModule(Fake("libfake_cuda_abi_ok.so"), o);
  ASSERT_TRUE(e.ok()) << e.status();
  const float w[6] = {1, 2, 3, 4, 5, 6};
  std::vector<double> out(2);
  const absl::Status s =
      (*e)->GramEigenvalues(MatrixView{w, 2, 3, 3, DType::kF32}, absl::MakeSpan(out), {});
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented) << s;
  EXPECT_THAT(s.message(), HasSubstr("gram_eigenvalues is NULL"));
}

TEST(CudaModule, MissingFileIsUnavailable) {
  absl::StatusOr<std::unique_ptr<Engine>> e = LoadCudaModule(Fake("absent.so"), {});
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), absl::StatusCode::kUnavailable);
}

// What `make run` does on a laptop or in CI: backend auto with the real
// module (built whenever the CUDA toolkit is) but no GPU, or no module.
TEST(CreateEngine, AutoWithoutGpuServesOnCpuAndSaysWhy) {
  std::string why;
  absl::StatusOr<std::unique_ptr<Engine>> e = CreateEngine("auto", 1, {}, &why);
  ASSERT_TRUE(e.ok()) << e.status();
  if ((*e)->Backend() == "cuda") {  // run on a GPU host
    EXPECT_THAT(why, HasSubstr("backend cuda: module loaded"));
    return;
  }
  EXPECT_EQ((*e)->Backend(), "cpu");
  EXPECT_THAT(why, HasSubstr("backend cpu: CUDA unavailable"));
  std::vector<double> out(1);
  const float w[4] = {1, 2, 3, 4};
  EXPECT_TRUE((*e)->ComputePR({MatrixView{w, 2, 2, 2, DType::kF32}}, {}, absl::MakeSpan(out)).ok());
  EXPECT_GT(out[0], 1.0);
  // Device memory is the CUDA backend's alone.
  absl::Status s =
      (*e)->ComputePRDevice({MatrixView{w, 2, 2, 2, DType::kF32}}, {}, absl::MakeSpan(out), nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented) << s;
  EXPECT_THAT(s.message(), HasSubstr("cpu backend takes host memory only"));
}

TEST(CreateEngine, CudaWithoutGpuFailsAndUnknownBackendIsInvalid) {
  std::string why;
  absl::StatusOr<std::unique_ptr<Engine>> e = CreateEngine("cuda", 1, {}, &why);
  if (e.ok()) {
    EXPECT_EQ((*e)->Backend(), "cuda");  // a GPU host
  } else {
    EXPECT_EQ(e.status().code(), absl::StatusCode::kUnavailable) << e.status();
  }
  EXPECT_EQ(CreateEngine("tpu", 1, {}, &why).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace rvd

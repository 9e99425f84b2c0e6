// The CUDA module boundary (kernels/cuda_module.h, server/backend.h): a
// module of another ABI is refused before any of its functions runs, a
// module without a device says so, the tuning table crosses as
// TuneDevice with the candidate's failures told from the harness's, and
// backend auto on a host without a GPU serves on the CPU and says why. The fake modules are built by CMake next
// to this test (FAKE_MODULE_DIR).
#include "server/backend.h"

#include <dlfcn.h>

#include <atomic>
#include <cstring>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cuda_module.h"
#include "kernels/tune_device.h"

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

// Engine::Tune() over the module's tuning table (ABI 5): what crosses the
// table (device info, the launch geometry, poison, timed launches, jobs),
// and which failures are the candidate's: a source that does not compile
// is a result with the log, a refused launch and a fault during the run
// are ABORTED, the harness's own failure and a device lost before the run
// are not.
TEST(CudaModule, TuneCrossesTheTableAndClassifiesFailures) {
  CudaEngineOptions o;
  o.device = 7;  // the fake's echo engine
  const std::string path = Fake("libfake_cuda_abi_ok.so");
  absl::StatusOr<std::unique_ptr<Engine>> e = LoadCudaModule(path, o);
  ASSERT_TRUE(e.ok()) << e.status();
  TuneDevice* tune = (*e)->Tune();
  ASSERT_NE(tune, nullptr);
  void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_NOLOAD);
  ASSERT_NE(h, nullptr);
  auto released = reinterpret_cast<int (*)()>(dlsym(h, "fake_module_released"));
  auto set_lost = reinterpret_cast<void (*)(const char*)>(dlsym(h, "fake_module_set_lost"));
  ASSERT_TRUE(released != nullptr && set_lost != nullptr);

  absl::StatusOr<TuneDevice::Info> info = tune->Device();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->sm, 90);
  EXPECT_EQ(info->arch, "sm_90a");
  EXPECT_EQ(info->dram_bytes_per_second, 4.8e12);
  EXPECT_EQ(info->fp32_flops_per_second, 6.7e13);
  EXPECT_EQ(info->l2_bytes, 50u << 20);

  absl::StatusOr<TuneDevice::Compiled> c = tune->Compile("syntax");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->module, nullptr);
  EXPECT_THAT(c->log, HasSubstr("candidate.cu(1): error"));
  EXPECT_THAT(c->log, HasSubstr("does not compile for sm_90a"));
  c = tune->Compile("no_nvrtc");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kUnavailable) << c.status();

  const float w[12] = {};
  const std::vector<MatrixView> batch = {MatrixView{w, 3, 4, 4, DType::kF32},
                                         MatrixView{w, 2, 6, 6, DType::kF32}};
  const int32_t jobs[2][6] = {{0, 0, 0, 3, 3, 1}, {1, 0, 0, 2, 2, 1}};
  TuneDevice::RunSpec spec;
  spec.threads = 128;
  spec.smem_bytes = 2;
  spec.grid = 1;
  spec.timed_launches = 3;
  spec.poison64 = 0x7ff800005eed0007ull;
  spec.poison32 = 0x7fc5e007u;
  const auto run = [&](const char* source) -> absl::StatusOr<TuneDevice::RunResult> {
    absl::StatusOr<TuneDevice::Compiled> m = tune->Compile(source);
    if (!m.ok()) return m.status();
    if (m->module == nullptr) return absl::InternalError("no module");
    absl::StatusOr<TuneDevice::RunResult> r = tune->Run(m->module, batch, jobs, 2, spec);
    tune->Release(m->module);
    return r;
  };
  const int released_before = released();
  absl::StatusOr<TuneDevice::RunResult> r = run("plain");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->g2, (std::vector<double>{200, 201}));
  EXPECT_EQ(r->trace, (std::vector<double>{128 + 2e3 + 1e6, 128 + 2e3 + 1e6}));
  uint32_t bits;
  std::memcpy(&bits, &r->maxabs[1], sizeof bits);
  EXPECT_EQ(bits, spec.poison32);
  ASSERT_EQ(r->seconds.size(), 3u);
  EXPECT_DOUBLE_EQ(r->seconds[0], 1e-3 + 7e-9);
  EXPECT_DOUBLE_EQ(r->seconds[2], 3e-3);
  EXPECT_FALSE(r->input_written);
  r = run("writes");
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->input_written);

  r = run("refused");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kAborted) << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr("CUDA_ERROR_INVALID_VALUE"));
  r = run("oom");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted) << r.status();
  r = run("fault");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kAborted) << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr("cudaErrorIllegalAddress"));
  // The fault lost the device: the next run is not the next candidate's.
  r = run("plain");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr("the device is lost"));
  set_lost(nullptr);
  EXPECT_EQ(released() - released_before, 6) << "every module released once";

  // Arguments the module must never see.
  absl::StatusOr<TuneDevice::Compiled> m = tune->Compile("plain");
  ASSERT_TRUE(m.ok() && m->module != nullptr);
  MatrixView blocked = batch[0];
  blocked.block_rows = 1;
  blocked.block_stride = 4;
  r = tune->Run(m->module, {blocked}, jobs, 1, spec);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  r = tune->Run(m->module, batch, jobs, 0, spec);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  tune->Release(m->module);
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

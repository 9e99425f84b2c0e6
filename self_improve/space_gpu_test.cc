// The built-in space's kernels on the GPU (label gpu; skips without a
// device): each sampled point compiled with NVRTC for the device's exact
// architecture, loaded with the driver API, launched as the harness will
// (rvd's jobs, outputs poisoned, a grid smaller than the jobs so the
// job loop is exercised) on wide, tall and unaligned matrices of every
// spectrum family, and its per-job sums checked against the float64 host
// reference (2e-6 relative, maxabs exact), twice for bitwise determinism.
// The first GPU check of the templates (they compile on the CPU in
// tune_space_nvrtc_test); RVD_TUNE_GPU_ALL=1 runs every point.
#include <cuda.h>
#include <nvrtc.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "kernels/cuda/descriptors.h"
#include "kernels/pr_check.h"
#include "kernels/test_matrices.h"
#include "self_improve/reference.h"
#include "self_improve/space.h"
#include "self_improve/verification.h"

namespace rvd::tune {
namespace {

#define CU_OK(call)                                                          \
  do {                                                                       \
    CUresult r_ = (call);                                                    \
    if (r_ != CUDA_SUCCESS) {                                                \
      const char* s_ = nullptr;                                              \
      cuGetErrorString(r_, &s_);                                             \
      FAIL() << #call << ": " << (s_ != nullptr ? s_ : "unknown");           \
    }                                                                        \
  } while (0)

std::vector<std::string> IncludeOptions() {
  std::vector<std::string> opts = {absl::StrCat("-I", RVD_SOURCE_DIR)};
  for (absl::string_view dir : absl::StrSplit(RVD_CUDA_INCLUDE_DIRS, '|', absl::SkipEmpty())) {
    opts.push_back(absl::StrCat("-I", dir));
    if (std::ifstream(absl::StrCat(dir, "/cccl/cuda/std/cstdint")).good()) {
      opts.push_back(absl::StrCat("-I", dir, "/cccl"));
    }
  }
  return opts;
}

// CUBIN for `arch` (e.g. sm_90a), or "" with the log in *log.
std::string CompileCubin(const std::string& source, const std::string& arch, std::string* log) {
  nvrtcProgram prog;
  nvrtcCreateProgram(&prog, source.c_str(), "candidate.cu", 0, nullptr, nullptr);
  std::vector<std::string> opts = IncludeOptions();
  opts.push_back(absl::StrCat("--gpu-architecture=", arch));
  opts.push_back("-std=c++17");
  std::vector<const char*> argv;
  for (const std::string& o : opts) argv.push_back(o.c_str());
  const nvrtcResult r = nvrtcCompileProgram(prog, static_cast<int>(argv.size()), argv.data());
  size_t n = 0;
  nvrtcGetProgramLogSize(prog, &n);
  log->assign(n, '\0');
  nvrtcGetProgramLog(prog, log->data());
  std::string cubin;
  if (r == NVRTC_SUCCESS) {
    nvrtcGetCUBINSize(prog, &n);
    cubin.assign(n, '\0');
    nvrtcGetCUBIN(prog, cubin.data());
  }
  nvrtcDestroyProgram(&prog);
  return cubin;
}

struct Shape {
  int count, rows, cols, pad;  // pad: elements between rows (NaN-filled)
};

class SpaceGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuInit(0) != CUDA_SUCCESS) GTEST_SKIP() << "no CUDA driver";
    int devices = 0;
    if (cuDeviceGetCount(&devices) != CUDA_SUCCESS || devices == 0) GTEST_SKIP() << "no GPU";
    CU_OK(cuDeviceGet(&device_, 0));
    CU_OK(cuDevicePrimaryCtxRetain(&ctx_, device_));
    CU_OK(cuCtxSetCurrent(ctx_));
    int major = 0, minor = 0;
    CU_OK(cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device_));
    CU_OK(cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device_));
    arch_ = absl::StrCat("sm_", major, minor, major == 9 && minor == 0 ? "a" : "");
  }
  void TearDown() override {
    if (ctx_ != nullptr) cuDevicePrimaryCtxRelease(device_);
  }

  // Checks point `p` on `dtype`; false on the first failure (reported).
  void Check(const SpacePoint& p, DType dtype) {
    SCOPED_TRACE(absl::StrCat(PointKey(p), " ", DTypeName(dtype), " on ", arch_));
    absl::StatusOr<Candidate> c = Emit(p, dtype);
    ASSERT_TRUE(c.ok()) << c.status();
    std::string log;
    const std::string cubin = CompileCubin(c->source, arch_, &log);
    ASSERT_FALSE(cubin.empty()) << log;
    CUmodule module;
    CU_OK(cuModuleLoadData(&module, cubin.data()));
    CUfunction fn;
    CU_OK(cuModuleGetFunction(&fn, module, kCandidateEntry));
    const CandidateLaunch launch = LaunchOf(p, dtype);
    if (launch.smem > 48 * 1024) {
      CU_OK(cuFuncSetAttribute(fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, launch.smem));
    }

    std::mt19937_64 rng = SeededRng(PointKey(p) + DTypeName(dtype));
    const Shape shapes[] = {{3, 128, 520, 8}, {2, 150, 96, 8}, {2, 40, 72, 1}, {1, 16, 16, 0}};
    std::vector<StoredMatrix> stored;
    for (const Shape& s : shapes) {
      for (int i = 0; i < s.count; ++i) {
        const Spectrum spec = kAllSpectra[stored.size() % 5];
        stored.push_back(Store(MakeMatrix(rng, s.rows, s.cols, spec), s.rows, s.cols, dtype,
                               s.pad, "m"));
      }
    }
    // Device copies, descriptors and jobs.
    std::vector<CUdeviceptr> data;
    std::vector<cuda::MatrixDesc> descs;
    std::vector<TuneJob> jobs;
    for (size_t m = 0; m < stored.size(); ++m) {
      const MatrixView& v = stored[m].view;
      CUdeviceptr d;
      CU_OK(cuMemAlloc(&d, stored[m].bytes.size()));
      CU_OK(cuMemcpyHtoD(d, stored[m].bytes.data(), stored[m].bytes.size()));
      data.push_back(d);
      cuda::MatrixDesc desc{};
      desc.data = reinterpret_cast<const void*>(d);
      desc.ld = v.ld;
      desc.rows = static_cast<int32_t>(v.rows);
      desc.cols = static_cast<int32_t>(v.cols);
      desc.n = static_cast<int32_t>(std::min(v.rows, v.cols));
      desc.k = static_cast<int32_t>(std::max(v.rows, v.cols));
      desc.tall = v.rows > v.cols;
      desc.aligned = (v.ld * static_cast<int64_t>(DTypeSize(dtype))) % 16 == 0;
      descs.push_back(desc);
      EnumerateTuneJobs(static_cast<int32_t>(m), desc.n, launch, &jobs);
    }
    const size_t nj = jobs.size();
    CUdeviceptr d_descs, d_jobs, d_g2, d_trace, d_max;
    CU_OK(cuMemAlloc(&d_descs, descs.size() * sizeof(cuda::MatrixDesc)));
    CU_OK(cuMemcpyHtoD(d_descs, descs.data(), descs.size() * sizeof(cuda::MatrixDesc)));
    CU_OK(cuMemAlloc(&d_jobs, nj * sizeof(TuneJob)));
    CU_OK(cuMemcpyHtoD(d_jobs, jobs.data(), nj * sizeof(TuneJob)));
    CU_OK(cuMemAlloc(&d_g2, nj * 8));
    CU_OK(cuMemAlloc(&d_trace, nj * 8));
    CU_OK(cuMemAlloc(&d_max, nj * 4));

    RunOutputs runs[2];
    for (int run = 0; run < 2; ++run) {
      const uint64_t p64 = PoisonBits64(run + 1);
      const uint32_t p32 = PoisonBits32(run + 1);
      std::vector<uint64_t> poison64(nj, p64);
      std::vector<uint32_t> poison32(nj, p32);
      CU_OK(cuMemcpyHtoD(d_g2, poison64.data(), nj * 8));
      CU_OK(cuMemcpyHtoD(d_trace, poison64.data(), nj * 8));
      CU_OK(cuMemcpyHtoD(d_max, poison32.data(), nj * 4));
      int num_jobs = static_cast<int>(nj);
      void* args[] = {&d_descs, &d_jobs, &num_jobs, &d_g2, &d_trace, &d_max};
      // Fewer blocks than jobs: each block takes several (the SM cap's case).
      const unsigned grid = static_cast<unsigned>(std::max<size_t>(1, nj / 2));
      CU_OK(cuLaunchKernel(fn, grid, 1, 1, static_cast<unsigned>(launch.threads), 1, 1,
                           static_cast<unsigned>(launch.smem), nullptr, args, nullptr));
      CU_OK(cuCtxSynchronize());
      runs[run].g2.resize(nj);
      runs[run].trace.resize(nj);
      runs[run].maxabs.resize(nj);
      CU_OK(cuMemcpyDtoH(runs[run].g2.data(), d_g2, nj * 8));
      CU_OK(cuMemcpyDtoH(runs[run].trace.data(), d_trace, nj * 8));
      CU_OK(cuMemcpyDtoH(runs[run].maxabs.data(), d_max, nj * 4));
    }
    // Every matrix checked, against the reference and the oracle.
    std::vector<MatrixReference> refs;
    for (size_t m = 0; m < stored.size(); ++m) {
      MatrixReference ref;
      ref.matrix = static_cast<int>(m);
      std::vector<TuneJob> mine;
      for (size_t j = 0; j < nj; ++j) {
        if (jobs[j].matrix != static_cast<int32_t>(m)) continue;
        ref.jobs.push_back(static_cast<int>(j));
        mine.push_back(jobs[j]);
      }
      ref.sums = ReferenceMatrixSums(stored[m].view, mine);
      absl::StatusOr<double> pr = OraclePR(stored[m].view);
      ASSERT_TRUE(pr.ok());
      ref.pr = *pr;
      refs.push_back(std::move(ref));
    }
    CorrectnessEvidence e;
    Evaluate(refs, runs[0], runs[1], 1, 2, true, kExactPrTolerance, &e);
    EXPECT_EQ(e.outputs_unwritten, 0) << e.first_mismatches;
    EXPECT_EQ(e.sum_mismatches, 0) << e.first_mismatches;
    EXPECT_EQ(e.pr_mismatches, 0) << e.first_mismatches;
    EXPECT_TRUE(e.deterministic);
    std::printf("%-40s %-5s jobs %4zu  max PR error %.2e  sums %.2e\n", PointKey(p).c_str(),
                DTypeName(dtype), nj, e.max_pr_rel_error, e.max_sum_rel_error);
    for (CUdeviceptr d : data) cuMemFree(d);
    for (CUdeviceptr d : {d_descs, d_jobs, d_g2, d_trace, d_max}) cuMemFree(d);
    cuModuleUnload(module);
  }

  CUdevice device_ = 0;
  CUcontext ctx_ = nullptr;
  std::string arch_;
};

TEST_F(SpaceGpuTest, SampledPointsComputeTheContract) {
  const bool all = std::getenv("RVD_TUNE_GPU_ALL") != nullptr;
  for (DType dtype : {DType::kBF16, DType::kF16, DType::kF32}) {
    const std::vector<SpacePoint> points = Points(DefaultSpace(), dtype);
    std::vector<SpacePoint> sample = {NaivePoint()};
    std::vector<SpacePoint> tiled;
    for (const SpacePoint& p : points) {
      if (all || p.family == Family::kTiledFma) tiled.push_back(p);
    }
    const size_t step = all ? 1 : std::max<size_t>(1, tiled.size() / 8);
    for (size_t i = 0; i < tiled.size(); i += step) sample.push_back(tiled[i]);
    for (const SpacePoint& p : sample) {
      Check(p, dtype);
      if (HasFatalFailure()) return;
    }
  }
}

}  // namespace
}  // namespace rvd::tune

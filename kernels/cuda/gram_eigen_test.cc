// GPU tests of the Gram eigenvalues through the module's table (label gpu;
// on the H200 host: build/bin/cuda_gram_eigen_test). The test drives
// rvd_cuda_module_table()->gram_eigenvalues as the daemon's ModuleEngine
// does (module.cc linked in), on fresh random matrices of every spectrum,
// wide, tall and square, in every dtype with padded rows, from host memory
// and from device memory, and checks them against the float64 SVD oracle's
// singular values squared with the CPU engine's tolerance
// (kernels/gram_eigen_check.h); also the CPU engine's eigenvalues of the
// same matrices. A small device cap makes the long side go in several
// chunks. The gate must fail on a matrix whose last chunk of the long side
// is zeroed (what a dropped chunk computes); errors: NaN/Inf, a bad dtype,
// a cancelled call, a Gram over the cap; and a timing line. Without a GPU
// every test skips.
//
// Every test prints the seed of its inputs: RVD_TEST_SEED=<seed>
// cuda_gram_eigen_test --gtest_filter=<test> replays it.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cuda_module.h"
#include "kernels/engine.h"
#include "kernels/gram_eigen_check.h"
#include "kernels/oracle_svd.h"
#include "kernels/test_matrices.h"

extern "C" const rvd_cuda_module* rvd_cuda_module_table();

namespace rvd {
namespace {

using ::testing::HasSubstr;

rvd_matrix ToModule(const MatrixView& v, int32_t memory) {
  return rvd_matrix{v.data, v.rows, v.cols, v.ld, static_cast<int32_t>(v.dtype),
                    memory, v.block_rows, v.block_stride};
}

class CudaGramEigenTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
      GTEST_SKIP() << "no CUDA device";
    }
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    const std::string name = absl::StrCat(info->test_suite_name(), ".", info->name());
    rng_ = SeededRng(name);
    const std::string replay = absl::StrCat("replay: RVD_TEST_SEED=", TestSeed(),
                                            " cuda_gram_eigen_test --gtest_filter='", name, "'");
    std::printf("%s\n", replay.c_str());
    trace_.emplace(__FILE__, __LINE__, replay);
    module_ = rvd_cuda_module_table();
    ASSERT_EQ(module_->abi_version, RVD_CUDA_MODULE_ABI_VERSION);
    ASSERT_NE(module_->gram_eigenvalues, nullptr);
  }
  void TearDown() override {
    for (rvd_cuda_engine* e : engines_) module_->destroy(e);
  }

  rvd_cuda_engine* Create(uint64_t max_device_bytes = 4ull << 30, int32_t streams = 4) {
    const rvd_cuda_options o{0, streams, max_device_bytes, 0};
    rvd_status status{};
    rvd_cuda_engine* e = module_->create(&o, &status);
    EXPECT_NE(e, nullptr) << status.message;
    if (e != nullptr) engines_.push_back(e);
    return e;
  }

  // The module's eigenvalues of m (host or device memory), poisoned first;
  // the status's code into *code.
  std::vector<double> Eigen(rvd_cuda_engine* e, const MatrixView& m, int32_t memory,
                            int32_t* code, const rvd_call* call = nullptr,
                            std::string* message = nullptr) {
    std::vector<double> out(static_cast<size_t>(std::min(m.rows, m.cols)),
                            std::numeric_limits<double>::quiet_NaN());
    const rvd_matrix mm = ToModule(m, memory);
    rvd_status status{};
    *code = module_->gram_eigenvalues(e, &mm, out.data(), call, &status);
    EXPECT_EQ(*code, status.code);
    if (message != nullptr) *message = status.message;
    return out;
  }

  // The same matrix (same ld) in device memory; freed at the end of the test.
  MatrixView OnDevice(const StoredMatrix& s) {
    void* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, s.bytes.size()), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(p, s.bytes.data(), s.bytes.size(), cudaMemcpyHostToDevice),
              cudaSuccess);
    device_.emplace_back(p, cudaFree);
    MatrixView v = s.view;
    v.data = p;
    return v;
  }

  const rvd_cuda_module* module_ = nullptr;
  std::vector<rvd_cuda_engine*> engines_;
  std::vector<std::unique_ptr<void, cudaError_t (*)(void*)>> device_;
  std::mt19937_64 rng_;
  std::optional<::testing::ScopedTrace> trace_;
};

TEST_F(CudaGramEigenTest, MatchesTheSvdOracleFromHostAndDeviceMemory) {
  // The default cap (one chunk for these shapes) and a 64 MiB cap over 4
  // streams (an 8 MiB budget: 600 x 4000 goes in chunks of ~700 columns,
  // 9000 x 300 in chunks of ~1800 rows).
  struct Case {
    int64_t rows, cols;
    std::vector<Spectrum> spectra;
    std::vector<DType> dtypes;
  };
  const std::vector<Spectrum> all(std::begin(kAllSpectra), std::end(kAllSpectra));
  const std::vector<DType> dtypes = {DType::kF32, DType::kBF16, DType::kF16};
  const std::vector<Case> cases = {
      {64, 512, all, dtypes},   {512, 64, all, dtypes},
      {128, 128, all, dtypes},  {1, 300, all, dtypes},
      {300, 1, all, dtypes},    {37, 1000, all, dtypes},
      {600, 4000, {Spectrum::kPowerLaw, Spectrum::kRankDeficient}, {DType::kF32, DType::kBF16}},
      {9000, 300, {Spectrum::kFlat, Spectrum::kRankOne}, {DType::kF32, DType::kF16}}};
  rvd_cuda_engine* big = Create();
  rvd_cuda_engine* small = Create(64ull << 20, 4);
  ASSERT_NE(big, nullptr);
  ASSERT_NE(small, nullptr);
  std::unique_ptr<Engine> cpu = NewCpuEngine(2);
  double worst = 0, worst_vs_cpu = 0;
  int matrices = 0;
  for (const Case& c : cases) {
    for (Spectrum spec : c.spectra) {
      const std::vector<double> w = MakeMatrix(rng_, c.rows, c.cols, spec);
      for (DType dt : c.dtypes) {
        const int64_t pad = std::uniform_int_distribution<int64_t>(0, 5)(rng_);
        const StoredMatrix m = Store(w, c.rows, c.cols, dt, pad,
                                     absl::StrCat(SpectrumName(spec), " ", c.rows, "x", c.cols,
                                                  " pad ", pad, " ", DTypeName(dt)));
        absl::StatusOr<std::vector<double>> sv = SvdSingularValues(m.view, 0);
        ASSERT_TRUE(sv.ok()) << sv.status();
        std::vector<double> on_cpu(static_cast<size_t>(std::min(c.rows, c.cols)));
        ASSERT_TRUE(cpu->GramEigenvalues(m.view, absl::MakeSpan(on_cpu), CallOptions()).ok());
        const MatrixView dev = OnDevice(m);
        for (rvd_cuda_engine* e : {big, small}) {
          for (int32_t memory : {RVD_MEMORY_HOST, RVD_MEMORY_DEVICE}) {
            int32_t code = -1;
            const std::vector<double> got =
                Eigen(e, memory == RVD_MEMORY_HOST ? m.view : dev, memory, &code);
            ASSERT_EQ(code, 0) << m.label;
            const EigenCheck check = CheckGramEigenvalues(got, *sv, std::max(c.rows, c.cols));
            EXPECT_EQ(check.result.mismatches, 0)
                << m.label << (e == big ? " default cap" : " 64 MiB cap")
                << (memory == RVD_MEMORY_HOST ? " host" : " device") << ":\n"
                << check.result.report;
            worst = std::max(worst, check.max_abs_error_rel_to_max);
            for (size_t i = 0; i < got.size(); ++i) {
              worst_vs_cpu = std::max(
                  worst_vs_cpu, std::fabs(got[i] - on_cpu[i]) / std::max(on_cpu.back(), 1e-300));
            }
          }
        }
        ++matrices;
      }
    }
  }
  std::printf("%d matrices x {default, 64 MiB cap} x {host, device}: max |error| / lambda_max "
              "%.3g vs the oracle, %.3g vs the CPU engine\n",
              matrices, worst, worst_vs_cpu);
  // Every call was counted on its path.
  double served = 0;
  module_->stats(
      big,
      [](void* ctx, const char* kind, const char* key, double value) {
        if (std::strcmp(kind, "served") == 0 &&
            std::strcmp(key, "gram_eigen/cublas-dsyrk-cusolver-dsyevd") == 0) {
          *static_cast<double*>(ctx) = value;
        }
      },
      &served);
  EXPECT_EQ(served, 2.0 * matrices);
}

TEST_F(CudaGramEigenTest, TheGateCatchesADroppedChunk) {
  // What an engine that skipped the last chunk of the long side computes:
  // the eigenvalues of the matrix with those columns zeroed. The check
  // against the whole matrix's oracle must fail.
  rvd_cuda_engine* e = Create();
  ASSERT_NE(e, nullptr);
  const int64_t rows = 600, cols = 4000;
  std::vector<double> w = MakeMatrix(rng_, rows, cols, Spectrum::kPowerLaw);
  const StoredMatrix whole = Store(w, rows, cols, DType::kF32, 0, "whole");
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = cols - 700; j < cols; ++j) w[i * cols + j] = 0;
  }
  const StoredMatrix cut = Store(w, rows, cols, DType::kF32, 0, "last chunk zeroed");
  absl::StatusOr<std::vector<double>> sv = SvdSingularValues(whole.view, 0);
  ASSERT_TRUE(sv.ok());
  int32_t code = -1;
  const std::vector<double> got = Eigen(e, cut.view, RVD_MEMORY_HOST, &code);
  ASSERT_EQ(code, 0);
  EXPECT_GT(CheckGramEigenvalues(got, *sv, cols).result.mismatches, 0);
}

// Not a gate, a measurement: the time of one call (median of 5, host
// memory, after a warm-up) at a typical activation (2048 tokens x 1024
// features, bf16) and at the side limit (4096 x 4096 f32), for the docs.
TEST_F(CudaGramEigenTest, TimingLine) {
  rvd_cuda_engine* e = Create();
  ASSERT_NE(e, nullptr);
  for (const auto& [rows, cols, dt] : std::vector<std::tuple<int64_t, int64_t, DType>>{
           {2048, 1024, DType::kBF16}, {4096, 4096, DType::kF32}}) {
    const StoredMatrix m = Store(MakeMatrix(rng_, rows, cols, Spectrum::kGaussian, 1.0), rows,
                                 cols, dt, 0, "timing");
    std::vector<double> ms;
    std::vector<double> got;
    for (int run = 0; run < 6; ++run) {
      int32_t code = -1;
      const auto t0 = std::chrono::steady_clock::now();
      got = Eigen(e, m.view, RVD_MEMORY_HOST, &code);
      const auto t1 = std::chrono::steady_clock::now();
      ASSERT_EQ(code, 0);
      if (run > 0) ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    }
    std::sort(ms.begin(), ms.end());
    for (size_t i = 1; i < got.size(); ++i) ASSERT_LE(got[i - 1], got[i]);
    EXPECT_GT(got.back(), 0.0);
    std::printf("gram_eigenvalues %lldx%lld %s: %.2f ms median of 5 (min %.2f, max %.2f)\n",
                static_cast<long long>(rows), static_cast<long long>(cols), DTypeName(dt),
                ms[2], ms.front(), ms.back());
  }
}

TEST_F(CudaGramEigenTest, Errors) {
  rvd_cuda_engine* e = Create();
  ASSERT_NE(e, nullptr);
  std::vector<double> w = MakeMatrix(rng_, 40, 900, Spectrum::kGaussian, 1.0);
  w[40 * 900 - 1] = std::numeric_limits<double>::quiet_NaN();
  for (DType dt : {DType::kF32, DType::kBF16}) {
    const StoredMatrix m = Store(w, 40, 900, dt, 2, "nan");
    for (int32_t memory : {RVD_MEMORY_HOST, RVD_MEMORY_DEVICE}) {
      int32_t code = -1;
      std::string message;
      const std::vector<double> out = Eigen(
          e, memory == RVD_MEMORY_HOST ? m.view : OnDevice(m), memory, &code, nullptr, &message);
      EXPECT_EQ(code, static_cast<int32_t>(absl::StatusCode::kInvalidArgument)) << message;
      EXPECT_THAT(message, HasSubstr("NaN or Inf"));
      for (double x : out) EXPECT_TRUE(std::isnan(x));
    }
  }
  w[40 * 900 - 1] = 1.0;
  const StoredMatrix ok = Store(w, 40, 900, DType::kF32, 0, "ok");
  rvd_matrix bad = ToModule(ok.view, RVD_MEMORY_HOST);
  bad.dtype = 7;
  std::vector<double> out(40);
  rvd_status status{};
  EXPECT_EQ(module_->gram_eigenvalues(e, &bad, out.data(), nullptr, &status),
            static_cast<int32_t>(absl::StatusCode::kInvalidArgument));

  std::atomic<bool> cancel{true};
  const rvd_call call{nullptr, &cancel};
  int32_t code = -1;
  Eigen(e, ok.view, RVD_MEMORY_HOST, &code, &call);
  EXPECT_EQ(code, static_cast<int32_t>(absl::StatusCode::kCancelled));

  // A 2048 x 2048 float64 Gram (32 MiB) under a 16 MiB cap.
  rvd_cuda_engine* capped = Create(16ull << 20, 1);
  ASSERT_NE(capped, nullptr);
  const StoredMatrix large =
      Store(MakeMatrix(rng_, 2048, 2100, Spectrum::kGaussian, 1.0), 2048, 2100, DType::kBF16, 0,
            "large");
  std::string message;
  Eigen(capped, large.view, RVD_MEMORY_HOST, &code, nullptr, &message);
  EXPECT_EQ(code, static_cast<int32_t>(absl::StatusCode::kResourceExhausted)) << message;

  // The engine serves on after every error.
  Eigen(e, ok.view, RVD_MEMORY_HOST, &code);
  EXPECT_EQ(code, 0);
  EXPECT_EQ(module_->lost(e), nullptr);
}

}  // namespace
}  // namespace rvd

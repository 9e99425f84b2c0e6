// The CUDA module's tuning table (rvd_cuda_tune, tune.cc) end to end (label
// gpu; on the H200 host: build/bin/cuda_tune_harness_test). Candidates are
// compiled through the table (NVRTC for the device's exact arch, driver-API
// load) and run under its harness on 20 fresh input sets of wide, tall,
// square and edge-tiled f32 matrices (padded rows, every spectrum), each
// run twice with the run's poison; their per-job sums go through the
// self_improve verifier (Evaluate: float64 reference sums and SVD-oracle
// PR) and Judge (JudgeCorrectness, the engine's 2e-6). The built-in naive
// candidate and this file's plain kernel are accepted; a syntax error
// returns NVRTC's log; the mutants (no output written, half of K, a write
// to the input, a device-side launch on another stream, bf16-truncated
// inputs) are rejected for their reason. NvrtcOnly runs without a GPU.
//
// Every test prints its seed: RVD_TEST_SEED=<seed>
// cuda_tune_harness_test --gtest_filter=<test> replays it.
#include <cuda_runtime_api.h>
#include <nvrtc.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cuda_module.h"
#include "kernels/engine.h"
#include "kernels/test_matrices.h"
#include "self_improve/acceptance.h"
#include "self_improve/candidate_abi.h"
#include "self_improve/generator.h"
#include "self_improve/reference.h"
#include "self_improve/space.h"
#include "self_improve/verification.h"

extern "C" const rvd_cuda_module* rvd_cuda_module_table();

namespace rvd::tune {
namespace {

using ::testing::HasSubstr;

// A plain correct candidate for f32 inputs: each block takes jobs
// blockIdx.x, +gridDim.x, ...; its threads take the tile's entries on or
// above the diagonal; float64 sums reduced in a fixed order. MUTANT_*
// macros (prepended) break it one way each.
constexpr char kPlain[] = R"(// rvd-launch: threads=128 smem=0 tile_rows=16 tile_cols=16
#include "kernels/cuda/descriptors.h"
#include "self_improve/candidate_abi.h"
__device__ float Op(const rvd::cuda::MatrixDesc& d, int r, int p) {
  const float* w = static_cast<const float*>(d.data);
  float x = d.tall ? w[(long long)p * d.ld + r] : w[(long long)r * d.ld + p];
#ifdef MUTANT_LOW_PRECISION
  x = __uint_as_float(__float_as_uint(x) & 0xffff0000u);
#endif
  return x;
}
extern "C" __global__ void rvd_tune_candidate(const rvd::cuda::MatrixDesc* mats,
    const rvd::tune::TuneJob* jobs, int num_jobs, double* g2, double* trace, float* maxabs) {
  __shared__ double s_g2[128];
  __shared__ double s_tr[128];
  __shared__ float s_mx[128];
  __shared__ int s_nan[128];
  for (int j = blockIdx.x; j < num_jobs; j += gridDim.x) {
    const rvd::tune::TuneJob job = jobs[j];
    const rvd::cuda::MatrixDesc d = mats[job.matrix];
    int kk = d.k;
#ifdef MUTANT_PARTIAL
    kk = d.k / 2;
#endif
    double a2 = 0, tr = 0;
    for (int e = threadIdx.x; e < job.rows * job.cols; e += blockDim.x) {
      const int r = job.row0 + e / job.cols, c = job.col0 + e % job.cols;
      if (c < r) continue;
      double g = 0;
      for (int p = 0; p < kk; ++p) g += (double)Op(d, r, p) * (double)Op(d, c, p);
      a2 += (c == r ? 1.0 : 2.0) * g * g;
      if (c == r) tr += g;
    }
    float mx = 0;
    int nan = 0;
    for (int e = threadIdx.x; e < (job.rows + job.cols) * d.k; e += blockDim.x) {
      const int i = e / d.k, p = e % d.k;
      const int r = i < job.rows ? job.row0 + i : job.col0 + (i - job.rows);
      const float x = fabsf(Op(d, r, p));
      if (x != x) nan = 1; else mx = fmaxf(mx, x);
    }
    s_g2[threadIdx.x] = a2;
    s_tr[threadIdx.x] = tr;
    s_mx[threadIdx.x] = mx;
    s_nan[threadIdx.x] = nan;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s /= 2) {
      if (threadIdx.x < s) {
        s_g2[threadIdx.x] += s_g2[threadIdx.x + s];
        s_tr[threadIdx.x] += s_tr[threadIdx.x + s];
        s_mx[threadIdx.x] = fmaxf(s_mx[threadIdx.x], s_mx[threadIdx.x + s]);
        s_nan[threadIdx.x] |= s_nan[threadIdx.x + s];
      }
      __syncthreads();
    }
    if (threadIdx.x == 0) {
#ifndef MUTANT_STALE
      g2[j] = s_g2[0];
      trace[j] = s_tr[0];
      maxabs[j] = s_nan[0] ? __int_as_float(0x7fc00000) : s_mx[0];
#endif
#ifdef MUTANT_WRITES_INPUT
      if (d.ld > d.cols) const_cast<float*>(static_cast<const float*>(d.data))[d.cols] = 0.f;
#endif
#ifdef MUTANT_SIDE_STREAM
      if (j == 0) rvd_tune_candidate<<<1, 1>>>(mats, jobs, 1, g2, trace, maxabs);
#endif
    }
    __syncthreads();
  }
}
)";

std::string Mutant(const char* macro) {
  // After the annotation line, so the source still starts with it.
  std::string s = kPlain;
  const size_t eol = s.find('\n');
  return s.insert(eol + 1, absl::StrCat("#define ", macro, "\n"));
}

constexpr char kSyntaxError[] = R"(// rvd-launch: threads=128 smem=0 tile_rows=16 tile_cols=16
#include "kernels/cuda/descriptors.h"
#include "self_improve/candidate_abi.h"
extern "C" __global__ void rvd_tune_candidate(const rvd::cuda::MatrixDesc* mats,
    const rvd::tune::TuneJob* jobs, int num_jobs, double* g2, double* trace, float* maxabs) {
  g2[0] = mats[0].n +;
}
)";

// NVRTC alone (no GPU): the sources compile, or fail, as the GPU tests
// expect them to through the module (the same include path).
std::string NvrtcLog(const std::string& source, bool* ok) {
  nvrtcProgram prog;
  nvrtcCreateProgram(&prog, source.c_str(), "candidate.cu", 0, nullptr, nullptr);
  std::vector<std::string> opts = {absl::StrCat("-I", RVD_SOURCE_DIR)};
  for (absl::string_view dir : absl::StrSplit(RVD_CUDA_INCLUDE_DIRS, '|', absl::SkipEmpty())) {
    opts.push_back(absl::StrCat("-I", dir));
    if (std::ifstream(absl::StrCat(dir, "/cccl/cuda/std/cstdint")).good()) {
      opts.push_back(absl::StrCat("-I", dir, "/cccl"));
    }
  }
  opts.push_back("--gpu-architecture=sm_90a");
  opts.push_back("-std=c++17");
  std::vector<const char*> argv;
  for (const std::string& o : opts) argv.push_back(o.c_str());
  *ok = nvrtcCompileProgram(prog, static_cast<int>(argv.size()), argv.data()) == NVRTC_SUCCESS;
  size_t n = 0;
  nvrtcGetProgramLogSize(prog, &n);
  std::string log(n, '\0');
  nvrtcGetProgramLog(prog, log.data());
  nvrtcDestroyProgram(&prog);
  return log;
}

// Writes the grid's size for every job its blocks take (the SM-cap test).
constexpr char kGridProbe[] = R"(// rvd-launch: threads=32 smem=0 tile_rows=16 tile_cols=16
#include "kernels/cuda/descriptors.h"
#include "self_improve/candidate_abi.h"
extern "C" __global__ void rvd_tune_candidate(const rvd::cuda::MatrixDesc* mats,
    const rvd::tune::TuneJob* jobs, int num_jobs, double* g2, double* trace, float* maxabs) {
  for (int j = blockIdx.x; j < num_jobs; j += gridDim.x) {
    if (threadIdx.x == 0) {
      g2[j] = gridDim.x;
      trace[j] = 0;
      maxabs[j] = 0;
    }
  }
}
)";

TEST(TuneHarnessNvrtcOnly, SourcesCompileAsExpected) {
  bool ok = false;
  for (const char* m : {"MUTANT_NONE", "MUTANT_STALE", "MUTANT_PARTIAL", "MUTANT_WRITES_INPUT",
                        "MUTANT_LOW_PRECISION"}) {
    const std::string log = NvrtcLog(Mutant(m), &ok);
    EXPECT_TRUE(ok) << m << ": " << log;
  }
  std::string log = NvrtcLog(kGridProbe, &ok);
  EXPECT_TRUE(ok) << "grid probe: " << log;
  log = NvrtcLog(kSyntaxError, &ok);
  EXPECT_FALSE(ok);
  EXPECT_THAT(log, HasSubstr("error"));
  log = NvrtcLog(Mutant("MUTANT_SIDE_STREAM"), &ok);
  EXPECT_FALSE(ok) << "a device-side launch (a stream rvd does not time) must not compile";
  EXPECT_THAT(log, HasSubstr("device-side kernel launch"));
}

struct Checked {
  CorrectnessEvidence evidence;
  Decision decision;
  std::vector<double> seconds;
};

class CudaTuneHarnessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
      GTEST_SKIP() << "no CUDA device";
    }
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    const std::string name = absl::StrCat(info->test_suite_name(), ".", info->name());
    rng_ = SeededRng(name);
    std::printf("replay: RVD_TEST_SEED=%llu cuda_tune_harness_test --gtest_filter='%s'\n",
                static_cast<unsigned long long>(TestSeed()), name.c_str());
    module_ = rvd_cuda_module_table();
    ASSERT_EQ(module_->abi_version, RVD_CUDA_MODULE_ABI_VERSION);
    ASSERT_NE(module_->tune, nullptr);
    tune_ = module_->tune;
    const rvd_cuda_options o{0, 2, 1ull << 30, 0};
    rvd_status status{};
    engine_ = module_->create(&o, &status);
    ASSERT_NE(engine_, nullptr) << status.message;
    rvd_tune_device dev{};
    ASSERT_EQ(tune_->device(engine_, &dev, &status), 0) << status.message;
    std::printf("device sm_%d, NVRTC arch %s, L2 %llu bytes\n", dev.sm, dev.arch,
                static_cast<unsigned long long>(dev.l2_bytes));
  }
  void TearDown() override {
    if (engine_ != nullptr) module_->destroy(engine_);
  }

  // Compiles `source` through the table; nullptr with the log in *log.
  rvd_tune_module* Compile(const std::string& source, std::string* log, rvd_status* status) {
    char* text = nullptr;
    rvd_tune_module* m = tune_->compile(engine_, source.c_str(), &text, status);
    *log = text != nullptr ? text : "";
    tune_->free_log(text);
    return m;
  }

  // 20 fresh input sets, each run twice, through Evaluate and the Judge.
  Checked Check(const std::string& source, int timed = 0) {
    Checked out;
    std::string log;
    rvd_status status{};
    rvd_tune_module* m = Compile(source, &log, &status);
    EXPECT_NE(m, nullptr) << status.message << "\n" << log;
    if (m == nullptr) return out;
    absl::StatusOr<CandidateLaunch> launch = ParseLaunchAnnotation(source);
    EXPECT_TRUE(launch.ok()) << launch.status();
    if (!launch.ok()) return out;
    struct Shape {
      int rows, cols;
    };
    const Shape shapes[] = {{24, 40}, {40, 24}, {32, 32}, {17, 50}};
    for (int input = 0; input < 20; ++input) {
      std::vector<StoredMatrix> stored;
      std::vector<rvd_matrix> batch;
      std::vector<TuneJob> jobs;
      for (const Shape& s : shapes) {
        const Spectrum spec = kAllSpectra[(input + stored.size()) % 5];
        stored.push_back(
            Store(MakeMatrix(rng_, s.rows, s.cols, spec), s.rows, s.cols, DType::kF32, 8, "m"));
      }
      for (size_t i = 0; i < stored.size(); ++i) {
        const MatrixView& v = stored[i].view;
        batch.push_back(rvd_matrix{v.data, v.rows, v.cols, v.ld, RVD_DTYPE_F32,
                                   RVD_MEMORY_HOST, 0, 0});
        EnumerateTuneJobs(static_cast<int32_t>(i),
                          static_cast<int>(std::min(v.rows, v.cols)), *launch, &jobs);
      }
      const size_t nj = jobs.size();
      RunOutputs runs[2];
      bool written = false;
      for (int run = 0; run < 2; ++run) {
        runs[run].g2.assign(nj, 0);
        runs[run].trace.assign(nj, 0);
        runs[run].maxabs.assign(nj, 0);
        std::vector<double> seconds(input == 0 ? timed : 0);
        rvd_tune_run io{};
        io.threads = static_cast<uint32_t>(launch->threads);
        io.smem_bytes = static_cast<uint32_t>(launch->smem);
        io.grid = static_cast<uint32_t>(std::max<size_t>(1, nj / 2));  // blocks loop
        io.timed_launches = static_cast<uint32_t>(seconds.size());
        io.poison64 = PoisonBits64(run + 1);
        io.poison32 = PoisonBits32(run + 1);
        io.g2 = runs[run].g2.data();
        io.trace = runs[run].trace.data();
        io.maxabs = runs[run].maxabs.data();
        io.seconds = seconds.data();
        const int32_t code = tune_->run(engine_, m, batch.data(), batch.size(), jobs.data(),
                                        nj, &io, &status);
        EXPECT_EQ(code, 0) << status.message;
        if (code != 0) {
          tune_->release(engine_, m);
          return out;
        }
        written = written || io.input_written != 0;
        if (run == 0 && input == 0) out.seconds = seconds;  // the timed input
      }
      std::vector<MatrixReference> refs;
      for (size_t i = 0; i < stored.size(); ++i) {
        MatrixReference ref;
        ref.matrix = static_cast<int>(i);
        for (size_t j = 0; j < nj; ++j) {
          if (jobs[j].matrix != static_cast<int32_t>(i)) continue;
          ref.jobs.push_back(static_cast<int>(j));
          ref.sums.push_back(ReferenceJobSums(stored[i].view, jobs[j]));
        }
        absl::StatusOr<double> pr = OraclePR(stored[i].view);
        EXPECT_TRUE(pr.ok()) << pr.status();
        ref.pr = pr.ok() ? *pr : 0;
        refs.push_back(std::move(ref));
      }
      Evaluate(refs, runs[0], runs[1], 1, 2, !written, kExactPrTolerance, &out.evidence);
    }
    tune_->release(engine_, m);
    out.decision = JudgeCorrectness(AcceptanceRules{}, out.evidence);
    std::printf("verdict %s: %s\n", VerdictName(out.decision.verdict),
                out.decision.reason.c_str());
    return out;
  }

  std::mt19937_64 rng_;
  const rvd_cuda_module* module_ = nullptr;
  const rvd_cuda_tune* tune_ = nullptr;
  rvd_cuda_engine* engine_ = nullptr;
};

// The measured ceilings (the acceptance rule's memory-bandwidth floor and
// the bottleneck signals read them): nonzero, below the device's peak from
// its attributes (DRAM: the bus width times the double-data-rate memory
// clock; fp32: an FMA per lane per clock, 128 lanes per SM from sm_86 on, 64
// before), above a quarter of it; an H200 within its specification (4.8
// TB/s, 67 TFLOP/s). A second device() call answers the same (cached).
TEST_F(CudaTuneHarnessTest, CeilingsAreMeasuredAndPlausible) {
  rvd_tune_device dev{}, again{};
  rvd_status status{};
  ASSERT_EQ(tune_->device(engine_, &dev, &status), 0) << status.message;
  ASSERT_EQ(tune_->device(engine_, &again, &status), 0) << status.message;
  EXPECT_EQ(again.dram_bytes_per_s, dev.dram_bytes_per_s);
  EXPECT_EQ(again.fp32_flop_per_s, dev.fp32_flop_per_s);
  int ordinal = 0, mem_khz = 0, bus_bits = 0, clock_khz = 0, sms = 0;
  ASSERT_EQ(cudaGetDevice(&ordinal), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&mem_khz, cudaDevAttrMemoryClockRate, ordinal), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, ordinal),
            cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, ordinal), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, ordinal), cudaSuccess);
  cudaDeviceProp p{};
  ASSERT_EQ(cudaGetDeviceProperties(&p, ordinal), cudaSuccess);
  const double dram_peak = 2.0 * mem_khz * 1e3 * bus_bits / 8;
  const int lanes = dev.sm >= 86 ? 128 : 64;
  const double fp32_peak = 2.0 * lanes * sms * clock_khz * 1e3;
  std::printf("%s: DRAM %.3g B/s measured, %.3g peak; fp32 %.3g FLOP/s measured, %.3g peak\n",
              p.name, dev.dram_bytes_per_s, dram_peak, dev.fp32_flop_per_s, fp32_peak);
  EXPECT_GT(dev.dram_bytes_per_s, 0.25 * dram_peak);
  EXPECT_LE(dev.dram_bytes_per_s, 1.05 * dram_peak);  // the attribute's clock is rounded
  EXPECT_GT(dev.fp32_flop_per_s, 0.25 * fp32_peak);
  EXPECT_LE(dev.fp32_flop_per_s, fp32_peak);
  if (std::string(p.name).find("H200") != std::string::npos) {
    EXPECT_GT(dev.dram_bytes_per_s, 2.0e12);
    EXPECT_LE(dev.dram_bytes_per_s, 4.8e12);
    EXPECT_GT(dev.fp32_flop_per_s, 3.0e13);
    EXPECT_LE(dev.fp32_flop_per_s, 6.7e13);
  }
}

// A run's grid stays within the engine's SM cap (issue 17 §1): a kernel
// that writes the grid's size for every job it takes, run with one block
// per job asked, on an engine capped at 3 SMs and on the fixture's
// uncapped one.
TEST_F(CudaTuneHarnessTest, TheGridIsCappedAtTheEnginesSms) {
  rvd_status status{};
  const rvd_cuda_options capped_options{0, 2, 1ull << 30, 3};
  rvd_cuda_engine* capped = module_->create(&capped_options, &status);
  ASSERT_NE(capped, nullptr) << status.message;
  std::vector<float> w(64 * 128, 1.0f);
  const rvd_matrix batch{w.data(), 64, 128, 128, RVD_DTYPE_F32, RVD_MEMORY_HOST, 0, 0};
  std::vector<TuneJob> jobs;
  EnumerateTuneJobs(0, 64, CandidateLaunch{32, 0, 16, 16}, &jobs);  // 10 jobs
  for (rvd_cuda_engine* e : {capped, engine_}) {
    char* log = nullptr;
    rvd_tune_module* m = tune_->compile(e, kGridProbe, &log, &status);
    ASSERT_NE(m, nullptr) << status.message << ": " << (log != nullptr ? log : "");
    tune_->free_log(log);
    std::vector<double> g2(jobs.size()), trace(jobs.size());
    std::vector<float> maxabs(jobs.size());
    rvd_tune_run io{};
    io.threads = 32;
    io.grid = 0;  // one block per job asked
    io.poison64 = PoisonBits64(1);
    io.poison32 = PoisonBits32(1);
    io.g2 = g2.data();
    io.trace = trace.data();
    io.maxabs = maxabs.data();
    ASSERT_EQ(tune_->run(e, m, &batch, 1, jobs.data(), jobs.size(), &io, &status), 0)
        << status.message;
    tune_->release(e, m);
    const double want = e == capped ? 3.0 : static_cast<double>(jobs.size());
    for (size_t j = 0; j < jobs.size(); ++j) EXPECT_EQ(g2[j], want) << "job " << j;
  }
  module_->destroy(capped);
}

TEST_F(CudaTuneHarnessTest, NaiveBuiltInCandidateIsCorrect) {
  absl::StatusOr<Candidate> c = Emit(NaivePoint(), DType::kF32);
  ASSERT_TRUE(c.ok()) << c.status();
  const Checked r = Check(c->source, /*timed=*/3);
  EXPECT_EQ(r.evidence.inputs, 20);
  EXPECT_EQ(r.decision.verdict, Verdict::kAccepted) << r.decision.reason;
  ASSERT_EQ(r.seconds.size(), 3u);
  for (double s : r.seconds) EXPECT_TRUE(std::isfinite(s) && s > 0) << s;
}

TEST_F(CudaTuneHarnessTest, PlainCandidateIsCorrect) {
  const Checked r = Check(kPlain);
  EXPECT_EQ(r.evidence.inputs, 20);
  EXPECT_EQ(r.decision.verdict, Verdict::kAccepted) << r.decision.reason;
}

TEST_F(CudaTuneHarnessTest, SyntaxErrorReturnsTheCompileLog) {
  std::string log;
  rvd_status status{};
  EXPECT_EQ(Compile(kSyntaxError, &log, &status), nullptr);
  EXPECT_EQ(status.code, 3) << status.message;  // INVALID_ARGUMENT
  EXPECT_THAT(log, HasSubstr("error"));
  EXPECT_THAT(log, HasSubstr("candidate.cu"));
}

TEST_F(CudaTuneHarnessTest, SideStreamLaunchIsRefusedAtCompile) {
  std::string log;
  rvd_status status{};
  EXPECT_EQ(Compile(Mutant("MUTANT_SIDE_STREAM"), &log, &status), nullptr);
  EXPECT_EQ(status.code, 3) << status.message;
  EXPECT_THAT(log, HasSubstr("device-side kernel launch"));
}

TEST_F(CudaTuneHarnessTest, StaleOutputIsRejected) {
  const Checked r = Check(Mutant("MUTANT_STALE"));
  EXPECT_EQ(r.decision.verdict, Verdict::kIncorrect);
  EXPECT_GT(r.evidence.outputs_unwritten, 0);
  EXPECT_THAT(r.decision.reason, HasSubstr("unwritten"));
}

TEST_F(CudaTuneHarnessTest, PartialMatrixIsRejected) {
  const Checked r = Check(Mutant("MUTANT_PARTIAL"));
  EXPECT_EQ(r.decision.verdict, Verdict::kIncorrect);
  EXPECT_GT(r.evidence.pr_mismatches + r.evidence.sum_mismatches, 0);
  EXPECT_THAT(r.decision.reason, HasSubstr("outside"));
}

TEST_F(CudaTuneHarnessTest, InputWriteIsRejected) {
  const Checked r = Check(Mutant("MUTANT_WRITES_INPUT"));
  EXPECT_FALSE(r.evidence.inputs_unchanged);
  EXPECT_EQ(r.decision.verdict, Verdict::kIncorrect);
  EXPECT_THAT(r.decision.reason, HasSubstr("wrote to its input"));
}

TEST_F(CudaTuneHarnessTest, LowerPrecisionIsRejected) {
  const Checked r = Check(Mutant("MUTANT_LOW_PRECISION"));
  EXPECT_EQ(r.decision.verdict, Verdict::kIncorrect);
  EXPECT_GT(r.evidence.max_pr_rel_error + r.evidence.max_sum_rel_error, 2e-6);
  EXPECT_THAT(r.decision.reason, HasSubstr("outside"));
}

}  // namespace
}  // namespace rvd::tune

// rvd_bench_gpu: the CUDA engine's variants, validated, then timed.
//
// Order (llm.c dev/cuda): measure the copy ceiling (cudaMemcpyAsync D2D,
// bytes read + written); build inputs (random, power-law spectra, never
// zero; 3 rotating input sets per case so the 60 MB L2 cannot serve them);
// validate EVERY exact variant on every case against the float64 SVD oracle
// with the one tolerance rule (kernels/pr_check.h) before timing any; then
// time. Columns:
//   kernel_ms  the fused kernel + finalize alone, CUDA events on one stream
//              (what the bandwidth floor bounds);
//   call_ms    one ComputePRDevice call, wall clock (host planning, the
//              descriptor upload, kernels, the result download);
//   %floor     floor / time, floor = input bytes / measured copy ceiling;
//   GB/s, TFLOP/s (2 n^2 K per matrix: the full Gram's products).
// Medians over --reps runs after warm-up. fused vs algebraic calls are
// interleaved A-B-A-B and the spread (max - min of the medians of each half)
// is reported. Then accuracy curves of the estimators (power_iter K = 10,
// 50, 200, Hutchinson and Hutch++; sketch r = 16, 128) over four spectrum
// families: mean and p95 relative error vs the oracle.
//
//   build/bin/rvd_bench_gpu [--json PATH] [--reps N] [--quick]
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_engine.h"
#include "kernels/cuda/kernels.h"
#include "kernels/cuda/launch_policy.h"
#include "kernels/dtype_convert.h"
#include "kernels/engine.h"
#include "kernels/pr_check.h"
#include "nlohmann/json.hpp"

namespace rvd::cuda {
namespace {

#define BENCH_CHECK(expr)                                                  \
  do {                                                                     \
    cudaError_t e_ = (expr);                                               \
    if (e_ != cudaSuccess) {                                               \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr,   \
                   cudaGetErrorString(e_));                                \
      return 1;                                                            \
    }                                                                      \
  } while (0)

enum class Spectrum { kFlat, kPowerLaw, kRankOne, kGaussian };
const char* SpectrumName(Spectrum s) {
  switch (s) {
    case Spectrum::kFlat: return "flat";
    case Spectrum::kPowerLaw: return "powerlaw";
    case Spectrum::kRankOne: return "rank1";
    case Spectrum::kGaussian: return "gaussian";
  }
  return "?";
}

// rows x cols, row-major float: sum over q components of s_c u_c v_c^T with
// Gaussian u, v (nearly orthogonal in high dimension) plus a small Gaussian
// floor. Power-law s_c = (c+1)^-0.7; flat s_c = 1 (q = n); rank-1 q = 1.
std::vector<float> MakeMatrix(std::mt19937_64& rng, int64_t rows, int64_t cols,
                              Spectrum spec) {
  std::normal_distribution<float> normal;
  std::vector<float> w(static_cast<size_t>(rows * cols));
  if (spec == Spectrum::kGaussian) {
    for (float& x : w) x = normal(rng);
    return w;
  }
  const int64_t n = std::min(rows, cols);
  const int64_t q = spec == Spectrum::kRankOne ? 1 : std::min<int64_t>(n, 64);
  std::vector<float> u(static_cast<size_t>(rows)), v(static_cast<size_t>(cols));
  for (int64_t c = 0; c < q; ++c) {
    const float s = spec == Spectrum::kFlat ? 1.0f : std::pow(float(c + 1), -0.7f);
    for (float& x : u) x = normal(rng);
    for (float& x : v) x = normal(rng) * s;
    for (int64_t i = 0; i < rows; ++i) {
      float* wr = &w[i * cols];
      for (int64_t j = 0; j < cols; ++j) wr[j] += u[i] * v[j];
    }
  }
  const float floor = spec == Spectrum::kRankOne ? 0.0f : 0.05f;
  if (floor > 0) {
    for (float& x : w) x += floor * normal(rng);
  }
  return w;
}

std::vector<uint8_t> Encode(const std::vector<float>& w, DType dt) {
  const size_t es = DTypeSize(dt);
  std::vector<uint8_t> b(w.size() * es);
  for (size_t i = 0; i < w.size(); ++i) {
    if (dt == DType::kF32) {
      std::memcpy(&b[i * 4], &w[i], 4);
    } else {
      const uint16_t h = dt == DType::kF16 ? FloatToHalf(w[i]) : FloatToBFloat16(w[i]);
      std::memcpy(&b[i * 2], &h, 2);
    }
  }
  return b;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

double Now() {
  return std::chrono::duration<double>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

struct Case {
  int64_t batch, rows, cols;
  DType dtype;
  std::string tag;
};

// One case's device inputs: 3 sets of `batch` matrices, cycling `distinct`
// generated matrices whose oracle PRs are known.
struct Inputs {
  std::vector<void*> buffers;
  std::vector<std::vector<MatrixView>> sets;
  std::vector<double> ref;  // per distinct matrix
  int distinct = 0;
  ~Inputs() {
    for (void* p : buffers) cudaFree(p);
  }
};

int Build(const Case& c, std::mt19937_64& rng, Inputs* in) {
  in->distinct = static_cast<int>(std::min<int64_t>(c.batch, c.rows * c.cols >= (1 << 22) ? 3 : 8));
  std::vector<std::vector<uint8_t>> host;
  for (int d = 0; d < in->distinct; ++d) {
    const Spectrum sp = d % 4 == 3 ? Spectrum::kGaussian : Spectrum::kPowerLaw;
    host.push_back(Encode(MakeMatrix(rng, c.rows, c.cols, sp), c.dtype));
    const MatrixView hv{host.back().data(), c.rows, c.cols, c.cols, c.dtype};
    absl::StatusOr<double> pr = OraclePR(hv);
    if (!pr.ok()) return 1;
    in->ref.push_back(*pr);
  }
  const size_t bytes = host[0].size();
  for (int s = 0; s < 3; ++s) {
    void* p = nullptr;
    BENCH_CHECK(cudaMalloc(&p, bytes * c.batch));
    in->buffers.push_back(p);
    std::vector<MatrixView> views;
    for (int64_t i = 0; i < c.batch; ++i) {
      void* dst = static_cast<uint8_t*>(p) + bytes * i;
      BENCH_CHECK(cudaMemcpy(dst, host[(i + s) % in->distinct].data(), bytes,
                             cudaMemcpyHostToDevice));
      views.push_back(MatrixView{dst, c.rows, c.cols, c.cols, c.dtype});
    }
    in->sets.push_back(views);
  }
  return 0;
}

// The fused kernel and finalize alone, prepared once per set.
struct FusedPrepared {
  void* dev = nullptr;
  MatrixDesc* desc = nullptr;
  FusedJob* jobs = nullptr;
  int32_t* jb = nullptr;
  double *g2 = nullptr, *tr = nullptr, *pr = nullptr;
  float* mx = nullptr;
  int32_t* st = nullptr;
  int num_jobs = 0, m = 0;
  bool offdiag = false;
  DType dtype = DType::kF32;
  ~FusedPrepared() { cudaFree(dev); }
};

int Prepare(const std::vector<MatrixView>& views, FusedPrepared* f) {
  std::vector<MatrixDesc> descs;
  std::vector<int64_t> sides;
  for (const MatrixView& v : views) {
    descs.push_back(MakeDesc(v));
    sides.push_back(descs.back().n);
  }
  std::vector<FusedJob> jobs;
  std::vector<int32_t> jb;
  EnumerateFusedJobs(sides, kFusedPolicySm90.block_tile, &jobs, &jb);
  f->m = static_cast<int>(views.size());
  f->num_jobs = static_cast<int>(jobs.size());
  f->dtype = views[0].dtype;
  for (const FusedJob& j : jobs) f->offdiag |= j.diagonal == 0;
  auto al = [](size_t b) { return (b + 255) / 256 * 256; };
  const size_t sd = al(descs.size() * sizeof(MatrixDesc)), sj = al(jobs.size() * sizeof(FusedJob)),
               sb = al(jb.size() * 4), s8 = al(jobs.size() * 8), s4 = al(jobs.size() * 4),
               m8 = al(views.size() * 8), m4 = al(views.size() * 4);
  BENCH_CHECK(cudaMalloc(&f->dev, sd + sj + sb + 2 * s8 + s4 + m8 + m4));
  auto* p = static_cast<uint8_t*>(f->dev);
  f->desc = reinterpret_cast<MatrixDesc*>(p);
  f->jobs = reinterpret_cast<FusedJob*>(p + sd);
  f->jb = reinterpret_cast<int32_t*>(p + sd + sj);
  f->g2 = reinterpret_cast<double*>(p + sd + sj + sb);
  f->tr = reinterpret_cast<double*>(p + sd + sj + sb + s8);
  f->mx = reinterpret_cast<float*>(p + sd + sj + sb + 2 * s8);
  f->pr = reinterpret_cast<double*>(p + sd + sj + sb + 2 * s8 + s4);
  f->st = reinterpret_cast<int32_t*>(p + sd + sj + sb + 2 * s8 + s4 + m8);
  BENCH_CHECK(cudaMemcpy(f->desc, descs.data(), descs.size() * sizeof(MatrixDesc), cudaMemcpyHostToDevice));
  BENCH_CHECK(cudaMemcpy(f->jobs, jobs.data(), jobs.size() * sizeof(FusedJob), cudaMemcpyHostToDevice));
  BENCH_CHECK(cudaMemcpy(f->jb, jb.data(), jb.size() * 4, cudaMemcpyHostToDevice));
  return 0;
}

cudaError_t RunPrepared(const FusedPrepared& f, cudaStream_t s) {
  cudaError_t e = LaunchFused(f.dtype, f.desc, f.jobs, f.num_jobs, f.offdiag, f.g2,
                              f.tr, f.mx, s);
  if (e != cudaSuccess) return e;
  return LaunchFinalize(f.desc, f.jb, f.m, f.g2, f.tr, f.mx, f.pr, f.st, s);
}

int Main(int argc, char** argv) {
  std::string json_path;
  int reps = 50;
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--json" && i + 1 < argc) json_path = argv[++i];
    else if (a.rfind("--json=", 0) == 0) json_path = a.substr(7);
    else if (a == "--reps" && i + 1 < argc) reps = std::atoi(argv[++i]);
    else if (a == "--quick") quick = true;
    else {
      std::fprintf(stderr, "usage: %s [--json PATH] [--reps N] [--quick]\n", argv[0]);
      return 2;
    }
  }
  CudaEngineOptions opt;
  opt.max_device_bytes = 16ull << 30;
  absl::StatusOr<std::unique_ptr<CudaEngine>> eng = CudaEngine::Create(opt);
  if (!eng.ok()) {
    std::fprintf(stderr, "no CUDA engine: %s\n", std::string(eng.status().message()).c_str());
    return 1;
  }
  CudaEngine& engine = **eng;
  cudaDeviceProp prop;
  BENCH_CHECK(cudaGetDeviceProperties(&prop, 0));
  nlohmann::json out;
  out["device"] = prop.name;
  out["version"] = engine.Version();
  std::printf("device %s, %d SMs; engine %s\n", prop.name, prop.multiProcessorCount,
              engine.Version().c_str());

  cudaStream_t stream;
  BENCH_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaEvent_t e0, e1;
  BENCH_CHECK(cudaEventCreate(&e0));
  BENCH_CHECK(cudaEventCreate(&e1));

  // 1. The copy ceiling, bytes read + written.
  double copy_tbps = 0;
  {
    const size_t bytes = 2ull << 30;
    void *a = nullptr, *b = nullptr;
    BENCH_CHECK(cudaMalloc(&a, bytes));
    BENCH_CHECK(cudaMalloc(&b, bytes));
    BENCH_CHECK(cudaMemset(a, 1, bytes));
    std::vector<double> ts;
    for (int r = 0; r < 13; ++r) {
      BENCH_CHECK(cudaEventRecord(e0, stream));
      BENCH_CHECK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, stream));
      BENCH_CHECK(cudaEventRecord(e1, stream));
      BENCH_CHECK(cudaEventSynchronize(e1));
      float ms = 0;
      BENCH_CHECK(cudaEventElapsedTime(&ms, e0, e1));
      if (r >= 3) ts.push_back(ms);
    }
    copy_tbps = 2.0 * bytes / (Median(ts) * 1e-3) / 1e12;
    cudaFree(a);
    cudaFree(b);
  }
  std::printf("copy ceiling (D2D, read + write): %.3f TB/s\n\n", copy_tbps);
  out["copy_TBps"] = copy_tbps;

  std::vector<Case> cases = {
      {480, 128, 4096, DType::kF32, "issue"},  {480, 128, 4096, DType::kBF16, "issue"},
      {256, 128, 4096, DType::kBF16, "issue"}, {32, 1024, 4096, DType::kBF16, "issue"},
      {480, 128, 4096, DType::kF16, "dtype"},  {32, 1024, 4096, DType::kF32, "dtype"},
      {480, 4096, 128, DType::kBF16, "tall"},
  };
  for (int64_t b : {1, 4, 16, 64, 256, 1024}) {
    if (!quick || b == 64) cases.push_back({b, 128, 4096, DType::kBF16, "scaling"});
  }
  std::mt19937_64 rng(20261129);

  // 2. Build every case's inputs, and validate every exact variant on every
  // case before any timing.
  std::vector<std::unique_ptr<Inputs>> inputs;
  bool all_ok = true;
  nlohmann::json validation = nlohmann::json::array();
  std::printf("validation (rtol %.0e vs float64 SVD oracle):\n", kExactPrTolerance.rtol);
  for (const Case& c : cases) {
    auto in = std::make_unique<Inputs>();
    if (Build(c, rng, in.get()) != 0) return 1;
    for (const char* name : {"fused", "algebraic", "naive"}) {
      // naive (cuSOLVER SVD) on the distinct matrices only: it is slow.
      const size_t nval = std::string(name) == "naive" ? in->distinct : c.batch;
      std::vector<MatrixView> views(in->sets[0].begin(), in->sets[0].begin() + nval);
      std::vector<double> got(nval, std::nan("")), ref(nval);
      for (size_t i = 0; i < nval; ++i) ref[i] = in->ref[i % in->distinct];
      VariantSpec v;
      v.name = name;
      absl::Status s = engine.ComputePRDevice(views, v, absl::MakeSpan(got), stream);
      CheckResult r = s.ok() ? CheckPR(got, ref, kExactPrTolerance) : CheckResult{1, 1, ""};
      const bool ok = s.ok() && r.mismatches == 0;
      all_ok &= ok;
      std::printf("  %-9s %5lld x %4lldx%-4lld %-4s %s max rel %.2e%s%s\n", name,
                  (long long)c.batch, (long long)c.rows, (long long)c.cols,
                  DTypeName(c.dtype), ok ? "ok  " : "FAIL", r.max_rel_error,
                  s.ok() ? "" : " ", s.ok() ? "" : std::string(s.message()).c_str());
      if (!ok) std::printf("%s", r.report.c_str());
      validation.push_back({{"variant", name}, {"batch", c.batch}, {"rows", c.rows},
                            {"cols", c.cols}, {"dtype", DTypeName(c.dtype)}, {"ok", ok},
                            {"max_rel_err", r.max_rel_error}});
    }
    inputs.push_back(std::move(in));
  }
  out["validation"] = validation;
  if (!all_ok) {
    std::printf("\nVALIDATION FAILED: not timing.\n");
    if (!json_path.empty()) std::ofstream(json_path) << out.dump(2);
    return 1;
  }

  // 3. Timing.
  nlohmann::json timing = nlohmann::json::array();
  std::printf("\n%-8s %5s %10s %-4s | %9s %7s %7s %7s | %9s %9s %9s %8s | %s\n", "case",
              "batch", "shape", "type", "kernel_ms", "%floor", "GB/s", "TFLOP/s",
              "fused_ms", "alg_ms", "spread_ms", "floor_ms", "served by");
  for (size_t ci = 0; ci < cases.size(); ++ci) {
    const Case& c = cases[ci];
    Inputs& in = *inputs[ci];
    const double bytes = double(c.batch) * c.rows * c.cols * DTypeSize(c.dtype);
    const double n = std::min(c.rows, c.cols), k = std::max(c.rows, c.cols);
    const double flops = 2.0 * n * n * k * c.batch;
    const double floor_ms = bytes / (copy_tbps * 1e12) * 1e3;
    // Kernel alone, rotating the 3 sets.
    std::vector<FusedPrepared> prep(3);
    for (int s = 0; s < 3; ++s) {
      if (Prepare(in.sets[s], &prep[s]) != 0) return 1;
    }
    std::vector<double> kt;
    for (int r = 0; r < reps + 5; ++r) {
      const FusedPrepared& f = prep[r % 3];
      BENCH_CHECK(cudaEventRecord(e0, stream));
      BENCH_CHECK(RunPrepared(f, stream));
      BENCH_CHECK(cudaEventRecord(e1, stream));
      BENCH_CHECK(cudaEventSynchronize(e1));
      float ms = 0;
      BENCH_CHECK(cudaEventElapsedTime(&ms, e0, e1));
      if (r >= 5) kt.push_back(ms);
    }
    const double kernel_ms = Median(kt);
    // Whole calls, fused and algebraic interleaved A-B-A-B.
    std::vector<double> ta, tb;
    const int call_reps = std::max(6, reps / (c.batch * c.rows * c.cols > (1ll << 28) ? 5 : 1));
    for (int r = 0; r < call_reps + 2; ++r) {
      for (int which = 0; which < 2; ++which) {
        VariantSpec v;
        v.name = which == 0 ? "fused" : "algebraic";
        std::vector<double> got(c.batch);
        const double t0 = Now();
        absl::Status s = engine.ComputePRDevice(in.sets[r % 3], v, absl::MakeSpan(got), stream);
        const double t1 = Now();
        if (!s.ok()) {
          std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
          return 1;
        }
        if (r >= 2) (which == 0 ? ta : tb).push_back((t1 - t0) * 1e3);
      }
    }
    const size_t h = ta.size() / 2;
    auto half_median = [](const std::vector<double>& v, size_t b, size_t e) {
      return Median(std::vector<double>(v.begin() + b, v.begin() + e));
    };
    const double spread = std::max(
        std::fabs(half_median(ta, 0, h) - half_median(ta, h, ta.size())),
        std::fabs(half_median(tb, 0, h) - half_median(tb, h, tb.size())));
    const std::string shape = absl::StrCat(c.rows, "x", c.cols);
    std::printf("%-8s %5lld %10s %-4s | %9.4f %6.1f%% %7.0f %7.1f | %9.4f %9.4f %9.4f %8.4f | %s\n",
                c.tag.c_str(), (long long)c.batch, shape.c_str(), DTypeName(c.dtype),
                kernel_ms, 100.0 * floor_ms / kernel_ms, bytes / (kernel_ms * 1e-3) / 1e9,
                flops / (kernel_ms * 1e-3) / 1e12, Median(ta), Median(tb), spread, floor_ms,
                kFusedPolicySm90.name);
    timing.push_back({{"case", c.tag}, {"batch", c.batch}, {"rows", c.rows}, {"cols", c.cols},
                      {"dtype", DTypeName(c.dtype)}, {"kernel_ms", kernel_ms},
                      {"pct_of_floor", 100.0 * floor_ms / kernel_ms},
                      {"GBps", bytes / (kernel_ms * 1e-3) / 1e9},
                      {"TFLOPs_full_gram", flops / (kernel_ms * 1e-3) / 1e12},
                      {"fused_call_ms", Median(ta)}, {"algebraic_call_ms", Median(tb)},
                      {"call_spread_ms", spread}, {"floor_ms", floor_ms},
                      {"policy", kFusedPolicySm90.name}});
  }
  out["timing"] = timing;

  // 4. Estimator accuracy curves.
  std::printf("\nestimators, 128x1024 f32, 24 matrices per family: mean / p95 rel error\n");
  nlohmann::json est = nlohmann::json::array();
  struct E {
    const char* name;
    int k;
    bool hpp;
    int r;
  };
  const std::vector<E> es = {{"power_iter", 10, false, 0},  {"power_iter", 50, false, 0},
                             {"power_iter", 200, false, 0}, {"power_iter", 10, true, 0},
                             {"power_iter", 50, true, 0},   {"power_iter", 200, true, 0},
                             {"sketch", 0, false, 16},      {"sketch", 0, false, 128}};
  for (Spectrum sp : {Spectrum::kFlat, Spectrum::kPowerLaw, Spectrum::kRankOne,
                      Spectrum::kGaussian}) {
    std::vector<std::vector<uint8_t>> mats;
    std::vector<MatrixView> views;
    std::vector<double> ref;
    for (int i = 0; i < (quick ? 8 : 24); ++i) {
      mats.push_back(Encode(MakeMatrix(rng, 128, 1024, sp), DType::kF32));
    }
    for (auto& m : mats) {
      views.push_back(MatrixView{m.data(), 128, 1024, 1024, DType::kF32});
      ref.push_back(*OraclePR(views.back()));
    }
    for (const E& e : es) {
      VariantSpec v;
      v.name = e.name;
      if (e.k > 0) v.probes = e.k;
      if (e.r > 0) v.sketch_rank = e.r;
      v.hutch_plus_plus = e.hpp;
      std::vector<double> err;
      for (size_t i = 0; i < views.size(); ++i) {
        v.seed = 1000 + i;
        std::vector<double> got(1);
        if (!engine.ComputePR({views[i]}, v, absl::MakeSpan(got)).ok()) return 1;
        err.push_back(std::fabs(got[0] - ref[i]) / ref[i]);
      }
      std::sort(err.begin(), err.end());
      double mean = 0;
      for (double x : err) mean += x / err.size();
      const double p95 = err[std::min(err.size() - 1, size_t(0.95 * err.size()))];
      const std::string label = e.r > 0 ? absl::StrCat("sketch r=", e.r)
                                        : absl::StrCat(e.hpp ? "hutch++" : "hutchinson", " K=", e.k);
      std::printf("  %-9s %-18s mean %.4f  p95 %.4f\n", SpectrumName(sp), label.c_str(), mean, p95);
      est.push_back({{"spectrum", SpectrumName(sp)}, {"estimator", label}, {"mean_rel_err", mean},
                     {"p95_rel_err", p95}});
    }
  }
  out["estimators"] = est;
  nlohmann::json served;
  for (const auto& [k, n] : engine.ServedCounts()) served[k] = n;
  out["served"] = served;
  std::printf("\nserved: %s\n", served.dump().c_str());
  if (!json_path.empty()) {
    std::ofstream(json_path) << out.dump(2);
    std::printf("wrote %s\n", json_path.c_str());
  }
  return 0;
}

}  // namespace
}  // namespace rvd::cuda

int main(int argc, char** argv) { return rvd::cuda::Main(argc, argv); }

// rvd_bench_gpu: the CUDA engine's variants, validated, then timed.
//
// Order (llm.c dev/cuda): measure the copy ceiling (cudaMemcpyAsync D2D,
// bytes read + written); build inputs (random, power-law spectra, never
// zero; 3 rotating input sets per case so the 60 MB L2 cannot serve them);
// validate EVERY exact variant on every case against the float64 SVD oracle
// with the one tolerance rule (kernels/pr_check.h) before timing any; then
// time. Columns:
//   isolated_ms the fused kernel + finalize alone, CUDA events on one
//              stream, each launch alone (TimeAlone) with 5 ms idle after
//              it, after 0.5 s idle: a sidecar measuring on an interval,
//              the SM clock at its maximum (1980 MHz on the H200); what
//              the targets are judged on ("target", "met") and what
//              %floor, GB/s and TFLOP/s use;
//   synced_ms  each launch right after a host sync, the host's submission
//              inside the events: torch_peers.py's harness;
//   steady_ms  the same launches queued back to back after 200 ms of the
//              same work: sustained load, where the H200 holds its 700 W
//              power cap by lowering the SM clock (docs/history/kernel-notes.md, session 6);
//   call_ms    one ComputePRDevice call, wall clock (host planning, the
//              descriptor upload, kernels, the result download);
//   %floor     floor / time, floor = input bytes / measured copy ceiling;
//   GB/s, TFLOP/s (2 n^2 K per matrix: the full Gram's products).
// Medians over --reps runs after warm-up. fused vs algebraic calls are
// interleaved A-B-A-B and the spread (max - min of the medians of each half)
// is reported (--quick: the four target cases and the tall case, no
// estimator curves). Then every variant (fused, algebraic, naive,
// power_iter K = 10, 50, 200 as Hutchinson and Hutch++, sketch r = 16, 128)
// on the seed's 480 x 128x4096 in f32 and bf16: call time, %floor, GB/s
// and error vs the oracle, the accuracy-latency table (bench/plots.py).
// Then accuracy curves of the estimators (the same K and r) over four
// spectrum families: mean and p95 relative error vs the oracle.
//
//   build/bin/rvd_bench_gpu [--json PATH] [--reps N] [--quick] [--probe] [--ab] [--ncu]
//                           [--sustain] [--max-sms N] [--case BATCHxROWSxCOLS:DTYPE ...]
// (--probe: the v3 kernel alone with parts left out or K split across
// blocks, to place its time; see Probe below. --ab: the wide kernels v3
// and v4, and v4's probes, from this one binary: accuracy per dtype and
// spectrum family first, then interleaved timing; see AB below. --ncu: the
// --ab cases launched twice each by v4, for ncu to profile; --sustain: see
// Sustain)
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <optional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/dev/fused_probes.h"
#include "kernels/cuda/cuda_engine.h"
#include "kernels/cuda/fused_plan.h"
#include "kernels/cuda/kernels.h"
#include "kernels/cuda/launch_policy.h"
#include "kernels/dtype_convert.h"
#include "kernels/engine.h"
#include "kernels/pr_check.h"
#include "kernels/test_matrices.h"
#include "nlohmann/json.hpp"

namespace rvd::cuda {

// Keeps the GPU busy for `ns` without touching memory (gpu_spin.cu).
cudaError_t LaunchSpin(uint64_t ns, cudaStream_t stream);

#ifdef RVD_V4_PREV
// v4 as it was at an earlier revision (scripts/v4_prev.sh).
cudaError_t LaunchFusedV4Prev(DType dtype, const FusedV4Launch& launch, cudaStream_t stream);
#endif

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


// A benchmark input: the tests' generator (kernels/test_matrices.h), entries
// of order 1, stored in `dt`.
std::vector<uint8_t> BenchMatrix(std::mt19937_64& rng, int64_t rows, int64_t cols, Spectrum sp,
                                 DType dt) {
  return Store(MakeMatrix(rng, rows, cols, sp, /*scale=*/1.0), rows, cols, dt, /*pad=*/0,
               SpectrumName(sp))
      .bytes;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// An event recorded now on `stream`: what a device call waits for (one
// event, re-recorded for each call).
cudaEvent_t Ready(cudaStream_t stream) {
  static cudaEvent_t ready = [] {
    cudaEvent_t e = nullptr;
    cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
    return e;
  }();
  cudaEventRecord(ready, stream);
  return ready;
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
  double target_ms = 0;  // the goal for fused (isolated), 0: none
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

// oracle = false: no reference PRs (timing only).
int Build(const Case& c, std::mt19937_64& rng, Inputs* in, bool oracle = true) {
  in->distinct = static_cast<int>(std::min<int64_t>(c.batch, c.rows * c.cols >= (1 << 22) ? 3 : 8));
  std::vector<std::vector<uint8_t>> host;
  for (int d = 0; d < in->distinct; ++d) {
    const Spectrum sp = d % 4 == 3 ? Spectrum::kGaussian : Spectrum::kPowerLaw;
    host.push_back(BenchMatrix(rng, c.rows, c.cols, sp, c.dtype));
    const MatrixView hv{host.back().data(), c.rows, c.cols, c.cols, c.dtype};
    if (!oracle) continue;
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

// --max-sms N: the product plan's persistent grid capped at N SMs, as rvd's
// cuda_max_sms does (0: every SM), to measure what the cap costs.
int g_max_sms = 0;

// --case BATCHxROWSxCOLS:DTYPE (repeatable, e.g. 32x1024x4096:f32): only
// those cases, in every mode (the main tables, --ab, --sustain); none
// given: every case.
std::vector<std::string> g_cases;

std::string CaseName(const Case& c) {
  return absl::StrCat(c.batch, "x", c.rows, "x", c.cols, ":", DTypeName(c.dtype));
}

bool Selected(const Case& c) {
  return g_cases.empty() ||
         std::find(g_cases.begin(), g_cases.end(), CaseName(c)) != g_cases.end();
}

// The product's fused kernels on this device (the engine's registry as
// created).
const KernelTable& ProductKernels() {
  static const std::shared_ptr<const KernelTable> table = [] {
    cudaDeviceProp prop;
    cudaGetDeviceProperties(&prop, 0);
    return KernelRegistry(prop.major, prop.minor).Snapshot();
  }();
  return *table;
}

// The fused kernel and finalize alone, prepared once per set.
struct FusedPrepared {
  void* dev = nullptr;
  MatrixDesc* desc = nullptr;
  FusedJob* jobs = nullptr;      // v1 (tall cases)
  FusedJobV2* jobs2 = nullptr;   // v3 and v4 (wide cases; v4: 128 x 128 tiles)
  void* maps = nullptr;          // v4's tensor maps
  FusedKernel kernel = FusedKernel::kV3;
  int32_t* jb = nullptr;
  double *g2 = nullptr, *tr = nullptr, *pr = nullptr;
  float* mx = nullptr;
  int32_t* st = nullptr;
  int num_jobs = 0, m = 0;
  bool offdiag = false;
  bool finished = false;  // the kernel writes every PR (FusedV4FinishesMatrix)
  bool pairs = false;     // v4's paired tiles (FusedV4Pairs: f32 of Gram side > 128)
  bool tall = false;      // v4 triangle's MN-major tiles (a tall 16-bit case: "v4-tall")
  DType dtype = DType::kF32;
  // v4: the engine's schedule (PlanFusedV4), its workspace, and the same
  // jobs uncut (the "-whole" contenders).
  FusedV4Plan plan, whole_plan;
  float* partials = nullptr;
  int32_t* tickets = nullptr;
  // The engine's own plan of the case (fused_plan.h), which RunPrepared
  // launches: what the product runs, planned by the same code. Set when the
  // kernel was not forced; pr and st then point at its results.
  bool product = false;
  FusedCall call;
  void* call_dev = nullptr;  // descriptors, then work, then tickets
  void* call_work = nullptr;
  int32_t* call_tickets = nullptr;
  ~FusedPrepared() {
    cudaFree(dev);
    cudaFree(call_dev);
  }

  FusedV4Launch V4Launch(bool whole = false) const {
    return FusedV4Launch{maps,    desc,
                         jobs2,   whole ? whole_plan : plan,
                         partials, tickets,
                         kernel == FusedKernel::kV4Triangle, pairs,
                         tall,
                         g2,      tr,
                         mx,      pr,
                         st};
  }
};

// One case is one shape and dtype: without `forced`, the kernel the engine
// would choose (ChooseFusedKernel).
int Prepare(const std::vector<MatrixView>& views, FusedPrepared* f,
            std::optional<FusedKernel> forced = std::nullopt) {
  std::vector<MatrixDesc> descs;
  std::vector<int64_t> sides;
  for (const MatrixView& v : views) {
    descs.push_back(MakeDesc(v));
    sides.push_back(descs.back().n);
  }
  int device = 0;
  cudaDeviceProp prop;
  BENCH_CHECK(cudaGetDevice(&device));
  BENCH_CHECK(cudaGetDeviceProperties(&prop, device));
  const FusedKernel kernel =
      forced ? *forced
             : ChooseFusedKernel(prop.major, prop.minor, views[0].dtype, views[0].rows,
                                 views[0].cols, descs[0].aligned != 0);
  f->kernel = kernel;
  f->finished = FusedV4FinishesMatrix(kernel, descs[0].n);
  f->pairs = FusedV4Pairs(kernel, views[0].dtype, descs[0].n);
  f->tall = kernel == FusedKernel::kV4Triangle && descs[0].tall != 0;
  std::vector<FusedJob> jobs;
  std::vector<FusedJobV2> jobs2;
  std::vector<int32_t> jb;
  const bool wide = kernel != FusedKernel::kV1Tall;
  if (wide) {
    const LaunchPolicy& p = FusedPolicyOf(kernel);
    for (size_t i = 0; i < sides.size(); ++i) {
      jb.push_back(static_cast<int32_t>(jobs2.size()));
      AppendFusedJobsV2(static_cast<int32_t>(i), sides[i], p, &jobs2);
    }
    jb.push_back(static_cast<int32_t>(jobs2.size()));
    for (const FusedJobV2& j : jobs2) f->offdiag |= j.diagonal == 0;
  } else {
    EnumerateFusedJobs(sides, kFusedPolicySm90.block_tile, &jobs, &jb);
    for (const FusedJob& j : jobs) f->offdiag |= j.diagonal == 0;
  }
  const size_t nj = wide ? jobs2.size() : jobs.size();
  f->m = static_cast<int>(views.size());
  f->num_jobs = static_cast<int>(nj);
  f->dtype = views[0].dtype;
  auto al = [](size_t b) { return (b + 255) / 256 * 256; };
  const size_t job_bytes = wide ? sizeof(FusedJobV2) : sizeof(FusedJob);
  static_assert(sizeof(FusedJobV2) == sizeof(FusedJob), "one job slot size");
  if (IsFusedV4(kernel)) {
    const int slices = FusedV4Slices(descs[0].k);  // one shape per case
    f->plan = PlanFusedV4(f->num_jobs, prop.multiProcessorCount, slices,
                          FusedV4TailPieces(kernel, f->dtype));
    f->whole_plan = PlanFusedV4(f->num_jobs, prop.multiProcessorCount, slices, 1);
  }
  const size_t sd = al(descs.size() * sizeof(MatrixDesc)), sj = al(nj * job_bytes),
               sb = al(jb.size() * 4), s8 = al(nj * 8), s4 = al(nj * 4),
               m8 = al(views.size() * 8), m4 = al(views.size() * 4),
               sm = IsFusedV4(kernel) ? al(views.size() * kTensorMapBytes) : 0,
               sp = al(FusedV4PartialBytes(f->plan)),
               st = f->plan.pieces > 1 ? al(kFusedV4TicketInts * 4) : 0;
  BENCH_CHECK(cudaMalloc(&f->dev, sd + sj + sb + 2 * s8 + s4 + m8 + m4 + sm + sp + st));
  auto* p = static_cast<uint8_t*>(f->dev);
  f->desc = reinterpret_cast<MatrixDesc*>(p);
  f->jobs = reinterpret_cast<FusedJob*>(p + sd);
  f->jobs2 = reinterpret_cast<FusedJobV2*>(p + sd);
  f->jb = reinterpret_cast<int32_t*>(p + sd + sj);
  f->g2 = reinterpret_cast<double*>(p + sd + sj + sb);
  f->tr = reinterpret_cast<double*>(p + sd + sj + sb + s8);
  f->mx = reinterpret_cast<float*>(p + sd + sj + sb + 2 * s8);
  f->pr = reinterpret_cast<double*>(p + sd + sj + sb + 2 * s8 + s4);
  f->st = reinterpret_cast<int32_t*>(p + sd + sj + sb + 2 * s8 + s4 + m8);
  f->maps = p + sd + sj + sb + 2 * s8 + s4 + m8 + m4;
  if (st > 0) {
    f->partials = reinterpret_cast<float*>(p + sd + sj + sb + 2 * s8 + s4 + m8 + m4 + sm);
    f->tickets = reinterpret_cast<int32_t*>(p + sd + sj + sb + 2 * s8 + s4 + m8 + m4 + sm + sp);
    BENCH_CHECK(cudaMemset(f->tickets, 0, st));
  }
  BENCH_CHECK(cudaMemcpy(f->desc, descs.data(), descs.size() * sizeof(MatrixDesc), cudaMemcpyHostToDevice));
  if (wide) {
    BENCH_CHECK(cudaMemcpy(f->jobs2, jobs2.data(), nj * sizeof(FusedJobV2), cudaMemcpyHostToDevice));
  } else {
    BENCH_CHECK(cudaMemcpy(f->jobs, jobs.data(), nj * sizeof(FusedJob), cudaMemcpyHostToDevice));
  }
  BENCH_CHECK(cudaMemcpy(f->jb, jb.data(), jb.size() * 4, cudaMemcpyHostToDevice));
  if (IsFusedV4(kernel)) {
    std::vector<uint8_t> maps(views.size() * kTensorMapBytes);
    for (size_t i = 0; i < views.size(); ++i) {
      BENCH_CHECK(EncodeFusedV4Map(views[i].dtype, descs[i], maps.data() + i * kTensorMapBytes));
    }
    BENCH_CHECK(cudaMemcpy(f->maps, maps.data(), maps.size(), cudaMemcpyHostToDevice));
  }
  if (!forced) {
    const DeviceInfo info =
        PlanningDevice(prop.major, prop.minor, prop.multiProcessorCount, g_max_sms);
    if (absl::Status st = PlanFusedCall(views, info, &f->call); !st.ok()) {
      std::fprintf(stderr, "PlanFusedCall: %s\n", std::string(st.message()).c_str());
      return 1;
    }
    const size_t up = al(f->call.upload.size()), work = al(f->call.work_bytes);
    const size_t tickets = f->call.needs_tickets ? al(kFusedV4TicketInts * 4) : 0;
    BENCH_CHECK(cudaMalloc(&f->call_dev, up + work + tickets));
    auto* q = static_cast<uint8_t*>(f->call_dev);
    BENCH_CHECK(cudaMemcpy(q, f->call.upload.data(), f->call.upload.size(),
                           cudaMemcpyHostToDevice));
    f->call_work = q + up;
    if (tickets > 0) {
      f->call_tickets = reinterpret_cast<int32_t*>(q + up + work);
      BENCH_CHECK(cudaMemset(f->call_tickets, 0, tickets));
    }
    f->pr = reinterpret_cast<double*>(static_cast<uint8_t*>(f->call_work) + f->call.o_pr);
    f->st = reinterpret_cast<int32_t*>(static_cast<uint8_t*>(f->call_work) + f->call.o_st);
    f->product = true;
  }
  return 0;
}

// After the fused launch that returned `e`: the finalize, unless v4 wrote
// every PR itself.
cudaError_t FinalizeUnlessFinished(const FusedPrepared& f, cudaError_t e, cudaStream_t s) {
  if (e != cudaSuccess || f.finished) return e;
  return LaunchFinalize(f.desc, f.jb, f.m, f.g2, f.tr, f.mx, f.pr, f.st, s);
}

// `whole`: v4 with no job cut (FusedPrepared::whole_plan).
cudaError_t RunPrepared(const FusedPrepared& f, cudaStream_t s, bool whole = false) {
  if (f.product && !whole) {
    return LaunchFusedCall(f.call, ProductKernels(), f.call_dev, f.call_work, f.call_tickets, s);
  }
  cudaError_t e = cudaErrorInvalidValue;
  switch (f.kernel) {
    case FusedKernel::kV1Tall:
      e = LaunchFused(f.dtype, f.desc, f.jobs, f.num_jobs, f.offdiag, f.g2, f.tr, f.mx, s);
      break;
    case FusedKernel::kV3:
      e = LaunchFusedV2(f.dtype, f.desc, f.jobs2, f.num_jobs, f.offdiag, f.g2, f.tr, f.mx, s);
      break;
    case FusedKernel::kV4:
    case FusedKernel::kV4Triangle:
      e = LaunchFusedV4(f.dtype, f.V4Launch(whole), s);
      break;
  }
  return FinalizeUnlessFinished(f, e, s);
}

int TimeQueued(const std::function<cudaError_t(int)>& launch, int reps, double warm_ms,
               cudaStream_t stream, std::vector<double>* ms);
int TimeAlone(const std::function<cudaError_t(int)>& launch, int r, bool spin,
              cudaStream_t stream, double* ms);

// --probe: times the bf16 v2 kernel alone with parts left out or K split
// across blocks (bench/dev/fused_probes.h, LaunchFusedV2Probe), to place the time.
int Probe(cudaStream_t stream, int reps, nlohmann::json* out) {
  struct V {
    const char* name;
    int flags, splits;
  };
  const std::vector<V> vs = {{"base", 0, 1},       {"rotate", 4, 1},   {"no_mma", 1, 1},
                             {"no_loads", 2, 1},   {"neither", 3, 1},  {"split2", 0, 2},
                             {"split4", 0, 4},     {"split8", 0, 8},   {"split4_rot", 4, 4},
                             {"split8_no_mma", 1, 8}};
  cudaEvent_t e0, e1;
  BENCH_CHECK(cudaEventCreate(&e0));
  BENCH_CHECK(cudaEventCreate(&e1));
  std::mt19937_64 rng(7);
  nlohmann::json rows = nlohmann::json::array();
  std::printf("\nprobe: v2 bf16 kernel alone (no finalize), median ms, queued after 100 ms warm-up\n%-16s", "variant");
  const std::vector<Case> cases = {{480, 128, 4096, DType::kBF16, "p"},
                                   {132, 128, 4096, DType::kBF16, "p"},
                                   {1, 128, 4096, DType::kBF16, "p"},
                                   {32, 1024, 4096, DType::kBF16, "p"}};
  for (const Case& c : cases) std::printf(" %5lldx%4lldx%-4lld", (long long)c.batch,
                                          (long long)c.rows, (long long)c.cols);
  std::printf("\n");
  std::vector<std::unique_ptr<Inputs>> ins;
  std::vector<std::vector<FusedPrepared>> preps(cases.size());
  void* outs = nullptr;
  size_t max_jobs = 0;
  for (size_t ci = 0; ci < cases.size(); ++ci) {
    auto in = std::make_unique<Inputs>();
    if (Build(cases[ci], rng, in.get(), /*oracle=*/false) != 0) return 1;
    preps[ci].resize(3);
    for (int st = 0; st < 3; ++st) {
      if (Prepare(in->sets[st], &preps[ci][st]) != 0) return 1;
    }
    max_jobs = std::max(max_jobs, size_t(preps[ci][0].num_jobs));
    ins.push_back(std::move(in));
  }
  BENCH_CHECK(cudaMalloc(&outs, max_jobs * 8 * 20));
  auto* g2 = static_cast<double*>(outs);
  auto* tr = g2 + max_jobs * 8;
  auto* mx = reinterpret_cast<float*>(tr + max_jobs * 8);
  for (const V& v : vs) {
    std::printf("%-16s", v.name);
    for (size_t ci = 0; ci < cases.size(); ++ci) {
      std::vector<double> t;
      auto launch = [&](int r) {
        const FusedPrepared& f = preps[ci][r % 3];
        return LaunchFusedV2Probe(f.desc, f.jobs2, f.num_jobs, f.offdiag, g2, tr, mx,
                                  v.flags, v.splits, stream);
      };
      if (TimeQueued(launch, reps, 100.0, stream, &t) != 0) return 1;
      const Case& c = cases[ci];
      std::printf(" %14.4f", Median(t));
      rows.push_back({{"variant", v.name}, {"batch", c.batch}, {"rows", c.rows},
                      {"cols", c.cols}, {"kernel_ms", Median(t)}});
    }
    std::printf("\n");
  }
  cudaFree(outs);
  (*out)["probe"] = rows;
  return 0;
}

// --ab: the wide kernels side by side from one binary: v3 (mma.sync +
// cp.async, live for unaligned rows and f32 Grams of side > 128) and v4
// (TMA + wgmma, live for the rest on sm_90). First accuracy:
// each kernel x dtype x spectrum family (flat, power-law, rank-1, Gaussian)
// on 128x4096 (diagonal jobs only) and 256x4096 / 1000x3001 (off-diagonal
// and edge tiles), max rel error vs the float64 SVD oracle. Then timing:
// the target cases, rounds A-B-A-B (each a queued median after 50 ms of
// warm-up); per kernel the median of the round medians and the spread
// (max - min).
//
// Besides the live kernels, v4's probes (bench/dev/fused_probes.h, LaunchFusedV4Probe):
// the exact one ("v4-chain1") takes part in both tables, the
// others (wrong on purpose) in the timing only.
struct Contender {
  const char* name;
  FusedKernel kernel;
  fused_v4::Mode v4_mode;  // kLive: the live kernel; else a probe
  bool exact;
  bool prev = false;  // v4 at an earlier revision (scripts/v4_prev.sh)
  bool no_finalize = false;  // the kernel alone (a probe: no PR)
  bool whole = false;  // the live kernel with no job cut (FusedV4Plan)
  bool tall = false;   // v4's triangle on tall 16-bit W (MN-major tiles; off in the policy)
};
constexpr Contender kContenders[] = {
    {"v3", FusedKernel::kV3, fused_v4::kLive, true},
    {"v1", FusedKernel::kV1Tall, fused_v4::kLive, true},
    {"v4-tall", FusedKernel::kV4Triangle, fused_v4::kLive, true, false, false, false, true},
    {"v4", FusedKernel::kV4, fused_v4::kLive, true},
    {"v4-tri", FusedKernel::kV4Triangle, fused_v4::kLive, true},
    {"v4-whole", FusedKernel::kV4, fused_v4::kLive, true, false, false, true},
#ifdef RVD_V4_PREV
    {"v4-prev", FusedKernel::kV4, fused_v4::kLive, true, true},
#endif
    {"v4-chain1", FusedKernel::kV4, fused_v4::kProbeChain1, true},
    {"v4-nofin", FusedKernel::kV4, fused_v4::kLive, false, false, true},
    {"v4-b=a", FusedKernel::kV4, fused_v4::kProbeBIsA, false},
    {"v4-noload", FusedKernel::kV4, fused_v4::kProbeNoLoad, false},
    {"v4-retire1", FusedKernel::kV4, fused_v4::kProbeRetire1, false},
    {"v4-noconv", FusedKernel::kV4, fused_v4::kProbeNoConvert, false},
    {"v4-mmaonly", FusedKernel::kV4, fused_v4::kProbeMmaOnly, false},
    {"v4-loadonly", FusedKernel::kV4, fused_v4::kProbeLoadOnly, false},
    {"v4-nocombine", FusedKernel::kV4, fused_v4::kProbeNoCombine, false},
};

cudaError_t RunContender(const FusedPrepared& f, const Contender& v, cudaStream_t s) {
#ifdef RVD_V4_PREV
  if (v.prev) {
    return FinalizeUnlessFinished(f, LaunchFusedV4Prev(f.dtype, f.V4Launch(), s), s);
  }
#endif
  if (v.no_finalize) {
    FusedV4Launch l = f.V4Launch();
    l.pr = nullptr;
    l.status = nullptr;
    return LaunchFusedV4(f.dtype, l, s);
  }
  if (v.v4_mode == fused_v4::kLive) return RunPrepared(f, s, v.whole);
  const cudaError_t e = LaunchFusedV4Probe(v.v4_mode, f.dtype, f.V4Launch(), s);
  if (e != cudaSuccess) return e;
  return LaunchFinalize(f.desc, f.jb, f.m, f.g2, f.tr, f.mx, f.pr, f.st, s);
}

// v4 only where it would serve on an H200 (f32: Gram side <= 128); some
// probes change f32's pipeline only, others the 16-bit work shapes.
bool Applies(const Contender& v, DType dt, int64_t rows, int64_t cols) {
  if (v.kernel == FusedKernel::kV3) return rows <= cols;  // (wide only)
  if (v.kernel == FusedKernel::kV1Tall) return rows > cols;
  if (v.tall) return FusedV4TallRuns(dt, rows, cols, /*aligned=*/true);
  if (rows > cols) return false;  // (v4's wide kernels)
  const bool f32 = dt == DType::kF32;
  if ((v.v4_mode == fused_v4::kProbeNoConvert || v.v4_mode == fused_v4::kProbeMmaOnly) && !f32) {
    return false;
  }
  if (v.v4_mode == fused_v4::kProbeChain1 && f32) return false;
  // f32 of Gram side > 128 (paired tiles): the live kernel and the probes
  // without copies, without conversion, or without both (the only probe
  // instances it has); not "v4-prev" (from before the paired tiles it would
  // run v4's diagonal-only f32 code on them).
  if (f32 && std::min(rows, cols) > kFusedPolicyV4Sm90.block_tile &&
      (v.prev || (v.v4_mode != fused_v4::kLive && v.v4_mode != fused_v4::kProbeNoLoad &&
                  v.v4_mode != fused_v4::kProbeNoConvert &&
                  v.v4_mode != fused_v4::kProbeMmaOnly))) {
    return false;
  }
  // "v4-tri" where the engine would run it; the others (v4's square kernel)
  // wherever v4 would run, the triangle's matrices included.
  const FusedKernel chosen = ChooseFusedKernel(9, 0, dt, rows, cols, /*aligned=*/true);
  return v.kernel == FusedKernel::kV4Triangle ? chosen == v.kernel : IsFusedV4(chosen);
}

// Each exact contender x dtype x spectrum family on 128x4096, 256x4096 and
// 1000x3001, 4 matrices each: max rel error vs the oracle into *acc.
// *all_ok: whether every one was within the tolerance. Returns non-zero on
// a CUDA or oracle error.
int ABAccuracy(cudaStream_t stream, std::mt19937_64& rng, nlohmann::json* acc, bool* all_ok) {
  std::printf("\nab accuracy: max rel err vs float64 SVD oracle (4 matrices each)\n");
  std::printf("%-5s %-10s %-9s", "dtype", "shape", "spectrum");
  for (const Contender& v : kContenders) {
    if (v.exact) std::printf(" %12s", v.name);
  }
  std::printf("\n");
  struct Sh {
    int64_t rows, cols;
  };
  for (DType dt : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (const Sh sh : {Sh{128, 4096}, Sh{256, 4096}, Sh{1000, 3001}, Sh{4096, 128},
                        Sh{3001, 100}}) {
      for (Spectrum sp : kAllSpectra) {
        const int64_t rows = sh.rows, cols = sh.cols;
        // Rows padded to 16 bytes, as the engine packs them.
        const int64_t ld = (cols * int64_t(DTypeSize(dt)) + 15) / 16 * 16 / int64_t(DTypeSize(dt));
        const size_t bytes = size_t(rows * ld) * DTypeSize(dt);
        void* dev = nullptr;
        BENCH_CHECK(cudaMalloc(&dev, bytes * 4));
        std::vector<MatrixView> views;
        std::vector<double> ref;
        for (int i = 0; i < 4; ++i) {
          const std::vector<uint8_t> host = BenchMatrix(rng, rows, cols, sp, dt);
          const MatrixView hv{host.data(), rows, cols, cols, dt};
          absl::StatusOr<double> pr = OraclePR(hv);
          if (!pr.ok()) return 1;
          ref.push_back(*pr);
          void* d = static_cast<uint8_t*>(dev) + bytes * i;
          const size_t es = DTypeSize(dt);
          BENCH_CHECK(cudaMemcpy2D(d, ld * es, host.data(), cols * es, cols * es, rows,
                                   cudaMemcpyHostToDevice));
          views.push_back(MatrixView{d, rows, cols, ld, dt});
        }
        std::printf("%-5s %4lldx%-5lld %-9s", DTypeName(dt), (long long)rows, (long long)cols,
                    SpectrumName(sp));
        for (const Contender& v : kContenders) {
          if (!v.exact) continue;
          if (!Applies(v, dt, rows, cols)) {
            std::printf(" %12s", "n/a");
            continue;
          }
          FusedPrepared f;
          if (Prepare(views, &f, v.kernel) != 0) return 1;
          BENCH_CHECK(cudaMemset(f.pr, 0xFF, 4 * sizeof(double)));
          BENCH_CHECK(RunContender(f, v, stream));
          std::vector<double> got(4);
          BENCH_CHECK(cudaMemcpyAsync(got.data(), f.pr, 4 * sizeof(double),
                                      cudaMemcpyDeviceToHost, stream));
          BENCH_CHECK(cudaStreamSynchronize(stream));
          const CheckResult r = CheckPR(got, ref, kExactPrTolerance);
          *all_ok &= r.mismatches == 0;
          std::printf(" %11.2e%s", r.max_rel_error, r.mismatches ? "!" : " ");
          acc->push_back({{"kernel", v.name}, {"dtype", DTypeName(dt)}, {"rows", rows},
                          {"cols", cols}, {"spectrum", SpectrumName(sp)},
                          {"max_rel_err", r.max_rel_error}, {"mismatches", r.mismatches}});
        }
        std::printf("\n");
        cudaFree(dev);
      }
    }
  }
  return 0;
}

// profile (--ncu): no accuracy table and no timing; live v4 (not the
// probes) launched twice per case, for a profiler to read.
int AB(cudaStream_t stream, int reps, bool profile, nlohmann::json* out) {
  constexpr int kV = sizeof(kContenders) / sizeof(kContenders[0]);
  std::mt19937_64 rng(11);
  nlohmann::json acc = nlohmann::json::array();
  bool all_ok = true;
  if (!profile && ABAccuracy(stream, rng, &acc, &all_ok) != 0) return 1;
  (*out)["ab_accuracy"] = acc;
  const std::vector<Case> cases = {{480, 128, 4096, DType::kF32, "ab"},
                                   {480, 128, 4096, DType::kBF16, "ab"},
                                   {480, 128, 4096, DType::kF16, "ab"},
                                   {256, 128, 4096, DType::kBF16, "ab"},
                                   {32, 1024, 4096, DType::kBF16, "ab"},
                                   {32, 1024, 4096, DType::kF32, "ab"},
                                   {32, 4096, 4096, DType::kF32, "ab"},
                                   {480, 4096, 128, DType::kBF16, "ab"}};
  constexpr int kRounds = 4;
  nlohmann::json rows = nlohmann::json::array();
  std::printf("\nab timing: kernel + finalize, median of %d rounds (each a queued median of %d"
              " after 50 ms warm-up), spread = max - min of the rounds, ms\n%-22s", kRounds, reps,
              "case");
  for (const Contender& v : kContenders) std::printf(" %20s", v.name);
  std::printf("\n");
  for (const Case& c : cases) {
    if (!Selected(c)) continue;
    Inputs in;
    if (Build(c, rng, &in, /*oracle=*/false) != 0) return 1;
    std::vector<std::vector<FusedPrepared>> prep(kV);
    for (int v = 0; v < kV; ++v) {
      if (!Applies(kContenders[v], c.dtype, c.rows, c.cols)) continue;
      prep[v] = std::vector<FusedPrepared>(3);
      for (int s = 0; s < 3; ++s) {
        if (Prepare(in.sets[s], &prep[v][s], kContenders[v].kernel) != 0) return 1;
      }
    }
    if (profile) {
      for (int v = 0; v < kV; ++v) {
        const Contender& k = kContenders[v];
        if (prep[v].empty() || !IsFusedV4(k.kernel) || k.v4_mode != fused_v4::kLive) {
          continue;
        }
        for (int r = 0; r < 2; ++r) BENCH_CHECK(RunContender(prep[v][r], k, stream));
        BENCH_CHECK(cudaStreamSynchronize(stream));
      }
      continue;
    }
    std::vector<std::vector<double>> med(kV);
    for (int round = 0; round < kRounds; ++round) {
      for (int v = 0; v < kV; ++v) {
        if (prep[v].empty()) continue;
        std::vector<double> t;
        auto launch = [&](int r) { return RunContender(prep[v][r % 3], kContenders[v], stream); };
        if (TimeQueued(launch, reps, 50.0, stream, &t) != 0) return 1;
        med[v].push_back(Median(t));
      }
    }
    const std::string label = absl::StrCat(c.batch, " x ", c.rows, "x", c.cols, " ",
                                           DTypeName(c.dtype));
    std::printf("%-22s", label.c_str());
    for (int v = 0; v < kV; ++v) {
      if (med[v].empty()) {
        std::printf("  %20s", "n/a");
        continue;
      }
      const double m = Median(med[v]);
      const double sp = *std::max_element(med[v].begin(), med[v].end()) -
                        *std::min_element(med[v].begin(), med[v].end());
      std::printf("  %9.4f +- %6.4f", m, sp);
      rows.push_back({{"kernel", kContenders[v].name}, {"batch", c.batch}, {"rows", c.rows},
                      {"cols", c.cols}, {"dtype", DTypeName(c.dtype)}, {"kernel_ms", m},
                      {"spread_ms", sp}, {"rounds_ms", med[v]}});
    }
    std::printf("\n");
  }
  (*out)["ab_timing"] = rows;
  return all_ok ? 0 : 1;
}

// Times launch(r) for r = 0 .. reps-1 queued back to back, one event pair
// around each, after at least warm_ms of the same launches back to back: the
// H200 idles at 345 MHz SM clock and ramps to 1980 MHz only under sustained
// load (KINDS.md), so a launch timed alone after a host sync can run at a
// fraction of the clock. Medians of the per-launch times go to *ms.
int TimeQueued(const std::function<cudaError_t(int)>& launch, int reps, double warm_ms,
               cudaStream_t stream, std::vector<double>* ms) {
  std::vector<cudaEvent_t> ev(2 * reps);
  for (cudaEvent_t& e : ev) BENCH_CHECK(cudaEventCreate(&e));
  double warmed = 0;
  for (int round = 0; round < 200 && warmed < warm_ms; ++round) {
    BENCH_CHECK(cudaEventRecord(ev[0], stream));
    for (int r = 0; r < 10; ++r) BENCH_CHECK(launch(r));
    BENCH_CHECK(cudaEventRecord(ev[1], stream));
    BENCH_CHECK(cudaEventSynchronize(ev[1]));
    float t = 0;
    BENCH_CHECK(cudaEventElapsedTime(&t, ev[0], ev[1]));
    warmed += t;
  }
  for (int r = 0; r < reps; ++r) {
    BENCH_CHECK(cudaEventRecord(ev[2 * r], stream));
    BENCH_CHECK(launch(r));
    BENCH_CHECK(cudaEventRecord(ev[2 * r + 1], stream));
  }
  BENCH_CHECK(cudaEventSynchronize(ev[2 * reps - 1]));
  ms->clear();
  for (int r = 0; r < reps; ++r) {
    float t = 0;
    BENCH_CHECK(cudaEventElapsedTime(&t, ev[2 * r], ev[2 * r + 1]));
    ms->push_back(t);
  }
  for (cudaEvent_t& e : ev) cudaEventDestroy(e);
  return 0;
}

// Launch r timed alone, after a host sync. With `spin`, a 50 us spin kernel
// goes ahead of it, so that the GPU reaches the start event only after the
// host has queued the launch (the host's submission time, slow after a
// sleep, stays out); without, the submission is inside the events (as in
// torch_peers.py's harness).
int TimeAlone(const std::function<cudaError_t(int)>& launch, int r, bool spin,
              cudaStream_t stream, double* ms) {
  cudaEvent_t e0, e1;
  BENCH_CHECK(cudaEventCreate(&e0));
  BENCH_CHECK(cudaEventCreate(&e1));
  if (spin) BENCH_CHECK(LaunchSpin(50000, stream));
  BENCH_CHECK(cudaEventRecord(e0, stream));
  BENCH_CHECK(launch(r));
  BENCH_CHECK(cudaEventRecord(e1, stream));
  BENCH_CHECK(cudaEventSynchronize(e1));
  float t = 0;
  BENCH_CHECK(cudaEventElapsedTime(&t, e0, e1));
  *ms = t;
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return 0;
}

// A variant as the benchmark runs it: the exact ones by name, the
// estimators with their K (Hutchinson or Hutch++) or sketch rank r.
struct VariantRun {
  const char* name;
  int probes = 0, rank = 0;
  bool hpp = false;

  VariantSpec Spec(uint64_t seed) const {
    VariantSpec v;
    v.name = name;
    if (probes > 0) v.probes = probes;
    if (rank > 0) v.sketch_rank = rank;
    v.hutch_plus_plus = hpp;
    v.seed = seed;
    return v;
  }
  std::string Label() const {
    if (rank > 0) return absl::StrCat("sketch r=", rank);
    if (probes > 0) return absl::StrCat(hpp ? "hutch++" : "hutchinson", " K=", probes);
    return name;
  }
};
// The estimators the benchmark measures: the seed's K and r.
const std::vector<VariantRun> kEstimatorRuns = {
    {"power_iter", 10},       {"power_iter", 50},       {"power_iter", 200},
    {"power_iter", 10, 0, true}, {"power_iter", 50, 0, true}, {"power_iter", 200, 0, true},
    {"sketch", 0, 16},        {"sketch", 0, 128}};

// Relative errors' mean, p95 and largest (sorts `err`).
struct ErrorStats {
  double mean = 0, p95 = 0, max = 0;
};
ErrorStats StatsOf(std::vector<double> err) {
  std::sort(err.begin(), err.end());
  ErrorStats e;
  for (double x : err) e.mean += x / err.size();
  e.p95 = err[std::min(err.size() - 1, size_t(0.95 * err.size()))];
  e.max = err.back();
  return e;
}

// --sustain: fused kernels run long enough for the H200's power control
// to settle (it holds 1980 MHz for ~0.1 s of back-to-back launches, then
// its 700 W cap lowers the SM clock: run s6-1), in three modes per run:
//   queued  launches back to back for 1.5 s (a median per 100 ms window);
//   synced  each launch timed alone after a host sync, 0.5 s;
//   spaced  as synced with 5 ms idle after each launch, 1 s: what a
//           sidecar measuring on an interval sees (a low duty cycle).
// (synced and spaced: each launch timed alone, TimeAlone, rotating the
// 3 input sets.)
// Each window is stamped with the wall clock (seconds since the epoch) so
// that nvidia-smi's clock and power samples (gpu_host_run.sh, smi.csv;
// bench/smi_align.py) can be placed against it. The f32 case whose last
// round is cut (480 jobs) runs the live kernel and "v4-whole" (the same
// jobs uncut) alternately, two rounds each: an A-B whose
// blocks are long enough that each kernel runs at its own clock (the --ab
// rounds are too short for that: the clock is set by their mix). Any
// contender may take part, probes and "v4-prev" (scripts/v4_prev.sh; the
// live kernel again without it) included (session 6 timed each part of the
// kernel alone at the power cap that way).
int Sustain(cudaStream_t stream, nlohmann::json* out) {
  auto wall = [] {
    return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
        .count();
  };
  struct Run {
    Case c;
    std::vector<std::string> contenders;  // kContenders' names
  };
  const std::vector<Run> runs = {
      {{480, 128, 4096, DType::kF32, "sustain"},
       {"v4", "v4-prev", "v4-whole", "v4", "v4-prev", "v4-whole"}},
      // 3 and 4 whole rounds on 132 SMs, what the cut of 480's last round
      // is measured against (docs/history/kernel-notes.md, session 8).
      {{396, 128, 4096, DType::kF32, "sustain"}, {"v4"}},
      {{528, 128, 4096, DType::kF32, "sustain"}, {"v4"}},
      {{480, 128, 4096, DType::kBF16, "sustain"}, {"v4-tri"}},
      {{256, 128, 4096, DType::kBF16, "sustain"}, {"v4-tri"}},
      {{32, 1024, 4096, DType::kBF16, "sustain"}, {"v4", "v4-prev", "v4", "v4-prev"}},
      // f32 Grams of side > 128: v4's paired tiles against v3's 3xTF32
      // (what served them before), and the Llama-2-7B V set without GQA.
      {{32, 1024, 4096, DType::kF32, "sustain"}, {"v4", "v3", "v4", "v3"}},
      {{32, 4096, 4096, DType::kF32, "sustain"}, {"v4", "v3", "v4", "v3"}},
      {{32, 4096, 4096, DType::kBF16, "sustain"}, {"v4", "v3"}},
      // Tall 16-bit: v1 (what serves it) against v4's triangle on MN-major
      // tiles (the policy's `tall`, off until measured).
      {{480, 4096, 128, DType::kBF16, "sustain"}, {"v1", "v4-tall", "v1", "v4-tall"}}};
  // Without scripts/v4_prev.sh's copy, "v4-prev" is the live kernel again.
  const bool have_prev = std::any_of(std::begin(kContenders), std::end(kContenders),
                                     [](const Contender& k) { return k.prev; });
  enum Mode { kQueued, kSynced, kSpaced };
  const char* const kModeNames[] = {"queued", "synced", "spaced"};
  const double kSeconds[] = {1.5, 0.5, 1.0};
  std::mt19937_64 rng(13);
  nlohmann::json rows = nlohmann::json::array();
  std::printf("\nsustain: kernel + finalize ms, median of the 100 ms windows (queued: after"
              " the first 0.3 s)\n%-22s %-30s %9s %9s %9s\n",
              "case", "kernel", "queued", "synced", "spaced");
  for (const Run& run : runs) {
    const Case& c = run.c;
    if (!Selected(c)) continue;
    Inputs in;
    if (Build(c, rng, &in, /*oracle=*/false) != 0) return 1;
    const std::string label = absl::StrCat(c.batch, " x ", c.rows, "x", c.cols, " ",
                                           DTypeName(c.dtype));
    for (const std::string& wanted : run.contenders) {
      const std::string name = wanted == "v4-prev" && !have_prev ? "v4" : wanted;
      const Contender* v = nullptr;
      for (const Contender& k : kContenders) {
        if (name == k.name) v = &k;
      }
      if (v == nullptr) {
        std::fprintf(stderr, "sustain: no contender %s\n", name.c_str());
        return 1;
      }
      std::vector<FusedPrepared> prep(3);
      for (int s = 0; s < 3; ++s) {
        if (Prepare(in.sets[s], &prep[s], v->kernel) != 0) return 1;
      }
      // The schedule that ran: "v4 cut 84x3" when the last round's jobs
      // were cut (FusedV4Plan).
      const FusedV4Plan& plan = v->whole ? prep[0].whole_plan : prep[0].plan;
      const std::string kernel =
          plan.pieces > 1 ? absl::StrCat(v->name, " cut ", plan.cut, "x", plan.pieces)
                          : std::string(v->name);
      auto launch = [&](int r) { return RunContender(prep[r % 3], *v, stream); };
      std::printf("%-22s %-30s", label.c_str(), kernel.c_str());
      for (const Mode mode : {kQueued, kSynced, kSpaced}) {
        const double t0 = wall();
        nlohmann::json series = nlohmann::json::array();
        std::vector<double> window_medians;
        while (wall() - t0 < kSeconds[mode]) {
          const double w0 = wall();
          std::vector<double> t;
          for (int r = 0; wall() - w0 < 0.1; ++r) {
            if (mode == kQueued) {
              std::vector<double> part;
              if (TimeQueued(launch, 20, 0.0, stream, &part) != 0) return 1;
              t.insert(t.end(), part.begin(), part.end());
              continue;
            }
            double ms = 0;
            if (TimeAlone(launch, r, /*spin=*/true, stream, &ms) != 0) return 1;
            t.push_back(ms);
            if (mode == kSpaced) std::this_thread::sleep_for(std::chrono::milliseconds(5));
          }
          series.push_back({{"wall_s", w0}, {"ms", Median(t)}, {"launches", t.size()}});
          if (mode != kQueued || w0 - t0 >= 0.3) window_medians.push_back(Median(t));
        }
        const double m = Median(window_medians);
        std::printf(" %9.4f", m);
        rows.push_back({{"batch", c.batch}, {"rows", c.rows}, {"cols", c.cols},
                        {"dtype", DTypeName(c.dtype)}, {"kernel", kernel},
                        {"mode", kModeNames[mode]}, {"kernel_ms", m}, {"series", series}});
      }
      std::printf("\n");
    }
  }
  (*out)["sustain"] = rows;
  return 0;
}

int Main(int argc, char** argv) {
  std::string json_path;
  int reps = 50;
  bool quick = false, probe = false, ab = false, ncu = false, sustain = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--json" && i + 1 < argc) json_path = argv[++i];
    else if (a.rfind("--json=", 0) == 0) json_path = a.substr(7);
    else if (a == "--reps" && i + 1 < argc) reps = std::atoi(argv[++i]);
    else if (a == "--quick") quick = true;
    else if (a == "--probe") probe = true;
    else if (a == "--ab") ab = true;
    else if (a == "--ncu") ab = ncu = true;
    else if (a == "--sustain") sustain = true;
    else if (a == "--max-sms" && i + 1 < argc) g_max_sms = std::atoi(argv[++i]);
    else if (a == "--case" && i + 1 < argc) g_cases.push_back(argv[++i]);
    else {
      std::fprintf(stderr,
                   "usage: %s [--json PATH] [--reps N] [--quick] [--probe] [--ab] [--ncu] [--sustain] "
                   "[--max-sms N] [--case BATCHxROWSxCOLS:DTYPE ...]\n",
                   argv[0]);
      return 2;
    }
  }
  CudaEngineOptions opt;
  opt.max_device_bytes = 16ull << 30;
  opt.max_sms = g_max_sms;
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
  if (ab) {
    const int rc = AB(stream, reps, ncu, &out);
    if (!json_path.empty()) std::ofstream(json_path) << out.dump(2);
    return rc;
  }
  if (sustain) {
    const int rc = Sustain(stream, &out);
    if (!json_path.empty()) std::ofstream(json_path) << out.dump(2);
    return rc;
  }
  if (probe) {
    const int rc = Probe(stream, reps, &out);
    if (!json_path.empty()) std::ofstream(json_path) << out.dump(2);
    return rc;
  }

  std::vector<Case> cases = {
      {480, 128, 4096, DType::kF32, "issue", 0.30},  {480, 128, 4096, DType::kBF16, "issue", 0.14},
      {256, 128, 4096, DType::kBF16, "issue", 0.085}, {32, 1024, 4096, DType::kBF16, "issue", 0.25},
      // f32 weights (issue 15: 6.2 ms on v3 before v4's paired tiles).
      {32, 1024, 4096, DType::kF32, "issue", 0.8},
      {480, 128, 4096, DType::kF16, "dtype"},
      // A Llama-2-7B V set without GQA (32 layers of 4096 x 4096).
      {32, 4096, 4096, DType::kBF16, "mha7b"}, {32, 4096, 4096, DType::kF32, "mha7b"},
      {480, 4096, 128, DType::kBF16, "tall"},
  };
  // --quick: the five target cases and the tall (v1) case only.
  if (quick) cases.erase(cases.begin() + 5, cases.begin() + 8);
  for (int64_t b : {1, 4, 16, 64, 256, 1024}) {
    if (!quick) cases.push_back({b, 128, 4096, DType::kBF16, "scaling"});
  }
  cases.erase(std::remove_if(cases.begin(), cases.end(), [](const Case& c) { return !Selected(c); }),
              cases.end());
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
      absl::Status s = engine.ComputePRDevice(views, v, absl::MakeSpan(got), Ready(stream));
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
  std::printf("\n%-8s %5s %10s %-4s | %11s %9s %9s | %6s %4s | %7s %7s %7s | %9s %9s %9s %8s"
              " | %s\n",
              "case", "batch", "shape", "type", "isolated_ms", "synced_ms", "steady_ms", "target",
              "met", "%floor", "GB/s", "TFLOP/s", "fused_ms", "alg_ms", "spread_ms", "floor_ms",
              "served by");
  int targets = 0, met = 0, met_steady = 0;
  nlohmann::json calls = nlohmann::json::array();
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
    auto run = [&](int r) { return RunPrepared(prep[r % 3], stream); };
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    // Medians after 5 warm-up launches: spaced (spin ahead, 5 ms idle after
    // each) and synced.
    std::vector<double> ti, kt;
    for (const bool spaced : {true, false}) {
      for (int r = 0; r < reps + 5; ++r) {
        double ms = 0;
        if (TimeAlone(run, r, spaced, stream, &ms) != 0) return 1;
        if (r >= 5) (spaced ? ti : kt).push_back(ms);
        if (spaced) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
    }
    const double isolated_ms = Median(ti), synced_ms = Median(kt);
    // The same, queued back to back after 200 ms of warm-up (steady clocks).
    std::vector<double> kq;
    if (TimeQueued(run, reps, 200.0, stream, &kq) != 0) return 1;
    const double steady_ms = Median(kq);
    // Whole calls interleaved: fused on the next input set (planned anew),
    // fused on the same set again (the plan reused: what a sidecar's
    // repeated measurement of the same weights gets), algebraic.
    std::vector<double> ta, tr, tb, plan;
    const int call_reps = std::max(6, reps / (c.batch * c.rows * c.cols > (1ll << 28) ? 5 : 1));
    for (int r = 0; r < call_reps + 2; ++r) {
      for (int which = 0; which < 3; ++which) {
        VariantSpec v;
        v.name = which == 2 ? "algebraic" : "fused";
        std::vector<double> got(c.batch);
        const double plan0 = engine.Stats().phase_seconds["plan"];
        const double t0 = Now();
        absl::Status s = engine.ComputePRDevice(in.sets[r % 3], v, absl::MakeSpan(got), Ready(stream));
        const double t1 = Now();
        if (!s.ok()) {
          std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
          return 1;
        }
        if (r < 2) continue;
        (which == 0 ? ta : which == 1 ? tr : tb).push_back((t1 - t0) * 1e3);
        if (which == 0) plan.push_back((engine.Stats().phase_seconds["plan"] - plan0) * 1e3);
      }
    }
    calls.push_back({{"case", c.tag}, {"batch", c.batch}, {"rows", c.rows}, {"cols", c.cols},
                     {"dtype", DTypeName(c.dtype)}, {"call_ms", Median(ta)},
                     {"repeat_call_ms", Median(tr)}, {"plan_ms", Median(plan)},
                     {"isolated_ms", isolated_ms}});
    const size_t h = ta.size() / 2;
    auto half_median = [](const std::vector<double>& v, size_t b, size_t e) {
      return Median(std::vector<double>(v.begin() + b, v.begin() + e));
    };
    const double spread = std::max(
        std::fabs(half_median(ta, 0, h) - half_median(ta, h, ta.size())),
        std::fabs(half_median(tb, 0, h) - half_median(tb, h, tb.size())));
    const std::string shape = absl::StrCat(c.rows, "x", c.cols);
    const bool has_target = c.target_ms > 0;
    targets += has_target;
    met += has_target && isolated_ms <= c.target_ms;
    met_steady += has_target && steady_ms <= c.target_ms;
    const std::string target = has_target ? absl::StrFormat("%.3f", c.target_ms) : "";
    const char* verdict = !has_target ? "" : isolated_ms <= c.target_ms ? "yes" : "no";
    std::printf("%-8s %5lld %10s %-4s | %11.4f %9.4f %9.4f | %6s %4s | %6.1f%% %7.0f %7.1f |"
                " %9.4f %9.4f %9.4f %8.4f | %s\n",
                c.tag.c_str(), (long long)c.batch, shape.c_str(), DTypeName(c.dtype),
                isolated_ms, synced_ms, steady_ms, target.c_str(), verdict,
                100.0 * floor_ms / isolated_ms, bytes / (isolated_ms * 1e-3) / 1e9,
                flops / (isolated_ms * 1e-3) / 1e12, Median(ta), Median(tb), spread, floor_ms,
                FusedPolicyOf(prep[0].kernel).name);
    timing.push_back({{"case", c.tag}, {"batch", c.batch}, {"rows", c.rows}, {"cols", c.cols},
                      {"dtype", DTypeName(c.dtype)}, {"isolated_ms", isolated_ms},
                      {"synced_ms", synced_ms}, {"steady_ms", steady_ms},
                      {"target_ms", c.target_ms},
                      {"pct_of_floor", 100.0 * floor_ms / isolated_ms},
                      {"GBps", bytes / (isolated_ms * 1e-3) / 1e9},
                      {"TFLOPs_full_gram", flops / (isolated_ms * 1e-3) / 1e12},
                      {"fused_call_ms", Median(ta)}, {"algebraic_call_ms", Median(tb)},
                      {"call_spread_ms", spread}, {"floor_ms", floor_ms},
                      {"policy", FusedPolicyOf(prep[0].kernel).name}});
  }
  out["timing"] = timing;
  // Where a call's time goes beyond its kernels.
  std::printf("\nfused calls, wall clock ms (median): a new plan, the plan reused, the host's"
              " planning of a new one, the kernels alone (isolated)\n%-8s %5s %10s %-4s | %9s"
              " %9s %9s %11s\n",
              "case", "batch", "shape", "type", "call", "repeat", "plan", "isolated");
  for (const nlohmann::json& k : calls) {
    std::printf("%-8s %5lld %10s %-4s | %9.4f %9.4f %9.4f %11.4f\n",
                k["case"].get<std::string>().c_str(), k["batch"].get<long long>(),
                absl::StrCat(k["rows"].get<int64_t>(), "x", k["cols"].get<int64_t>()).c_str(),
                k["dtype"].get<std::string>().c_str(), k["call_ms"].get<double>(),
                k["repeat_call_ms"].get<double>(), k["plan_ms"].get<double>(),
                k["isolated_ms"].get<double>());
  }
  std::printf("(plans reused: %lld matrices)\n",
              static_cast<long long>(engine.Stats().events["fused_plan_reused"]));
  out["calls"] = calls;
  std::printf("targets met: %d of %d in isolated calls, %d of %d at steady load\n", met,
              targets, met_steady, targets);
  out["targets"] = {{"cases", targets}, {"met_isolated", met}, {"met_steady", met_steady}};

  // 4. Every variant on the seed's cases (480 x 128x4096, f32 and bf16):
  // ComputePRDevice calls, wall clock, median after one warm-up call, each
  // against the oracle: the exact variants' largest error, the estimators'
  // mean and p95 over the batch (one seed per call: every matrix gets the
  // same draws). naive runs
  // one matrix after another, so it is timed on 16 matrices and scaled to
  // the batch (x30), as the table says.
  nlohmann::json lineup = nlohmann::json::array();
  std::printf("\nevery variant on the seed's case (one call, wall clock, median):\n");
  std::printf("%-5s %-18s %9s %7s %7s %10s %10s | %s\n", "dtype", "variant", "call_ms", "%floor",
              "GB/s", "err", "p95 err", "served by");
  std::vector<VariantRun> runs = {{"fused"}, {"algebraic"}, {"naive"}};
  runs.insert(runs.end(), kEstimatorRuns.begin(), kEstimatorRuns.end());
  for (size_t ci = 0; ci < cases.size(); ++ci) {
    const Case& c = cases[ci];
    if (c.tag != "issue" || c.batch != 480) continue;
    const Inputs& in = *inputs[ci];
    const double floor_ms = double(c.batch) * c.rows * c.cols * DTypeSize(c.dtype) /
                            (copy_tbps * 1e12) * 1e3;
    for (const VariantRun& l : runs) {
      const VariantSpec v = l.Spec(20261129);
      const bool naive = v.name == "naive";
      const size_t n = naive ? 16 : c.batch;
      const int calls = naive ? 2 : std::max(3, reps / 3);
      const std::map<std::string, int64_t> before = engine.Stats().served;
      std::vector<double> ms, got(n);
      int set = 0;
      for (int r = 0; r < calls + 1; ++r) {
        set = r % 3;
        const std::vector<MatrixView> views(in.sets[set].begin(), in.sets[set].begin() + n);
        const double t0 = Now();
        const absl::Status st = engine.ComputePRDevice(views, v, absl::MakeSpan(got), Ready(stream));
        const double t1 = Now();
        if (!st.ok()) {
          std::fprintf(stderr, "%s: %s\n", l.name, std::string(st.message()).c_str());
          return 1;
        }
        if (r > 0) ms.push_back((t1 - t0) * 1e3 * (naive ? double(c.batch) / n : 1.0));
      }
      // Errors of the last call (set `set`: matrix i is distinct (i + set)).
      std::vector<double> err;
      for (size_t i = 0; i < n; ++i) {
        const double ref = in.ref[(i + set) % in.distinct];
        err.push_back(std::fabs(got[i] - ref) / ref);
      }
      const ErrorStats es = StatsOf(std::move(err));
      std::string served;  // the path whose count this variant's calls raised
      for (const auto& [key, count] : engine.Stats().served) {
        const auto it = before.find(key);
        if (count > (it == before.end() ? 0 : it->second)) served = key;
      }
      const bool exact = IsExactVariant(l.name);
      const std::string label = naive ? std::string("naive (x30 of 16)") : l.Label();
      const double call_ms = Median(ms);
      const double bytes = double(c.batch) * c.rows * c.cols * DTypeSize(c.dtype);
      std::printf("%-5s %-18s %9.3f %6.1f%% %7.0f %10.2e %10.2e | %s\n", DTypeName(c.dtype),
                  label.c_str(), call_ms, 100.0 * floor_ms / call_ms,
                  bytes / (call_ms * 1e-3) / 1e9, exact ? es.max : es.mean, es.p95,
                  served.c_str());
      lineup.push_back({{"batch", c.batch}, {"rows", c.rows}, {"cols", c.cols},
                        {"dtype", DTypeName(c.dtype)}, {"variant", l.name}, {"label", label},
                        {"exact", exact}, {"call_ms", call_ms},
                        {"pct_of_floor", 100.0 * floor_ms / call_ms},
                        {"GBps", bytes / (call_ms * 1e-3) / 1e9}, {"max_rel_err", es.max},
                        {"mean_rel_err", es.mean}, {"p95_rel_err", es.p95}, {"served", served},
                        {"matrices_timed", n}});
    }
  }
  out["lineup"] = lineup;
  if (quick) {
    nlohmann::json served;
    for (const auto& [k, n] : engine.Stats().served) served[k] = n;
    out["served"] = served;
    std::printf("\nserved: %s\n", served.dump().c_str());
    if (!json_path.empty()) std::ofstream(json_path) << out.dump(2);
    return 0;  // --quick: no estimator curves
  }

  // 5. Estimator accuracy curves.
  std::printf("\nestimators, 128x1024 f32, 24 matrices per family: mean / p95 rel error\n");
  nlohmann::json est = nlohmann::json::array();
  for (Spectrum sp : {Spectrum::kFlat, Spectrum::kPowerLaw, Spectrum::kRankOne,
                      Spectrum::kGaussian}) {
    std::vector<std::vector<uint8_t>> mats;
    std::vector<MatrixView> views;
    std::vector<double> ref;
    for (int i = 0; i < (quick ? 8 : 24); ++i) {
      mats.push_back(BenchMatrix(rng, 128, 1024, sp, DType::kF32));
    }
    for (auto& m : mats) {
      views.push_back(MatrixView{m.data(), 128, 1024, 1024, DType::kF32});
      ref.push_back(*OraclePR(views.back()));
    }
    for (const VariantRun& e : kEstimatorRuns) {
      VariantSpec v = e.Spec(0);
      std::vector<double> err;
      for (size_t i = 0; i < views.size(); ++i) {
        v.seed = 1000 + i;
        std::vector<double> got(1);
        if (!engine.ComputePR({views[i]}, v, absl::MakeSpan(got)).ok()) return 1;
        err.push_back(std::fabs(got[0] - ref[i]) / ref[i]);
      }
      const ErrorStats st = StatsOf(std::move(err));
      const std::string label = e.Label();
      std::printf("  %-9s %-18s mean %.4f  p95 %.4f\n", SpectrumName(sp), label.c_str(), st.mean,
                  st.p95);
      est.push_back({{"spectrum", SpectrumName(sp)}, {"estimator", label},
                     {"mean_rel_err", st.mean}, {"p95_rel_err", st.p95}});
    }
  }
  out["estimators"] = est;
  nlohmann::json served;
  for (const auto& [k, n] : engine.Stats().served) served[k] = n;
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

#include "self_improve/device_tools.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <numeric>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "kernels/dtype_convert.h"
#include "self_improve/acceptance.h"
#include "self_improve/candidate_abi.h"
#include "self_improve/reference.h"
#include "self_improve/seed_mix.h"
#include "self_improve/space.h"

namespace rvd::tune {

static_assert(sizeof(TuneJob) == TuneDevice::kJobBytes,
              "TuneDevice passes TuneJob records as kJobBytes bytes each");

namespace {

constexpr double kPi = 3.14159265358979323846;

// A stream of draws from one matrix's seed.
struct Draws {
  uint64_t state;
  // splitmix64: each draw a function of its index, so that consecutive draws
  // do not wait on one another.
  uint64_t Next() { return SplitMix64(state += 0x9e3779b97f4a7c15ull); }
  // Near-normal, variance 1: four 16-bit uniforms summed (Irwin-Hall).
  // (The four summed as integers: the same value as summing the quotients.)
  double Normal() {
    const uint64_t b = Next();
    const uint64_t s = (b & 0xffff) + ((b >> 16) & 0xffff) + ((b >> 32) & 0xffff) + (b >> 48);
    return (static_cast<double>(s) / 65536.0 - 2.0) * std::sqrt(3.0);
  }
  double Sign() { return (Next() & 1) != 0 ? 1.0 : -1.0; }
};

// The n x k (n <= k) wide form of a planned matrix, row-major, float64.
std::vector<double> WideValues(const MatrixPlan& p, int n, int k, Draws& d) {
  std::vector<double> w(static_cast<size_t>(n) * k);
  const auto gaussian = [&] {
    for (double& x : w) x = d.Normal();
  };
  switch (p.kind) {
    case MatrixKind::kFlat:
    case MatrixKind::kPowerLaw:
    case MatrixKind::kSpiked: {
      std::vector<double> s(static_cast<size_t>(n), 1.0);
      if (p.kind == MatrixKind::kPowerLaw) {
        for (int i = 0; i < n; ++i) s[i] = std::pow(i + 1.0, -0.7);
      }
      if (p.kind == MatrixKind::kSpiked) s[0] = 100.0;
      // n distinct DCT-II frequencies (a partial Fisher-Yates), column signs.
      std::vector<int> freq(static_cast<size_t>(k));
      std::iota(freq.begin(), freq.end(), 0);
      for (int i = 0; i < n; ++i) std::swap(freq[i], freq[i + d.Next() % (k - i)]);
      std::vector<double> sign(static_cast<size_t>(k));
      for (double& x : sign) x = d.Sign();
      // cos(pi f (j + 1/2) / k) = cos(pi m / (2k)), m = f (2j + 1) mod 4k:
      // one table of 4k cosines instead of one per entry.
      const int64_t period = 4 * static_cast<int64_t>(k);
      std::vector<double> cosine(static_cast<size_t>(period));
      for (int64_t m = 0; m < period; ++m) {
        cosine[static_cast<size_t>(m)] = std::cos(kPi * static_cast<double>(m) / (2.0 * k));
      }
      for (int i = 0; i < n; ++i) {
        const double scale = s[i] * std::sqrt((freq[i] == 0 ? 1.0 : 2.0) / k);
        const int64_t step = 2 * static_cast<int64_t>(freq[i]) % period;
        int64_t m = freq[i] % period;  // j = 0
        for (int j = 0; j < k; ++j) {
          w[static_cast<size_t>(i) * k + j] = scale * cosine[static_cast<size_t>(m)] * sign[j];
          m += step;
          if (m >= period) m -= period;
        }
      }
      // U = I - 2 a a^T (a a unit vector): W = M - 2 a (a^T M).
      std::vector<double> a(static_cast<size_t>(n));
      double norm = 0;
      for (double& x : a) {
        x = d.Normal();
        norm += x * x;
      }
      norm = std::sqrt(norm);
      for (double& x : a) x /= norm;
      std::vector<double> y(static_cast<size_t>(k), 0.0);
      for (int i = 0; i < n; ++i) {
        for (int j = 0; j < k; ++j) y[j] += a[i] * w[static_cast<size_t>(i) * k + j];
      }
      for (int i = 0; i < n; ++i) {
        for (int j = 0; j < k; ++j) w[static_cast<size_t>(i) * k + j] -= 2 * a[i] * y[j];
      }
      return w;
    }
    case MatrixKind::kRankOne: {
      std::vector<double> u(static_cast<size_t>(n)), v(static_cast<size_t>(k));
      for (double& x : u) x = d.Normal();
      for (double& x : v) x = d.Normal();
      for (int i = 0; i < n; ++i) {
        for (int j = 0; j < k; ++j) w[static_cast<size_t>(i) * k + j] = u[i] * v[j];
      }
      return w;
    }
    case MatrixKind::kZeros: return w;
    case MatrixKind::kGaussian:
    case MatrixKind::kNaN:
    case MatrixKind::kInf:
    case MatrixKind::kHuge:
    case MatrixKind::kTiny:
    case MatrixKind::kSubnormal: break;
  }
  gaussian();
  double scale = 1;
  if (p.kind == MatrixKind::kHuge) scale = 1e19;
  if (p.kind == MatrixKind::kTiny) scale = 1e-20;
  if (p.kind == MatrixKind::kSubnormal) scale = 1e-39;
  for (double& x : w) x *= scale;
  return w;
}

// One input as the device receives it: its matrices, their jobs under a
// kernel's tile, and where each matrix's jobs are.
struct Input {
  std::vector<std::vector<uint8_t>> bytes;
  std::vector<MatrixView> views;
  std::vector<MatrixPlan> plans;
};

// Runs fn(0) .. fn(n - 1) on up to `threads` threads; each index is
// independent work, so the result does not depend on the split.
void ParallelFor(size_t n, int threads, const std::function<void(size_t)>& fn) {
  const size_t t = std::min<size_t>(n, static_cast<size_t>(std::max(1, threads)));
  if (t <= 1) {
    for (size_t i = 0; i < n; ++i) fn(i);
    return;
  }
  std::atomic<size_t> next{0};
  std::vector<std::thread> pool;
  for (size_t w = 0; w < t; ++w) {
    pool.emplace_back([&] {
      for (size_t i = next++; i < n; i = next++) fn(i);
    });
  }
  for (std::thread& th : pool) th.join();
}

Input RealizeInput(const InputPlan& plan, DType dtype, int threads) {
  Input in;
  in.plans = plan.matrices;
  in.bytes.resize(plan.matrices.size());
  ParallelFor(plan.matrices.size(), threads,
              [&](size_t m) { in.bytes[m] = RealizeMatrix(plan.matrices[m], dtype); });
  for (size_t m = 0; m < plan.matrices.size(); ++m) {
    const MatrixPlan& p = plan.matrices[m];
    MatrixView v;
    v.data = in.bytes[m].data();
    v.rows = p.rows;
    v.cols = p.cols;
    v.ld = p.cols;
    v.dtype = dtype;
    in.views.push_back(v);
  }
  return in;
}

struct Jobs {
  std::vector<TuneJob> jobs;
  std::vector<int> first;  // per matrix: its first job; first[m + 1] - first[m] of them
};

Jobs JobsOf(const Input& in, const CandidateLaunch& launch) {
  Jobs j;
  for (size_t m = 0; m < in.views.size(); ++m) {
    j.first.push_back(static_cast<int>(j.jobs.size()));
    const int n = static_cast<int>(std::min(in.views[m].rows, in.views[m].cols));
    EnumerateTuneJobs(static_cast<int32_t>(m), n, launch, &j.jobs);
  }
  j.first.push_back(static_cast<int>(j.jobs.size()));
  return j;
}

// The float64 reference of every checked matrix: each job's sums, the
// oracle's PR (NaN for a non-finite matrix), the trust rule.
std::vector<MatrixReference> References(const Input& in, const Jobs& jobs, int threads) {
  std::vector<size_t> checked;
  for (size_t m = 0; m < in.views.size(); ++m) {
    if (in.plans[m].checked) checked.push_back(m);
  }
  std::vector<MatrixReference> refs(checked.size());
  ParallelFor(checked.size(), threads, [&](size_t c) {
    const size_t m = checked[c];
    const MatrixPlan& p = in.plans[m];
    MatrixReference& ref = refs[c];
    ref.matrix = static_cast<int>(m);
    ref.kind = p.kind;
    double mx = 0;
    for (int j = jobs.first[m]; j < jobs.first[m + 1]; ++j) ref.jobs.push_back(j);
    ref.sums = ReferenceMatrixSums(
        in.views[m], absl::MakeConstSpan(jobs.jobs.data() + jobs.first[m],
                                         static_cast<size_t>(jobs.first[m + 1] - jobs.first[m])));
    for (const JobSums& s : ref.sums) mx = std::max(mx, s.maxabs);
    ref.untrusted = mx > 0 && !TrustedMagnitude(mx, std::max(p.rows, p.cols));
    absl::StatusOr<double> pr = OraclePR(in.views[m]);
    ref.pr = pr.ok() ? *pr : std::numeric_limits<double>::quiet_NaN();
  });
  return refs;
}

// A compiled candidate: a module of `device`, released with the kernel.
class DeviceKernel final : public CompiledKernel {
 public:
  DeviceKernel(TuneDevice& device, TuneDevice::Module* module, CandidateLaunch launch,
               std::string arch)
      : device_(device), module_(module), launch_(launch), arch_(std::move(arch)) {}
  ~DeviceKernel() override { device_.Release(module_); }
  DeviceKernel(const DeviceKernel&) = delete;
  DeviceKernel& operator=(const DeviceKernel&) = delete;

  std::string Describe() const override {
    return absl::StrCat(arch_, " NVRTC module, ", FormatLaunchAnnotation(launch_));
  }
  const TuneDevice* device() const { return &device_; }
  TuneDevice::Module* module() const { return module_; }
  const CandidateLaunch& launch() const { return launch_; }

 private:
  TuneDevice& device_;
  TuneDevice::Module* const module_;
  const CandidateLaunch launch_;
  const std::string arch_;
};

absl::StatusOr<const DeviceKernel*> AsDeviceKernel(const CompiledKernel& k,
                                                   const TuneDevice& device) {
  const auto* d = dynamic_cast<const DeviceKernel*>(&k);
  if (d == nullptr || d->device() != &device) {
    return absl::InvalidArgumentError(
        absl::StrCat("kernel \"", k.Describe(), "\" was not compiled on this tuning device"));
  }
  return d;
}

// One run of `kernel` on `in`; a failure of the kernel itself stays
// ABORTED, with `what` saying which run.
absl::StatusOr<TuneDevice::RunResult> RunOn(TuneDevice& device, DutyCycle& pace,
                                            const DeviceKernel& kernel, const Input& in,
                                            const Jobs& jobs, TuneDevice::RunSpec spec,
                                            const std::string& what) {
  spec.threads = static_cast<uint32_t>(kernel.launch().threads);
  spec.smem_bytes = static_cast<uint32_t>(kernel.launch().smem);
  absl::StatusOr<TuneDevice::RunResult> r = pace.Run([&] {
    return device.Run(kernel.module(), in.views, jobs.jobs.data(), jobs.jobs.size(), spec);
  });
  if (!r.ok()) {
    return absl::Status(r.status().code(), absl::StrCat(what, ": ", r.status().message()));
  }
  if (r->g2.size() != jobs.jobs.size() || r->trace.size() != jobs.jobs.size() ||
      r->maxabs.size() != jobs.jobs.size() || r->seconds.size() != spec.timed_launches) {
    return absl::InternalError(absl::StrCat(what, ": the device returned ", r->g2.size(),
                                            " sums and ", r->seconds.size(), " times for ",
                                            jobs.jobs.size(), " jobs and ",
                                            spec.timed_launches, " timed launches"));
  }
  return r;
}

// The best kernel failing is not the candidate's verdict: the job ends.
absl::Status AsHarnessError(const absl::Status& s) {
  if (!absl::IsAborted(s)) return s;
  return absl::InternalError(absl::StrCat("the current best kernel failed: ", s.message()));
}

// A timing input: the plan's matrices, special kinds made regular (never
// time on zeros, NaN or extreme magnitudes).
Input TimingInput(const TuneTarget& target, uint64_t seed, int threads) {
  std::vector<InputPlan> plans = PlanInputs(target, seed, 1, 0);
  for (MatrixPlan& p : plans[0].matrices) {
    if (p.kind >= MatrixKind::kZeros) p.kind = MatrixKind::kGaussian;
  }
  return RealizeInput(plans[0], target.dtype, threads);
}

int HostThreads(const DeviceToolsOptions& o) {
  if (o.host_threads > 0) return o.host_threads;
  return static_cast<int>(std::clamp(std::thread::hardware_concurrency() / 2, 1u, 8u));
}

class DeviceCompiler final : public Compiler {
 public:
  explicit DeviceCompiler(TuneDevice& device) : device_(device) {}

  absl::StatusOr<CompileResult> Compile(const TuneTarget& target, const std::string& source,
                                        const CandidateLaunch& launch) override {
    absl::StatusOr<TuneDevice::Info> info = device_.Device();
    if (!info.ok()) return info.status();
    if (!target.arch.empty() && target.arch != info->arch) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the target is ", target.arch, " but the tuning device is ", info->arch));
    }
    absl::StatusOr<TuneDevice::Compiled> c = device_.Compile(source);
    if (!c.ok()) return c.status();
    CompileResult r;
    r.log = c->log;
    if (c->module != nullptr) {
      r.kernel = std::make_shared<DeviceKernel>(device_, c->module, launch, info->arch);
    }
    return r;
  }

  absl::StatusOr<std::shared_ptr<const CompiledKernel>> Product(const TuneTarget&) override {
    return absl::FailedPreconditionError(
        "start \"product\" is not available: the product kernels (fused v1, v3, v4) are "
        "compiled into the CUDA module with job records of their own (FusedJob, FusedJobV2, "
        "v4's launch with host-encoded TMA tensor maps), and the module's tuning table "
        "(ABI 5) runs only NVRTC-compiled candidates of the per-job contract; start from "
        "\"naive\"");
  }

 private:
  TuneDevice& device_;
};

class DeviceVerifier final : public Verifier {
 public:
  DeviceVerifier(TuneDevice& device, int threads, std::shared_ptr<DutyCycle> pace)
      : device_(device), threads_(threads), pace_(std::move(pace)) {}

  absl::StatusOr<CorrectnessEvidence> Verify(const TuneTarget& target,
                                             const CompiledKernel& compiled,
                                             const VerifyRequest& request) override {
    absl::StatusOr<const DeviceKernel*> kernel = AsDeviceKernel(compiled, device_);
    if (!kernel.ok()) return kernel.status();
    const Tolerance tolerance = AcceptanceRules{}.tolerance;
    CorrectnessEvidence e;
    const std::vector<InputPlan> plans = PlanInputs(target, request.seed, request.inputs);
    for (size_t i = 0; i < plans.size(); ++i) {
      const Input in = RealizeInput(plans[i], target.dtype, threads_);
      const Jobs jobs = JobsOf(in, (*kernel)->launch());
      // Fewer blocks than jobs: each block must take its share of the jobs.
      TuneDevice::RunSpec spec;
      spec.grid = static_cast<uint32_t>(std::max<size_t>(1, (jobs.jobs.size() + 1) / 2));
      // Each run's poison names it: a slot left from another run is told.
      const int first_run = static_cast<int>(2 * i + 1), second_run = first_run + 1;
      RunOutputs outputs[2];
      bool written = false;
      std::vector<MatrixReference> refs;
      for (int run : {first_run, second_run}) {
        spec.poison64 = PoisonBits64(run);
        spec.poison32 = PoisonBits32(run);
        absl::StatusOr<TuneDevice::RunResult> r =
            RunOn(device_, *pace_, **kernel, in, jobs, spec,
                  absl::StrCat("verification input ", i, " run ", run == first_run ? 1 : 2));
        if (!r.ok()) return r.status();
        written = written || r->input_written;
        RunOutputs& o = outputs[run == first_run ? 0 : 1];
        o.g2 = std::move(r->g2);
        o.trace = std::move(r->trace);
        o.maxabs = std::move(r->maxabs);
        // The reference between the candidate's two runs, recomputed.
        if (run == first_run) refs = References(in, jobs, threads_);
      }
      Evaluate(refs, outputs[0], outputs[1], first_run, second_run, !written, tolerance, &e);
    }
    return e;
  }

 private:
  TuneDevice& device_;
  const int threads_;  // host threads realizing inputs and references
  const std::shared_ptr<DutyCycle> pace_;
};

class DeviceBenchmarker final : public Benchmarker {
 public:
  DeviceBenchmarker(TuneDevice& device, DeviceToolsOptions options,
                    std::shared_ptr<DutyCycle> pace)
      : device_(device), options_(options), pace_(std::move(pace)) {}

  absl::StatusOr<KernelProfile> Profile(const TuneTarget& target, const CompiledKernel& compiled,
                                        uint64_t seed) override {
    absl::StatusOr<const DeviceKernel*> kernel = AsDeviceKernel(compiled, device_);
    if (!kernel.ok()) return kernel.status();
    absl::StatusOr<TuneDevice::Info> info = device_.Device();
    if (!info.ok()) return info.status();
    const Input in = TimingInput(target, seed, HostThreads(options_));
    const Jobs jobs = JobsOf(in, (*kernel)->launch());
    TuneDevice::RunSpec spec;
    spec.timed_launches = static_cast<uint32_t>(std::max(1, options_.profile_launches));
    absl::StatusOr<TuneDevice::RunResult> r =
        RunOn(device_, *pace_, **kernel, in, jobs, spec, "profile");
    if (!r.ok()) return AsHarnessError(r.status());
    KernelProfile p;
    p.seconds = Median(r->seconds);
    p.bytes = TargetBytes(target);
    p.flops = TargetFlops(target);
    p.peak_bytes_per_second = info->dram_bytes_per_second;
    p.peak_flops_per_second = info->fp32_flops_per_second;
    return p;
  }

  absl::StatusOr<TimingEvidence> Compare(const TuneTarget& target, const CompiledKernel& candidate,
                                         const CompiledKernel& best,
                                         const BenchRequest& request) override {
    absl::StatusOr<const DeviceKernel*> c = AsDeviceKernel(candidate, device_);
    if (!c.ok()) return c.status();
    absl::StatusOr<const DeviceKernel*> b = AsDeviceKernel(best, device_);
    if (!b.ok()) return b.status();
    absl::StatusOr<TuneDevice::Info> info = device_.Device();
    if (!info.ok()) return info.status();
    const Input in = TimingInput(target, request.seed, HostThreads(options_));
    const Jobs candidate_jobs = JobsOf(in, (*c)->launch());
    const Jobs best_jobs = JobsOf(in, (*b)->launch());
    TuneDevice::RunSpec spec;
    spec.timed_launches = static_cast<uint32_t>(
        std::max(1, options_.block_launches *
                        (request.long_measurement ? std::max(1, options_.long_block_factor) : 1)));
    TimingEvidence t;
    t.long_measurement = request.long_measurement;
    if (info->dram_bytes_per_second > 0) {
      t.floor_seconds = TargetBytes(target) / info->dram_bytes_per_second;
    }
    for (int round = 0; round < request.rounds; ++round) {
      absl::StatusOr<TuneDevice::RunResult> rc =
          RunOn(device_, *pace_, **c, in, candidate_jobs, spec,
                absl::StrCat("candidate block ", round + 1));
      if (!rc.ok()) return rc.status();
      absl::StatusOr<TuneDevice::RunResult> rb = RunOn(
          device_, *pace_, **b, in, best_jobs, spec, absl::StrCat("best block ", round + 1));
      if (!rb.ok()) return AsHarnessError(rb.status());
      t.candidate_seconds.push_back(Median(rc->seconds));
      t.best_seconds.push_back(Median(rb->seconds));
    }
    return t;
  }

 private:
  TuneDevice& device_;
  const DeviceToolsOptions options_;
  const std::shared_ptr<DutyCycle> pace_;
};

}  // namespace

DutyCycle::Clock& DutyCycle::Clock::Real() {
  class System final : public Clock {
   public:
    absl::Time Now() override { return absl::Now(); }
    void SleepFor(absl::Duration d) override { absl::SleepFor(d); }
  };
  static System* const clock = new System;
  return *clock;
}

DutyCycle::DutyCycle(double duty, Clock& clock)
    : duty_(duty > 0 && duty <= 1 ? std::max(duty, 0.01) : (duty > 1 ? 1.0 : 0.01)),
      clock_(clock) {}

absl::Time DutyCycle::WaitTurn() {
  absl::MutexLock lock(&mu_);
  const absl::Time now = clock_.Now();
  if (now < next_) clock_.SleepFor(next_ - now);
  return clock_.Now();
}

void DutyCycle::Done(absl::Time start) {
  absl::MutexLock lock(&mu_);
  const absl::Time end = clock_.Now();
  next_ = end + (end - start) * ((1 - duty_) / duty_);
}

std::vector<uint8_t> RealizeMatrix(const MatrixPlan& p, DType dtype) {
  const int n = std::min(p.rows, p.cols), k = std::max(p.rows, p.cols);
  const bool tall = p.rows > p.cols;
  Draws d{SplitMix64(p.seed ^ 0x5eedf00dull)};
  std::vector<double> wide = WideValues(p, n, k, d);
  // The bad entry is placed in the stored (rows x cols) orientation.
  const size_t bad = tall ? static_cast<size_t>(p.bad_col) * k + p.bad_row
                          : static_cast<size_t>(p.bad_row) * k + p.bad_col;
  if (p.kind == MatrixKind::kNaN) wide[bad] = std::numeric_limits<double>::quiet_NaN();
  if (p.kind == MatrixKind::kInf) wide[bad] = -std::numeric_limits<double>::infinity();
  const size_t es = DTypeSize(dtype);
  std::vector<uint8_t> out(static_cast<size_t>(p.rows) * p.cols * es);
  // The dtype chosen once per matrix, not per element.
  const auto store = [&](auto convert, auto* at) {
    for (int i = 0; i < p.rows; ++i) {
      for (int j = 0; j < p.cols; ++j) {
        const double x = tall ? wide[static_cast<size_t>(j) * k + i]
                              : wide[static_cast<size_t>(i) * k + j];
        at[static_cast<size_t>(i) * p.cols + j] = convert(static_cast<float>(x));
      }
    }
  };
  switch (dtype) {
    case DType::kF32: {
      std::vector<float> f(static_cast<size_t>(p.rows) * p.cols);
      store([](float x) { return x; }, f.data());
      std::memcpy(out.data(), f.data(), out.size());
      break;
    }
    case DType::kF16:
    case DType::kBF16: {
      std::vector<uint16_t> h(static_cast<size_t>(p.rows) * p.cols);
      if (dtype == DType::kF16) {
        store([](float x) { return FloatToHalf(x); }, h.data());
      } else {
        store([](float x) { return FloatToBFloat16(x); }, h.data());
      }
      std::memcpy(out.data(), h.data(), out.size());
      break;
    }
  }
  return out;
}

double TargetBytes(const TuneTarget& target) {
  double b = 0;
  for (const TuneShape& s : target.shapes) {
    b += static_cast<double>(s.count) * s.rows * s.cols * static_cast<double>(DTypeSize(target.dtype));
  }
  return b;
}

double TargetFlops(const TuneTarget& target) {
  double f = 0;
  for (const TuneShape& s : target.shapes) {
    const double n = std::min(s.rows, s.cols), k = std::max(s.rows, s.cols);
    f += static_cast<double>(s.count) * n * (n + 1) * k;
  }
  return f;
}

TuneBackend::Tools MakeDeviceTools(TuneDevice& device, DeviceToolsOptions options) {
  TuneBackend::Tools t;
  t.compiler = std::make_unique<DeviceCompiler>(device);
  auto pace = std::make_shared<DutyCycle>(
      options.duty_cycle, options.clock != nullptr ? *options.clock : DutyCycle::Clock::Real());
  t.verifier = std::make_unique<DeviceVerifier>(device, HostThreads(options), pace);
  t.benchmarker = std::make_unique<DeviceBenchmarker>(device, options, pace);
  return t;
}

}  // namespace rvd::tune

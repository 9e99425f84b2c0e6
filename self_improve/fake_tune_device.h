// A host fake of TuneDevice (kernels/tune_device.h), for the CPU tests of
// the device tools (test code only). A "candidate" is a source with one line
//   // fake-device: seconds=S [broken] [stale] [wrong] [writes_input]
//   //              [nondet] [hides_nan] [fault]
// (any other source, e.g. the built-in generator's, runs as an honest
// kernel of 1 ms) and its run computes the per-job sums on the host with the float64
// reference (reference.h) into outputs first filled with the call's poison,
// then misbehaves as its flags say:
//   broken        does not compile (a log, no module)
//   stale         writes no output slot (they keep the poison)
//   wrong         g2 off by 1e-5 relative (inside seed 000's 1e-3)
//   writes_input  reports the inputs changed
//   nondet        every second run's g2 one ulp off
//   hides_nan     a NaN or Inf read is reported as 0 (trace and maxabs finite)
//   fault         the run fails: ABORTED, as a launch error or fault is
// Timed launches read S each, +-0.1% alternating. Every run is recorded.
#ifndef RVD_SELF_IMPROVE_FAKE_TUNE_DEVICE_H_
#define RVD_SELF_IMPROVE_FAKE_TUNE_DEVICE_H_

#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "kernels/dtype_convert.h"
#include "kernels/tune_device.h"
#include "self_improve/candidate_abi.h"
#include "self_improve/reference.h"

namespace rvd::tune::testing {

// A fake candidate's source: `flags` after its seconds, and the annotation.
inline std::string FakeDeviceSource(double seconds, const std::string& flags,
                                    const std::string& annotation) {
  return absl::StrCat(annotation, "\n// fake-device: seconds=", seconds, " ", flags, "\n");
}

class FakeTuneDevice final : public TuneDevice {
 public:
  // One Run as the fake saw it.
  struct RunRecord {
    int module = 0;               // FakeModule::id
    std::vector<MatrixView> batch;  // shapes only: the data is the caller's, gone after the run
    uint64_t inputs_hash = 0;     // of the batch's bytes
    bool regular_inputs = false;  // no matrix all zeros, none with NaN or Inf
    size_t num_jobs = 0;
    RunSpec spec;
  };

  Info info{90, "sm_90a", 4e12, 60e12, 50u << 20};

  absl::StatusOr<Info> Device() override { return info; }

  absl::StatusOr<Compiled> Compile(const std::string& source) override {
    absl::MutexLock lock(&mu_);
    Compiled c;
    auto m = std::make_unique<FakeModule>();
    m->id = next_id_++;
    for (absl::string_view line : absl::StrSplit(source, '\n')) {
      if (!absl::ConsumePrefix(&line, "// fake-device:")) continue;
      for (absl::string_view w : absl::StrSplit(line, ' ', absl::SkipEmpty())) {
        if (absl::ConsumePrefix(&w, "seconds=") && !absl::SimpleAtod(w, &m->seconds)) {
          return absl::InternalError("bad fake seconds");
        }
        m->flags[std::string(w)] = true;
      }
    }
    if (m->Has("broken")) {
      c.log = "candidate.cu(3): error: expected an expression";
      return c;
    }
    c.module = reinterpret_cast<Module*>(m.get());
    live_[m->id] = std::move(m);
    return c;
  }

  absl::StatusOr<RunResult> Run(Module* module, absl::Span<const MatrixView> batch,
                                const void* jobs_bytes, size_t num_jobs,
                                const RunSpec& spec) override {
    auto* m = reinterpret_cast<FakeModule*>(module);
    bool odd_run = false;  // nondet: every second run of a module is off
    {
      absl::MutexLock lock(&mu_);
      if (live_.count(m->id) == 0) return absl::InternalError("run of a released module");
      RunRecord r;
      r.module = m->id;
      r.batch.assign(batch.begin(), batch.end());
      r.inputs_hash = Hash(batch);
      r.regular_inputs = Regular(batch);
      r.num_jobs = num_jobs;
      r.spec = spec;
      runs_.push_back(r);
      odd_run = (m->runs++ % 2) == 1;
    }
    if (m->Has("fault")) {
      return absl::AbortedError("the candidate failed at run time: cudaErrorIllegalAddress");
    }
    const auto* jobs = static_cast<const TuneJob*>(jobs_bytes);
    RunResult out;
    double p64;
    float p32;
    std::memcpy(&p64, &spec.poison64, sizeof p64);
    std::memcpy(&p32, &spec.poison32, sizeof p32);
    out.g2.assign(num_jobs, p64);
    out.trace.assign(num_jobs, p64);
    out.maxabs.assign(num_jobs, p32);
    for (size_t j = 0; j < num_jobs && !m->Has("stale"); ++j) {
      JobSums s = ReferenceJobSums(batch[static_cast<size_t>(jobs[j].matrix)], jobs[j]);
      if (m->Has("hides_nan") && !(std::isfinite(s.maxabs) && std::isfinite(s.trace))) {
        s = JobSums{0, 0, 0};
      }
      out.g2[j] = s.g2;
      if (m->Has("wrong")) out.g2[j] *= 1 + 1e-5;
      if (m->Has("nondet") && odd_run) out.g2[j] = std::nextafter(out.g2[j], 0.0);
      out.trace[j] = s.trace;
      out.maxabs[j] = static_cast<float>(s.maxabs);
    }
    for (uint32_t t = 0; t < spec.timed_launches; ++t) {
      out.seconds.push_back(m->seconds * (t % 2 == 0 ? 1.001 : 0.999));
    }
    out.input_written = m->Has("writes_input");
    return out;
  }

  void Release(Module* module) override {
    absl::MutexLock lock(&mu_);
    ++releases_;
    live_.erase(reinterpret_cast<FakeModule*>(module)->id);
  }

  std::vector<RunRecord> runs() const {
    absl::MutexLock lock(&mu_);
    return runs_;
  }
  void ClearRuns() {
    absl::MutexLock lock(&mu_);
    runs_.clear();
  }
  int live_modules() const {
    absl::MutexLock lock(&mu_);
    return static_cast<int>(live_.size());
  }
  int releases() const {
    absl::MutexLock lock(&mu_);
    return releases_;
  }

 private:
  struct FakeModule {
    int id = 0;
    double seconds = 1e-3;
    std::map<std::string, bool> flags;
    int runs = 0;
    bool Has(const char* flag) const { return flags.count(flag) > 0; }
  };

  static float ElementOf(const MatrixView& v, int64_t i) {
    switch (v.dtype) {
      case DType::kF32: return static_cast<const float*>(v.data)[i];
      case DType::kF16: return HalfToFloat(static_cast<const uint16_t*>(v.data)[i]);
      case DType::kBF16: return BFloat16ToFloat(static_cast<const uint16_t*>(v.data)[i]);
    }
    return 0;
  }
  static bool Regular(absl::Span<const MatrixView> batch) {
    for (const MatrixView& v : batch) {
      bool nonzero = false;
      for (int64_t i = 0; i < v.rows * v.ld; ++i) {
        const float x = ElementOf(v, i);
        if (!std::isfinite(x)) return false;
        nonzero |= x != 0;
      }
      if (!nonzero) return false;
    }
    return true;
  }

  static uint64_t Hash(absl::Span<const MatrixView> batch) {
    uint64_t h = 1469598103934665603ull;
    for (const MatrixView& v : batch) {
      const auto* p = static_cast<const unsigned char*>(v.data);
      const size_t bytes = static_cast<size_t>(v.rows * v.ld) * DTypeSize(v.dtype);
      for (size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * 1099511628211ull;
    }
    return h;
  }

  mutable absl::Mutex mu_;
  int next_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<int, std::unique_ptr<FakeModule>> live_ ABSL_GUARDED_BY(mu_);
  std::vector<RunRecord> runs_ ABSL_GUARDED_BY(mu_);
  int releases_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace rvd::tune::testing

#endif  // RVD_SELF_IMPROVE_FAKE_TUNE_DEVICE_H_

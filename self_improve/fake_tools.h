// CPU fakes of the tuning loop's tools, for the tests (test code only):
// a candidate's behaviour is written into its source as one line
//   // fake: key=K seconds=S [broken] [wrong] [fault] [nondet] [heldout_wrong]
// which FakeCompiler reads; the verifier and the benchmark answer from it.
// Every call is recorded, so a test can check what the loop asked for.
#ifndef RVD_SELF_IMPROVE_FAKE_TOOLS_H_
#define RVD_SELF_IMPROVE_FAKE_TOOLS_H_

#include <atomic>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "self_improve/tune_loop.h"

namespace rvd::tune::testing {

struct FakeKernel final : CompiledKernel {
  std::string key;
  double seconds = 1e-3;
  bool wrong = false, fault = false, nondet = false, heldout_wrong = false;
  std::string Describe() const override { return "fake " + key; }
};

// A source a fake generator hands out.
inline std::string FakeSource(const std::string& key, double seconds,
                              const std::string& flags = "") {
  return absl::StrCat("// fake: key=", key, " seconds=", seconds, " ", flags, "\n",
                      FormatLaunchAnnotation(CandidateLaunch{128, 0, 0, 0}), "\n");
}

class FakeCompiler final : public Compiler {
 public:
  absl::StatusOr<CompileResult> Compile(const TuneTarget&, const std::string& source,
                                        const CandidateLaunch&) override {
    absl::MutexLock lock(&mu_);
    compiled_.push_back(source);
    if (!fail_with_.ok()) return fail_with_;
    auto k = std::make_shared<FakeKernel>();
    CompileResult r;
    for (absl::string_view line : absl::StrSplit(source, '\n')) {
      if (!absl::ConsumePrefix(&line, "// fake:")) continue;
      for (absl::string_view w : absl::StrSplit(line, ' ', absl::SkipEmpty())) {
        if (absl::ConsumePrefix(&w, "key=")) k->key = std::string(w);
        if (absl::ConsumePrefix(&w, "seconds=") && !absl::SimpleAtod(w, &k->seconds)) {
          return absl::InternalError("bad fake seconds");
        }
        if (w == "broken") {
          r.log = absl::StrCat("candidate.cu(12): error: ", k->key, " does not compile");
          return r;
        }
        k->wrong |= w == "wrong";
        k->fault |= w == "fault";
        k->nondet |= w == "nondet";
        k->heldout_wrong |= w == "heldout_wrong";
      }
    }
    r.kernel = k;
    return r;
  }
  absl::StatusOr<std::shared_ptr<const CompiledKernel>> Product(const TuneTarget&) override {
    auto k = std::make_shared<FakeKernel>();
    k->key = "product";
    k->seconds = product_seconds;
    return std::shared_ptr<const CompiledKernel>(k);
  }
  std::vector<std::string> compiled() const {
    absl::MutexLock lock(&mu_);
    return compiled_;
  }
  void FailWith(absl::Status s) {
    absl::MutexLock lock(&mu_);
    fail_with_ = std::move(s);
  }
  double product_seconds = 0.2e-3;

 private:
  mutable absl::Mutex mu_;
  std::vector<std::string> compiled_ ABSL_GUARDED_BY(mu_);
  absl::Status fail_with_ ABSL_GUARDED_BY(mu_);
};

class FakeVerifier final : public Verifier {
 public:
  absl::StatusOr<CorrectnessEvidence> Verify(const TuneTarget&, const CompiledKernel& kernel,
                                             const VerifyRequest& request) override {
    const auto& k = static_cast<const FakeKernel&>(kernel);
    {
      absl::MutexLock lock(&mu_);
      requests_.push_back(request);
      if (!fail_with_.ok()) return fail_with_;
    }
    if (k.fault) return absl::AbortedError(absl::StrCat(k.key, ": illegal memory access"));
    CorrectnessEvidence e;
    e.inputs = request.inputs;
    e.max_pr_rel_error = 1e-7;
    e.max_sum_rel_error = 1e-7;
    if (k.wrong || (request.held_out && k.heldout_wrong)) {
      e.pr_mismatches = 3;
      e.max_pr_rel_error = 4e-3;
    }
    e.deterministic = !k.nondet;
    return e;
  }
  std::vector<VerifyRequest> requests() const {
    absl::MutexLock lock(&mu_);
    return requests_;
  }
  void FailWith(absl::Status s) {
    absl::MutexLock lock(&mu_);
    fail_with_ = std::move(s);
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<VerifyRequest> requests_ ABSL_GUARDED_BY(mu_);
  absl::Status fail_with_ ABSL_GUARDED_BY(mu_);
};

// Times are the kernels' own seconds, each block +-0.2% apart; a long
// measurement of a kernel flagged "inflated" in its key reads 3x slower
// (the short one was fooled).
class FakeBenchmarker final : public Benchmarker {
 public:
  absl::StatusOr<KernelProfile> Profile(const TuneTarget&, const CompiledKernel& kernel,
                                        uint64_t) override {
    KernelProfile p;
    p.seconds = static_cast<const FakeKernel&>(kernel).seconds;
    p.bytes = 1e9;
    p.flops = 1e12;
    p.peak_bytes_per_second = 4e12;
    p.peak_flops_per_second = 700e12;
    absl::MutexLock lock(&mu_);
    ++profiles_;
    return p;
  }
  absl::StatusOr<TimingEvidence> Compare(const TuneTarget&, const CompiledKernel& candidate,
                                         const CompiledKernel& best,
                                         const BenchRequest& request) override {
    const auto& c = static_cast<const FakeKernel&>(candidate);
    const auto& b = static_cast<const FakeKernel&>(best);
    {
      absl::MutexLock lock(&mu_);
      requests_.push_back(request);
    }
    TimingEvidence t;
    t.floor_seconds = floor_seconds;
    const double cs = request.long_measurement && c.key.find("inflated") != std::string::npos
                          ? 3 * c.seconds
                          : c.seconds;
    for (int i = 0; i < request.rounds; ++i) {
      const double jitter = i % 2 == 0 ? 1.001 : 0.999;
      t.candidate_seconds.push_back(cs * jitter);
      t.best_seconds.push_back(b.seconds * jitter);
    }
    return t;
  }
  std::vector<BenchRequest> requests() const {
    absl::MutexLock lock(&mu_);
    return requests_;
  }
  int profiles() const {
    absl::MutexLock lock(&mu_);
    return profiles_;
  }
  double floor_seconds = 1e-5;

 private:
  mutable absl::Mutex mu_;
  std::vector<BenchRequest> requests_ ABSL_GUARDED_BY(mu_);
  int profiles_ ABSL_GUARDED_BY(mu_) = 0;
};

// Hands out scripted answers in order, then OUT_OF_RANGE; records every
// request. An answer may also run a hook (e.g. cancel the job).
class FakeGenerator final : public Generator {
 public:
  struct Answer {
    absl::StatusOr<Candidate> candidate;
    std::function<void(const CandidateRequest&)> hook;  // runs before it is returned
  };
  void Add(const std::string& key, double seconds, const std::string& flags = "") {
    absl::MutexLock lock(&mu_);
    answers_.push_back({Candidate{FakeSource(key, seconds, flags), key + ": fake"}, nullptr});
  }
  void AddError(absl::Status s, std::function<void(const CandidateRequest&)> hook = nullptr) {
    absl::MutexLock lock(&mu_);
    answers_.push_back({std::move(s), std::move(hook)});
  }
  std::string Name() const override { return "fake"; }
  absl::StatusOr<Candidate> Generate(const CandidateRequest& request) override {
    Answer a;
    {
      absl::MutexLock lock(&mu_);
      requests_.push_back(request);
      if (answers_.empty()) return absl::OutOfRangeError("script exhausted");
      a = std::move(answers_.front());
      answers_.pop_front();
    }
    if (a.hook) a.hook(request);
    return a.candidate;
  }
  std::vector<CandidateRequest> requests() const {
    absl::MutexLock lock(&mu_);
    return requests_;
  }

 private:
  mutable absl::Mutex mu_;
  std::deque<Answer> answers_ ABSL_GUARDED_BY(mu_);
  std::vector<CandidateRequest> requests_ ABSL_GUARDED_BY(mu_);
};

class RecordingObserver final : public LoopObserver {
 public:
  void OnPhase(int iteration, const char* phase) override {
    absl::MutexLock lock(&mu_);
    phases.push_back(absl::StrCat(iteration, ":", phase));
  }
  void OnRecord(const IterationRecord& r) override {
    absl::MutexLock lock(&mu_);
    records.push_back(r);
  }
  absl::Mutex mu_;
  std::vector<std::string> phases;
  std::vector<IterationRecord> records;
};

}  // namespace rvd::tune::testing

#endif  // RVD_SELF_IMPROVE_FAKE_TOOLS_H_

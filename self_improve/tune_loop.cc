#include "self_improve/tune_loop.h"

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "self_improve/seed_mix.h"
#include "self_improve/space.h"

namespace rvd::tune {
namespace {

enum Purpose { kVerifySeed = 1, kHeldOutSeed = 2, kBenchSeed = 3, kProfileSeed = 4 };

AcceptanceRules RulesOf(const LoopConfig& c) {
  AcceptanceRules r;
  r.min_improvement = c.budget.min_improvement;
  r.min_inputs = std::min(r.min_inputs, c.verify_inputs);
  return r;
}

}  // namespace

const char* StopReasonName(StopReason r) {
  switch (r) {
    case StopReason::kBudget: return "budget";
    case StopReason::kPatience: return "patience";
    case StopReason::kExhausted: return "exhausted";
    case StopReason::kCancelled: return "cancelled";
  }
  return "unknown";
}

uint64_t TuneLoop::DeriveSeed(uint64_t secret, int iteration, int purpose) {
  return SplitMix64(SplitMix64(secret) ^
                    SplitMix64(static_cast<uint64_t>(iteration) << 8 | static_cast<uint64_t>(purpose)));
}

TuneLoop::TuneLoop(LoopConfig config, Compiler& compiler, Verifier& verifier,
                   Benchmarker& bench, Generator& generator, LoopObserver& observer)
    : config_(std::move(config)),
      rules_(RulesOf(config_)),
      compiler_(compiler),
      verifier_(verifier),
      bench_(bench),
      generator_(generator),
      observer_(observer) {}

void TuneLoop::Restore(std::vector<IterationRecord> records) {
  records_ = std::move(records);
  without_improvement_ = 0;
  for (const IterationRecord& r : records_) {
    if (r.iteration == 0) continue;
    without_improvement_ = r.verdict == Verdict::kAccepted ? 0 : without_improvement_ + 1;
  }
}

std::vector<HistoryEntry> TuneLoop::History() const {
  std::vector<HistoryEntry> h;
  for (const IterationRecord& r : records_) {
    if (r.iteration == 0) continue;
    h.push_back({r.iteration, r.description, r.verdict, r.reason, r.candidate_seconds});
  }
  return h;
}

// The best to start from: the last accepted source of a restored log, else
// the configured start. It must compile and be correct: a job never
// compares against a wrong kernel.
absl::Status TuneLoop::StartBest(const std::atomic<bool>& cancelled) {
  const IterationRecord* accepted = nullptr;
  for (const IterationRecord& r : records_) {
    if (r.verdict == Verdict::kAccepted) accepted = &r;
  }
  const bool fresh = records_.empty();
  Best best;
  observer_.OnPhase(0, "compiling");
  if (accepted != nullptr && !accepted->source.empty()) {
    best.source = accepted->source;
    best.description = accepted->description;
  } else if (config_.start == "product") {
    absl::StatusOr<std::shared_ptr<const CompiledKernel>> product =
        compiler_.Product(config_.target);
    if (!product.ok()) return product.status();
    best.kernel = *std::move(product);
    best.description = "the product kernel of the target's registry entry";
  } else if (config_.start == "naive") {
    absl::StatusOr<Candidate> naive = Emit(NaivePoint(), config_.target.dtype);
    if (!naive.ok()) return naive.status();
    best.source = naive->source;
    best.description = naive->description;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown start \"", config_.start, "\" (naive or product)"));
  }
  if (best.kernel == nullptr) {
    absl::StatusOr<CandidateLaunch> launch = ParseLaunchAnnotation(best.source);
    if (!launch.ok()) return launch.status();
    absl::StatusOr<CompileResult> compiled =
        compiler_.Compile(config_.target, best.source, *launch);
    if (!compiled.ok()) return compiled.status();
    if (compiled->kernel == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the starting kernel (", best.description, ") does not compile: ", compiled->log));
    }
    best.kernel = compiled->kernel;
  }
  if (cancelled.load()) return absl::OkStatus();
  observer_.OnPhase(0, "verifying");
  VerifyRequest vr;
  vr.seed = DeriveSeed(config_.secret_seed, 0, kVerifySeed);
  vr.inputs = config_.verify_inputs;
  absl::StatusOr<CorrectnessEvidence> evidence = verifier_.Verify(config_.target, *best.kernel, vr);
  if (!evidence.ok()) return evidence.status();
  const Decision correct = JudgeCorrectness(rules_, *evidence);
  if (correct.verdict != Verdict::kAccepted) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the starting kernel (", best.description, ") is not correct: ", correct.reason));
  }
  observer_.OnPhase(0, "profiling");
  absl::StatusOr<KernelProfile> profile = bench_.Profile(
      config_.target, *best.kernel, DeriveSeed(config_.secret_seed, 0, kProfileSeed));
  if (!profile.ok()) return profile.status();
  best.profile = *profile;
  best.seconds = profile->seconds;
  best_ = std::move(best);
  if (fresh) {
    baseline_seconds_ = best_.seconds;
    IterationRecord r;
    r.iteration = 0;
    r.description = best_.description;
    r.source = best_.source;
    r.verdict = Verdict::kAccepted;
    r.reason = absl::StrCat("the starting point: ", correct.reason);
    r.bottleneck = BottleneckName(ClassifyBottleneck(best_.profile).bottleneck);
    r.compile_attempts = 1;
    r.candidate_seconds = best_.seconds;
    r.best_seconds = best_.seconds;
    r.speedup = 1;
    r.best_after = best_.seconds;
    records_.push_back(r);
    observer_.OnRecord(r);
  } else {
    baseline_seconds_ = records_.front().candidate_seconds;
  }
  return absl::OkStatus();
}

absl::Status TuneLoop::Iterate(int iteration, const std::atomic<bool>& cancelled,
                               IterationRecord* record, bool* exhausted) {
  IterationRecord& r = *record;
  r.iteration = iteration;
  r.best_after = best_.seconds;
  const BottleneckReport bottleneck = ClassifyBottleneck(best_.profile);
  r.bottleneck = BottleneckName(bottleneck.bottleneck);

  CandidateRequest request;
  request.target = config_.target;
  request.iteration = iteration;
  request.best_source = best_.source;
  request.best_description = best_.description;
  request.profile = best_.profile;
  request.bottleneck = bottleneck;
  request.history = History();
  request.cancelled = &cancelled;

  // Generate and compile, the compile log fed back on a retry.
  std::shared_ptr<const CompiledKernel> kernel;
  for (int attempt = 0; attempt <= config_.compile_retries && kernel == nullptr; ++attempt) {
    if (cancelled.load()) return absl::CancelledError("cancelled");
    request.attempt = attempt;
    observer_.OnPhase(iteration, "generating");
    absl::StatusOr<Candidate> candidate = generator_.Generate(request);
    r.compile_attempts = attempt + 1;
    if (!candidate.ok()) {
      if (candidate.status().code() == absl::StatusCode::kOutOfRange) {
        *exhausted = true;
        r.reason = std::string(candidate.status().message());
        return absl::OkStatus();
      }
      if (candidate.status().code() == absl::StatusCode::kCancelled) {
        return candidate.status();
      }
      r.verdict = Verdict::kGeneratorError;
      r.reason = candidate.status().ToString();
      return absl::OkStatus();
    }
    r.description = candidate->description;
    r.source = candidate->source;
    observer_.OnPhase(iteration, "compiling");
    absl::StatusOr<CandidateLaunch> launch = ParseLaunchAnnotation(candidate->source);
    std::string log;
    if (!launch.ok()) {
      log = std::string(launch.status().message());
    } else {
      absl::StatusOr<CompileResult> compiled =
          compiler_.Compile(config_.target, candidate->source, *launch);
      if (!compiled.ok()) return compiled.status();
      kernel = compiled->kernel;
      log = compiled->log;
    }
    if (kernel == nullptr) {
      request.failed_source = candidate->source;
      request.compile_log = log;
      r.reason = absl::StrCat("did not compile after ", attempt + 1, " attempt(s): ", log);
    }
  }
  if (kernel == nullptr) {
    r.verdict = Verdict::kCompileError;
    return absl::OkStatus();
  }

  if (cancelled.load()) return absl::CancelledError("cancelled");
  observer_.OnPhase(iteration, "verifying");
  VerifyRequest vr;
  vr.seed = DeriveSeed(config_.secret_seed, iteration, kVerifySeed);
  vr.inputs = config_.verify_inputs;
  absl::StatusOr<CorrectnessEvidence> evidence = verifier_.Verify(config_.target, *kernel, vr);
  if (!evidence.ok()) {
    if (evidence.status().code() != absl::StatusCode::kAborted) return evidence.status();
    r.verdict = Verdict::kLaunchError;
    r.reason = std::string(evidence.status().message());
    return absl::OkStatus();
  }
  const Decision correct = JudgeCorrectness(rules_, *evidence);
  if (correct.verdict != Verdict::kAccepted) {
    r.verdict = correct.verdict;
    r.reason = correct.reason;
    return absl::OkStatus();
  }

  if (cancelled.load()) return absl::CancelledError("cancelled");
  observer_.OnPhase(iteration, "benchmarking");
  BenchRequest br;
  br.seed = DeriveSeed(config_.secret_seed, iteration, kBenchSeed);
  br.rounds = config_.bench_rounds;
  Decision d;
  for (int pass = 0; pass < 2; ++pass) {
    absl::StatusOr<TimingEvidence> timing =
        bench_.Compare(config_.target, *kernel, *best_.kernel, br);
    if (!timing.ok()) {
      if (timing.status().code() != absl::StatusCode::kAborted) return timing.status();
      r.verdict = Verdict::kLaunchError;
      r.reason = std::string(timing.status().message());
      return absl::OkStatus();
    }
    timing->long_measurement = br.long_measurement;
    d = Judge(rules_, *evidence, *timing);
    if (!d.measure_longer) break;
    // A claim too good for one measurement: again, longer, on fresh inputs.
    br.long_measurement = true;
    br.rounds = config_.long_bench_rounds;
    br.seed = DeriveSeed(config_.secret_seed, iteration, kBenchSeed + 16);
  }
  r.verdict = d.measure_longer ? Verdict::kSlower : d.verdict;
  r.reason = d.reason;
  r.candidate_seconds = d.candidate_seconds;
  r.best_seconds = d.best_seconds;
  r.speedup = d.speedup;
  r.spread = d.spread;
  if (r.verdict != Verdict::kAccepted) return absl::OkStatus();

  // The held-out re-check, on inputs drawn only now.
  observer_.OnPhase(iteration, "held_out");
  VerifyRequest ho;
  ho.seed = DeriveSeed(config_.secret_seed, iteration, kHeldOutSeed);
  ho.inputs = config_.verify_inputs;
  ho.held_out = true;
  absl::StatusOr<CorrectnessEvidence> held = verifier_.Verify(config_.target, *kernel, ho);
  if (!held.ok()) {
    if (held.status().code() != absl::StatusCode::kAborted) return held.status();
    r.verdict = Verdict::kLaunchError;
    r.reason = absl::StrCat("held-out set: ", held.status().message());
    return absl::OkStatus();
  }
  const Decision ho_decision = JudgeHeldOut(rules_, *evidence, *held);
  r.held_out = ho_decision.reason;
  if (ho_decision.verdict != Verdict::kAccepted) {
    r.verdict = ho_decision.verdict;
    r.reason = ho_decision.reason;
    return absl::OkStatus();
  }

  // The new best; its profile for the next bottleneck.
  observer_.OnPhase(iteration, "profiling");
  absl::StatusOr<KernelProfile> profile = bench_.Profile(
      config_.target, *kernel, DeriveSeed(config_.secret_seed, iteration, kProfileSeed));
  if (!profile.ok()) return profile.status();
  best_.kernel = kernel;
  best_.source = r.source;
  best_.description = r.description;
  best_.profile = *profile;
  best_.seconds = d.candidate_seconds;
  r.best_after = best_.seconds;
  return absl::OkStatus();
}

absl::StatusOr<LoopOutcome> TuneLoop::Run(const std::atomic<bool>& cancelled) {
  LoopOutcome out;
  if (absl::Status s = StartBest(cancelled); !s.ok()) return s;
  const auto finish = [&](StopReason stop, std::string why) {
    out.stop = stop;
    out.why = std::move(why);
    out.baseline_seconds = baseline_seconds_;
    out.best_seconds = best_.seconds;
    out.best_description = best_.description;
    out.best_source = best_.source;
    return out;
  };
  const auto cancelled_outcome = [&] {
    return finish(StopReason::kCancelled, "cancelled");
  };
  if (cancelled.load()) return cancelled_outcome();
  const int first = records_.empty() ? 1 : records_.back().iteration + 1;
  for (int it = first; it <= config_.budget.max_iter; ++it) {
    if (without_improvement_ >= config_.budget.patience) break;
    if (cancelled.load()) return cancelled_outcome();
    IterationRecord r;
    bool exhausted = false;
    absl::Status s = Iterate(it, cancelled, &r, &exhausted);
    if (absl::IsCancelled(s) && cancelled.load()) return cancelled_outcome();
    if (!s.ok()) return s;
    if (exhausted) return finish(StopReason::kExhausted, r.reason);
    records_.push_back(r);
    observer_.OnRecord(r);
    without_improvement_ = r.verdict == Verdict::kAccepted ? 0 : without_improvement_ + 1;
  }
  if (without_improvement_ >= config_.budget.patience) {
    return finish(StopReason::kPatience,
                  absl::StrCat(without_improvement_, " iterations without improvement (patience ",
                               config_.budget.patience, ")"));
  }
  return finish(StopReason::kBudget,
                absl::StrCat("max_iter ", config_.budget.max_iter, " reached"));
}

}  // namespace rvd::tune

#include "client/rvctl_tune.h"

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "google/protobuf/util/json_util.h"
#include "rvd/v1/rvd.grpc.pb.h"

ABSL_DECLARE_FLAG(bool, json);
ABSL_DECLARE_FLAG(uint64_t, seed);
ABSL_FLAG(std::string, shape_class, "",
          "tune start: the registry's shape class: square, triangle, wide or tall");
ABSL_FLAG(std::string, dtype, "bf16", "tune start: bf16, f16 or f32");
ABSL_FLAG(std::string, shapes, "",
          "tune start: COUNTxROWSxCOLS,... (empty: the shape class's defaults)");
ABSL_FLAG(std::string, generator, "builtin", "tune start: builtin, or an LLM provider's name");
ABSL_FLAG(int32_t, max_iter, -1, "tune start: iterations after the start (-1: rvd's 30)");
ABSL_FLAG(int32_t, patience, -1,
          "tune start: iterations without improvement before stopping (-1: rvd's 3)");
ABSL_FLAG(double, min_improvement, -1,
          "tune start: fraction faster beyond the spread to accept (-1: rvd's 0.01)");
ABSL_FLAG(std::string, start, "naive", "tune start: naive or product");
ABSL_FLAG(uint32_t, device, 0, "tune start: the GPU");
ABSL_FLAG(bool, iterations, false,
          "tune status: also every iteration (the improvement log) and the best source");

namespace rvd {
namespace {

using rvd::v1::TuneJob;

constexpr int kFailure = 1;
constexpr int kUsageError = 2;

int Fail(const grpc::Status& s) {
  std::fprintf(stderr, "rvctl: %s: %s\n",
               absl::StatusCodeToString(static_cast<absl::StatusCode>(s.error_code())).c_str(),
               s.error_message().c_str());
  return kFailure;
}

int Usage(const std::string& why) {
  std::fprintf(stderr, "rvctl: %s\n%s\n", why.c_str(), absl::ProgramUsageMessage().data());
  return kUsageError;
}

const char* StateName(rvd::v1::TuneJobState s) {
  switch (s) {
    case rvd::v1::TUNE_JOB_QUEUED: return "queued";
    case rvd::v1::TUNE_JOB_RUNNING: return "running";
    case rvd::v1::TUNE_JOB_SUCCEEDED: return "succeeded";
    case rvd::v1::TUNE_JOB_FAILED: return "failed";
    case rvd::v1::TUNE_JOB_CANCELLED: return "cancelled";
    default: return "unknown";
  }
}

bool Finished(const TuneJob& j) {
  return j.state() == rvd::v1::TUNE_JOB_SUCCEEDED || j.state() == rvd::v1::TUNE_JOB_FAILED ||
         j.state() == rvd::v1::TUNE_JOB_CANCELLED;
}

void PrintJson(const google::protobuf::Message& m) {
  std::string out;
  google::protobuf::util::JsonPrintOptions o;
  o.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(m, &out, o);
  std::printf("%s\n", out.c_str());
}

// One line: id, state, iteration, best against the start, the last verdict.
void PrintLine(const TuneJob& j) {
  const rvd::v1::TuneProgress& p = j.progress();
  std::string line = absl::StrFormat("%s %s %s/%s iteration %u", j.id(), StateName(j.state()),
                                     j.spec().target().shape_class(),
                                     rvd::v1::DType_Name(j.spec().target().dtype()),
                                     p.iteration());
  if (p.best_seconds() > 0) {
    absl::StrAppendFormat(&line, " best %.4g ms", 1e3 * p.best_seconds());
    if (p.baseline_seconds() > 0) {
      absl::StrAppendFormat(&line, " (%.3fx the start)", p.baseline_seconds() / p.best_seconds());
    }
  }
  if (!p.phase().empty()) absl::StrAppend(&line, " [", p.phase(), "]");
  if (!p.last_verdict().empty()) {
    absl::StrAppend(&line, "; last ", p.last_verdict(), ": ", p.last_reason());
  }
  if (Finished(j) && !j.message().empty()) absl::StrAppend(&line, "; ", j.message());
  std::printf("%s\n", line.c_str());
}

// The improvement log: one line per iteration, then the best source.
void PrintIterations(const TuneJob& j) {
  std::printf("%4s  %-16s %12s %12s %8s  %s\n", "iter", "verdict", "cand ms", "best ms",
              "speedup", "candidate");
  for (const rvd::v1::TuneIteration& it : j.iterations()) {
    std::printf("%4u  %-16s %12.4f %12.4f %8.3f  %s\n", it.iteration(), it.verdict().c_str(),
                1e3 * it.candidate_seconds(), 1e3 * it.best_after(), it.speedup(),
                it.description().c_str());
  }
  if (!j.best_source().empty()) std::printf("best source:\n%s\n", j.best_source().c_str());
}

void Print(const TuneJob& j) {
  if (absl::GetFlag(FLAGS_json)) {
    PrintJson(j);
  } else {
    PrintLine(j);
  }
}

bool ParseShapes(const std::string& text, rvd::v1::TuneTarget* t, std::string* why) {
  for (absl::string_view s : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    std::vector<absl::string_view> parts = absl::StrSplit(s, 'x');
    uint32_t v[3];
    if (parts.size() != 3 || !absl::SimpleAtoi(parts[0], &v[0]) ||
        !absl::SimpleAtoi(parts[1], &v[1]) || !absl::SimpleAtoi(parts[2], &v[2])) {
      *why = absl::StrCat("--shapes: \"", s, "\" is not COUNTxROWSxCOLS");
      return false;
    }
    rvd::v1::TuneShape* sh = t->add_shapes();
    sh->set_count(v[0]);
    sh->set_rows(v[1]);
    sh->set_cols(v[2]);
  }
  return true;
}

int Start(rvd::v1::Rvd::Stub& stub) {
  rvd::v1::StartTuneJobRequest r;
  rvd::v1::TuneTarget* t = r.mutable_target();
  t->set_shape_class(absl::GetFlag(FLAGS_shape_class));
  if (t->shape_class().empty()) return Usage("tune start needs --shape-class");
  const std::string dtype = absl::GetFlag(FLAGS_dtype);
  if (dtype == "bf16") {
    t->set_dtype(rvd::v1::DTYPE_BF16);
  } else if (dtype == "f16") {
    t->set_dtype(rvd::v1::DTYPE_F16);
  } else if (dtype == "f32") {
    t->set_dtype(rvd::v1::DTYPE_F32);
  } else {
    return Usage("--dtype is bf16, f16 or f32");
  }
  std::string why;
  if (!ParseShapes(absl::GetFlag(FLAGS_shapes), t, &why)) return Usage(why);
  r.set_generator(absl::GetFlag(FLAGS_generator));
  if (absl::GetFlag(FLAGS_max_iter) >= 0) {
    r.mutable_budget()->set_max_iter(static_cast<uint32_t>(absl::GetFlag(FLAGS_max_iter)));
  }
  if (absl::GetFlag(FLAGS_patience) >= 0) {
    r.mutable_budget()->set_patience(static_cast<uint32_t>(absl::GetFlag(FLAGS_patience)));
  }
  if (absl::GetFlag(FLAGS_min_improvement) >= 0) {
    r.mutable_budget()->set_min_improvement(absl::GetFlag(FLAGS_min_improvement));
  }
  r.set_seed(absl::GetFlag(FLAGS_seed));
  r.set_start(absl::GetFlag(FLAGS_start));
  r.set_device(absl::GetFlag(FLAGS_device));
  grpc::ClientContext c;
  TuneJob job;
  grpc::Status s = stub.StartTuneJob(&c, r, &job);
  if (!s.ok()) return Fail(s);
  Print(job);
  return 0;
}

int Watch(rvd::v1::Rvd::Stub& stub, const std::string& id) {
  grpc::ClientContext c;
  rvd::v1::WatchTuneJobRequest r;
  r.set_id(id);
  std::unique_ptr<grpc::ClientReader<TuneJob>> reader = stub.WatchTuneJob(&c, r);
  TuneJob job;
  bool failed = false;
  while (reader->Read(&job)) {
    Print(job);
    std::fflush(stdout);
    failed = job.state() == rvd::v1::TUNE_JOB_FAILED;
  }
  grpc::Status s = reader->Finish();
  if (!s.ok()) return Fail(s);
  return failed ? kFailure : 0;
}

}  // namespace

int RunTuneCommand(const std::shared_ptr<grpc::Channel>& channel,
                   const std::vector<std::string>& args) {
  if (args.empty()) return Usage("tune needs start, status, list, watch or cancel");
  const std::string& sub = args[0];
  auto stub = rvd::v1::Rvd::NewStub(channel);
  const auto need_id = [&]() -> bool { return args.size() == 2 && !args[1].empty(); };
  if (sub == "start") {
    if (args.size() != 1) return Usage("tune start takes no argument (flags only)");
    return Start(*stub);
  }
  if (sub == "list") {
    if (args.size() != 1) return Usage("tune list takes no argument");
    grpc::ClientContext c;
    rvd::v1::ListTuneJobsResponse list;
    grpc::Status s = stub->ListTuneJobs(&c, rvd::v1::ListTuneJobsRequest(), &list);
    if (!s.ok()) return Fail(s);
    if (absl::GetFlag(FLAGS_json)) {
      PrintJson(list);
    } else {
      for (const TuneJob& j : list.jobs()) PrintLine(j);
    }
    return 0;
  }
  if (sub == "status" || sub == "cancel" || sub == "watch") {
    if (!need_id()) return Usage(absl::StrCat("tune ", sub, " needs a job id"));
    if (sub == "watch") return Watch(*stub, args[1]);
    grpc::ClientContext c;
    TuneJob job;
    grpc::Status s;
    if (sub == "status") {
      rvd::v1::GetTuneJobRequest r;
      r.set_id(args[1]);
      r.set_include_iterations(absl::GetFlag(FLAGS_iterations));
      s = stub->GetTuneJob(&c, r, &job);
      if (s.ok() && !absl::GetFlag(FLAGS_json) && absl::GetFlag(FLAGS_iterations)) {
        PrintLine(job);
        PrintIterations(job);
        return 0;
      }
    } else {
      rvd::v1::CancelTuneJobRequest r;
      r.set_id(args[1]);
      s = stub->CancelTuneJob(&c, r, &job);
    }
    if (!s.ok()) return Fail(s);
    Print(job);
    return 0;
  }
  return Usage(absl::StrCat("unknown tune command '", sub, "'"));
}

}  // namespace rvd

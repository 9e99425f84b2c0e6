#include "self_improve/job_log.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace rvd::tune {
namespace {

using json = nlohmann::json;

absl::Status Errno(const std::string& what, const std::string& path) {
  return absl::InternalError(absl::StrCat(what, " ", path, ": ", std::strerror(errno)));
}

const char* DTypeKey(DType d) { return DTypeName(d); }

absl::StatusOr<DType> ParseDType(const std::string& s) {
  for (DType d : {DType::kF32, DType::kF16, DType::kBF16}) {
    if (s == DTypeName(d)) return d;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown dtype \"", s, "\""));
}

json SpecJson(const JobSpec& s) {
  json shapes = json::array();
  for (const TuneShape& sh : s.target.shapes) {
    shapes.push_back({{"count", sh.count}, {"rows", sh.rows}, {"cols", sh.cols}});
  }
  return {{"target",
           {{"variant", s.target.variant},
            {"dtype", DTypeKey(s.target.dtype)},
            {"shape_class", s.target.shape_class},
            {"arch", s.target.arch},
            {"shapes", shapes}}},
          {"generator", s.generator},
          {"budget",
           {{"max_iter", s.budget.max_iter},
            {"patience", s.budget.patience},
            {"min_improvement", s.budget.min_improvement}}},
          {"seed", s.seed},
          {"start", s.start},
          {"device", s.device}};
}

absl::StatusOr<JobSpec> SpecOf(const json& j) {
  try {
    JobSpec s;
    const json& t = j.at("target");
    s.target.variant = t.at("variant").get<std::string>();
    absl::StatusOr<DType> d = ParseDType(t.at("dtype").get<std::string>());
    if (!d.ok()) return d.status();
    s.target.dtype = *d;
    s.target.shape_class = t.at("shape_class").get<std::string>();
    s.target.arch = t.at("arch").get<std::string>();
    for (const json& sh : t.at("shapes")) {
      s.target.shapes.push_back(
          {sh.at("count").get<int>(), sh.at("rows").get<int>(), sh.at("cols").get<int>()});
    }
    s.generator = j.at("generator").get<std::string>();
    const json& b = j.at("budget");
    s.budget.max_iter = b.at("max_iter").get<int>();
    s.budget.patience = b.at("patience").get<int>();
    s.budget.min_improvement = b.at("min_improvement").get<double>();
    s.seed = j.at("seed").get<uint64_t>();
    s.start = j.at("start").get<std::string>();
    s.device = j.at("device").get<int>();
    return s;
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("job spec: ", e.what()));
  }
}

json RecordJson(const IterationRecord& r) {
  return {{"type", "iteration"},
          {"iteration", r.iteration},
          {"description", r.description},
          {"source", r.source},
          {"verdict", VerdictName(r.verdict)},
          {"reason", r.reason},
          {"bottleneck", r.bottleneck},
          {"compile_attempts", r.compile_attempts},
          {"candidate_seconds", r.candidate_seconds},
          {"best_seconds", r.best_seconds},
          {"speedup", r.speedup},
          {"spread", r.spread},
          {"held_out", r.held_out},
          {"best_after", r.best_after}};
}

absl::StatusOr<Verdict> ParseVerdict(const std::string& s) {
  for (int v = 0; v <= static_cast<int>(Verdict::kGeneratorError); ++v) {
    if (s == VerdictName(static_cast<Verdict>(v))) return static_cast<Verdict>(v);
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown verdict \"", s, "\""));
}

absl::StatusOr<IterationRecord> RecordOf(const json& j) {
  IterationRecord r;
  r.iteration = j.at("iteration").get<int>();
  r.description = j.at("description").get<std::string>();
  r.source = j.at("source").get<std::string>();
  absl::StatusOr<Verdict> v = ParseVerdict(j.at("verdict").get<std::string>());
  if (!v.ok()) return v.status();
  r.verdict = *v;
  r.reason = j.at("reason").get<std::string>();
  r.bottleneck = j.at("bottleneck").get<std::string>();
  r.compile_attempts = j.at("compile_attempts").get<int>();
  r.candidate_seconds = j.at("candidate_seconds").get<double>();
  r.best_seconds = j.at("best_seconds").get<double>();
  r.speedup = j.at("speedup").get<double>();
  r.spread = j.at("spread").get<double>();
  r.held_out = j.at("held_out").get<std::string>();
  r.best_after = j.at("best_after").get<double>();
  return r;
}

absl::StatusOr<JobState> ParseState(const std::string& s) {
  for (JobState st : {JobState::kQueued, JobState::kRunning, JobState::kSucceeded,
                      JobState::kFailed, JobState::kCancelled}) {
    if (s == JobStateName(st)) return st;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown state \"", s, "\""));
}

// Dumps with invalid UTF-8 replaced (a generator's text is not trusted to be UTF-8).
std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

}  // namespace

const char* JobStateName(JobState s) {
  switch (s) {
    case JobState::kQueued: return "queued";
    case JobState::kRunning: return "running";
    case JobState::kSucceeded: return "succeeded";
    case JobState::kFailed: return "failed";
    case JobState::kCancelled: return "cancelled";
  }
  return "unknown";
}

bool IsTerminal(JobState s) {
  return s == JobState::kSucceeded || s == JobState::kFailed || s == JobState::kCancelled;
}

std::string SpecToJson(const JobSpec& spec) { return Dump(SpecJson(spec)); }

absl::StatusOr<JobSpec> SpecFromJson(const std::string& text) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError("job spec: not JSON");
  return SpecOf(j);
}

absl::StatusOr<JobLog> JobLog::Create(const std::string& path, const std::string& id,
                                      const JobSpec& spec, uint64_t secret_seed,
                                      int64_t created_unix_nanos) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return Errno("cannot create the job log", path);
  ::close(fd);
  JobLog log(path);
  json line = {{"type", "job"},
               {"id", id},
               {"spec", SpecJson(spec)},
               {"secret_seed", secret_seed},
               {"created", created_unix_nanos}};
  if (absl::Status s = log.WriteLine(Dump(line)); !s.ok()) return s;
  return log;
}

absl::StatusOr<JobLog> JobLog::Append(const std::string& path) {
  absl::StatusOr<JobLogContents> contents = ReadJobLog(path);
  if (!contents.ok()) return contents.status();
  if (contents->torn_tail) {
    // Cut the torn line so that the next line starts on its own.
    std::ifstream in(path, std::ios::binary);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const size_t keep = text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1;
    if (::truncate(path.c_str(), static_cast<off_t>(keep)) != 0) {
      return Errno("cannot cut the torn tail of", path);
    }
  }
  return JobLog(path);
}

absl::Status JobLog::WriteLine(const std::string& line) {
  const int fd = ::open(path_.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
  if (fd < 0) return Errno("cannot open the job log", path_);
  const std::string text = line + "\n";
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      const absl::Status s = Errno("cannot write the job log", path_);
      ::close(fd);
      return s;
    }
    done += static_cast<size_t>(n);
  }
  // Durable before the job goes on: a resumed job never repeats a logged step.
  if (::fsync(fd) != 0) {
    const absl::Status s = Errno("cannot fsync the job log", path_);
    ::close(fd);
    return s;
  }
  ::close(fd);
  return absl::OkStatus();
}

absl::Status JobLog::AddIteration(const IterationRecord& r) { return WriteLine(Dump(RecordJson(r))); }

absl::Status JobLog::AddState(JobState state, const std::string& message, const std::string& stop,
                              int64_t unix_nanos) {
  return WriteLine(Dump({{"type", "state"},
                         {"state", JobStateName(state)},
                         {"message", message},
                         {"stop", stop},
                         {"time", unix_nanos}}));
}

absl::StatusOr<JobLogContents> ReadJobLog(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("no job log ", path));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  JobLogContents c;
  std::vector<std::string> lines;
  {
    size_t start = 0;
    while (start < text.size()) {
      const size_t nl = text.find('\n', start);
      if (nl == std::string::npos) {
        c.torn_tail = true;  // no newline: the write did not finish
        break;
      }
      lines.push_back(text.substr(start, nl - start));
      start = nl + 1;
    }
  }
  bool have_job = false;
  for (size_t i = 0; i < lines.size(); ++i) {
    const auto bad = [&](const std::string& why) {
      return absl::DataLossError(absl::StrCat(path, " line ", i + 1, ": ", why));
    };
    json j = json::parse(lines[i], nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) {
      // Only the last line may be torn (written without its end); a bad line
      // before it is damage.
      if (i + 1 == lines.size()) {
        c.torn_tail = true;
        break;
      }
      return bad("not a JSON object");
    }
    try {
      const std::string type = j.at("type").get<std::string>();
      if (type == "job") {
        if (have_job) return bad("a second job line");
        c.id = j.at("id").get<std::string>();
        absl::StatusOr<JobSpec> spec = SpecOf(j.at("spec"));
        if (!spec.ok()) return bad(std::string(spec.status().message()));
        c.spec = *spec;
        c.secret_seed = j.at("secret_seed").get<uint64_t>();
        c.created_unix_nanos = j.at("created").get<int64_t>();
        have_job = true;
      } else if (!have_job) {
        return bad("the job line is not first");
      } else if (type == "iteration") {
        absl::StatusOr<IterationRecord> r = RecordOf(j);
        if (!r.ok()) return bad(std::string(r.status().message()));
        c.records.push_back(*std::move(r));
      } else if (type == "state") {
        absl::StatusOr<JobState> st = ParseState(j.at("state").get<std::string>());
        if (!st.ok()) return bad(std::string(st.status().message()));
        c.state = *st;
        c.message = j.at("message").get<std::string>();
        c.stop = j.at("stop").get<std::string>();
      } else {
        return bad(absl::StrCat("unknown line type \"", type, "\""));
      }
    } catch (const json::exception& e) {
      return bad(e.what());
    }
  }
  if (!have_job) return absl::DataLossError(absl::StrCat(path, ": no job line"));
  return c;
}

}  // namespace rvd::tune

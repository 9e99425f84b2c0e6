// A tuning job's log (self_improve/, public): one JSON object per line in
// data_dir/tune/<job id>.jsonl, appended and fsynced as the job goes, so
// that a job resumes after a restart from what it had logged. The log is
// also the job's improvement log: every candidate's source, verdict and
// reason, and the best after each iteration.
//
// Lines, in order:
//   {"type":"job", "id", "spec":{...}, "secret_seed", "search_seed", "created"}   first, once
//   {"type":"iteration", ...IterationRecord...}                                    per iteration
//   {"type":"state", "state", "message", "stop", "time"}                           each change
// Replay keeps every complete line; a torn last line (a crash mid-write) is
// dropped; a malformed line before the last is DATA_LOSS naming its line.
//
// Thread-compatible: one writer per file (the job's thread).
#ifndef RVD_SELF_IMPROVE_JOB_LOG_H_
#define RVD_SELF_IMPROVE_JOB_LOG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "self_improve/tune_loop.h"

namespace rvd::tune {

enum class JobState { kQueued, kRunning, kSucceeded, kFailed, kCancelled };
// "queued", "running", "succeeded", "failed", "cancelled".
const char* JobStateName(JobState s);
bool IsTerminal(JobState s);

// What a job was asked to do.
struct JobSpec {
  TuneTarget target;
  std::string generator = "builtin";  // a registered generator's name
  TuneBudget budget;
  uint64_t seed = 0;                  // the search's seed (0: drawn at start)
  std::string start = "naive";        // "naive" or "product"
  int device = 0;                     // the GPU, as the engine numbers them
};

struct JobLogContents {
  std::string id;
  JobSpec spec;
  uint64_t secret_seed = 0;
  int64_t created_unix_nanos = 0;
  std::vector<IterationRecord> records;
  JobState state = JobState::kQueued;  // the last state line's
  std::string message;                 // and its message
  std::string stop;                    // StopReasonName of a finished job
  bool torn_tail = false;              // a torn last line was dropped
};

class JobLog {
 public:
  // Creates `path` (its directory must exist) with the job line; fails if
  // the file exists.
  static absl::StatusOr<JobLog> Create(const std::string& path, const std::string& id,
                                       const JobSpec& spec, uint64_t secret_seed,
                                       int64_t created_unix_nanos);
  // Opens an existing log to append to (a resumed job), cutting a torn tail.
  static absl::StatusOr<JobLog> Append(const std::string& path);

  absl::Status AddIteration(const IterationRecord& r);
  absl::Status AddState(JobState state, const std::string& message, const std::string& stop,
                        int64_t unix_nanos);
  const std::string& path() const { return path_; }

 private:
  explicit JobLog(std::string path) : path_(std::move(path)) {}
  absl::Status WriteLine(const std::string& line);
  std::string path_;
};

absl::StatusOr<JobLogContents> ReadJobLog(const std::string& path);

// The spec as JSON text and back (the log's and the tests' form).
std::string SpecToJson(const JobSpec& spec);
absl::StatusOr<JobSpec> SpecFromJson(const std::string& json);

}  // namespace rvd::tune

#endif  // RVD_SELF_IMPROVE_JOB_LOG_H_

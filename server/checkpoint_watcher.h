// Measures every new complete Hugging Face checkpoint that appears in the
// watched directories (config `watch`, watch_config.h), once, with no change
// to the trainer.
//
// A watched directory is each directory a configured glob matches (globs
// are expanded again at every look, so runs started later are found). Its
// subdirectories named like a step (ParseCheckpointStep: checkpoint-1200,
// global_step1200, ...) are its checkpoints; the model id comes from the
// configured template ("{dir}": the watched directory's name).
//
// A checkpoint is read when it is complete and settled:
//   complete  config.json, and either model.safetensors.index.json that
//             parses with every shard it names present, or model.safetensors;
//   settled   two looks at least settle_seconds apart saw the same size and
//             modification time of every one of those files.
// A checkpoint still being written fails one of the two; one that settles
// half-written (a writer paused for longer than settle_seconds) fails the
// loader's checks (a tensor past the end of its file) and is tried again
// once its files change. A checkpoint whose read or measurement failed for
// another reason (a bad config.json, a path the policy refuses) is logged
// and tried again only when its files change.
//
// Once only: a measured checkpoint (its real path) is recorded in a file
// under data_dir (one JSON object per line, fsync'ed, a torn last line
// skipped on load), and one whose model already has a measurement at that
// step in rvd's history is not measured again either (this covers a crash
// between the measurement and the record once the history is durable). A
// checkpoint is recorded after it was measured: rvd dying in between
// measures it again at the next start, unless the history has it. The key
// is the checkpoint's real path: a checkpoint deleted and written again
// under the same name (a run restarted from scratch into the same
// directory) is not measured again; give the new run its own directory.
//
// Looks happen every poll_interval_seconds, and at once when inotify reports
// a change in a watched directory or a checkpoint not yet read (where the
// kernel has inotify and `inotify` is on; polling alone otherwise, e.g. for
// network filesystems whose remote writes inotify never sees).
//
// Thread-safety: Start and Stop from one thread; the watcher's own thread
// does every look and measurement, one at a time.
#ifndef RVD_SERVER_CHECKPOINT_WATCHER_H_
#define RVD_SERVER_CHECKPOINT_WATCHER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "rvd/v1/rvd.pb.h"
#include "server/path_policy.h"
#include "server/watch_config.h"

namespace rvd {

// The step a checkpoint directory's name gives: checkpoint, global_step,
// step or iter, then "-", "_" or nothing, then 1 to 18 decimal digits
// (checkpoint-1200, global_step1200, step_300, iter_0001200). nullopt for
// any other name (tmp-checkpoint-1300, checkpoint-1200.tmp, runs).
std::optional<int64_t> ParseCheckpointStep(std::string_view name);

// A file of a checkpoint as one look saw it.
struct FileStamp {
  std::string name;  // relative to the checkpoint directory
  uint64_t size = 0;
  int64_t mtime_ns = 0;
  bool operator==(const FileStamp&) const = default;
};

// One look at a checkpoint directory.
struct CheckpointLook {
  bool complete = false;
  std::string incomplete;         // why not, for the debug log
  std::vector<FileStamp> files;   // config.json, index, shards; by name
};
// Looks at `dir` (no file is opened but the index, which is parsed).
CheckpointLook LookAtCheckpoint(const std::string& dir);

// Settle detection: when has a checkpoint looked the same for long enough?
class SettleTracker {
 public:
  explicit SettleTracker(absl::Duration settle) : settle_(settle) {}
  // Records a look at `key` at `now`. True when the files are the same as
  // at the look that first saw them so, and that look was at least
  // `settle` before `now`; any change starts the wait again.
  bool Observe(const std::string& key, const std::vector<FileStamp>& files,
               absl::Time now);
  void Forget(const std::string& key) { pending_.erase(key); }
  // Forgets every key not in `keys` (checkpoints that went away).
  void Retain(const std::set<std::string>& keys);
  // The earliest time a pending key could settle, if there is one.
  std::optional<absl::Time> NextDue() const;

 private:
  struct Pending {
    std::vector<FileStamp> files;
    absl::Time since;  // the first look that saw `files`
  };
  const absl::Duration settle_;
  std::map<std::string, Pending> pending_;
};

// The checkpoints measured already, kept in a file so that a restart does
// not measure them again.
class SeenSet {
 public:
  // Loads `path` (created when absent; its directory too). "": memory only.
  // A line that does not parse is skipped and counted (a torn last write).
  // An unreadable or uncreatable file is an error.
  static absl::StatusOr<SeenSet> Open(const std::string& path);

  bool Contains(const std::string& key) const { return keys_.contains(key); }
  size_t size() const { return keys_.size(); }
  int skipped_lines() const { return skipped_lines_; }
  const std::string& path() const { return path_; }

  // Records `key`, in memory, then appended to the file and fsync'ed. A
  // write error is returned; the key stays recorded in memory.
  absl::Status Add(const std::string& key, const std::string& model_id,
                   int64_t step, uint64_t sequence);

 private:
  std::string path_;
  std::set<std::string> keys_;
  int skipped_lines_ = 0;
};

// What the watcher needs from the daemon, so that a test can stand in.
struct WatchHooks {
  // Measures and stores the checkpoint at `real_path` for `header` (model
  // id and step, no tensors); `stopping` turns true when the watcher stops.
  std::function<absl::StatusOr<rvd::v1::Measurement>(
      const std::string& real_path, const rvd::v1::MeasureHeader& header,
      const std::function<bool()>& stopping)>
      measure;
  // Whether the history holds a measurement of `model_id` at `step`.
  std::function<bool(const std::string& model_id, int64_t step)> has_step;
};

// What the watcher has done, for /metrics (watch_metrics.h).
struct WatchStats {
  int64_t measured = 0;       // checkpoints measured
  int64_t failed = 0;         // reads or measurements that failed (not busy)
  // Checkpoints found but not measured at the last look: being written,
  // settling, or failed and waiting for their files to change.
  int64_t pending = 0;
  int64_t directories = 0;    // watched directories at the last look
  double last_look_seconds = 0;  // Unix time of the last look's end
};

class CheckpointWatcher {
 public:
  // Checks the configuration against the filesystem: every directory's
  // glob must start from an existing directory (its leading components
  // without a glob character) that resolves under the policy's roots; an
  // error names the directory (the daemon does not start). Loads the seen
  // set from `seen_path` ("": memory only; a file that cannot be opened is
  // logged, and the watcher runs on the history alone).
  static absl::StatusOr<std::unique_ptr<CheckpointWatcher>> Create(
      const WatchConfig& config, const PathPolicy& policy,
      const std::string& seen_path, WatchHooks hooks);
  ~CheckpointWatcher();  // Stop()

  // Starts the watcher's thread: one look at once, then one per poll
  // interval or inotify event.
  void Start();
  // Stops the thread, after the measurement in progress (whose `stopping`
  // turns true, so that it leaves the compute queue). Idempotent.
  void Stop();

  // One look at every watched directory, measuring what has settled; the
  // thread's step, public for tests (never while the thread runs).
  void LookOnce(absl::Time now);
  // Measurements made so far (each checkpoint once).
  int measured() const { return measured_.load(); }
  // Thread-safe: read at scrape time.
  WatchStats Stats() const;

 private:
  CheckpointWatcher(const WatchConfig& config, const PathPolicy& policy,
                    SeenSet seen, WatchHooks hooks);
  void Run();
  void LookAt(const WatchDirectory& dir, const std::string& watched,
              absl::Time now);
  void Consider(const std::string& model_id, int64_t step,
                const std::string& checkpoint, absl::Time now);
  // Logs `text` (warn) once per `key`.
  void WarnOnce(const std::string& key, const std::string& text);
  void AddInotify(const std::string& dir);
  void RemoveInotify(const std::string& dir);
  // Waits up to `timeout` for a stop or an inotify event.
  void Wait(absl::Duration timeout);

  const WatchConfig config_;
  const PathPolicy& policy_;
  SeenSet seen_;
  const WatchHooks hooks_;
  SettleTracker tracker_;
  // Checkpoints (real paths) measured, or seen before; never looked at again.
  std::set<std::string> done_;
  // Checkpoints whose read failed, with the files it failed on.
  std::map<std::string, std::vector<FileStamp>> failed_;
  std::set<std::string> warned_;  // WarnOnce keys
  std::set<std::string> visited_;  // checkpoints pending in this look
  std::atomic<int> measured_{0};
  std::atomic<int64_t> failed_total_{0};
  std::atomic<int64_t> pending_{0};
  std::atomic<int64_t> directories_{0};
  std::atomic<double> last_look_seconds_{0};

  int inotify_fd_ = -1;                    // -1: polling only
  std::map<int, std::string> inotify_dirs_;   // watch descriptor -> dir
  std::map<std::string, int> inotify_wds_;    // dir -> watch descriptor
  int wake_fds_[2] = {-1, -1};  // a pipe: Stop writes, Wait returns

  std::thread thread_;
  std::atomic<bool> stopping_{false};
};

}  // namespace rvd

#endif  // RVD_SERVER_CHECKPOINT_WATCHER_H_

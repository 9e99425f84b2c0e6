// Which paths on its own host rvd may read: the checkpoint roots.
//
// rvd reads checkpoints itself (MeasurePath, the checkpoint watcher) only
// under the directories of config `checkpoint_roots`. A path is accepted when
// it is absolute, lies under a root as written, and its real path (every
// symlink resolved, `realpath(3)`) lies under a root's real path too, so a
// symlink inside a root that leads out of it is refused like a path outside.
// A file is accepted when, in addition, it is a regular file rvd can read
// (a FIFO or a device would block or never end a read).
//
// Each refusal's status says what is wrong in words a client may see;
// `reason` (where given) adds what only the log should hold, such as where a
// symlink leads.
//
// What this does not close: a directory on a resolved path replaced by a
// symlink between the check and the open. The loader opens the resolved path
// the check returns, so the last component cannot be swapped, but whoever can
// rename directories inside a root can race the check; the roots are meant
// for the trainer's checkpoint directories, writable by the trainer only.
//
// Thread-safety: immutable after Create; any number of threads may call it.
#ifndef RVD_SERVER_PATH_POLICY_H_
#define RVD_SERVER_PATH_POLICY_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace rvd {

class PathPolicy {
 public:
  // Resolves every root: each must be an absolute path to an existing
  // directory (INVALID_ARGUMENT or NOT_FOUND, naming it). No roots: a policy
  // that refuses every path (FAILED_PRECONDITION).
  static absl::StatusOr<PathPolicy> Create(const std::vector<std::string>& roots);

  // True when there are no roots: rvd reads no path itself.
  bool empty() const { return roots_.empty(); }
  // The roots' real paths, in the order configured.
  const std::vector<std::string>& real_roots() const { return real_roots_; }

  // The real path of `path` when it may be read: FAILED_PRECONDITION
  // without roots; INVALID_ARGUMENT for an empty or relative path;
  // PERMISSION_DENIED when it lies outside the roots (as written, or once
  // its symlinks are resolved) or a directory on the way may not be
  // searched; NOT_FOUND when it does not exist. On a refusal, `*reason`
  // (when not null) is set to the details for the log.
  absl::StatusOr<std::string> Resolve(const std::string& path,
                                      std::string* reason = nullptr) const;

  // Resolve, then the result must be a regular file rvd can read:
  // INVALID_ARGUMENT when it is not a regular file, PERMISSION_DENIED when
  // rvd may not read it.
  absl::StatusOr<std::string> ResolveReadableFile(
      const std::string& path, std::string* reason = nullptr) const;

  // Whether the already resolved `real_path` lies under a root's real path.
  bool ContainsReal(const std::string& real_path) const;
  // Whether `path`, lexically normalized (no symlink resolved), lies under
  // a root as configured or under a root's real path.
  bool ContainsLexically(const std::string& path) const;

 private:
  std::vector<std::string> roots_;       // as configured, normalized
  std::vector<std::string> real_roots_;  // realpath of each
};

// Whether `path` equals `dir` or lies below it, comparing whole components
// ("/a/bc" is not under "/a/b"). Both are absolute and normalized.
bool PathIsUnder(const std::string& path, const std::string& dir);

}  // namespace rvd

#endif  // RVD_SERVER_PATH_POLICY_H_

// The configuration of server-side checkpoint reads: `checkpoint_roots` and
// the `watch` section (server/checkpoint_watcher.h does the watching).
//
//   checkpoint_roots: [/mnt/checkpoints]     # flag: --checkpoint-root DIR, repeatable
//   watch:
//     directories:                           # each entry: a glob, or a map
//       - path: /mnt/checkpoints/llama-*     # every directory it matches is watched
//         model_id: "{dir}"                  # the watched directory's name (default),
//                                            # or a fixed id; "{dir}" may be embedded
//       - /mnt/checkpoints/runs/*            # the same with the default model_id
//     poll_interval_seconds: 10
//     settle_seconds: 5
//     inotify: true                          # false: polling only (e.g. NFS)
//
// A watched directory's subdirectories named like a training step
// (checkpoint-1200, global_step1200, ...) are its checkpoints.
#ifndef RVD_SERVER_WATCH_CONFIG_H_
#define RVD_SERVER_WATCH_CONFIG_H_

#include <string>
#include <vector>

#include "absl/status/status.h"

namespace YAML {
class Node;
}  // namespace YAML

namespace rvd {

struct Config;

struct WatchDirectory {
  std::string path;                // absolute glob (glob(3) syntax)
  std::string model_id = "{dir}";  // "{dir}": the watched directory's name
};

struct WatchConfig {
  std::vector<WatchDirectory> directories;  // none: no watching
  // How often every watched directory is listed again (with inotify too:
  // inotify misses writes made on another host of a network filesystem).
  double poll_interval_seconds = 10;
  // A complete checkpoint is read once two looks this far apart saw the same
  // sizes and modification times of all its files.
  double settle_seconds = 5;
  bool inotify = true;  // wake on inotify events where the kernel has them
};

// Reads the `watch` section. INVALID_ARGUMENT naming `where` (e.g. "config
// key 'watch'") and the field on an unknown field or an ill-typed value.
// Never throws.
absl::Status ReadWatchConfig(const std::string& where, const YAML::Node& node,
                             WatchConfig* out);
// The directory a glob starts from: its leading components without a glob
// character (*, ?, [), e.g. "/ckpt/runs" for "/ckpt/runs/llama-*/out";
// the pattern itself when it has none.
std::string GlobStaticPrefix(const std::string& pattern);

// One line for --help: the defaults.
std::string WatchConfigText(const WatchConfig& watch);

// What can be checked without touching the filesystem: absolute roots,
// watched paths absolute and under a root as written, model ids valid with
// "{dir}" filled in, intervals finite and > 0. The roots' and watched
// directories' existence is checked at start (PathPolicy::Create,
// CheckpointWatcher::Create).
absl::Status ValidateCheckpointConfig(const Config& config);

}  // namespace rvd

#endif  // RVD_SERVER_WATCH_CONFIG_H_

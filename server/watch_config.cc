// The `watch` section and checkpoint_roots. yaml-cpp reports errors by
// throwing; every call into it happens inside a try block here.
#include "server/watch_config.h"

#include <cmath>
#include <exception>
#include <filesystem>
#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "server/config.h"
#include "server/measure.h"
#include "server/path_policy.h"
#include "yaml-cpp/yaml.h"

namespace rvd {
namespace {

namespace fs = std::filesystem;

absl::Status Bad(const std::string& where, const YAML::Node& node,
                 const std::string& want) {
  return absl::InvalidArgumentError(absl::StrCat(
      where, ": expected ", want, " (line ", node.Mark().line + 1, ")"));
}

absl::Status ReadString(const std::string& where, const YAML::Node& node,
                        std::string* out) {
  if (!node.IsScalar()) return Bad(where, node, "a string");
  *out = node.Scalar();
  return absl::OkStatus();
}

absl::Status ReadNumber(const std::string& where, const YAML::Node& node,
                        double* out) {
  if (!node.IsScalar() || !absl::SimpleAtod(node.Scalar(), out)) {
    return Bad(where, node, "a number");
  }
  return absl::OkStatus();
}

absl::Status ReadDirectory(const std::string& where, const YAML::Node& node,
                           WatchDirectory* out) {
  if (node.IsScalar()) return ReadString(where, node, &out->path);
  if (!node.IsMap()) {
    return Bad(where, node, "a glob, or a map of path and model_id");
  }
  bool has_path = false;
  for (const auto& entry : node) {
    const std::string key = entry.first.Scalar();
    const std::string at = absl::StrCat(where, ".", key);
    absl::Status s;
    if (key == "path") {
      s = ReadString(at, entry.second, &out->path);
      has_path = true;
    } else if (key == "model_id") {
      s = ReadString(at, entry.second, &out->model_id);
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": unknown field '", key, "' (line ",
                       entry.first.Mark().line + 1, "); known: path, model_id"));
    }
    if (!s.ok()) return s;
  }
  if (!has_path) return Bad(where, node, "a 'path'");
  return absl::OkStatus();
}

absl::Status ReadWatch(const std::string& where, const YAML::Node& node,
                       WatchConfig* out) {
  WatchConfig watch;
  if (node.IsNull()) {
    *out = watch;
    return absl::OkStatus();
  }
  if (!node.IsMap()) {
    return Bad(where, node,
               "a map of directories, poll_interval_seconds, settle_seconds, "
               "inotify");
  }
  std::set<std::string> seen;
  for (const auto& entry : node) {
    const std::string key = entry.first.IsScalar() ? entry.first.Scalar() : "";
    const std::string at = absl::StrCat(where, ".", key);
    if (!seen.insert(key).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(at, " appears more than once"));
    }
    absl::Status s;
    if (key == "directories") {
      const YAML::Node& list = entry.second;
      if (list.IsNull()) continue;
      if (!list.IsSequence()) return Bad(at, list, "a list");
      for (size_t i = 0; i < list.size(); ++i) {
        WatchDirectory dir;
        s = ReadDirectory(absl::StrCat(at, "[", i, "]"), list[i], &dir);
        if (!s.ok()) return s;
        watch.directories.push_back(std::move(dir));
      }
    } else if (key == "poll_interval_seconds") {
      s = ReadNumber(at, entry.second, &watch.poll_interval_seconds);
    } else if (key == "settle_seconds") {
      s = ReadNumber(at, entry.second, &watch.settle_seconds);
    } else if (key == "inotify") {
      if (!entry.second.IsScalar() ||
          !YAML::convert<bool>::decode(entry.second, watch.inotify)) {
        s = Bad(at, entry.second, "true or false");
      }
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": unknown field '", key, "' (line ",
          entry.first.Mark().line + 1,
          "); known: directories, poll_interval_seconds, settle_seconds, "
          "inotify"));
    }
    if (!s.ok()) return s;
  }
  *out = std::move(watch);
  return absl::OkStatus();
}

}  // namespace

absl::Status ReadWatchConfig(const std::string& where, const YAML::Node& node,
                             WatchConfig* out) {
  try {
    return ReadWatch(where, node, out);
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", e.what()));
  }
}

std::string GlobStaticPrefix(const std::string& pattern) {
  const size_t glob = pattern.find_first_of("*?[");
  if (glob == std::string::npos) return pattern;
  const size_t slash = pattern.rfind('/', glob);
  if (slash == std::string::npos) return "";
  return slash == 0 ? "/" : pattern.substr(0, slash);
}

std::string WatchConfigText(const WatchConfig& watch) {
  std::vector<std::string> dirs;
  for (const WatchDirectory& d : watch.directories) dirs.push_back(d.path);
  return absl::StrCat("{directories: [", absl::StrJoin(dirs, ", "),
                      "], poll_interval_seconds: ", watch.poll_interval_seconds,
                      ", settle_seconds: ", watch.settle_seconds,
                      ", inotify: ", watch.inotify ? "true" : "false", "}");
}

absl::Status ValidateCheckpointConfig(const Config& config) {
  std::vector<std::string> errors;
  std::vector<std::string> roots;
  for (const std::string& root : config.checkpoint_roots) {
    if (root.empty() || root[0] != '/') {
      errors.push_back(absl::StrCat("config key 'checkpoint_roots': \"", root,
                                    "\" is not an absolute path"));
      continue;
    }
    roots.push_back(fs::path(root).lexically_normal().string());
    while (roots.back().size() > 1 && roots.back().back() == '/') {
      roots.back().pop_back();
    }
  }
  const WatchConfig& watch = config.watch;
  for (const WatchDirectory& dir : watch.directories) {
    const std::string what =
        absl::StrCat("config key 'watch': directory \"", dir.path, "\"");
    if (dir.path.empty() || dir.path[0] != '/') {
      errors.push_back(absl::StrCat(what, " is not an absolute path"));
      continue;
    }
    std::string prefix =
        fs::path(GlobStaticPrefix(dir.path)).lexically_normal().string();
    while (prefix.size() > 1 && prefix.back() == '/') prefix.pop_back();
    bool under = false;
    for (const std::string& root : roots) under |= PathIsUnder(prefix, root);
    if (!under) {
      errors.push_back(absl::StrCat(
          what, " is not under any of checkpoint_roots [",
          absl::StrJoin(config.checkpoint_roots, ", "), "]"));
    }
    if (dir.path.find("..") != std::string::npos) {
      errors.push_back(absl::StrCat(what, " may not contain \"..\""));
    }
    const std::string sample =
        absl::StrReplaceAll(dir.model_id, {{"{dir}", "run"}});
    if (absl::Status s = ValidateModelId(sample); !s.ok()) {
      errors.push_back(absl::StrCat(
          what, ": model_id \"", dir.model_id,
          "\" is not a model id once {dir} is filled in: ", s.message()));
    }
  }
  if (!(watch.poll_interval_seconds > 0) ||
      !std::isfinite(watch.poll_interval_seconds)) {
    errors.push_back(
        "config key 'watch': poll_interval_seconds must be a finite number > 0");
  }
  if (!(watch.settle_seconds > 0) || !std::isfinite(watch.settle_seconds)) {
    errors.push_back(
        "config key 'watch': settle_seconds must be a finite number > 0");
  }
  if (errors.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrJoin(errors, "; "));
}

}  // namespace rvd

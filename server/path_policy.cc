#include "server/path_policy.h"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace rvd {
namespace {

namespace fs = std::filesystem;

// Lexically normal, without a trailing separator (except for "/").
std::string Normal(const std::string& path) {
  std::string out = fs::path(path).lexically_normal().string();
  while (out.size() > 1 && out.back() == '/') out.pop_back();
  return out;
}

struct RealPath {
  std::string path;
  int error = 0;  // errno of realpath(3); 0: resolved
};

RealPath Real(const std::string& path) {
  std::unique_ptr<char, decltype(&::free)> real(::realpath(path.c_str(), nullptr),
                                                &::free);
  if (real == nullptr) return {"", errno};
  return {real.get(), 0};
}

void SetReason(std::string* reason, std::string text) {
  if (reason != nullptr) *reason = std::move(text);
}

}  // namespace

bool PathIsUnder(const std::string& path, const std::string& dir) {
  if (dir == "/") return !path.empty() && path[0] == '/';
  return path.size() >= dir.size() && path.compare(0, dir.size(), dir) == 0 &&
         (path.size() == dir.size() || path[dir.size()] == '/');
}

absl::StatusOr<PathPolicy> PathPolicy::Create(
    const std::vector<std::string>& roots) {
  PathPolicy policy;
  for (const std::string& root : roots) {
    if (root.empty() || root[0] != '/') {
      return absl::InvalidArgumentError(absl::StrCat(
          "checkpoint root \"", root, "\" is not an absolute path"));
    }
    const RealPath real = Real(root);
    if (real.error != 0) {
      return absl::ErrnoToStatus(
          real.error, absl::StrCat("checkpoint root ", root, ": cannot resolve"));
    }
    struct stat st;
    if (::stat(real.path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
      return absl::InvalidArgumentError(
          absl::StrCat("checkpoint root ", root, " is not a directory"));
    }
    policy.roots_.push_back(Normal(root));
    policy.real_roots_.push_back(real.path);
  }
  return policy;
}

bool PathPolicy::ContainsReal(const std::string& real_path) const {
  for (const std::string& root : real_roots_) {
    if (PathIsUnder(real_path, root)) return true;
  }
  return false;
}

bool PathPolicy::ContainsLexically(const std::string& path) const {
  const std::string normal = Normal(path);
  for (size_t i = 0; i < roots_.size(); ++i) {
    if (PathIsUnder(normal, roots_[i]) || PathIsUnder(normal, real_roots_[i])) {
      return true;
    }
  }
  return false;
}

absl::StatusOr<std::string> PathPolicy::Resolve(const std::string& path,
                                                std::string* reason) const {
  if (roots_.empty()) {
    SetReason(reason, "no checkpoint_roots are configured");
    return absl::FailedPreconditionError(
        "rvd reads no checkpoints itself: it has no checkpoint_roots (config "
        "checkpoint_roots, flag --checkpoint-root)");
  }
  if (path.empty() || path[0] != '/') {
    SetReason(reason, "not an absolute path");
    return absl::InvalidArgumentError(
        absl::StrCat("path \"", path, "\" is not absolute"));
  }
  if (path.find('\0') != std::string::npos) {
    SetReason(reason, "the path holds a NUL byte");
    return absl::InvalidArgumentError("path holds a NUL byte");
  }
  // Outside the roots as written: refused before anything is looked up, so
  // that the answer says nothing of what exists there.
  if (!ContainsLexically(path)) {
    SetReason(reason, "outside checkpoint_roots");
    return absl::PermissionDeniedError(
        absl::StrCat(path, " is outside rvd's checkpoint_roots"));
  }
  const RealPath real = Real(path);
  if (real.error == ENOENT || real.error == ENOTDIR) {
    SetReason(reason, "does not exist");
    return absl::NotFoundError(
        absl::StrCat(path, " does not exist on rvd's host"));
  }
  if (real.error == EACCES) {
    SetReason(reason, "a directory on the path may not be searched by rvd");
    return absl::PermissionDeniedError(
        absl::StrCat(path, ": rvd may not search a directory on the path"));
  }
  if (real.error != 0) {
    SetReason(reason, absl::StrCat("realpath: ", std::strerror(real.error)));
    return absl::ErrnoToStatus(real.error,
                               absl::StrCat(path, ": cannot resolve"));
  }
  if (!ContainsReal(real.path)) {
    SetReason(reason, absl::StrCat("a symlink leads outside checkpoint_roots, to ",
                                   real.path));
    return absl::PermissionDeniedError(absl::StrCat(
        path, " leads through a symlink outside rvd's checkpoint_roots"));
  }
  return real.path;
}

absl::StatusOr<std::string> PathPolicy::ResolveReadableFile(
    const std::string& path, std::string* reason) const {
  absl::StatusOr<std::string> real = Resolve(path, reason);
  if (!real.ok()) return real;
  struct stat st;
  if (::stat(real->c_str(), &st) != 0) {
    const int err = errno;
    SetReason(reason, absl::StrCat("stat: ", std::strerror(err)));
    return absl::ErrnoToStatus(err, absl::StrCat(path, ": cannot stat"));
  }
  if (!S_ISREG(st.st_mode)) {
    SetReason(reason, "not a regular file");
    return absl::InvalidArgumentError(
        absl::StrCat(path, " is not a regular file"));
  }
  // access(2) asks with rvd's real ids, which are the ids it opens with.
  if (::access(real->c_str(), R_OK) != 0) {
    const int err = errno;
    SetReason(reason, absl::StrCat("not readable by rvd: ", std::strerror(err)));
    if (err == EACCES) {
      return absl::PermissionDeniedError(
          absl::StrCat(path, " is not readable by rvd"));
    }
    return absl::ErrnoToStatus(err, absl::StrCat(path, ": cannot read"));
  }
  return real;
}

}  // namespace rvd

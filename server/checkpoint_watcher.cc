#include "server/checkpoint_watcher.h"

#include <fcntl.h>
#include <glob.h>
#include <poll.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "nlohmann/json.hpp"
#include "server/log_text.h"
#include "server/measure.h"
#include "spdlog/spdlog.h"

namespace rvd {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

constexpr char kConfig[] = "config.json";
constexpr char kIndex[] = "model.safetensors.index.json";
constexpr char kSingle[] = "model.safetensors";
// Changes that can complete a checkpoint or start a new one. Not IN_MODIFY:
// a shard being written would wake the watcher at every write.
constexpr uint32_t kInotifyMask = IN_CREATE | IN_MOVED_TO | IN_MOVED_FROM |
                                  IN_CLOSE_WRITE | IN_DELETE | IN_ONLYDIR;

bool Transient(absl::StatusCode code) {
  return code == absl::StatusCode::kResourceExhausted ||
         code == absl::StatusCode::kUnavailable ||
         code == absl::StatusCode::kCancelled ||
         code == absl::StatusCode::kDeadlineExceeded ||
         code == absl::StatusCode::kAborted;
}

// A shard name as the loader accepts it: relative, without "..".
bool InsideDir(const std::string& name) {
  const fs::path rel(name);
  return !name.empty() && !rel.is_absolute() &&
         std::find(rel.begin(), rel.end(), fs::path("..")) == rel.end();
}

std::string Basename(const std::string& path) {
  std::string p = path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  return fs::path(p).filename().string();
}

}  // namespace

std::optional<int64_t> ParseCheckpointStep(std::string_view name) {
  static constexpr std::string_view kWords[] = {"checkpoint", "global_step",
                                                "step", "iter"};
  for (std::string_view word : kWords) {
    if (name.substr(0, word.size()) != word) continue;
    std::string_view rest = name.substr(word.size());
    if (!rest.empty() && (rest[0] == '-' || rest[0] == '_')) {
      rest.remove_prefix(1);
    }
    if (rest.empty() || rest.size() > 18 ||
        !std::all_of(rest.begin(), rest.end(), absl::ascii_isdigit)) {
      continue;
    }
    int64_t step = 0;
    for (char c : rest) step = step * 10 + (c - '0');
    return step;
  }
  return std::nullopt;
}

CheckpointLook LookAtCheckpoint(const std::string& dir) {
  CheckpointLook look;
  auto stamp = [&](const std::string& name) {
    struct stat st;
    const std::string path = absl::StrCat(dir, "/", name);
    if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return false;
    look.files.push_back(
        {name, static_cast<uint64_t>(st.st_size),
         int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec});
    return true;
  };
  if (!stamp(kConfig)) {
    look.incomplete = "no config.json yet";
    return look;
  }
  if (stamp(kIndex)) {
    std::ifstream in(absl::StrCat(dir, "/", kIndex), std::ios::binary);
    std::stringstream text;
    text << in.rdbuf();
    Json index = Json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
    auto map = index.is_object() ? index.find("weight_map") : index.end();
    if (!index.is_object() || map == index.end() || !map->is_object() ||
        map->empty()) {
      // A half-written index does not parse; a bad complete one is the
      // loader's to report once the files have settled.
      look.incomplete = "the index has no weight_map (yet)";
      return look;
    }
    std::set<std::string> shards;
    for (auto it = map->begin(); it != map->end(); ++it) {
      if (it->is_string() && InsideDir(it->get<std::string>())) {
        shards.insert(it->get<std::string>());
      }
    }
    for (const std::string& shard : shards) {
      if (!stamp(shard)) {
        look.incomplete = absl::StrCat("shard ", shard, " not there yet");
        return look;
      }
    }
  } else if (!stamp(kSingle)) {
    look.incomplete = "neither model.safetensors nor its index yet";
    return look;
  }
  std::sort(look.files.begin(), look.files.end(),
            [](const FileStamp& a, const FileStamp& b) { return a.name < b.name; });
  look.complete = true;
  return look;
}

bool SettleTracker::Observe(const std::string& key,
                            const std::vector<FileStamp>& files,
                            absl::Time now) {
  auto it = pending_.find(key);
  if (it == pending_.end() || it->second.files != files) {
    pending_[key] = Pending{files, now};
    return false;
  }
  return now - it->second.since >= settle_;
}

std::optional<absl::Time> SettleTracker::NextDue() const {
  std::optional<absl::Time> due;
  for (const auto& [key, p] : pending_) {
    const absl::Time t = p.since + settle_;
    if (!due.has_value() || t < *due) due = t;
  }
  return due;
}

void SettleTracker::Retain(const std::set<std::string>& keys) {
  for (auto it = pending_.begin(); it != pending_.end();) {
    it = keys.contains(it->first) ? std::next(it) : pending_.erase(it);
  }
}

// ---------------------------------------------------------------------------

absl::StatusOr<SeenSet> SeenSet::Open(const std::string& path) {
  SeenSet seen;
  seen.path_ = path;
  if (path.empty()) return seen;
  std::error_code ec;
  const fs::path parent = fs::path(path).parent_path();
  if (!parent.empty()) fs::create_directories(parent, ec);
  if (ec) {
    return absl::UnavailableError(absl::StrCat(
        "cannot create ", parent.string(), ": ", ec.message()));
  }
  const bool existed = fs::exists(path, ec);
  bool ends_in_newline = true;
  if (existed) {
    std::ifstream in(path, std::ios::binary);
    if (!in) {
      return absl::PermissionDeniedError(
          absl::StrCat("cannot read ", path, ": ", std::strerror(errno)));
    }
    std::string line;
    std::string all((std::istreambuf_iterator<char>(in)),
                    std::istreambuf_iterator<char>());
    ends_in_newline = all.empty() || all.back() == '\n';
    std::istringstream lines(all);
    while (std::getline(lines, line)) {
      if (line.empty()) continue;
      Json j = Json::parse(line, nullptr, /*allow_exceptions=*/false);
      auto p = j.is_object() ? j.find("path") : j.end();
      if (!j.is_object() || p == j.end() || !p->is_string()) {
        ++seen.skipped_lines_;
        continue;
      }
      seen.keys_.insert(p->get<std::string>());
    }
  }
  const int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC,
                        0644);
  if (fd < 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot open ", path));
  }
  // A torn last line (rvd died in the middle of a write) is closed off, so
  // that the next record starts a line of its own.
  bool ok = ends_in_newline || ::write(fd, "\n", 1) == 1;
  ok = ok && ::fsync(fd) == 0;
  const int err = errno;
  ::close(fd);
  if (!ok) return absl::ErrnoToStatus(err, absl::StrCat("cannot write ", path));
  if (!existed && !parent.empty()) {
    // The new file's directory entry is durable too.
    const int dir = ::open(parent.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dir >= 0) {
      ::fsync(dir);
      ::close(dir);
    }
  }
  return seen;
}

absl::Status SeenSet::Add(const std::string& key, const std::string& model_id,
                          int64_t step, uint64_t sequence) {
  keys_.insert(key);
  if (path_.empty()) return absl::OkStatus();
  const std::string line =
      Json{{"path", key},
           {"model_id", model_id},
           {"step", step},
           {"sequence", sequence},
           {"time", absl::FormatTime(absl::RFC3339_sec, absl::Now(),
                                     absl::UTCTimeZone())}}
          .dump() +
      "\n";
  const int fd = ::open(path_.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC,
                        0644);
  if (fd < 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot open ", path_));
  }
  // One write of one line: O_APPEND keeps it in one piece at the end.
  const bool ok =
      ::write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size()) &&
      ::fsync(fd) == 0;
  const int err = errno;
  ::close(fd);
  if (!ok) return absl::ErrnoToStatus(err, absl::StrCat("cannot write ", path_));
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<CheckpointWatcher>> CheckpointWatcher::Create(
    const WatchConfig& config, const PathPolicy& policy,
    const std::string& seen_path, WatchHooks hooks) {
  for (const WatchDirectory& dir : config.directories) {
    const std::string prefix = GlobStaticPrefix(dir.path);
    const std::string what =
        absl::StrCat("config key 'watch': directory \"", dir.path, "\"");
    std::string reason;
    absl::StatusOr<std::string> real = policy.Resolve(prefix, &reason);
    if (!real.ok()) {
      if (real.status().code() == absl::StatusCode::kNotFound) {
        return absl::NotFoundError(
            absl::StrCat(what, ": ", prefix, " does not exist"));
      }
      return absl::Status(real.status().code(),
                          absl::StrCat(what, ": ", real.status().message(),
                                       " (", reason, ")"));
    }
    if (!fs::is_directory(*real)) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": ", prefix, " is not a directory"));
    }
  }
  absl::StatusOr<SeenSet> seen = SeenSet::Open(seen_path);
  if (!seen.ok()) {
    spdlog::warn(
        "watch: {}; the checkpoints measured are kept in memory only (after "
        "a restart, only rvd's history keeps one from being measured twice)",
        std::string(seen.status().message()));
    seen = SeenSet::Open("");
  } else if (seen->skipped_lines() > 0) {
    spdlog::warn("watch: {}: skipped {} line(s) that do not parse (a torn "
                 "write?); those checkpoints may be measured again",
                 seen_path, seen->skipped_lines());
  }
  return std::unique_ptr<CheckpointWatcher>(new CheckpointWatcher(
      config, policy, *std::move(seen), std::move(hooks)));
}

CheckpointWatcher::CheckpointWatcher(const WatchConfig& config,
                                     const PathPolicy& policy, SeenSet seen,
                                     WatchHooks hooks)
    : config_(config),
      policy_(policy),
      seen_(std::move(seen)),
      hooks_(std::move(hooks)),
      tracker_(absl::Seconds(config.settle_seconds)) {
  if (config_.inotify) {
    inotify_fd_ = ::inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    if (inotify_fd_ < 0) {
      spdlog::info("watch: inotify is not available ({}); polling only",
                   std::strerror(errno));
    }
  }
  if (::pipe2(wake_fds_, O_CLOEXEC | O_NONBLOCK) != 0) {
    wake_fds_[0] = wake_fds_[1] = -1;  // Wait then sleeps in poll(2) alone
  }
}

CheckpointWatcher::~CheckpointWatcher() {
  Stop();
  if (inotify_fd_ >= 0) ::close(inotify_fd_);
  for (int fd : wake_fds_) {
    if (fd >= 0) ::close(fd);
  }
}

void CheckpointWatcher::Start() {
  std::vector<std::string> globs;
  for (const WatchDirectory& d : config_.directories) globs.push_back(d.path);
  spdlog::info(
      "watch: {} director{} ({}), looking every {} s{}, settled after {} s; "
      "{} checkpoint(s) measured before{}",
      globs.size(), globs.size() == 1 ? "y" : "ies", absl::StrJoin(globs, ", "),
      config_.poll_interval_seconds,
      inotify_fd_ >= 0 ? " and on inotify events" : "", config_.settle_seconds,
      seen_.size(),
      seen_.path().empty() ? " (not persisted)" : " in " + seen_.path());
  if (seen_.path().empty()) {
    spdlog::warn(
        "watch: the checkpoints measured are remembered in memory only (no "
        "usable data_dir), so a restart measures every checkpoint still there "
        "again");
  }
  thread_ = std::thread([this] { Run(); });
}

void CheckpointWatcher::Stop() {
  if (!thread_.joinable()) return;
  stopping_ = true;
  if (wake_fds_[1] >= 0) {
    const ssize_t unused = ::write(wake_fds_[1], "x", 1);
    (void)unused;
  }
  thread_.join();
}

void CheckpointWatcher::Run() {
  while (!stopping_) {
    LookOnce(absl::Now());
    absl::Duration wait = absl::Seconds(config_.poll_interval_seconds);
    if (std::optional<absl::Time> due = tracker_.NextDue()) {
      wait = std::min(wait, std::max(*due - absl::Now(), absl::Milliseconds(10)));
    }
    if (!stopping_) Wait(wait);
  }
}

void CheckpointWatcher::Wait(absl::Duration timeout) {
  pollfd fds[2];
  int n = 0;
  if (wake_fds_[0] >= 0) fds[n++] = {wake_fds_[0], POLLIN, 0};
  if (inotify_fd_ >= 0) fds[n++] = {inotify_fd_, POLLIN, 0};
  const int ms = static_cast<int>(
      std::min<int64_t>(absl::ToInt64Milliseconds(timeout), 1 << 30));
  if (::poll(fds, n, std::max(ms, 1)) <= 0 || inotify_fd_ < 0) return;
  // Drain the events; which file changed does not matter, the next look
  // reads the directories again. A removed directory's watch is forgotten.
  alignas(inotify_event) char buffer[16384];
  while (true) {
    const ssize_t got = ::read(inotify_fd_, buffer, sizeof(buffer));
    if (got <= 0) break;
    for (ssize_t at = 0; at < got;) {
      const auto* e = reinterpret_cast<const inotify_event*>(buffer + at);
      if (e->mask & IN_IGNORED) {
        auto it = inotify_dirs_.find(e->wd);
        if (it != inotify_dirs_.end()) {
          inotify_wds_.erase(it->second);
          inotify_dirs_.erase(it);
        }
      }
      at += sizeof(inotify_event) + e->len;
    }
  }
}

void CheckpointWatcher::AddInotify(const std::string& dir) {
  if (inotify_fd_ < 0 || inotify_wds_.contains(dir)) return;
  const int wd = ::inotify_add_watch(inotify_fd_, dir.c_str(), kInotifyMask);
  if (wd < 0) {
    WarnOnce(absl::StrCat("inotify:", dir),
             absl::StrCat("watch: cannot watch ", LogEscape(dir),
                          " with inotify (", std::strerror(errno),
                          "); it is looked at every ",
                          config_.poll_interval_seconds, " s"));
    return;
  }
  inotify_wds_[dir] = wd;
  inotify_dirs_[wd] = dir;
}

void CheckpointWatcher::RemoveInotify(const std::string& dir) {
  auto it = inotify_wds_.find(dir);
  if (it == inotify_wds_.end()) return;
  ::inotify_rm_watch(inotify_fd_, it->second);
  inotify_dirs_.erase(it->second);
  inotify_wds_.erase(it);
}

void CheckpointWatcher::WarnOnce(const std::string& key,
                                 const std::string& text) {
  if (warned_.insert(key).second) spdlog::warn("{}", text);
}

WatchStats CheckpointWatcher::Stats() const {
  WatchStats s;
  s.measured = measured_.load();
  s.failed = failed_total_.load();
  s.pending = pending_.load();
  s.directories = directories_.load();
  s.last_look_seconds = last_look_seconds_.load();
  return s;
}

void CheckpointWatcher::LookOnce(absl::Time now) {
  visited_.clear();
  int64_t directories = 0;
  for (const WatchDirectory& dir : config_.directories) {
    // New watched directories appear in the glob's starting directory.
    if (absl::StatusOr<std::string> prefix =
            policy_.Resolve(GlobStaticPrefix(dir.path));
        prefix.ok()) {
      AddInotify(*prefix);
    }
    glob_t matches;
    const int rc = ::glob(dir.path.c_str(), GLOB_ONLYDIR, nullptr, &matches);
    if (rc == 0) {
      for (size_t i = 0; i < matches.gl_pathc && !stopping_; ++i) {
        const std::string match = matches.gl_pathv[i];
        std::error_code ec;
        if (fs::is_directory(match, ec)) {
          ++directories;
          LookAt(dir, match, now);
        }
      }
    } else if (rc != GLOB_NOMATCH) {
      WarnOnce(absl::StrCat("glob:", dir.path),
               absl::StrCat("watch: cannot expand ", LogEscape(dir.path),
                            " (glob error ", rc, ")"));
    }
    ::globfree(&matches);
  }
  // Checkpoints that went away (a trainer keeps the newest few) stop
  // waiting to settle.
  tracker_.Retain(visited_);
  pending_ = static_cast<int64_t>(visited_.size());
  directories_ = directories;
  last_look_seconds_ = absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch());
}

void CheckpointWatcher::LookAt(const WatchDirectory& dir,
                               const std::string& watched, absl::Time now) {
  std::string reason;
  absl::StatusOr<std::string> real = policy_.Resolve(watched, &reason);
  if (!real.ok()) {
    WarnOnce(watched,
             absl::StrCat("watch: not watching ", LogEscape(watched), ": ",
                          real.status().message(), " (", reason, ")"));
    return;
  }
  const std::string model_id =
      absl::StrReplaceAll(dir.model_id, {{"{dir}", Basename(watched)}});
  if (absl::Status s = ValidateModelId(model_id); !s.ok()) {
    WarnOnce(absl::StrCat("model_id:", watched),
             absl::StrCat("watch: not watching ", LogEscape(watched),
                          ": its model id: ", LogEscape(s.message())));
    return;
  }
  AddInotify(*real);
  std::error_code ec;
  std::vector<std::pair<int64_t, std::string>> checkpoints;
  for (fs::directory_iterator it(*real, ec), end; !ec && it != end;
       it.increment(ec)) {
    const std::string name = it->path().filename().string();
    std::optional<int64_t> step = ParseCheckpointStep(name);
    std::error_code dir_ec;
    if (step.has_value() && it->is_directory(dir_ec)) {
      checkpoints.emplace_back(*step, it->path().string());
    }
  }
  if (ec) {
    WarnOnce(absl::StrCat("list:", *real),
             absl::StrCat("watch: cannot list ", LogEscape(*real), ": ",
                          ec.message()));
    return;
  }
  // Oldest step first, so that the history is in training order.
  std::sort(checkpoints.begin(), checkpoints.end());
  for (const auto& [step, path] : checkpoints) {
    if (stopping_) return;
    Consider(model_id, step, path, now);
  }
}

void CheckpointWatcher::Consider(const std::string& model_id, int64_t step,
                                 const std::string& checkpoint,
                                 absl::Time now) {
  std::string reason;
  absl::StatusOr<std::string> real = policy_.Resolve(checkpoint, &reason);
  if (!real.ok()) {
    WarnOnce(checkpoint,
             absl::StrCat("watch: not reading ", LogEscape(checkpoint), ": ",
                          real.status().message(), " (", reason, ")"));
    return;
  }
  const std::string& key = *real;
  if (done_.contains(key)) return;
  if (seen_.Contains(key)) {
    done_.insert(key);
    spdlog::info("watch: {} was measured before ({}); not measured again",
                 LogEscape(key), seen_.path());
    return;
  }
  if (hooks_.has_step && hooks_.has_step(model_id, step)) {
    done_.insert(key);
    spdlog::info(
        "watch: {}: model {} has a measurement at step {} already; not "
        "measured again",
        LogEscape(key), model_id, step);
    return;
  }
  visited_.insert(key);
  AddInotify(key);
  const CheckpointLook look = LookAtCheckpoint(key);
  if (!look.complete) {
    tracker_.Forget(key);
    spdlog::debug("watch: {} not complete: {}", LogEscape(key), look.incomplete);
    return;
  }
  if (auto f = failed_.find(key); f != failed_.end() && f->second == look.files) {
    return;  // failed with these very files: wait for them to change
  }
  if (!tracker_.Observe(key, look.files, now)) return;

  tracker_.Forget(key);
  rvd::v1::MeasureHeader header;
  header.set_model_id(model_id);
  header.set_step(step);
  absl::StatusOr<rvd::v1::Measurement> m =
      hooks_.measure(key, header, [this] { return stopping_.load(); });
  if (!m.ok()) {
    if (Transient(m.status().code())) {
      // Settled again (settle_seconds) before the next try.
      spdlog::warn("watch: {} not measured now ({}); tried again",
                   LogEscape(key), LogEscape(m.status().ToString()));
    } else {
      failed_[key] = look.files;
      ++failed_total_;
      spdlog::warn(
          "watch: cannot measure {} (model {} step {}): {}; tried again when "
          "its files change",
          LogEscape(key), model_id, step, LogEscape(m.status().ToString()));
    }
    return;
  }
  done_.insert(key);
  failed_.erase(key);
  RemoveInotify(key);
  ++measured_;
  spdlog::info("watch: measured {} as model {} step {} (sequence {})",
               LogEscape(key), model_id, step, m->sequence());
  if (absl::Status s = seen_.Add(key, model_id, step, m->sequence()); !s.ok()) {
    spdlog::warn(
        "watch: {}: cannot record that {} was measured: {}; a restart may "
        "measure it again",
        seen_.path(), LogEscape(key), LogEscape(s.ToString()));
  }
}

}  // namespace rvd

#include "self_improve/ncu/ncu_runner.h"

#include <fcntl.h>
#include <glob.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"

extern char** environ;

namespace rvd::tune {
namespace {

bool IsExecutable(const std::string& path) {
  std::error_code ec;
  return std::filesystem::is_regular_file(path, ec) && access(path.c_str(), X_OK) == 0;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string Tail(const std::string& text, size_t n) {
  return text.size() <= n ? text : absl::StrCat("...", text.substr(text.size() - n));
}

// A temporary directory removed when this goes out of scope.
class TempDir {
 public:
  TempDir() {
    const char* tmp = std::getenv("TMPDIR");
    std::string templ =
        absl::StrCat(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp", "/rvd-ncu-XXXXXX");
    if (mkdtemp(templ.data()) != nullptr) path_ = templ;
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace

absl::StatusOr<std::string> FindNcu(const std::string& explicit_path) {
  if (!explicit_path.empty()) {
    if (IsExecutable(explicit_path)) return explicit_path;
    return absl::NotFoundError(absl::StrCat("ncu: ", explicit_path, " is not an executable file"));
  }
  const char* path = std::getenv("PATH");
  for (absl::string_view dir :
       absl::StrSplit(path != nullptr ? path : "", ':', absl::SkipEmpty())) {
    const std::string candidate = absl::StrCat(dir, "/ncu");
    if (IsExecutable(candidate)) return candidate;
  }
  if (IsExecutable("/usr/local/cuda/bin/ncu")) return std::string("/usr/local/cuda/bin/ncu");
  glob_t g;
  std::vector<std::string> found;
  if (glob("/opt/nvidia/nsight-compute/*/ncu", 0, nullptr, &g) == 0) {
    for (size_t i = 0; i < g.gl_pathc; ++i) found.emplace_back(g.gl_pathv[i]);
  }
  globfree(&g);
  std::sort(found.begin(), found.end());  // version directories: the newest sorts last
  for (auto it = found.rbegin(); it != found.rend(); ++it) {
    if (IsExecutable(*it)) return *it;
  }
  return absl::NotFoundError(
      "ncu: not found on PATH, in /usr/local/cuda/bin or /opt/nvidia/nsight-compute/*/ "
      "(Nsight Compute metrics are left out)");
}

std::vector<std::string> NcuCommandLine(const NcuRunOptions& options, const std::string& ncu_path,
                                        const std::string& log_file,
                                        const std::vector<std::string>& target) {
  std::vector<std::string> argv = {
      ncu_path,
      "--csv",
      "--page",
      "raw",
      "--print-units",
      "base",
      "--metrics",
      absl::StrJoin(options.metrics, ","),
      "--kernel-name",
      options.kernel_name,
      "--launch-skip",
      absl::StrCat(options.launch_skip),
      "--launch-count",
      absl::StrCat(options.launch_count),
      "--cache-control",
      "all",
      "--clock-control",
      "base",
      "--target-processes",
      "all",
      "--log-file",
      log_file,
  };
  argv.insert(argv.end(), target.begin(), target.end());
  return argv;
}

absl::StatusOr<NcuReport> RunNcu(const NcuRunOptions& options,
                                 const std::vector<std::string>& target) {
  if (target.empty()) return absl::InvalidArgumentError("ncu: no target to profile");
  absl::StatusOr<std::string> ncu = FindNcu(options.ncu);
  if (!ncu.ok()) return ncu.status();
  TempDir dir;
  if (dir.path().empty()) {
    return absl::InternalError(absl::StrCat("ncu: mkdtemp: ", std::strerror(errno)));
  }
  const std::string log_file = dir.path() + "/ncu.csv";
  const std::string out_file = dir.path() + "/output.txt";
  const std::vector<std::string> args = NcuCommandLine(options, *ncu, log_file, target);

  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  // The environment with LC_ALL=C: ncu prints numbers in the locale.
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) {
    if (!absl::StartsWith(*e, "LC_ALL=")) env_strings.emplace_back(*e);
  }
  env_strings.emplace_back("LC_ALL=C");
  std::vector<char*> envp;
  for (std::string& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, out_file.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0600);
  posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
  posix_spawnattr_setpgroup(&attr, 0);  // its own group: a timeout kills ncu and the target
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, argv[0], &actions, &attr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) {
    return absl::InternalError(absl::StrCat("ncu: cannot run ", *ncu, ": ", std::strerror(rc)));
  }

  const absl::Time deadline = absl::Now() + options.timeout;
  int status = 0;
  for (;;) {
    const pid_t done = waitpid(pid, &status, WNOHANG);
    if (done == pid) break;
    if (done < 0 && errno != EINTR) {
      return absl::InternalError(absl::StrCat("ncu: waitpid: ", std::strerror(errno)));
    }
    if (absl::Now() >= deadline) {
      kill(-pid, SIGKILL);
      while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
      }
      return absl::DeadlineExceededError(absl::StrCat(
          "ncu: no result within ", absl::FormatDuration(options.timeout), " (killed)"));
    }
    absl::SleepFor(absl::Milliseconds(20));
  }

  const std::string log = ReadFile(log_file);
  const std::string output = ReadFile(out_file);
  absl::StatusOr<NcuReport> report = ParseNcuCsv(log);
  std::vector<std::string> errors;
  if (report.ok()) errors = report->errors;
  for (absl::string_view line : absl::StrSplit(absl::StrCat(log, "\n", output), '\n')) {
    if (absl::ConsumePrefix(&line, "==ERROR==")) {
      std::string e(absl::StripAsciiWhitespace(line));
      if (std::find(errors.begin(), errors.end(), e) == errors.end()) errors.push_back(e);
    }
  }
  for (const std::string& e : errors) {
    if (absl::StrContains(e, "ERR_NVGPUCTRPERM")) {
      return absl::PermissionDeniedError(
          absl::StrCat("ncu: ", e,
                       " (the GPU's performance counters are restricted: run rvd with "
                       "CAP_SYS_ADMIN or set NVreg_RestrictProfilingToAdminUsers=0)"));
    }
  }
  const bool exited_ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  if (!exited_ok) {
    const std::string how = WIFEXITED(status) ? absl::StrCat("exited ", WEXITSTATUS(status))
                                              : absl::StrCat("killed by signal ", WTERMSIG(status));
    return absl::InternalError(absl::StrCat(
        "ncu: ", how, ": ",
        errors.empty() ? Tail(absl::StrCat(log, output), 600) : absl::StrJoin(errors, "; ")));
  }
  return report;
}

}  // namespace rvd::tune

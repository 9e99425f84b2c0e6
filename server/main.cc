// rvd: the daemon. Reads config/rvd.yaml (or --config), applies the flags on
// top, serves until SIGTERM or SIGINT, then shuts down and exits 0.
//
// Signals: SIGTERM and SIGINT stop rvd; in-flight work gets
// Server::kShutdownGrace, then it is cancelled (engine calls stop at their
// next checkpoint, nothing is recorded) and rvd exits. SIGHUP rereads the alert rules file (a bad file is
// logged and refused, the old rules stay); SIGUSR1 logs the daemon's state.
// No work runs in a signal handler:
// the handler writes the signal's number to a pipe that main reads.
// (Blocking the signals and sigwait-ing would not do: threads started before
// main, such as OpenBLAS's, do not inherit the mask, and a signal that finds
// the main thread busy goes to one of them and kills rvd.)
#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <string>
#include <thread>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "server/config.h"
#include "server/log_text.h"
#include "server/server.h"
#include "spdlog/spdlog.h"

namespace {

int signal_pipe[2] = {-1, -1};  // [0]: main reads, [1]: the handler writes

extern "C" void OnSignal(int signal) {
  const int saved = errno;  // async-signal-safe: write(2) only
  const unsigned char number = static_cast<unsigned char>(signal);
  [[maybe_unused]] ssize_t unused = write(signal_pipe[1], &number, 1);
  errno = saved;
}

// Routes `signals` to the pipe; false (errno set) on failure.
bool CatchSignals(std::initializer_list<int> signals) {
  if (pipe2(signal_pipe, O_CLOEXEC) != 0) return false;
  struct sigaction action = {};
  action.sa_handler = OnSignal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  for (int s : signals) {
    if (sigaction(s, &action, nullptr) != 0) return false;
  }
  return true;
}

// The next caught signal.
int WaitForSignal() {
  unsigned char number = 0;
  while (read(signal_pipe[0], &number, 1) != 1) {
    if (errno != EINTR) return SIGTERM;  // the pipe broke: stop cleanly
  }
  return number;
}

// Exits without running destructors: threads still computing hold the
// objects they would destroy.
[[noreturn]] void ExitNow(int code) {
  spdlog::default_logger()->flush();
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(code);
}

}  // namespace

int main(int argc, char** argv) {
  // glibc gives each thread that allocates its own arena (up to 8 per
  // core); with gRPC's threads receiving megabyte chunks, freed memory
  // stays spread over many arenas and RSS grows far past what is in use.
  // Measured with scripts/load_rss.py (64 clients streaming 8 MiB each for
  // 60 s, CPU backend, 2 cores, where glibc's default is 16 arenas): RSS
  // still rising at 1615 MB with 16 arenas (MALLOC_ARENA_MAX=16), level at
  // 930-955 MB with 2 (64 queued requests hold 512 MiB of received bytes,
  // plus the receive-buffer pool's idle buffers); 3368 vs 3730
  // measurements served, p99 2.20 vs 1.60 s.
  // An operator's MALLOC_ARENA_MAX wins (glibc reads it itself).
  if (std::getenv("MALLOC_ARENA_MAX") == nullptr) mallopt(M_ARENA_MAX, 2);
  // Streams arrive in megabyte chunks: keep freed memory mapped instead of
  // returning it to the kernel after each request, since re-faulting the
  // pages cost more CPU than receiving the bytes (perf, 128 MB streams).
  mallopt(M_MMAP_THRESHOLD, 64 << 20);
  mallopt(M_TRIM_THRESHOLD, 256 << 20);

  absl::StatusOr<rvd::CommandLine> command_line =
      rvd::ParseCommandLine(argc, argv);
  if (!command_line.ok()) {
    std::fprintf(stderr, "rvd: %s\n",
                 std::string(command_line.status().message()).c_str());
    return 2;
  }
  if (command_line->exit_now) {
    std::fputs(command_line->text.c_str(), stdout);
    return 0;
  }
  const rvd::Config& config = command_line->config;
  spdlog::set_level(spdlog::level::from_str(config.log_level));

  if (!CatchSignals({SIGTERM, SIGINT, SIGHUP, SIGUSR1})) {
    std::fprintf(stderr, "rvd: cannot install signal handlers: %s\n",
                 std::strerror(errno));
    return 1;
  }

  absl::StatusOr<std::unique_ptr<rvd::Server>> server =
      rvd::Server::Start(config);
  if (!server.ok()) {
    spdlog::error("cannot start: {}", server.status().ToString());
    std::fprintf(stderr, "rvd: cannot start: %s\n",
                 server.status().ToString().c_str());
    return 1;
  }
  int signal = 0;
  while (true) {
    signal = WaitForSignal();
    if (signal == SIGTERM || signal == SIGINT) break;
    if (signal == SIGHUP) {
      absl::StatusOr<size_t> rules = (*server)->ReloadAlertRules();
      if (rules.ok()) {
        spdlog::info("received SIGHUP: alert rules reloaded ({} rules)", *rules);
      } else {
        spdlog::error("received SIGHUP: alert rules NOT reloaded, the old rules "
                      "stay: {}", rvd::LogEscape(rules.status().ToString()));
      }
    } else {
      spdlog::info("received SIGUSR1: {}", (*server)->DescribeState());
    }
  }
  spdlog::info("received {}; finishing in-flight work (up to {} s)",
               strsignal(signal), rvd::Server::kShutdownGrace.count());
  // Shutdown cancels in-flight calls at the grace deadline, and their engine
  // calls stop at the next checkpoint (a tile, a chunk); one that still does
  // not return (a long BLAS or cuSOLVER call) is not waited for. The 2 s
  // past the grace are for that checkpoint and the teardown of gRPC and the
  // metrics server (0.1-0.2 s).
  absl::Notification stopped;
  std::thread stopper([&] {
    (*server)->Shutdown();
    stopped.Notify();
  });
  if (!stopped.WaitForNotificationWithTimeout(
          absl::FromChrono(rvd::Server::kShutdownGrace) + absl::Seconds(2))) {
    spdlog::warn(
        "in-flight work did not finish within the grace period: cancelled; "
        "exiting without it");
    ExitNow(0);
  }
  stopper.join();
  spdlog::info("stopped");
  return 0;
}

// The ncu command line and run, against a fake ncu (a shell script this test
// writes) that records its arguments and environment and answers as ncu
// does: the CSV in --log-file, ERR_NVGPUCTRPERM, a hang, a crash.
#include "self_improve/ncu/ncu_runner.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"

namespace rvd::tune {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Optional;

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

class NcuRunnerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char templ[] = "/tmp/rvd-ncu-test-XXXXXX";
    ASSERT_NE(mkdtemp(templ), nullptr);
    dir_ = templ;
    fake_ = dir_ + "/ncu";
    // Arguments one per line, LC_ALL, then the mode's answer.
    std::ofstream script(fake_);
    script << "#!/bin/sh\n"
           << "printf '%s\\n' \"$@\" > " << dir_ << "/args\n"
           << "echo \"$LC_ALL\" > " << dir_ << "/lc_all\n"
           << "log=''\n"
           << "while [ $# -gt 0 ]; do\n"
           << "  if [ \"$1\" = --log-file ]; then log=$2; fi\n"
           << "  shift\n"
           << "done\n"
           << "echo 'target output on stdout'\n"
           << "case \"$FAKE_NCU_MODE\" in\n"
           << "  ok) cp " << RVD_NCU_TESTDATA << "/raw_metrics.csv \"$log\" ;;\n"
           << "  perm) printf '==PROF== Connected to process 1\\n==ERROR== ERR_NVGPUCTRPERM - "
              "The user does not have permission to access NVIDIA GPU Performance Counters on "
              "the target device 0.\\n' > \"$log\"; exit 1 ;;\n"
           << "  hang) sleep 30 ;;\n"
           << "  crash) echo 'Segmentation fault' >&2; exit 139 ;;\n"
           << "esac\n";
    script.close();
    ASSERT_EQ(chmod(fake_.c_str(), 0755), 0);
  }
  void TearDown() override {
    unsetenv("FAKE_NCU_MODE");
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  NcuRunOptions Options() const {
    NcuRunOptions o;
    o.ncu = fake_;
    o.timeout = absl::Seconds(20);
    return o;
  }

  std::string dir_;
  std::string fake_;
};

TEST_F(NcuRunnerTest, CommandLine) {
  NcuRunOptions o = Options();
  o.metrics = {"a.sum", "b.pct"};
  o.launch_skip = 2;
  o.launch_count = 5;
  EXPECT_THAT(NcuCommandLine(o, "/x/ncu", "/tmp/log.csv", {"/bin/target", "--seed", "7"}),
              ElementsAre("/x/ncu", "--csv", "--page", "raw", "--print-units", "base", "--metrics",
                          "a.sum,b.pct", "--kernel-name", "rvd_tune_candidate", "--launch-skip",
                          "2", "--launch-count", "5", "--cache-control", "all", "--clock-control",
                          "base", "--target-processes", "all", "--log-file", "/tmp/log.csv",
                          "/bin/target", "--seed", "7"));
}

TEST_F(NcuRunnerTest, RunsAndParsesTheLogFile) {
  ASSERT_EQ(setenv("FAKE_NCU_MODE", "ok", 1), 0);
  ASSERT_EQ(setenv("LC_ALL", "de_DE.UTF-8", 1), 0);
  absl::StatusOr<NcuReport> r = RunNcu(Options(), {"/bin/target", "--seed", "7"});
  unsetenv("LC_ALL");
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->launches.size(), 3u);
  absl::StatusOr<NcuMetrics> m = SummarizeLaunches(*r, "rvd_tune_candidate");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_THAT(m->sm_throughput_pct, Optional(92.10));
  EXPECT_EQ(ReadAll(dir_ + "/lc_all"), "C\n");  // ncu prints numbers in the C locale
  const std::vector<std::string> args =
      absl::StrSplit(ReadAll(dir_ + "/args"), '\n', absl::SkipEmpty());
  ASSERT_GE(args.size(), 3u);
  EXPECT_THAT(std::vector<std::string>(args.end() - 3, args.end()),
              ElementsAre("/bin/target", "--seed", "7"));
  EXPECT_EQ(args[6], absl::StrJoin(NcuMetricNames(), ","));
}

TEST_F(NcuRunnerTest, RestrictedCountersArePermissionDenied) {
  ASSERT_EQ(setenv("FAKE_NCU_MODE", "perm", 1), 0);
  absl::StatusOr<NcuReport> r = RunNcu(Options(), {"/bin/target"});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kPermissionDenied) << r.status();
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("ERR_NVGPUCTRPERM"));
}

TEST_F(NcuRunnerTest, HangIsKilledAtTheTimeout) {
  ASSERT_EQ(setenv("FAKE_NCU_MODE", "hang", 1), 0);
  NcuRunOptions o = Options();
  o.timeout = absl::Milliseconds(300);
  const absl::Time start = absl::Now();
  absl::StatusOr<NcuReport> r = RunNcu(o, {"/bin/target"});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded) << r.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));  // the sleep child died with the group
}

TEST_F(NcuRunnerTest, CrashIsInternalWithItsOutput) {
  ASSERT_EQ(setenv("FAKE_NCU_MODE", "crash", 1), 0);
  absl::StatusOr<NcuReport> r = RunNcu(Options(), {"/bin/target"});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInternal) << r.status();
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("exited 139"));
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("Segmentation fault"));
}

TEST_F(NcuRunnerTest, FindNcu) {
  EXPECT_THAT(FindNcu(fake_), ::testing::Eq(absl::StatusOr<std::string>(fake_)));
  EXPECT_EQ(FindNcu(dir_ + "/missing").status().code(), absl::StatusCode::kNotFound);
  const char* old = std::getenv("PATH");
  const std::string saved = old != nullptr ? old : "";
  ASSERT_EQ(setenv("PATH", (dir_ + ":/nonexistent").c_str(), 1), 0);
  absl::StatusOr<std::string> found = FindNcu("");
  ASSERT_EQ(setenv("PATH", saved.c_str(), 1), 0);
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(*found, fake_);
}

}  // namespace
}  // namespace rvd::tune

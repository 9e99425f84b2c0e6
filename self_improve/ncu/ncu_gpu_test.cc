// Real ncu on the GPU host (ctest label gpu; staged and run by
// scripts/gpu_stage.sh and gpu_host_run.sh as cuda_tune_ncu_test): profiles
// the fused kernels of cuda_engine_test (one short test of it) with the
// worker's command line
// and checks that the CSV ncu really prints parses as the samples of
// ncu_csv_test assume: every metric the worker asks for, by name, with a
// number, and NcuMetrics in range. Skipped where ncu is not installed or
// the host hides the performance counters.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <iostream>
#include <string>

#include "self_improve/ncu/ncu_csv.h"
#include "self_improve/ncu/ncu_runner.h"

namespace rvd::tune {
namespace {

void ExpectPercent(const std::optional<double>& v, const char* what) {
  ASSERT_TRUE(v.has_value()) << what;
  EXPECT_GE(*v, 0.0) << what;
  EXPECT_LE(*v, 100.5) << what;  // ncu's percentages can round a little over 100
}

// cuda_engine_test beside this binary in a staged build (RVD_BUILD_DIR,
// scripts/gpu_stage.sh), else where the build put it.
std::string EngineTest() {
  const char* dir = std::getenv("RVD_BUILD_DIR");
  if (dir != nullptr && *dir != '\0') {
    const std::string staged = std::string(dir) + "/bin/cuda_engine_test";
    if (access(staged.c_str(), X_OK) == 0) return staged;
  }
  return RVD_CUDA_ENGINE_TEST;
}

TEST(NcuGpuTest, ProfilesTheFusedKernel) {
  absl::StatusOr<std::string> ncu = FindNcu("");
  if (!ncu.ok()) GTEST_SKIP() << ncu.status();
  NcuRunOptions o;
  o.ncu = *ncu;
  o.kernel_name = "regex:Fused";
  o.launch_skip = 0;
  o.launch_count = 3;
  o.timeout = absl::Seconds(100);  // gpu_host_run.sh gives a test binary 120 s
  const std::string target = EngineTest();
  std::cout << "ncu " << *ncu << " on " << target << "\n";
  absl::StatusOr<NcuReport> r =
      RunNcu(o, {target, "--gtest_filter=CudaEngineTest.FusedIsBitwiseDeterministic"});
  // Hosts that hide the counters (gVisor) cannot run ncu at all.
  if (r.status().code() == absl::StatusCode::kPermissionDenied) GTEST_SKIP() << r.status();
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_FALSE(r->launches.empty()) << "no launch profiled";
  for (const std::string& w : r->warnings) std::cout << "ncu warning: " << w << "\n";
  for (const NcuLaunch& l : r->launches) {
    std::cout << "launch " << l.id << ": " << l.kernel_name << " block " << l.block_size << " grid "
              << l.grid_size << " cc " << l.cc << "\n";
    EXPECT_THAT(l.kernel_name, ::testing::HasSubstr("Fused"));
    for (const std::string& name : NcuMetricNames()) {
      const NcuMetric* m = l.Find(name);
      ASSERT_NE(m, nullptr) << name << " missing from the raw page";
      EXPECT_TRUE(m->value.has_value()) << name << " = \"" << m->text << "\" " << m->unit;
      std::cout << "  " << name << " = " << m->text << " " << m->unit << "\n";
    }
    const NcuMetrics n = ToNcuMetrics(l);
    ExpectPercent(n.sm_throughput_pct, "sm_throughput_pct");
    ExpectPercent(n.sm_active_cycles_pct, "sm_active_cycles_pct");
    ExpectPercent(n.dram_throughput_pct, "dram_throughput_pct");
    ExpectPercent(n.l2_hit_rate_pct, "l2_hit_rate_pct");
    ExpectPercent(n.l1_hit_rate_pct, "l1_hit_rate_pct");
    ExpectPercent(n.achieved_occupancy_pct, "achieved_occupancy_pct");
    ExpectPercent(n.memory_stall_pct, "memory_stall_pct");
    ASSERT_TRUE(n.registers_per_thread.has_value());
    EXPECT_GT(*n.registers_per_thread, 0);
    const NcuMetric* t = l.Find("gpu__time_duration.sum");
    ASSERT_NE(t, nullptr);
    ASSERT_TRUE(t->BaseValue().has_value());
    EXPECT_GT(*t->BaseValue(), 0.0);
    EXPECT_LT(*t->BaseValue(), 1.0);  // seconds: a kernel of this test is far below 1 s
  }
}

}  // namespace
}  // namespace rvd::tune

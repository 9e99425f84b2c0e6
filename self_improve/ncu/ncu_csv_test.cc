// ncu's CSV by column name: the details page with its sections' labels and
// rule rows, the raw page with its units row and shuffled columns, profiler
// and application lines around the table, and the worker's metrics from
// both. The samples in testdata/ follow ncu's documented layouts (no ncu
// here): details_sections.csv is `ncu --csv --section SpeedOfLight
// --section LaunchStats --section Occupancy --section MemoryWorkloadAnalysis`
// (two launches of the candidate, one of another kernel); raw_metrics.csv is
// `ncu --csv --page raw --print-units base --metrics ...` (three launches).
#include "self_improve/ncu/ncu_csv.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

namespace rvd::tune {
namespace {

using ::testing::DoubleNear;
using ::testing::HasSubstr;
using ::testing::Optional;

std::string Sample(const std::string& name) {
  std::ifstream in(std::string(RVD_NCU_TESTDATA) + "/" + name, std::ios::binary);
  EXPECT_TRUE(in.good()) << name;
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(NcuCsvTest, DetailsPageBySectionLabels) {
  absl::StatusOr<NcuReport> r = ParseNcuCsv(Sample("details_sections.csv"));
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->launches.size(), 3u);
  EXPECT_EQ(r->warnings.size(), 1u);
  EXPECT_TRUE(r->errors.empty());
  EXPECT_EQ(r->skipped_lines, 2);  // the target's two lines of output

  const NcuLaunch& first = r->launches[0];
  EXPECT_EQ(first.id, 1);
  EXPECT_EQ(first.kernel_name, "rvd_tune_candidate");
  EXPECT_EQ(first.block_size, "(256, 1, 1)");
  EXPECT_EQ(first.cc, "9.0");
  EXPECT_EQ(first.metrics.size(), 22u);  // the rule rows carry no metric
  const NcuMetric* duration = first.Find("Duration");
  ASSERT_NE(duration, nullptr);
  EXPECT_EQ(duration->section, "GPU Speed Of Light Throughput");
  EXPECT_EQ(duration->unit, "usecond");
  EXPECT_THAT(duration->value, Optional(131.30));
  EXPECT_THAT(duration->BaseValue(), Optional(DoubleNear(131.30e-6, 1e-15)));
  const NcuMetric* threads = first.Find("Threads");
  ASSERT_NE(threads, nullptr);
  EXPECT_THAT(threads->value, Optional(33792.0));           // thousands separator
  EXPECT_THAT(first.Find("Memory Throughput")->unit, "%");  // the first of a repeated label
  EXPECT_EQ(r->launches[2].Find("SM Active Cycles")->value, std::nullopt);  // "n/a"
  EXPECT_EQ(r->launches[2].Find("SM Active Cycles")->text, "n/a");

  const NcuMetrics m = ToNcuMetrics(first);
  EXPECT_THAT(m.dram_throughput_pct, Optional(86.52));
  EXPECT_THAT(m.sm_throughput_pct, Optional(40.10));
  EXPECT_THAT(m.achieved_occupancy_pct, Optional(47.80));
  EXPECT_THAT(m.l2_hit_rate_pct, Optional(12.50));
  EXPECT_THAT(m.l1_hit_rate_pct, Optional(0.0));
  EXPECT_THAT(m.registers_per_thread, Optional(96.0));
  EXPECT_THAT(m.sm_active_cycles_pct, Optional(DoubleNear(100.0 * 1802311.25 / 2101112, 1e-9)));
  EXPECT_EQ(m.memory_stall_pct, std::nullopt);  // the sections print no stall breakdown
}

TEST(NcuCsvTest, SummaryIsTheMedianOfTheCandidatesLaunches) {
  absl::StatusOr<NcuReport> r = ParseNcuCsv(Sample("details_sections.csv"));
  ASSERT_TRUE(r.ok()) << r.status();
  absl::StatusOr<NcuMetrics> m = SummarizeLaunches(*r, "rvd_tune_candidate");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_THAT(m->dram_throughput_pct, Optional(DoubleNear((86.52 + 88.00) / 2, 1e-12)));
  EXPECT_THAT(m->l2_hit_rate_pct, Optional(DoubleNear((12.50 + 13.10) / 2, 1e-12)));
  // The finalize kernel's launch (L2 hit 90%) is not the candidate's.
  absl::StatusOr<NcuMetrics> fin = SummarizeLaunches(*r, "rvd::cuda::FinalizeKernel<float>");
  ASSERT_TRUE(fin.ok()) << fin.status();
  EXPECT_THAT(fin->l2_hit_rate_pct, Optional(90.0));
  EXPECT_TRUE(SummarizeLaunches(*r, "FinalizeKernel").ok());  // namespaces and templates
  EXPECT_FALSE(SummarizeLaunches(*r, "Kernel").ok());
  EXPECT_FALSE(SummarizeLaunches(*r, "float").ok());
  absl::StatusOr<NcuMetrics> none = SummarizeLaunches(*r, "rvd_tune");
  EXPECT_EQ(none.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(none.status().message()), HasSubstr("rvd_tune_candidate"));
}

TEST(NcuCsvTest, RawPageWithUnitsRowAndShuffledColumns) {
  absl::StatusOr<NcuReport> r = ParseNcuCsv(Sample("raw_metrics.csv"));
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->launches.size(), 3u);
  const NcuLaunch& l = r->launches[0];
  EXPECT_EQ(l.id, 0);
  EXPECT_EQ(l.kernel_name, "rvd_tune_candidate");
  EXPECT_EQ(l.block_size, "(384, 1, 1)");
  EXPECT_EQ(l.metrics.size(), NcuMetricNames().size());  // every metric, no launch column
  const NcuMetric* t = l.Find("gpu__time_duration.sum");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->unit, "nsecond");
  EXPECT_EQ(t->section, "");
  EXPECT_THAT(t->BaseValue(), Optional(DoubleNear(412160e-9, 1e-15)));
  for (const std::string& name : NcuMetricNames()) {
    EXPECT_NE(l.Find(name), nullptr) << name;  // the metrics the runner asks for
  }

  absl::StatusOr<NcuMetrics> m = SummarizeLaunches(*r, "rvd_tune_candidate");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_THAT(m->sm_throughput_pct, Optional(92.10));
  EXPECT_THAT(m->dram_throughput_pct, Optional(23.80));
  EXPECT_THAT(m->l2_hit_rate_pct, Optional(71.10));
  EXPECT_THAT(m->achieved_occupancy_pct, Optional(12.50));
  EXPECT_THAT(m->registers_per_thread, Optional(168.0));
  EXPECT_THAT(m->memory_stall_pct, Optional(DoubleNear(25.0, 1e-12)));  // 6/24, 8/25, 7/28
  EXPECT_THAT(m->sm_active_cycles_pct, Optional(DoubleNear(100.0 * 605000 / 650000, 1e-9)));
}

// The same launch in two column orders reads the same.
TEST(NcuCsvTest, ColumnOrderDoesNotMatter) {
  const std::string a =
      "\"ID\",\"Kernel Name\",\"Section Name\",\"Metric Name\",\"Metric Unit\",\"Metric Value\"\n"
      "\"0\",\"k\",\"Command line profiler metrics\",\"dram__throughput.avg.pct_of_peak_"
      "sustained_elapsed\",\"%\",\"81.5\"\n";
  const std::string b =
      "\"Metric Value\",\"Metric Unit\",\"Metric Name\",\"Kernel Name\",\"Stream\",\"ID\"\n"
      "\"81.5\",\"%\",\"dram__throughput.avg.pct_of_peak_sustained_elapsed\",\"k\",\"7\",\"0\"\n";
  for (const std::string& text : {a, b}) {
    absl::StatusOr<NcuReport> r = ParseNcuCsv(text);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(r->launches.size(), 1u);
    EXPECT_EQ(r->launches[0].kernel_name, "k");
    EXPECT_THAT(ToNcuMetrics(r->launches[0]).dram_throughput_pct, Optional(81.5));
  }
}

TEST(NcuCsvTest, QuotedCommasAndEscapedQuotes) {
  const std::string text =
      "\"ID\",\"Kernel Name\",\"Metric Name\",\"Metric Unit\",\"Metric Value\"\n"
      "\"3\",\"void k<256, 1>(const float *, \"\"x\"\")\",\"Threads\",\"thread\",\"1,024\"\n";
  absl::StatusOr<NcuReport> r = ParseNcuCsv(text);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->launches.size(), 1u);
  EXPECT_EQ(r->launches[0].kernel_name, "void k<256, 1>(const float *, \"x\")");
  EXPECT_THAT(r->launches[0].Find("Threads")->value, Optional(1024.0));
  EXPECT_TRUE(SummarizeLaunches(*r, "k").ok());
}

TEST(NcuCsvTest, NoTableQuotesNcusErrors) {
  const std::string text =
      "==PROF== Connected to process 99\n"
      "==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU "
      "Performance Counters on the target device 0.\n"
      "==PROF== Disconnected from process 99\n";
  absl::StatusOr<NcuReport> r = ParseNcuCsv(text);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("ERR_NVGPUCTRPERM"));
  EXPECT_EQ(ParseNcuCsv("").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(NcuCsvTest, DetailsHeaderWithoutValuesIsRefused) {
  absl::StatusOr<NcuReport> r = ParseNcuCsv("\"ID\",\"Kernel Name\",\"Metric Name\"\n");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(NcuCsvTest, NoKernelsProfiled) {
  absl::StatusOr<NcuReport> r = ParseNcuCsv(
      "\"ID\",\"Kernel Name\",\"Metric Name\",\"Metric Unit\",\"Metric Value\"\n"
      "==WARNING== No kernels were profiled.\n");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->launches.empty());
  EXPECT_THAT(r->warnings, ::testing::ElementsAre("No kernels were profiled."));
  EXPECT_EQ(SummarizeLaunches(*r, "rvd_tune_candidate").status().code(),
            absl::StatusCode::kNotFound);
}

TEST(NcuCsvTest, BaseUnits) {
  auto base = [](const std::string& unit, double v) {
    NcuMetric m;
    m.unit = unit;
    m.value = v;
    return *m.BaseValue();
  };
  EXPECT_DOUBLE_EQ(base("msecond", 2), 2e-3);
  EXPECT_DOUBLE_EQ(base("second", 2), 2);
  EXPECT_DOUBLE_EQ(base("Kbyte", 2), 2e3);
  EXPECT_DOUBLE_EQ(base("Gbyte/second", 3), 3e9);
  EXPECT_DOUBLE_EQ(base("Tbyte/second", 3.86), 3.86e12);
  EXPECT_DOUBLE_EQ(base("cycle/nsecond", 1.5), 1.5e9);
  EXPECT_DOUBLE_EQ(base("%", 50), 50);
  EXPECT_DOUBLE_EQ(base("register/thread", 96), 96);
  EXPECT_DOUBLE_EQ(base("Mcycle", 2), 2e6);
  // The short names of newer versions.
  EXPECT_DOUBLE_EQ(base("ns", 373952), 373952e-9);
  EXPECT_DOUBLE_EQ(base("us", 2), 2e-6);
  EXPECT_DOUBLE_EQ(base("ms", 2), 2e-3);
  EXPECT_DOUBLE_EQ(base("s", 2), 2);
  EXPECT_DOUBLE_EQ(base("KB", 2), 2e3);
  EXPECT_DOUBLE_EQ(base("TB/s", 3.86), 3.86e12);
  EXPECT_DOUBLE_EQ(base("GHz", 1.98), 1.98e9);
  EXPECT_DOUBLE_EQ(base("cycle/ns", 1.5), 1.5e9);
  EXPECT_DOUBLE_EQ(base("byte/block", 7), 7);
}

// A real capture: the project's own H200 run s4-14 (ncu's raw page of
// rvd_bench_gpu --ncu, bench/h200/s4-14_ncu_shared.csv at commit 11f729e),
// cut to the launch columns and six of its 310 metrics, rows and quoting as
// ncu printed them: short units ("ns"), demangled names without namespaces.
TEST(NcuCsvTest, RealH200RawPage) {
  absl::StatusOr<NcuReport> r = ParseNcuCsv(Sample("h200_raw_excerpt.csv"));
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->launches.size(), 10u);
  EXPECT_THAT(r->warnings, ::testing::SizeIs(1));
  EXPECT_EQ(r->skipped_lines, 4);  // the benchmark's own lines before the table
  const NcuLaunch& l = r->launches[0];
  EXPECT_EQ(l.id, 0);
  EXPECT_EQ(l.kernel_name,
            "void FusedV4Kernel<float, 0>(const CUtensorMap_st *, const MatrixDesc *, const "
            "FusedJobV2 *, int, double *, double *, float *)");
  EXPECT_EQ(l.block_size, "(512, 1, 1)");
  EXPECT_EQ(l.cc, "9.0");
  EXPECT_EQ(l.metrics.size(), 6u);
  EXPECT_THAT(l.Find("gpu__time_duration.sum")->BaseValue(),
              Optional(DoubleNear(373952e-9, 1e-15)));
  EXPECT_THAT(l.Find("sm__cycles_elapsed.avg")->value, Optional(637468.48));
  EXPECT_THAT(ToNcuMetrics(l).registers_per_thread, Optional(128.0));
  EXPECT_EQ(ToNcuMetrics(l).dram_throughput_pct, std::nullopt);  // not collected in that run
  // Every launch is FusedV4Kernel's, whatever its template arguments.
  absl::StatusOr<NcuMetrics> m = SummarizeLaunches(*r, "FusedV4Kernel");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_THAT(m->registers_per_thread, Optional(168.0));  // 2 launches of 128, 8 of 168
}

}  // namespace
}  // namespace rvd::tune

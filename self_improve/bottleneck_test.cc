#include "gtest/gtest.h"
#include "self_improve/profile.h"

namespace rvd::tune {
namespace {

// 480 x 128x4096 bf16 on an H200-like device: 503 MB read, 32 Gflop.
KernelProfile Base(double seconds) {
  KernelProfile p;
  p.seconds = seconds;
  p.bytes = 480.0 * 128 * 4096 * 2;
  p.flops = 480.0 * 2 * 128 * 128 * 4096;
  p.peak_bytes_per_second = 4.0e12;
  p.peak_flops_per_second = 700e12;
  return p;
}

TEST(BottleneckTest, Names) {
  EXPECT_STREQ(BottleneckName(Bottleneck::kCompute), "compute");
  EXPECT_STREQ(BottleneckName(Bottleneck::kMemoryBandwidth), "memory_bandwidth");
  EXPECT_STREQ(BottleneckName(Bottleneck::kMemoryLatency), "memory_latency");
  EXPECT_STREQ(BottleneckName(Bottleneck::kOccupancy), "occupancy");
  EXPECT_STREQ(BottleneckName(Bottleneck::kMixed), "mixed");
}

TEST(BottleneckTest, NoTimingIsUnknown) {
  EXPECT_EQ(ClassifyBottleneck(KernelProfile{}).bottleneck, Bottleneck::kUnknown);
}

TEST(BottleneckTest, NearTheBandwidthRoofBelowTheRidge) {
  // 503 MB in 0.14 ms: 3.6 TB/s, 90% of 4 TB/s; intensity 64 < 175.
  BottleneckReport r = ClassifyBottleneck(Base(0.14e-3));
  EXPECT_EQ(r.bottleneck, Bottleneck::kMemoryBandwidth);
  ASSERT_FALSE(r.signals.empty());
  EXPECT_NE(r.signals[0].find("DRAM"), std::string::npos) << r.signals[0];
}

TEST(BottleneckTest, NcuDramAboveEightyPercent) {
  KernelProfile p = Base(1e-3);  // 12% of the roofline bandwidth
  p.ncu.dram_throughput_pct = 85;
  EXPECT_EQ(ClassifyBottleneck(p).bottleneck, Bottleneck::kMemoryBandwidth);
  p.ncu.dram_throughput_pct = 79;
  EXPECT_NE(ClassifyBottleneck(p).bottleneck, Bottleneck::kMemoryBandwidth);
}

TEST(BottleneckTest, ComputeFromSmActivity) {
  KernelProfile p = Base(1e-3);
  p.ncu.sm_active_cycles_pct = 95;
  p.ncu.dram_throughput_pct = 20;
  p.ncu.achieved_occupancy_pct = 60;
  EXPECT_EQ(ClassifyBottleneck(p).bottleneck, Bottleneck::kCompute);
  p.ncu.sm_active_cycles_pct = 90;  // not above 90
  EXPECT_NE(ClassifyBottleneck(p).bottleneck, Bottleneck::kCompute);
}

TEST(BottleneckTest, ComputeFromTheFlopRoof) {
  KernelProfile p = Base(1e-3);
  p.flops = 0.85 * 700e12 * 1e-3;
  p.bytes = 1e6;  // intensity far above the ridge: DRAM is not the limit
  EXPECT_EQ(ClassifyBottleneck(p).bottleneck, Bottleneck::kCompute);
}

TEST(BottleneckTest, LatencyFromMissesAndStalls) {
  KernelProfile p = Base(1e-3);
  p.ncu.dram_throughput_pct = 30;
  p.ncu.l2_hit_rate_pct = 40;  // 60% misses
  p.ncu.memory_stall_pct = 70;
  p.ncu.achieved_occupancy_pct = 80;
  EXPECT_EQ(ClassifyBottleneck(p).bottleneck, Bottleneck::kMemoryLatency);
  p.ncu.memory_stall_pct = 40;  // misses without stalls: not latency
  EXPECT_NE(ClassifyBottleneck(p).bottleneck, Bottleneck::kMemoryLatency);
}

TEST(BottleneckTest, OccupancyBelowHalf) {
  KernelProfile p = Base(1e-3);
  p.ncu.dram_throughput_pct = 30;
  p.ncu.achieved_occupancy_pct = 25;
  BottleneckReport r = ClassifyBottleneck(p);
  EXPECT_EQ(r.bottleneck, Bottleneck::kOccupancy);
  ASSERT_EQ(r.signals.size(), 1u);
  EXPECT_NE(r.signals[0].find("25.0%"), std::string::npos) << r.signals[0];
}

TEST(BottleneckTest, TwoSignalsAreMixed) {
  KernelProfile p = Base(0.14e-3);  // bandwidth-bound
  p.ncu.achieved_occupancy_pct = 25;
  BottleneckReport r = ClassifyBottleneck(p);
  EXPECT_EQ(r.bottleneck, Bottleneck::kMixed);
  EXPECT_EQ(r.signals.size(), 2u);
}

TEST(BottleneckTest, BothRoofsFarWithoutNcuIsLatency) {
  // The naive kernel: 10 ms, 1.3% of bandwidth, 0.5% of flops.
  EXPECT_EQ(ClassifyBottleneck(Base(10e-3)).bottleneck, Bottleneck::kMemoryLatency);
  // 60% of bandwidth and nothing else: no class is guessed.
  EXPECT_EQ(ClassifyBottleneck(Base(0.21e-3)).bottleneck, Bottleneck::kUnknown);
}

}  // namespace
}  // namespace rvd::tune

// The kernel registry (no GPU needed): product entries for every (dtype,
// shape class), swaps that bump the generation without changing a snapshot
// in use, and concurrent readers that never see a torn table.
#include "kernels/cuda/kernel_registry.h"

#include <atomic>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace rvd::cuda {
namespace {

constexpr DType kDtypes[] = {DType::kF32, DType::kF16, DType::kBF16};
constexpr FusedKernel kClasses[] = {FusedKernel::kV4, FusedKernel::kV4Triangle,
                                    FusedKernel::kV3, FusedKernel::kV1Tall};

TEST(KernelRegistry, ProductEntriesNameTheirTechniqueAndPolicy) {
  KernelRegistry r(9, 0);
  auto t = r.Snapshot();
  EXPECT_EQ(t->generation(), 0u);
  for (DType dt : kDtypes) {
    for (FusedKernel k : kClasses) {
      const KernelEntry& e = t->Find(dt, k);
      EXPECT_EQ(e.technique, FusedTechnique(k, dt));
      EXPECT_EQ(e.policy, FusedPolicyOf(k).name);
      EXPECT_EQ(e.launchers.v1, &LaunchFused);
      EXPECT_EQ(e.launchers.v4, &LaunchFusedV4);
    }
  }
  EXPECT_EQ(t->Find(DType::kF32, FusedKernel::kV3).technique, "mma-sync-3xtf32-wide");
  EXPECT_EQ(t->Find(DType::kBF16, FusedKernel::kV3).technique, "mma-sync-wide");
}

cudaError_t FakeV4(DType, const FusedV4Launch&, cudaStream_t) { return cudaErrorNotSupported; }

TEST(KernelRegistry, SwapBumpsTheGenerationAndLeavesSnapshotsAlone) {
  KernelRegistry r(9, 0);
  auto before = r.Snapshot();
  KernelEntry e;
  e.technique = "candidate-7";
  e.policy = "bt64";
  e.launchers.v4 = &FakeV4;
  EXPECT_EQ(r.Swap(DType::kBF16, FusedKernel::kV4, e), 1u);
  auto after = r.Snapshot();
  EXPECT_EQ(after->generation(), 1u);
  EXPECT_EQ(after->Find(DType::kBF16, FusedKernel::kV4).technique, "candidate-7");
  EXPECT_EQ(after->Find(DType::kBF16, FusedKernel::kV4).launchers.v4, &FakeV4);
  EXPECT_EQ(after->Find(DType::kBF16, FusedKernel::kV4).generation, 1u);
  // Other entries and the earlier snapshot are unchanged.
  EXPECT_EQ(after->Find(DType::kF16, FusedKernel::kV4).technique, "tma-wgmma-square");
  EXPECT_EQ(before->generation(), 0u);
  EXPECT_EQ(before->Find(DType::kBF16, FusedKernel::kV4).technique, "tma-wgmma-square");
  EXPECT_EQ(r.Reset(), 2u);
  EXPECT_EQ(r.Snapshot()->Find(DType::kBF16, FusedKernel::kV4).technique, "tma-wgmma-square");
}

// Readers take snapshots while a writer swaps one entry back and forth;
// every snapshot is whole: its entry matches its generation's parity.
TEST(KernelRegistry, ConcurrentReadersSeeWholeTables) {
  KernelRegistry r(9, 0);
  std::atomic<bool> stop{false};
  std::atomic<int64_t> torn{0}, reads{0};
  std::vector<std::thread> readers;
  for (int i = 0; i < 4; ++i) {
    readers.emplace_back([&] {
      while (!stop) {
        auto t = r.Snapshot();
        const bool candidate = t->Find(DType::kBF16, FusedKernel::kV4).technique == "candidate";
        if (candidate != (t->generation() % 2 == 1)) ++torn;
        ++reads;
      }
    });
  }
  KernelEntry c;
  c.technique = "candidate";
  for (int i = 0; i < 2000; ++i) {
    if (i % 2 == 0) {
      r.Swap(DType::kBF16, FusedKernel::kV4, c);
    } else {
      r.Swap(DType::kBF16, FusedKernel::kV4, KernelRegistry(9, 0).Snapshot()->Find(
                                                  DType::kBF16, FusedKernel::kV4));
    }
  }
  stop = true;
  for (auto& t : readers) t.join();
  EXPECT_EQ(torn, 0);
  EXPECT_GT(reads, 0);
}

}  // namespace
}  // namespace rvd::cuda

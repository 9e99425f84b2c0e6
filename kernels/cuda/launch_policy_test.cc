// Host-side planning of the CUDA engine (no GPU needed): the fused kernel's
// job enumeration and warp tiling must cover each Gram exactly once with the
// right weights; grouping and chunking must keep every matrix.
#include "kernels/cuda/launch_policy.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace rvd::cuda {
namespace {

TEST(LaunchPolicy, JobsCoverUpperTriangleOnce) {
  const std::vector<int64_t> sides = {1, 128, 129, 1024, 300};
  std::vector<FusedJob> jobs;
  std::vector<int32_t> begin;
  EnumerateFusedJobs(sides, 128, &jobs, &begin);
  ASSERT_EQ(begin.size(), sides.size() + 1);
  const std::vector<int> expect = {1, 1, 3, 36, 6};
  for (size_t m = 0; m < sides.size(); ++m) {
    EXPECT_EQ(begin[m + 1] - begin[m], expect[m]) << "matrix " << m;
    std::set<std::pair<int, int>> seen;
    for (int j = begin[m]; j < begin[m + 1]; ++j) {
      EXPECT_EQ(jobs[j].matrix, static_cast<int32_t>(m));
      EXPECT_LE(jobs[j].ti, jobs[j].tj);
      EXPECT_EQ(jobs[j].diagonal, jobs[j].ti == jobs[j].tj ? 1 : 0);
      EXPECT_TRUE(seen.insert({jobs[j].ti, jobs[j].tj}).second);
    }
  }
  EXPECT_EQ(begin.back(), static_cast<int32_t>(jobs.size()));
}

TEST(LaunchPolicy, GroupByShapeKeepsOrder) {
  float x[4];
  std::vector<MatrixView> b = {
      {x, 2, 3, 3, DType::kF32}, {x, 2, 3, 4, DType::kF32},
      {x, 2, 3, 3, DType::kF32}, {x, 2, 3, 3, DType::kBF16},
      {x, 2, 3, 3, DType::kF32}};
  const std::vector<ShapeGroup> g = GroupByShape(b);
  ASSERT_EQ(g.size(), 3u);
  EXPECT_EQ(g[0].members, (std::vector<size_t>{0, 2, 4}));
  EXPECT_EQ(g[1].members, (std::vector<size_t>{1}));
  EXPECT_EQ(g[2].members, (std::vector<size_t>{3}));
}

TEST(LaunchPolicy, ChunkByBytes) {
  EXPECT_EQ(ChunkByBytes(std::vector<uint64_t>{}, 10), (std::vector<size_t>{0}));
  EXPECT_EQ(ChunkByBytes(std::vector<uint64_t>{4, 4, 4, 4}, 8),
            (std::vector<size_t>{0, 2, 4}));
  // An item over the budget gets a chunk of its own.
  EXPECT_EQ(ChunkByBytes(std::vector<uint64_t>{1, 20, 1, 1}, 8),
            (std::vector<size_t>{0, 1, 2, 4}));
  EXPECT_EQ(ChunkByBytes(std::vector<uint64_t>{3, 3, 3}, 100),
            (std::vector<size_t>{0, 3}));
}

TEST(LaunchPolicy, PackedRowsAre16ByteAligned) {
  int64_t ld = 0;
  EXPECT_EQ(PackedBytes({nullptr, 2, 4097, 4097, DType::kBF16}, &ld), 16640u);
  EXPECT_EQ(ld, 4104);
  EXPECT_EQ(PackedBytes({nullptr, 1, 1, 1, DType::kF32}, &ld), 256u);
  EXPECT_EQ(ld, 4);
  EXPECT_EQ(PackedBytes({nullptr, 128, 4096, 4096, DType::kF32}, &ld),
            128u * 4096 * 4);
  EXPECT_EQ(ld, 4096);
}

TEST(LaunchPolicy, VersionNamesTheKernel) {
  const std::string v = KernelVersion(9, 0);
  EXPECT_NE(v.find("cuda/sm90"), std::string::npos) << v;
  for (const char* t : {"tma-wgmma-square", "tma-wgmma-triangle", "mma-sync-wide", "wmma-tall"}) {
    EXPECT_NE(v.find(t), std::string::npos) << v;
    EXPECT_EQ(KernelPolicies(9, 0).count(t), 1u) << t;
  }
  // v4 is sm_90a code: other devices get v3.
  const std::string a100 = KernelVersion(8, 0);
  EXPECT_NE(a100.find("cuda/sm80"), std::string::npos) << a100;
  EXPECT_EQ(a100.find("tma-wgmma"), std::string::npos) << a100;
  EXPECT_EQ(KernelPolicies(8, 0).count("tma-wgmma-square"), 0u);
  EXPECT_FALSE(FusedV4Runs(10, 0));
  EXPECT_TRUE(FusedV4Runs(9, 0));
}

// One choice of fused kernel for the engine, the bench and v4's tensor-map
// encoder.
TEST(LaunchPolicy, ChooseFusedKernel) {
  using K = FusedKernel;
  for (DType dt : {DType::kF32, DType::kF16, DType::kBF16}) {
    EXPECT_EQ(ChooseFusedKernel(9, 0, dt, 4096, 128, true), K::kV1Tall);
    // 16-bit Grams of side <= 128: v4's triangle.
    EXPECT_EQ(ChooseFusedKernel(9, 0, dt, 128, 4096, true),
              dt == DType::kF32 ? K::kV4 : K::kV4Triangle);
    EXPECT_EQ(ChooseFusedKernel(9, 0, dt, 128, 4096, false), K::kV3);  // TMA needs alignment
    EXPECT_EQ(ChooseFusedKernel(8, 0, dt, 128, 4096, true), K::kV3);   // no sm_90a code
    EXPECT_EQ(ChooseFusedKernel(10, 0, dt, 128, 4096, true), K::kV3);
  }
  // f32 on v4 at any Gram side: up to 128 its diagonal jobs, beyond as
  // paired tiles (a launch of their own); the policy's f32_pairs is what
  // sends them there (0: v3, as before).
  ASSERT_EQ(kFusedPolicyV4Sm90.f32_pairs, 1);
  EXPECT_EQ(ChooseFusedKernel(9, 0, DType::kF32, 129, 4096, true), K::kV4);
  EXPECT_EQ(ChooseFusedKernel(9, 0, DType::kF32, 1024, 4096, true), K::kV4);
  EXPECT_EQ(ChooseFusedKernel(9, 0, DType::kF32, 1024, 4096, false), K::kV3);
  EXPECT_FALSE(FusedV4Pairs(K::kV4, DType::kF32, 128));
  EXPECT_TRUE(FusedV4Pairs(K::kV4, DType::kF32, 129));
  EXPECT_FALSE(FusedV4Pairs(K::kV4, DType::kBF16, 1024));
  EXPECT_FALSE(FusedV4Pairs(K::kV3, DType::kF32, 1024));
  EXPECT_FALSE(FusedV4FinishesMatrix(K::kV4, 129));
  // Tall 16-bit W of Gram side <= 128 fit v4's triangle (MN-major tiles),
  // which serves them only with its policy's `tall` (off, unmeasured).
  EXPECT_TRUE(FusedV4TallRuns(DType::kBF16, 4096, 128, true));
  EXPECT_TRUE(FusedV4TallRuns(DType::kF16, 3001, 100, true));
  EXPECT_FALSE(FusedV4TallRuns(DType::kF32, 4096, 128, true));
  EXPECT_FALSE(FusedV4TallRuns(DType::kBF16, 4096, 129, true));
  EXPECT_FALSE(FusedV4TallRuns(DType::kBF16, 4096, 128, false));
  EXPECT_FALSE(FusedV4TallRuns(DType::kBF16, 128, 4096, true));
  EXPECT_EQ(ChooseFusedKernel(9, 0, DType::kBF16, 4096, 128, true),
            kFusedPolicyV4TriangleSm90.tall != 0 ? K::kV4Triangle : K::kV1Tall);
  EXPECT_EQ(ChooseFusedKernel(8, 0, DType::kBF16, 4096, 128, true), K::kV1Tall);
  EXPECT_EQ(ChooseFusedKernel(9, 0, DType::kBF16, 1024, 4096, true), K::kV4);
  EXPECT_EQ(ChooseFusedKernel(9, 0, DType::kBF16, 129, 4096, true), K::kV4);
  EXPECT_EQ(ChooseFusedKernel(9, 0, DType::kF16, 1, 512, true), K::kV4Triangle);
  EXPECT_STREQ(FusedPolicyOf(K::kV4).name, kFusedPolicyV4Sm90.name);
  EXPECT_STREQ(FusedPolicyOf(K::kV4Triangle).name, kFusedPolicyV4TriangleSm90.name);
  EXPECT_TRUE(IsFusedV4(K::kV4) && IsFusedV4(K::kV4Triangle));
  EXPECT_FALSE(IsFusedV4(K::kV3) || IsFusedV4(K::kV1Tall));
  EXPECT_STREQ(FusedPolicyOf(K::kV3).name, kFusedPolicyV3Sm90.name);
  EXPECT_STREQ(FusedPolicyOf(K::kV1Tall).name, kFusedPolicySm90.name);
  // Cut pieces: f32 only (16-bit launches were slower cut, session 8).
  EXPECT_GT(FusedV4TailPieces(K::kV4, DType::kF32), 1);
  EXPECT_EQ(FusedV4TailPieces(K::kV4, DType::kBF16), 1);
  EXPECT_EQ(FusedV4TailPieces(K::kV4Triangle, DType::kF16), 1);
}

// v4 jobs: whole 128 x 128 tiles, diagonal ones weight 1 over their square,
// off-diagonal ones weight 2: every Gram entry counted once (with i <-> j).
TEST(LaunchPolicy, V4JobsWeightEveryGramEntryOnce) {
  const LaunchPolicy& p = kFusedPolicyV4Sm90;
  for (int64_t side : {1, 7, 127, 128, 129, 300, 1024}) {
    std::vector<FusedJobV2> jobs;
    AppendFusedJobsV2(0, side, p, &jobs);
    std::vector<int> w(static_cast<size_t>(side * side), 0);
    for (const FusedJobV2& j : jobs) {
      for (int64_t r = j.row0; r < std::min<int64_t>(j.row0 + 128, side); ++r) {
        for (int64_t c = j.col0; c < std::min<int64_t>(j.col0 + 128, side); ++c) {
          w[r * side + c] += 1;
          if (!j.diagonal) w[c * side + r] += 1;
        }
      }
    }
    for (int x : w) ASSERT_EQ(x, 1) << "side " << side;
    const int64_t t = (side + 127) / 128;
    EXPECT_EQ(static_cast<int64_t>(jobs.size()), t * (t + 1) / 2);
  }
}

// v2 jobs, with the kernel's 16 x 16 blocks (fused_v2_kernel.cuh: diagonal
// jobs g >= strip with weight 0/1/2 inside diagonal blocks; off-diagonal
// jobs 8 x 4 blocks, weight 2), weight every entry of the Gram once.
TEST(LaunchPolicy, V2JobsWeightEveryGramEntryOnce) {
  const LaunchPolicy& p = kFusedPolicyV3Sm90;  // v3 keeps v2's jobs
  for (int64_t side : {1, 7, 64, 127, 128, 129, 200, 257, 300, 1024}) {
    std::vector<FusedJobV2> jobs;
    AppendFusedJobsV2(3, side, p, &jobs);
    std::vector<int> w(static_cast<size_t>(side * side), 0);
    for (const FusedJobV2& j : jobs) {
      EXPECT_EQ(j.matrix, 3);
      const int rows = p.block_tile, cols = j.diagonal ? p.block_tile : p.col_tile;
      for (int r = 0; r < rows; ++r) {
        for (int c = 0; c < cols; ++c) {
          const int64_t gr = j.row0 + r, gc = j.col0 + c;
          if (gr >= side || gc >= side) continue;
          int weight = 2;
          if (j.diagonal) {
            if (c / 16 < r / 16) continue;  // blocks below the diagonal
            weight = r < c ? 2 : (r == c ? 1 : 0);
          }
          w[gr * side + gc] += weight;
        }
      }
    }
    // Symmetric G: entry (i, j), i < j, counts for itself and (j, i).
    for (int64_t i = 0; i < side; ++i) {
      for (int64_t j = 0; j < side; ++j) {
        const int expect = i < j ? 2 : (i == j ? 1 : 0);
        ASSERT_EQ(w[i * side + j], expect) << "side " << side << " (" << i << ", " << j << ")";
      }
    }
  }
}

// The kernel's slot table: every 16 x 16 block of a diagonal tile's upper
// triangle once, at most 5 per warp (mirror of FusedV2Kernel's formula).
TEST(LaunchPolicy, V2SlotsCoverTheUpperTriangle) {
  std::vector<int> seen(64, 0);
  for (int warp = 0; warp < 8; ++warp) {
    const int p = warp / 2, n0 = 3 - p;
    int count = 0;
    for (int s = 0; s < 5; ++s) {
      int strip, grp;
      bool act;
      if (warp % 2 == 0) {
        strip = p;
        grp = p + s;
        act = true;
      } else {
        strip = s >= n0 ? 7 - p : p;
        grp = s < n0 ? p + 5 + s : 7 - p + (s - n0);
        act = s < 4;
      }
      if (!act) continue;
      ASSERT_LT(grp, 8);
      ++seen[strip * 8 + grp];
      ++count;
    }
    EXPECT_LE(count, 5);
  }
  for (int i = 0; i < 8; ++i)
    for (int g = 0; g < 8; ++g) EXPECT_EQ(seen[i * 8 + g], g >= i ? 1 : 0) << i << "," << g;
}

// The busiest block's work under a plan, in jobs (round-robin units).
double BusiestBlock(const FusedV4Plan& p) {
  std::vector<double> load(p.grid, 0.0);
  for (int u = 0; u < p.units; ++u) {
    load[u % p.grid] += u < p.cut * p.pieces ? 1.0 / p.pieces : 1.0;
  }
  return *std::max_element(load.begin(), load.end());
}

TEST(LaunchPolicy, FusedV4PlanCutsOnlyALastRoundThatLeavesBlocksIdle) {
  // 480 x 128x4096 on 132 SMs: 84 jobs after 3 rounds, cut into thirds.
  const FusedV4Plan p = PlanFusedV4(480, 132, 64, 8);
  EXPECT_EQ(p.jobs, 480);
  EXPECT_EQ(p.grid, 132);
  EXPECT_EQ(p.cut, 84);
  EXPECT_EQ(p.pieces, 3);
  EXPECT_EQ(p.units, 396 + 84 * 3);
  EXPECT_DOUBLE_EQ(BusiestBlock(p), 3.0 + 2.0 / 3.0);
  EXPECT_GT(FusedV4PartialBytes(p), 0);
  // 1152 jobs (32 x 1024x4096): 96 after 8 rounds, in quarters.
  EXPECT_EQ(PlanFusedV4(1152, 132, 64, 8).pieces, 4);
  // Nothing to cut: fewer jobs than SMs, whole rounds, a tail no cut
  // helps (256: 124 of 132), pieces under 4 slices, a policy of 1.
  for (const FusedV4Plan q : {PlanFusedV4(100, 132, 64, 8), PlanFusedV4(528, 132, 64, 8),
                              PlanFusedV4(256, 132, 64, 8), PlanFusedV4(480, 132, 7, 8),
                              PlanFusedV4(480, 132, 64, 1)}) {
    EXPECT_EQ(q.pieces, 1);
    EXPECT_EQ(q.cut, 0);
    EXPECT_EQ(q.units, q.jobs);
    EXPECT_EQ(FusedV4PartialBytes(q), 0);
  }
  EXPECT_EQ(PlanFusedV4(0, 132, 64, 8).units, 0);
}

TEST(LaunchPolicy, FusedV4PlanNeverLoadsTheBusiestBlockMore) {
  for (int sms : {1, 7, 132}) {
    for (int jobs = 1; jobs <= 3 * sms + 5; ++jobs) {
      for (int slices : {1, 8, 16, 63, 64}) {
        const FusedV4Plan p = PlanFusedV4(jobs, sms, slices, 8);
        const FusedV4Plan whole = PlanFusedV4(jobs, sms, slices, 1);
        ASSERT_EQ(p.grid, std::min(jobs, sms));
        EXPECT_LE(BusiestBlock(p), BusiestBlock(whole)) << jobs << " on " << sms;
        EXPECT_EQ(p.units, jobs - p.cut + p.cut * p.pieces);
        EXPECT_EQ(p.cut == 0, p.pieces == 1);
        EXPECT_LE(p.cut, std::min(kFusedV4MaxCutJobs, p.grid));
        // The pieces tile the job's slices, each at least the minimum.
        EXPECT_EQ(PieceBegin(0, p.pieces, slices), 0);
        EXPECT_EQ(PieceBegin(p.pieces, p.pieces, slices), slices);
        auto size = [&](int q) {
          return PieceBegin(q + 1, p.pieces, slices) - PieceBegin(q, p.pieces, slices);
        };
        for (int q = 0; p.pieces > 1 && q < p.pieces; ++q) {
          EXPECT_GE(size(q), kFusedV4MinPieceSlices);
          EXPECT_GE(size(0), size(q));  // piece 0 the largest (CombinePieces)
        }
      }
    }
  }
  EXPECT_EQ(FusedV4Slices(4096), 64);
  EXPECT_EQ(FusedV4Slices(1000), 16);
}

}  // namespace
}  // namespace rvd::cuda

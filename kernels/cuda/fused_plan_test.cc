// The SM cap in fused planning (host code: runs without a GPU, label unit).
// Under a cap every launch of a planned fused call, the finalize included,
// has a grid of at most the cap for every kernel family and shape class;
// without one, v1 and v3 keep a block per job. The views are never read
// (planning looks at shapes, strides and the alignment of the pointers),
// and v4's tensor maps come from a stand-in encoder.
#include "kernels/cuda/fused_plan.h"

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/cuda/launch_policy.h"
#include "kernels/engine.h"

namespace rvd::cuda {
namespace {

cudaError_t FakeEncoder(DType, const MatrixDesc&, void* map) {
  static_cast<unsigned char*>(map)[0] = 1;
  return cudaSuccess;
}

struct Case {
  DType dtype;
  int64_t rows, cols;
  bool aligned;
  int count;  // matrices of this shape in the call
};

// A call of `cases` with fake device pointers: 16-byte aligned, or one
// element off.
std::vector<MatrixView> Views(const std::vector<Case>& cases) {
  std::vector<MatrixView> views;
  uintptr_t next = 1 << 20;
  for (const Case& c : cases) {
    for (int i = 0; i < c.count; ++i) {
      MatrixView v;
      v.dtype = c.dtype;
      v.rows = c.rows;
      v.cols = c.cols;
      const uint64_t es = DTypeSize(c.dtype);
      v.ld = (c.cols * static_cast<int64_t>(es) + 15) / 16 * 16 / static_cast<int64_t>(es);
      v.data = reinterpret_cast<const void*>(next + (c.aligned ? 0 : es));
      next += (static_cast<uint64_t>(v.ld) * c.rows * es + 4096) / 256 * 256 + 256;
      views.push_back(v);
    }
  }
  return views;
}

// Every shape class on sm_90 (v4 square and triangle, v4's f32 paired
// tiles, v3 wide, v3 on f32, v1 tall), in calls with more jobs than any cap below.
const std::vector<std::vector<Case>> kCalls = {
    {{DType::kF32, 128, 4096, true, 480}},                // v4 square, f32
    {{DType::kBF16, 128, 4096, true, 480}},               // v4 triangle
    {{DType::kBF16, 1024, 4096, true, 32}},               // v4 square, off-diagonal jobs
    {{DType::kBF16, 128, 4096, false, 300}},              // v3 (unaligned rows)
    {{DType::kF32, 300, 4096, true, 40}},                 // v4 square, f32 paired tiles
    {{DType::kF32, 300, 4096, false, 40}},                // v3 on f32 (unaligned rows)
    {{DType::kBF16, 4096, 128, true, 480}},               // v1 tall
    {{DType::kF16, 4096, 300, true, 40}},                 // v1 tall, off-diagonal jobs
    {{DType::kF32, 129, 1000, true, 7},                   // all of them in one call
     {DType::kBF16, 64, 64, true, 9},
     {DType::kF16, 257, 3001, false, 5},
     {DType::kF32, 2000, 40, true, 11},
     {DType::kBF16, 4096, 256, true, 13}},
};

TEST(FusedPlanTest, PlanningDeviceCapsBelowTheDeviceOnly) {
  EXPECT_FALSE(PlanningDevice(9, 0, 132, 0).capped);
  EXPECT_EQ(PlanningDevice(9, 0, 132, 0).sms, 132);
  EXPECT_FALSE(PlanningDevice(9, 0, 132, 132).capped);
  EXPECT_FALSE(PlanningDevice(9, 0, 132, 500).capped);
  EXPECT_EQ(PlanningDevice(9, 0, 132, 500).sms, 132);
  EXPECT_TRUE(PlanningDevice(9, 0, 132, 33).capped);
  EXPECT_EQ(PlanningDevice(9, 0, 132, 33).sms, 33);
}

TEST(FusedPlanTest, EveryGridWithinTheSmCap) {
  for (const auto& [major, minor] : {std::pair{9, 0}, std::pair{8, 0}}) {
    std::set<FusedKernel> seen;
    for (int cap : {1, 7, 33, 66, 131, 0}) {
      const DeviceInfo device = PlanningDevice(major, minor, 132, cap);
      for (const std::vector<Case>& cases : kCalls) {
        const std::vector<MatrixView> views = Views(cases);
        FusedCall call;
        ASSERT_TRUE(PlanFusedCall(views, device, &call, &FakeEncoder).ok());
        const std::string what = absl::StrCat("sm_", major, minor, " cap ", cap, ", ",
                                              views.size(), " matrices, first ",
                                              views[0].rows, "x", views[0].cols);
        ASSERT_FALSE(call.launches.empty()) << what;
        for (const FusedCall::Launch& l : call.launches) {
          seen.insert(l.kernel);
          const std::string in = absl::StrCat(what, ", kernel ", static_cast<int>(l.kernel),
                                              ", ", l.jobs, " jobs");
          ASSERT_GE(l.grid, 1) << in;
          if (cap > 0) {
            EXPECT_LE(l.grid, cap) << in;
          }
          if (IsFusedV4(l.kernel)) {
            EXPECT_EQ(l.grid, l.plan.grid) << in;
            EXPECT_LE(l.grid, device.sms) << in;
          } else {
            EXPECT_LE(l.grid, l.jobs) << in;
            // Uncapped: a block per job, as the kernels were tuned.
            if (cap == 0) {
              EXPECT_EQ(l.grid, l.jobs) << in;
            }
            // Capped: no fewer blocks than the cap allows.
            if (cap > 0) {
              EXPECT_EQ(l.grid, std::min(l.jobs, cap)) << in;
            }
          }
        }
        if (!call.finished) {
          const int blocks = FinalizeBlocks(static_cast<int>(views.size()));
          ASSERT_GE(call.finalize_grid, 1) << what;
          EXPECT_LE(call.finalize_grid, blocks) << what;
          if (cap > 0) {
            EXPECT_LE(call.finalize_grid, cap) << what;
          }
          if (cap == 0) {
            EXPECT_EQ(call.finalize_grid, blocks) << what;
          }
        }
      }
    }
    // Every shape class the device has was planned.
    std::set<FusedKernel> expected = {FusedKernel::kV3, FusedKernel::kV1Tall};
    if (FusedV4Runs(major, minor)) {
      expected.insert(FusedKernel::kV4);
      expected.insert(FusedKernel::kV4Triangle);
    }
    EXPECT_EQ(seen, expected) << "sm_" << major << minor;
  }
}

// The cap changes the grid only, never the jobs: each job's sums land in the
// same slots, so a capped call's v1 and v3 results are the uncapped bits.
TEST(FusedPlanTest, CapKeepsJobsAndLayout) {
  const std::vector<MatrixView> views = Views(kCalls.back());
  FusedCall free_call, capped_call;
  ASSERT_TRUE(PlanFusedCall(views, PlanningDevice(9, 0, 132, 0), &free_call, &FakeEncoder).ok());
  ASSERT_TRUE(
      PlanFusedCall(views, PlanningDevice(9, 0, 132, 3), &capped_call, &FakeEncoder).ok());
  ASSERT_EQ(free_call.launches.size(), capped_call.launches.size());
  for (size_t i = 0; i < free_call.launches.size(); ++i) {
    const FusedCall::Launch &a = free_call.launches[i], &b = capped_call.launches[i];
    EXPECT_EQ(a.kernel, b.kernel);
    EXPECT_EQ(a.j0, b.j0);
    EXPECT_EQ(a.jobs, b.jobs);
    EXPECT_EQ(a.list0, b.list0);
  }
  EXPECT_EQ(free_call.order, capped_call.order);
  EXPECT_EQ(free_call.o_jobs, capped_call.o_jobs);
  EXPECT_EQ(free_call.o_g2, capped_call.o_g2);
  EXPECT_EQ(free_call.o_pr, capped_call.o_pr);
}

// v4's f32 matrices of Gram side > 128 (paired tiles, their own kernel
// instance) launch apart from its f32 ones of side <= 128, whatever the
// order in the call, and only they have `pairs`: each matrix meets the
// same kernel in every call. Their jobs are the 128 x 128 tiles of the
// upper triangle, and the finalize sums them (v4 finishes side <= 128 only).
TEST(FusedPlanTest, F32PairedTilesLaunchApart) {
  const std::vector<MatrixView> views = Views({{DType::kF32, 300, 4096, true, 2},
                                               {DType::kF32, 128, 4096, true, 3},
                                               {DType::kF32, 1024, 4096, true, 1},
                                               {DType::kBF16, 300, 4096, true, 2}});
  FusedCall call;
  ASSERT_TRUE(PlanFusedCall(views, PlanningDevice(9, 0, 132, 0), &call, &FakeEncoder).ok());
  ASSERT_EQ(call.launches.size(), 3u);
  const FusedCall::Launch& small = call.launches[0];
  const FusedCall::Launch& paired = call.launches[1];
  const FusedCall::Launch& bf16 = call.launches[2];
  EXPECT_EQ(small.dtype, DType::kF32);
  EXPECT_EQ(small.kernel, FusedKernel::kV4);
  EXPECT_FALSE(small.pairs);
  EXPECT_EQ(small.matrices, 3);
  EXPECT_EQ(small.jobs, 3);
  EXPECT_EQ(paired.dtype, DType::kF32);
  EXPECT_EQ(paired.kernel, FusedKernel::kV4);
  EXPECT_TRUE(paired.pairs);
  EXPECT_EQ(paired.matrices, 3);
  EXPECT_EQ(paired.jobs, 2 * 6 + 36);  // 3 row tiles: 6 jobs; 8: 36
  EXPECT_TRUE(paired.offdiag);
  EXPECT_EQ(paired.j0, small.j0 + small.jobs);
  EXPECT_EQ(bf16.kernel, FusedKernel::kV4);
  EXPECT_FALSE(bf16.pairs);
  EXPECT_FALSE(call.finished);  // the paired matrices' jobs go to the finalize
  // In slot order: the small f32 ones (input 2, 3, 4), the paired (0, 1, 5).
  EXPECT_EQ(call.order, (std::vector<size_t>{2, 3, 4, 0, 1, 5, 6, 7}));
}

}  // namespace
}  // namespace rvd::cuda

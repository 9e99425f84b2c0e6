// Live weights' host side, without a GPU: PyTorch's expandable-segment
// handle body (ipc_handle.h), the device UUID's form, and snapshot planning
// (snapshot.h: validation, flat/strided/blocked tiles, vector loads).
#include <cstdint>
#include <cstring>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cuda/ipc_handle.h"
#include "kernels/cuda/snapshot.h"
#include "kernels/cuda_module.h"

namespace rvd::cuda {
namespace {

using ::testing::HasSubstr;

// The bytes torch 2.11's share() writes for one 20 MiB page held by fd 37
// of pid 4242, spelled out field by field (ShareHeader: pid_t, 4 bytes of
// padding, size_t segment_size, size_t num_handles; then an int fd).
std::vector<uint8_t> TorchBody() {
  std::vector<uint8_t> b = {
      0x92, 0x10, 0x00, 0x00,                          // pid 4242
      0x00, 0x00, 0x00, 0x00,                          // padding
      0x00, 0x00, 0x40, 0x01, 0x00, 0x00, 0x00, 0x00,  // segment_size 20 MiB
      0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,  // num_handles 1
      0x25, 0x00, 0x00, 0x00,                          // fd 37
  };
  return b;
}

TEST(ExpandableShare, ParsesTorchsLayout) {
  const std::vector<uint8_t> body = TorchBody();
  ASSERT_EQ(body.size() + 2, 30u);  // the 30-byte handle measured on the H200 host
  absl::StatusOr<ExpandableShare> s = ParseExpandableShare(body);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->pid, 4242);
  EXPECT_EQ(s->segment_size, 20u << 20);
  EXPECT_EQ(s->pages, 1u);
  EXPECT_EQ(s->bytes(), 20u << 20);
  EXPECT_FALSE(s->fabric);
  EXPECT_THAT(s->fds, ::testing::ElementsAre(37));
}

TEST(ExpandableShare, SerializeIsTorchsLayoutAndRoundTrips) {
  EXPECT_EQ(SerializeExpandableShare(4242, 20u << 20, {37}), TorchBody());
  const std::vector<int32_t> fds = {5, 9, 11};
  absl::StatusOr<ExpandableShare> s =
      ParseExpandableShare(SerializeExpandableShare(77, 2u << 20, fds));
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->pid, 77);
  EXPECT_EQ(s->pages, 3u);
  EXPECT_EQ(s->bytes(), 6u << 20);
  EXPECT_EQ(s->fds, fds);
}

TEST(ExpandableShare, OlderTorchsUnzeroedPaddingIsIgnored) {
  std::vector<uint8_t> body = TorchBody();
  body[4] = 0xde;
  body[7] = 0xad;
  absl::StatusOr<ExpandableShare> s = ParseExpandableShare(body);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->pid, 4242);
}

TEST(ExpandableShare, FabricHandlesAreRecognized) {
  std::vector<uint8_t> body = TorchBody();
  body.resize(kExpandableHeaderBytes + kFabricHandleBytes, 0x5a);
  absl::StatusOr<ExpandableShare> s = ParseExpandableShare(body);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_TRUE(s->fabric);
  EXPECT_TRUE(s->fds.empty());
}

TEST(ExpandableShare, GarbageIsInvalidArgumentSayingWhat) {
  auto error = [](std::vector<uint8_t> body) {
    absl::StatusOr<ExpandableShare> s = ParseExpandableShare(body);
    EXPECT_FALSE(s.ok());
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << s.status();
    return std::string(s.status().message());
  };
  std::vector<uint8_t> b = TorchBody();
  EXPECT_THAT(error(std::vector<uint8_t>(b.begin(), b.begin() + 20)), HasSubstr("header"));
  // With the prefix still on: the lengths do not add up.
  std::vector<uint8_t> prefixed(b.size() + 2);
  prefixed[0] = 2;
  prefixed[1] = 'e';
  std::memcpy(prefixed.data() + 2, b.data(), b.size());
  EXPECT_THAT(error(prefixed), HasSubstr("expected"));
  std::vector<uint8_t> v = b;
  std::memset(v.data(), 0, 4);  // pid 0
  EXPECT_THAT(error(v), HasSubstr("pid 0"));
  v = b;
  std::memset(v.data() + 8, 0, 8);  // segment_size 0
  EXPECT_THAT(error(v), HasSubstr("segment_size 0"));
  v = b;
  std::memset(v.data() + 16, 0, 8);  // no pages
  EXPECT_THAT(error(v), HasSubstr("num_handles 0"));
  v = b;
  v[16] = 2;  // two pages, one fd
  EXPECT_THAT(error(v), HasSubstr("expected"));
  v = b;
  std::memset(v.data() + 8, 0xff, 8);  // segment_size ~2^64
  EXPECT_THAT(error(v), HasSubstr("2^63"));
  v = b;
  std::memset(v.data() + 24, 0xff, 4);  // fd -1
  EXPECT_THAT(error(v), HasSubstr("file descriptor -1"));
}

TEST(GpuUuid, AsNvidiaSmiPrintsIt) {
  const unsigned char b[16] = {0x8f, 0x0c, 0x1a, 0x2b, 0x3c, 0x4d, 0x5e, 0x6f,
                               0x70, 0x81, 0x92, 0xa3, 0xb4, 0xc5, 0xd6, 0xe7};
  EXPECT_EQ(FormatGpuUuid(b), "GPU-8f0c1a2b-3c4d-5e6f-7081-92a3b4c5d6e7");
}

// Snapshot planning. Pointers are never dereferenced: fake device addresses.
uint8_t* Fake(uintptr_t addr) { return reinterpret_cast<uint8_t*>(addr); }

rvd_snapshot_item Item(uintptr_t src, int64_t rows, int64_t cols, int64_t ld, int32_t dtype,
                       uintptr_t dst, uintptr_t last) {
  rvd_snapshot_item it{};
  it.src = rvd_matrix{Fake(src), rows, cols, ld, dtype, RVD_MEMORY_DEVICE, 0, 0};
  it.dst = Fake(dst);
  it.last = last != 0 ? Fake(last) : nullptr;
  return it;
}

TEST(PlanSnapshot, ContiguousIsFlatWithVectorLoadsAndTilesInOrder) {
  // A 7B V projection (1024 x 4096 bf16, 8 MiB) and a small f32 one.
  std::vector<rvd_snapshot_item> items = {
      Item(0x100000, 1024, 4096, 4096, RVD_DTYPE_BF16, 0x8000000, 0x9000000),
      Item(0x200000, 3, 5, 5, RVD_DTYPE_F32, 0xa000000, 0)};
  absl::StatusOr<SnapshotPlan> plan = PlanSnapshot(items);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->items.size(), 2u);
  const SnapshotDesc& a = plan->items[0];
  EXPECT_EQ(a.flags, kSnapshotFlat | kSnapshotVector);
  EXPECT_EQ(a.row_bytes, 8 << 20);
  EXPECT_EQ(a.tiles, (8 << 20) / kSnapshotTileBytes);
  EXPECT_EQ(a.first_tile, 0);
  const SnapshotDesc& b = plan->items[1];
  EXPECT_EQ(b.flags, kSnapshotFlat | kSnapshotVector);  // 60 bytes: one unit, 11 elements tail
  EXPECT_EQ(b.row_bytes, 60);
  EXPECT_EQ(b.tiles, 1);
  EXPECT_EQ(b.first_tile, a.tiles);
  EXPECT_EQ(b.last, nullptr);
  EXPECT_EQ(plan->tiles, a.tiles + 1);
  EXPECT_EQ(plan->src_bytes, (8u << 20) + 60u);
}

TEST(PlanSnapshot, UnalignedBaseTakesElementLoads) {
  std::vector<rvd_snapshot_item> items = {
      Item(0x100002, 64, 64, 64, RVD_DTYPE_F16, 0x8000000, 0)};
  absl::StatusOr<SnapshotPlan> plan = PlanSnapshot(items);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->items[0].flags, kSnapshotFlat);
  // Any of the three addresses off 16 bytes: a 16-byte load of it would
  // fault (misaligned address, a sticky error).
  items[0] = Item(0x100000, 64, 64, 64, RVD_DTYPE_F16, 0x8000000, 0x9000002);
  plan = PlanSnapshot(items);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->items[0].flags, kSnapshotFlat);
  items[0] = Item(0x100000, 64, 64, 64, RVD_DTYPE_F16, 0x8000008, 0x9000000);
  plan = PlanSnapshot(items);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->items[0].flags, kSnapshotFlat);
}

TEST(PlanSnapshot, StridedAndBlockedAreRows) {
  // Strided: ld 4100 (rows 8200 bytes apart, not a multiple of 16).
  // Blocked: gpt_neox's V of 4 heads x 128 rows, 384 rows apart.
  rvd_snapshot_item blocked = Item(0x100000 + 256 * 4096 * 2, 512, 4096, 4096, RVD_DTYPE_BF16,
                                   0xa000000, 0xb000000);
  blocked.src.block_rows = 128;
  blocked.src.block_stride = 384 * 4096;
  std::vector<rvd_snapshot_item> items = {
      Item(0x100000, 100, 4096, 4100, RVD_DTYPE_BF16, 0x8000000, 0), blocked};
  absl::StatusOr<SnapshotPlan> plan = PlanSnapshot(items);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const SnapshotDesc& s = plan->items[0];
  EXPECT_EQ(s.flags, 0);  // rows, element loads
  EXPECT_EQ(s.row_bytes, 8192);
  EXPECT_EQ(s.src_pitch, 8200);
  EXPECT_EQ(s.block_rows, 100);
  EXPECT_EQ(s.tile_rows, kSnapshotTileBytes / 8192);
  EXPECT_EQ(s.tiles, (100 + s.tile_rows - 1) / s.tile_rows);
  const SnapshotDesc& b = plan->items[1];
  EXPECT_EQ(b.flags, kSnapshotVector);
  EXPECT_EQ(b.block_rows, 128);
  EXPECT_EQ(b.block_stride, 384 * 4096 * 2);
  EXPECT_EQ(b.src_pitch, 8192);
  EXPECT_EQ(b.first_tile, s.tiles);
  // A blocked view whose blocks follow each other is one contiguous range.
  rvd_snapshot_item dense = blocked;
  dense.src.block_stride = 128 * 4096;
  plan = PlanSnapshot(absl::MakeConstSpan(&dense, 1));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->items[0].flags, kSnapshotFlat | kSnapshotVector);
}

TEST(PlanSnapshot, BadItemsAreInvalidArgumentNamingTheItem) {
  auto error = [](rvd_snapshot_item bad) {
    std::vector<rvd_snapshot_item> items = {
        Item(0x100000, 8, 8, 8, RVD_DTYPE_F32, 0x8000000, 0), bad};
    absl::StatusOr<SnapshotPlan> plan = PlanSnapshot(items);
    EXPECT_FALSE(plan.ok());
    EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument) << plan.status();
    EXPECT_THAT(plan.status().message(), HasSubstr("items[1]"));
    return std::string(plan.status().message());
  };
  const rvd_snapshot_item good = Item(0x200000, 8, 8, 8, RVD_DTYPE_BF16, 0x9000000, 0xa000000);
  rvd_snapshot_item v = good;
  v.src.memory = RVD_MEMORY_HOST;
  EXPECT_THAT(error(v), HasSubstr("not device memory"));
  v = good;
  v.src.dtype = 7;
  EXPECT_THAT(error(v), HasSubstr("dtype"));
  v = good;
  v.src.ld = 4;
  EXPECT_THAT(error(v), HasSubstr("bad matrix view"));
  v = good;
  v.src.data = nullptr;
  EXPECT_THAT(error(v), HasSubstr("bad matrix view"));
  v = good;
  v.src.data = Fake(0x200001);
  EXPECT_THAT(error(v), HasSubstr("aligned"));
  v = good;
  v.dst = nullptr;
  EXPECT_THAT(error(v), HasSubstr("dst is null"));
  v = good;
  v.last = Fake(0xa000001);
  EXPECT_THAT(error(v), HasSubstr("aligned"));
  v = good;
  v.src.block_rows = 3;  // does not divide 8
  v.src.block_stride = 64;
  EXPECT_THAT(error(v), HasSubstr("block_rows"));
  v = good;
  v.src.block_rows = 4;
  v.src.block_stride = 16;  // overlaps (4 x 8)
  EXPECT_THAT(error(v), HasSubstr("overlaps"));
}

TEST(PlanSnapshot, EmptyIsAnEmptyPlan) {
  absl::StatusOr<SnapshotPlan> plan = PlanSnapshot({});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(plan->items.empty());
  EXPECT_EQ(plan->tiles, 0);
}

}  // namespace
}  // namespace rvd::cuda

#include "server/measurement_index.h"

#include <algorithm>
#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace rvd {
namespace {

using Entry = MeasurementLog::Entry;

uint64_t next_sequence = 1;

Entry Make(const std::string& model, int64_t step) {
  auto m = std::make_shared<rvd::v1::Measurement>();
  m->set_model_id(model);
  m->set_step(step);
  m->set_sequence(next_sequence++);
  return m;
}

std::vector<int64_t> Steps(const std::vector<Entry>& es) {
  std::vector<int64_t> steps;
  for (const Entry& e : es) steps.push_back(e->step());
  return steps;
}

std::vector<int64_t> Range(int64_t first, int64_t last) {
  std::vector<int64_t> r;
  for (int64_t s = first; s <= last; ++s) r.push_back(s);
  return r;
}

TEST(MeasurementRingTest, Empty) {
  MeasurementRing ring(4);
  EXPECT_EQ(ring.size(), 0u);
  EXPECT_EQ(ring.capacity(), 4u);
  EXPECT_EQ(ring.Latest(), nullptr);
  EXPECT_TRUE(ring.Newest(0).empty());
  EXPECT_TRUE(ring.Newest(3).empty());
}

TEST(MeasurementRingTest, ZeroCapacityIsOne) {
  MeasurementRing ring(0);
  EXPECT_EQ(ring.capacity(), 1u);
  EXPECT_EQ(ring.Push(Make("m", 1)), nullptr);
  Entry dropped = ring.Push(Make("m", 2));
  ASSERT_NE(dropped, nullptr);
  EXPECT_EQ(dropped->step(), 1);
  EXPECT_EQ(Steps(ring.Newest(0)), std::vector<int64_t>({2}));
}

// After every push, for every capacity and every limit, the ring holds
// exactly the newest min(pushed, capacity) steps in order, and Push returns
// the one it dropped.
TEST(MeasurementRingTest, WrapsAroundManyTimes) {
  for (size_t capacity : {1u, 2u, 3u, 5u, 8u, 13u}) {
    MeasurementRing ring(capacity);
    const int64_t pushes = static_cast<int64_t>(capacity) * 11 + 3;
    for (int64_t s = 1; s <= pushes; ++s) {
      Entry dropped = ring.Push(Make("m", s));
      const int64_t cap = static_cast<int64_t>(capacity);
      if (s <= cap) {
        EXPECT_EQ(dropped, nullptr);
      } else {
        ASSERT_NE(dropped, nullptr);
        EXPECT_EQ(dropped->step(), s - cap);
      }
      const size_t kept = std::min<size_t>(s, capacity);
      ASSERT_EQ(ring.size(), kept);
      EXPECT_EQ(ring.Latest()->step(), s);
      for (size_t limit = 0; limit <= capacity + 1; ++limit) {
        const size_t n = limit == 0 ? kept : std::min(limit, kept);
        EXPECT_EQ(Steps(ring.Newest(limit)), Range(s - n + 1, s))
            << "capacity " << capacity << " limit " << limit;
      }
    }
    EXPECT_EQ(ring.total_pushed(), static_cast<uint64_t>(pushes));
  }
}

TEST(MeasurementIndexTest, UnknownModelIsNotFound) {
  MeasurementIndex index(4, 4);
  EXPECT_EQ(index.Latest("nope"), nullptr);
  EXPECT_EQ(index.Get("nope", 0).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(index.Models().empty());
}

TEST(MeasurementIndexTest, ReserveInsertGetLatest) {
  MeasurementIndex index(3, 4);
  ASSERT_TRUE(index.Reserve("a").ok());
  // A reserved model without entries is invisible.
  EXPECT_EQ(index.Latest("a"), nullptr);
  EXPECT_EQ(index.Get("a", 0).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(index.Models().empty());
  for (int64_t s = 1; s <= 5; ++s) ASSERT_TRUE(index.Insert(Make("a", s)).ok());
  EXPECT_EQ(index.Latest("a")->step(), 5);
  EXPECT_EQ(Steps(*index.Get("a", 0)), Range(3, 5));  // capacity 3
  EXPECT_EQ(Steps(*index.Get("a", 2)), Range(4, 5));
}

TEST(MeasurementIndexTest, InsertWithoutReserveIsRefused) {
  MeasurementIndex index(3, 4);
  EXPECT_EQ(index.Insert(Make("x", 1)).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(index.Insert(nullptr).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(index.Reserve("").code(), absl::StatusCode::kInvalidArgument);
}

TEST(MeasurementIndexTest, ModelsSortedWithCountsAndLatest) {
  MeasurementIndex index(2, 8);
  for (const char* id : {"zeta", "alpha", "mid"}) ASSERT_TRUE(index.Reserve(id).ok());
  ASSERT_TRUE(index.Insert(Make("zeta", 1)).ok());
  ASSERT_TRUE(index.Insert(Make("alpha", 1)).ok());
  ASSERT_TRUE(index.Insert(Make("alpha", 2)).ok());
  ASSERT_TRUE(index.Insert(Make("alpha", 3)).ok());
  std::vector<MeasurementIndex::ModelState> models = index.Models();
  ASSERT_EQ(models.size(), 2u);  // "mid" has no entry
  EXPECT_EQ(models[0].model_id, "alpha");
  EXPECT_EQ(models[0].kept, 2u);
  EXPECT_EQ(models[0].latest->step(), 3);
  EXPECT_EQ(models[1].model_id, "zeta");
  EXPECT_EQ(models[1].kept, 1u);
}

TEST(MeasurementIndexTest, MaxModelsRefusesNewModelsOnly) {
  MeasurementIndex index(2, 2);
  ASSERT_TRUE(index.Reserve("a").ok());
  ASSERT_TRUE(index.Reserve("b").ok());
  absl::Status s = index.Reserve("c");
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(s.message(), ::testing::HasSubstr("max_models"));
  EXPECT_TRUE(index.Reserve("a").ok());  // known models still fine
}

// Writers insert while readers read: every Get is a run of increasing
// steps ending at a step no older than the Latest seen before it.
TEST(MeasurementIndexTest, ConcurrentWritersAndReaders) {
  MeasurementIndex index(16, 8);
  constexpr int kModels = 4;
  constexpr int kEach = 2000;
  for (int m = 0; m < kModels; ++m) ASSERT_TRUE(index.Reserve(absl::StrCat("m", m)).ok());
  std::atomic<bool> done{false};
  std::atomic<int> bad{0};
  std::vector<std::thread> threads;
  for (int m = 0; m < kModels; ++m) {
    // Entries are made up front: the sequence counter is not thread-safe.
    std::vector<Entry> entries;
    for (int i = 1; i <= kEach; ++i) entries.push_back(Make(absl::StrCat("m", m), i));
    threads.emplace_back([&index, entries = std::move(entries)] {
      for (const Entry& e : entries) (void)index.Insert(e);
    });
  }
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&] {
      while (!done.load()) {
        for (int m = 0; m < kModels; ++m) {
          const std::string id = absl::StrCat("m", m);
          Entry before = index.Latest(id);
          absl::StatusOr<std::vector<Entry>> got = index.Get(id, 0);
          if (!got.ok()) continue;  // nothing inserted yet
          std::vector<int64_t> steps = Steps(*got);
          for (size_t i = 1; i < steps.size(); ++i) {
            if (steps[i] != steps[i - 1] + 1) ++bad;
          }
          if (before != nullptr && steps.back() < before->step()) ++bad;
          (void)index.Models();
        }
      }
    });
  }
  for (int m = 0; m < kModels; ++m) threads[m].join();
  done = true;
  for (size_t t = kModels; t < threads.size(); ++t) threads[t].join();
  EXPECT_EQ(bad.load(), 0);
  for (int m = 0; m < kModels; ++m) {
    EXPECT_EQ(Steps(*index.Get(absl::StrCat("m", m), 0)), Range(kEach - 15, kEach));
  }
}

}  // namespace
}  // namespace rvd

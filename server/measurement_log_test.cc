#include "server/measurement_log.h"

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace rvd {
namespace {

using Entry = MeasurementLog::Entry;

rvd::v1::Measurement Make(const std::string& model, int64_t step) {
  rvd::v1::Measurement m;
  m.set_model_id(model);
  m.set_step(step);
  return m;
}

std::vector<uint64_t> Sequences(const std::vector<Entry>& es) {
  std::vector<uint64_t> out;
  for (const Entry& e : es) out.push_back(e->sequence());
  return out;
}

std::vector<uint64_t> Range(uint64_t first, uint64_t last) {
  std::vector<uint64_t> r;
  for (uint64_t s = first; s <= last; ++s) r.push_back(s);
  return r;
}

TEST(MemLogTest, AssignsDenseSequenceNumbersFromOne) {
  std::unique_ptr<MeasurementLog> log = NewMemLog(100);
  EXPECT_EQ(log->LastSequence(), 0u);
  for (int64_t i = 1; i <= 5; ++i) {
    rvd::v1::Measurement m = Make(i % 2 ? "a" : "b", i);
    m.set_sequence(999);  // whatever a caller set is replaced
    absl::StatusOr<Entry> e = log->Append(std::move(m));
    ASSERT_TRUE(e.ok()) << e.status();
    EXPECT_EQ((*e)->sequence(), static_cast<uint64_t>(i));
    EXPECT_EQ((*e)->step(), i);
    EXPECT_EQ(log->LastSequence(), static_cast<uint64_t>(i));
  }
}

TEST(MemLogTest, ReadReturnsTheRangeOldestFirstSharedNotCopied) {
  std::unique_ptr<MeasurementLog> log = NewMemLog(100);
  std::vector<Entry> appended;
  for (int64_t i = 1; i <= 10; ++i) appended.push_back(*log->Append(Make("m", i)));
  EXPECT_EQ(Sequences(*log->Read(0, 10, 100)), Range(1, 10));
  EXPECT_EQ(Sequences(*log->Read(3, 7, 100)), Range(4, 7));
  EXPECT_EQ(Sequences(*log->Read(3, 7, 2)), Range(4, 5));  // at most max
  EXPECT_EQ(Sequences(*log->Read(0, 99, 100)), Range(1, 10));  // through > last
  EXPECT_TRUE(log->Read(10, 10, 100)->empty());
  EXPECT_TRUE(log->Read(7, 3, 100)->empty());
  EXPECT_TRUE(log->Read(0, 10, 0)->empty());
  // The log hands out the entry it stored, not a copy.
  EXPECT_EQ(log->Read(4, 5, 1)->at(0).get(), appended[4].get());
}

TEST(MemLogTest, RetainsTheNewestEntriesOnly) {
  std::unique_ptr<MeasurementLog> log = NewMemLog(3);
  for (int64_t i = 1; i <= 8; ++i) ASSERT_TRUE(log->Append(Make("m", i)).ok());
  EXPECT_EQ(log->LastSequence(), 8u);
  // 1..5 are gone; what is left is one contiguous range.
  EXPECT_EQ(Sequences(*log->Read(0, 8, 100)), Range(6, 8));
  EXPECT_EQ(Sequences(*log->Read(6, 8, 100)), Range(7, 8));
  EXPECT_TRUE(log->Read(0, 5, 100)->empty());
}

TEST(MemLogTest, ZeroRetainedKeepsOne) {
  std::unique_ptr<MeasurementLog> log = NewMemLog(0);
  ASSERT_TRUE(log->Append(Make("m", 1)).ok());
  ASSERT_TRUE(log->Append(Make("m", 2)).ok());
  EXPECT_EQ(Sequences(*log->Read(0, 2, 10)), Range(2, 2));
}

// Appenders and readers at once: every number is used once, and every read
// is a contiguous, increasing run.
TEST(MemLogTest, ConcurrentAppendsAndReads) {
  constexpr int kAppenders = 4;
  constexpr int kEach = 500;
  std::unique_ptr<MeasurementLog> log = NewMemLog(kAppenders * kEach);
  std::atomic<bool> done{false};
  std::atomic<int> bad_reads{0};
  std::thread reader([&] {
    while (!done.load()) {
      const uint64_t last = log->LastSequence();
      const uint64_t after = last / 2;
      std::vector<Entry> es = *log->Read(after, last, 64);
      for (size_t i = 0; i < es.size(); ++i) {
        if (es[i]->sequence() != after + 1 + i) ++bad_reads;
      }
    }
  });
  std::vector<std::thread> appenders;
  std::vector<std::vector<uint64_t>> got(kAppenders);
  for (int t = 0; t < kAppenders; ++t) {
    appenders.emplace_back([&, t] {
      for (int i = 0; i < kEach; ++i) {
        got[t].push_back((*log->Append(Make(absl::StrCat("m", t), i)))->sequence());
      }
    });
  }
  for (std::thread& a : appenders) a.join();
  done = true;
  reader.join();
  EXPECT_EQ(bad_reads.load(), 0);
  std::vector<uint64_t> all;
  for (const auto& g : got) {
    // Each thread's own appends got increasing numbers.
    EXPECT_TRUE(std::is_sorted(g.begin(), g.end()));
    all.insert(all.end(), g.begin(), g.end());
  }
  std::sort(all.begin(), all.end());
  EXPECT_EQ(all, Range(1, kAppenders * kEach));
  EXPECT_EQ(Sequences(*log->Read(0, kAppenders * kEach, kAppenders * kEach)),
            Range(1, kAppenders * kEach));
}

}  // namespace
}  // namespace rvd

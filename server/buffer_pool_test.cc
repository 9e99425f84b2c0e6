// BufferPool: reuse, the idle cap, and an engine's allocator (which may
// refuse), with a counting allocator standing in for page-locked memory.
#include "server/buffer_pool.h"

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <set>

#include "gtest/gtest.h"

// Under AddressSanitizer a failed allocation must come back as nullptr (as
// without it) rather than end the test.
extern "C" const char* __asan_default_options() {
  return "allocator_may_return_null=1";
}

namespace rvd {
namespace {

struct CountingAllocator {
  std::set<void*> live;
  int allocations = 0;
  uint64_t refuse_above = UINT64_MAX;  // bytes: return nullptr above this

  HostAllocator Get() {
    return HostAllocator{[this](uint64_t n) -> void* {
                           if (n > refuse_above) return nullptr;
                           ++allocations;
                           void* p = std::malloc(n);
                           live.insert(p);
                           return p;
                         },
                         [this](void* p) {
                           EXPECT_EQ(live.erase(p), 1u) << "freed twice or not ours";
                           std::free(p);
                         }};
  }
};

TEST(BufferPoolTest, ReusesTheSmallestIdleBufferThatFits) {
  BufferPool pool(1 << 20);
  char* first = nullptr;
  {
    BufferPool::Buffer a = *pool.Get(1000);
    first = a.data();
    std::memset(a.data(), 7, 1000);  // writable
    EXPECT_FALSE(a.from_allocator());
  }
  EXPECT_EQ(pool.idle_bytes(), 1000u);
  BufferPool::Buffer b = *pool.Get(500);
  EXPECT_EQ(b.data(), first);
  EXPECT_EQ(pool.idle_bytes(), 0u);
  BufferPool::Buffer c = *pool.Get(2000);  // nothing idle fits: new
  EXPECT_NE(c.data(), first);
}

TEST(BufferPoolTest, EngineAllocatorServesAndGetsItsMemoryBack) {
  CountingAllocator alloc;
  {
    BufferPool pool(4096, alloc.Get());
    {
      BufferPool::Buffer a = *pool.Get(1024);
      EXPECT_TRUE(a.from_allocator());
      EXPECT_EQ(alloc.live.count(a.data()), 1u);
      BufferPool::Buffer moved = std::move(a);  // moves do not free
      EXPECT_EQ(alloc.live.size(), 1u);
    }
    EXPECT_EQ(alloc.live.size(), 1u);  // idle, kept for the next request
    { BufferPool::Buffer again = *pool.Get(512); }
    EXPECT_EQ(alloc.allocations, 1);
    // Over the idle cap: freed on return, through the allocator.
    { BufferPool::Buffer big = *pool.Get(8192); }
    EXPECT_EQ(alloc.allocations, 2);
    EXPECT_EQ(alloc.live.size(), 1u);
  }
  EXPECT_TRUE(alloc.live.empty()) << "the pool's destructor frees idle buffers";
}

TEST(BufferPoolTest, RefusedAllocationFallsBackToOrdinaryMemory) {
  CountingAllocator alloc;
  alloc.refuse_above = 100;
  BufferPool pool(1 << 20, alloc.Get());
  BufferPool::Buffer a = *pool.Get(1000);
  EXPECT_FALSE(a.from_allocator());
  EXPECT_NE(a.data(), nullptr);
  EXPECT_EQ(alloc.allocations, 0);
  BufferPool::Buffer b = *pool.Get(50);
  EXPECT_TRUE(b.from_allocator());
}

TEST(BufferPoolTest, AllocationFailureIsResourceExhaustedNotAnException) {
  CountingAllocator alloc;
  alloc.refuse_above = 0;  // the engine refuses; ordinary memory fails too
  BufferPool pool(1 << 20, alloc.Get());
  absl::StatusOr<BufferPool::Buffer> huge = pool.Get(uint64_t{1} << 62);
  ASSERT_FALSE(huge.ok());
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(pool.Get(4096).ok());  // the pool still serves
}

TEST(ByteBudgetTest, TakesUpToTheLimitAndGivesBack) {
  ByteBudget budget(100);
  EXPECT_TRUE(budget.TryTake(60));
  EXPECT_FALSE(budget.TryTake(41));
  EXPECT_EQ(budget.used(), 60u);
  EXPECT_FALSE(budget.TryTake(UINT64_MAX));  // no wrap-around
  {
    ByteBudget::Reservation r(budget);
    EXPECT_TRUE(r.Take(40));
    EXPECT_FALSE(r.Take(1));
    EXPECT_EQ(budget.used(), 100u);
    r.Give(10);
    EXPECT_EQ(r.bytes(), 30u);
    EXPECT_EQ(budget.used(), 90u);
  }
  EXPECT_EQ(budget.used(), 60u);  // the reservation gave back its 30
  budget.Give(60);
  EXPECT_EQ(budget.used(), 0u);
}

}  // namespace
}  // namespace rvd

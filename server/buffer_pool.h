// Reusable host buffers for streamed tensors. A fresh multi-megabyte
// allocation is mmap'ed by malloc and every page faults on first touch,
// which cost more than the copy itself (measured: most of rvd's CPU time
// for a 128 MB stream). Buffers returned here keep their pages mapped for
// the next request, up to `max_idle_bytes` in total. With an engine's
// allocator (CUDA: page-locked memory, which the GPU copies from several
// times faster than from pageable memory) the buffers come from the engine;
// an allocation it refuses falls back to ordinary memory. An allocation
// that fails is a RESOURCE_EXHAUSTED status, never an exception.
// Thread-safe.
#ifndef RVD_SERVER_BUFFER_POOL_H_
#define RVD_SERVER_BUFFER_POOL_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <new>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace rvd {

// Where pool memory comes from when not from new[]: `allocate` may return
// nullptr (then new[] serves); `free` releases what `allocate` returned.
struct HostAllocator {
  std::function<void*(uint64_t)> allocate;
  std::function<void(void*)> free;
};

class BufferPool {
 public:
  // A buffer of at least `size` bytes; goes back to its pool when destroyed.
  class Buffer {
   public:
    Buffer(Buffer&& o) noexcept : pool_(o.pool_), block_(o.block_) { o.block_ = {}; }
    Buffer(const Buffer&) = delete;
    Buffer& operator=(const Buffer&) = delete;
    Buffer& operator=(Buffer&&) = delete;
    ~Buffer() {
      if (block_.data != nullptr) pool_->Return(block_);
    }
    char* data() { return block_.data; }
    const char* data() const { return block_.data; }
    // Whether the engine's allocator provided it (e.g. page-locked).
    bool from_allocator() const { return block_.from_allocator; }

   private:
    friend class BufferPool;
    struct Block {
      char* data = nullptr;
      uint64_t capacity = 0;  // bytes allocated
      bool from_allocator = false;
    };
    Buffer(BufferPool* pool, Block block) : pool_(pool), block_(block) {}
    BufferPool* pool_;
    Block block_;
  };

  explicit BufferPool(uint64_t max_idle_bytes, HostAllocator allocator = {})
      : max_idle_bytes_(max_idle_bytes), allocator_(std::move(allocator)) {}

  BufferPool(const BufferPool&) = delete;
  BufferPool& operator=(const BufferPool&) = delete;

  ~BufferPool() {
    for (const Block& b : idle_) Free(b);
  }

  // The smallest idle buffer that fits, else a new one (not zeroed);
  // RESOURCE_EXHAUSTED when memory for a new one cannot be had.
  absl::StatusOr<Buffer> Get(uint64_t size) {
    {
      absl::MutexLock lock(&mu_);
      int best = -1;
      for (int i = 0; i < static_cast<int>(idle_.size()); ++i) {
        if (idle_[i].capacity >= size &&
            (best < 0 || idle_[i].capacity < idle_[best].capacity)) {
          best = i;
        }
      }
      if (best >= 0) {
        const Block block = idle_[best];
        idle_.erase(idle_.begin() + best);
        idle_bytes_ -= block.capacity;
        return Buffer(this, block);
      }
    }
    Block block{nullptr, size, false};
    if (allocator_.allocate) {
      block.data = static_cast<char*>(allocator_.allocate(size));
      block.from_allocator = block.data != nullptr;
    }
    if (block.data == nullptr) {
      block.data = static_cast<char*>(::operator new[](size, std::nothrow));
    }
    if (block.data == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("cannot allocate a receive buffer of ", size, " bytes"));
    }
    return Buffer(this, block);
  }

  uint64_t idle_bytes() const {
    absl::MutexLock lock(&mu_);
    return idle_bytes_;
  }

 private:
  using Block = Buffer::Block;

  void Free(const Block& b) {
    if (b.from_allocator) {
      allocator_.free(b.data);
    } else {
      ::operator delete[](b.data);
    }
  }

  // Keeps the buffer unless that would exceed max_idle_bytes_; then frees
  // the smallest idle buffers first, since large ones save the most faults.
  void Return(const Block& block) {
    std::vector<Block> freed;
    {
      absl::MutexLock lock(&mu_);
      if (block.capacity > max_idle_bytes_) {
        freed.push_back(block);
      } else {
        idle_.push_back(block);
        idle_bytes_ += block.capacity;
        while (idle_bytes_ > max_idle_bytes_) {
          auto smallest = idle_.begin();
          for (auto it = idle_.begin(); it != idle_.end(); ++it) {
            if (it->capacity < smallest->capacity) smallest = it;
          }
          idle_bytes_ -= smallest->capacity;
          freed.push_back(*smallest);
          idle_.erase(smallest);
        }
      }
    }
    for (const Block& b : freed) Free(b);  // outside the lock: may be slow
  }

  const uint64_t max_idle_bytes_;
  const HostAllocator allocator_;
  mutable absl::Mutex mu_;
  std::vector<Block> idle_ ABSL_GUARDED_BY(mu_);
  uint64_t idle_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

// A budget of bytes shared by many holders, e.g. the received tensor bytes
// of every request in flight (max_buffered_bytes). Thread-safe.
class ByteBudget {
 public:
  explicit ByteBudget(uint64_t limit) : limit_(limit) {}

  ByteBudget(const ByteBudget&) = delete;
  ByteBudget& operator=(const ByteBudget&) = delete;

  // Takes `bytes` and returns true, or takes nothing and returns false when
  // the bytes in use would exceed the limit.
  bool TryTake(uint64_t bytes) {
    uint64_t used = used_.load();
    do {
      if (bytes > limit_ || used > limit_ - bytes) return false;
    } while (!used_.compare_exchange_weak(used, used + bytes));
    return true;
  }
  void Give(uint64_t bytes) { used_.fetch_sub(bytes); }

  uint64_t used() const { return used_.load(); }
  uint64_t limit() const { return limit_; }

  // Bytes taken from a budget, given back when destroyed.
  class Reservation {
   public:
    explicit Reservation(ByteBudget& budget) : budget_(budget) {}
    Reservation(const Reservation&) = delete;
    Reservation& operator=(const Reservation&) = delete;
    ~Reservation() { budget_.Give(bytes_); }

    // Takes `more` bytes; on false nothing was taken.
    bool Take(uint64_t more) {
      if (!budget_.TryTake(more)) return false;
      bytes_ += more;
      return true;
    }
    // Gives back `fewer` of the bytes taken.
    void Give(uint64_t fewer) {
      bytes_ -= fewer;
      budget_.Give(fewer);
    }
    uint64_t bytes() const { return bytes_; }

   private:
    ByteBudget& budget_;
    uint64_t bytes_ = 0;
  };

 private:
  const uint64_t limit_;
  std::atomic<uint64_t> used_{0};
};

}  // namespace rvd

#endif  // RVD_SERVER_BUFFER_POOL_H_

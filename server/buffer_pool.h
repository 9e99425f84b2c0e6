// Reusable host buffers for streamed tensors. A fresh multi-megabyte
// allocation is mmap'ed by malloc and every page faults on first touch,
// which cost more than the copy itself (measured: most of rvd's CPU time
// for a 128 MB stream). Buffers returned here keep their pages mapped for
// the next request, up to `max_idle_bytes` in total. With an engine's
// allocator (CUDA: page-locked memory, which the GPU copies from several
// times faster than from pageable memory) the buffers come from the engine;
// an allocation it refuses falls back to ordinary memory. Thread-safe.
#ifndef RVD_SERVER_BUFFER_POOL_H_
#define RVD_SERVER_BUFFER_POOL_H_

#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
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

  // The smallest idle buffer that fits, else a new one (not zeroed).
  Buffer Get(uint64_t size) {
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
    if (block.data == nullptr) block.data = new char[size];
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
      delete[] b.data;
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

}  // namespace rvd

#endif  // RVD_SERVER_BUFFER_POOL_H_

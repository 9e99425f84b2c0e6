// Reusable host buffers for streamed tensors. A fresh multi-megabyte
// allocation is mmap'ed by malloc and every page faults on first touch,
// which cost more than the copy itself (measured: most of rvd's CPU time
// for a 128 MB stream). Buffers returned here keep their pages mapped for
// the next request, up to `max_idle_bytes` in total. Thread-safe.
#ifndef RVD_SERVER_BUFFER_POOL_H_
#define RVD_SERVER_BUFFER_POOL_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace rvd {

class BufferPool {
 public:
  // A buffer of at least `size` bytes; goes back to its pool when destroyed.
  class Buffer {
   public:
    Buffer(Buffer&&) = default;
    ~Buffer() {
      if (pool_ != nullptr && bytes_ != nullptr) {
        pool_->Return(std::move(bytes_), capacity_);
      }
    }
    char* data() { return bytes_.get(); }
    const char* data() const { return bytes_.get(); }

   private:
    friend class BufferPool;
    Buffer(BufferPool* pool, std::unique_ptr<char[]> bytes, uint64_t capacity)
        : pool_(pool), bytes_(std::move(bytes)), capacity_(capacity) {}
    BufferPool* pool_;
    std::unique_ptr<char[]> bytes_;
    uint64_t capacity_;  // bytes allocated
  };

  explicit BufferPool(uint64_t max_idle_bytes)
      : max_idle_bytes_(max_idle_bytes) {}

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
        Idle idle = std::move(idle_[best]);
        idle_.erase(idle_.begin() + best);
        idle_bytes_ -= idle.capacity;
        return Buffer(this, std::move(idle.bytes), idle.capacity);
      }
    }
    return Buffer(this, std::unique_ptr<char[]>(new char[size]), size);
  }

  uint64_t idle_bytes() const {
    absl::MutexLock lock(&mu_);
    return idle_bytes_;
  }

 private:
  struct Idle {
    std::unique_ptr<char[]> bytes;
    uint64_t capacity;
  };

  // Keeps the buffer unless that would exceed max_idle_bytes_; then frees
  // the smallest idle buffers first, since large ones save the most faults.
  void Return(std::unique_ptr<char[]> bytes, uint64_t capacity) {
    absl::MutexLock lock(&mu_);
    if (capacity > max_idle_bytes_) return;  // freed here
    idle_.push_back({std::move(bytes), capacity});
    idle_bytes_ += capacity;
    while (idle_bytes_ > max_idle_bytes_) {
      auto smallest = idle_.begin();
      for (auto it = idle_.begin(); it != idle_.end(); ++it) {
        if (it->capacity < smallest->capacity) smallest = it;
      }
      idle_bytes_ -= smallest->capacity;
      idle_.erase(smallest);
    }
  }

  const uint64_t max_idle_bytes_;
  mutable absl::Mutex mu_;
  std::vector<Idle> idle_ ABSL_GUARDED_BY(mu_);
  uint64_t idle_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace rvd

#endif  // RVD_SERVER_BUFFER_POOL_H_

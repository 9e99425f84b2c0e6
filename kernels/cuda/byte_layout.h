// Laying several arrays out in one device or pinned buffer (private to
// kernels/cuda/): a Layout hands out 256-byte aligned offsets, At turns a
// base and an offset into a typed pointer.
#ifndef RVD_KERNELS_CUDA_BYTE_LAYOUT_H_
#define RVD_KERNELS_CUDA_BYTE_LAYOUT_H_

#include <cstdint>

namespace rvd::cuda {

class Layout {
 public:
  // The offset of `bytes` more, each piece starting 256-byte aligned.
  uint64_t Add(uint64_t bytes) {
    const uint64_t at = size_;
    size_ += (bytes + 255) / 256 * 256;
    return at;
  }
  uint64_t size() const { return size_; }

 private:
  uint64_t size_ = 0;
};

template <typename T>
T* At(void* base, uint64_t offset) {
  return reinterpret_cast<T*>(static_cast<unsigned char*>(base) + offset);
}
template <typename T>
const T* At(const void* base, uint64_t offset) {
  return reinterpret_cast<const T*>(static_cast<const unsigned char*>(base) + offset);
}

}  // namespace rvd::cuda

#endif  // RVD_KERNELS_CUDA_BYTE_LAYOUT_H_

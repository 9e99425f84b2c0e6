// The one conversion of an absl::Status into the module ABI's rvd_status
// (kernels/cuda_module.h), for every table entry of the module (private to
// kernels/cuda/). The message is cut to fit and always NUL-terminated.
#ifndef RVD_KERNELS_CUDA_ABI_STATUS_H_
#define RVD_KERNELS_CUDA_ABI_STATUS_H_

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "kernels/cuda_module.h"

namespace rvd::cuda_internal {

// Writes `s` into `*out` (nothing when out is NULL) and returns its code,
// so that an entry can end with `return SetAbiStatus(s, status);`.
inline int32_t SetAbiStatus(const absl::Status& s, rvd_status* out) {
  const auto code = static_cast<int32_t>(s.code());
  if (out == nullptr) return code;
  out->code = code;
  const absl::string_view msg = s.message();
  const size_t n = std::min(msg.size(), sizeof(out->message) - 1);
  std::memcpy(out->message, msg.data(), n);
  out->message[n] = '\0';
  return code;
}

}  // namespace rvd::cuda_internal

#endif  // RVD_KERNELS_CUDA_ABI_STATUS_H_

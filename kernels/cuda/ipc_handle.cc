// The byte formats of live-weight sharing (ipc_handle.h).
#include "kernels/cuda/ipc_handle.h"

#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace rvd::cuda {
namespace {

// ShareHeader's fields, little-endian as the producer's memory holds them
// (both ends run on the same host).
template <typename T>
T Read(absl::Span<const uint8_t> body, size_t offset) {
  T v;
  std::memcpy(&v, body.data() + offset, sizeof(T));
  return v;
}

absl::Status Bad(const std::string& what) {
  return absl::InvalidArgumentError(
      absl::StrCat("expandable-segment handle ('e'): ", what));
}

}  // namespace

absl::StatusOr<ExpandableShare> ParseExpandableShare(absl::Span<const uint8_t> body) {
  if (body.size() < kExpandableHeaderBytes) {
    return Bad(absl::StrCat(body.size(), " bytes; the header alone is ", kExpandableHeaderBytes,
                            " (pass the bytes after the 2-byte prefix)"));
  }
  ExpandableShare s;
  s.pid = Read<int32_t>(body, 0);
  s.segment_size = Read<uint64_t>(body, 8);
  s.pages = Read<uint64_t>(body, 16);
  if (s.pid <= 0) return Bad(absl::StrCat("producer pid ", s.pid));
  if (s.segment_size == 0) return Bad("segment_size 0");
  if (s.pages == 0 || s.pages > kMaxExpandablePages) {
    return Bad(absl::StrCat("num_handles ", s.pages, " (1 to ", kMaxExpandablePages, ")"));
  }
  if (s.segment_size > (uint64_t{1} << 63) / s.pages) {
    return Bad(absl::StrCat("segment_size ", s.segment_size, " x ", s.pages,
                            " pages exceeds 2^63 bytes"));
  }
  const size_t rest = body.size() - kExpandableHeaderBytes;
  if (rest == s.pages * sizeof(int32_t)) {
    for (uint64_t i = 0; i < s.pages; ++i) {
      const int32_t fd = Read<int32_t>(body, kExpandableHeaderBytes + i * sizeof(int32_t));
      if (fd < 0) return Bad(absl::StrCat("page ", i, ": file descriptor ", fd));
      s.fds.push_back(fd);
    }
  } else if (rest == s.pages * kFabricHandleBytes) {
    s.fabric = true;
  } else {
    return Bad(absl::StrCat(body.size(), " bytes for ", s.pages, " pages: expected ",
                            kExpandableHeaderBytes + s.pages * sizeof(int32_t),
                            " (file descriptors) or ",
                            kExpandableHeaderBytes + s.pages * kFabricHandleBytes,
                            " (fabric handles)"));
  }
  return s;
}

std::vector<uint8_t> SerializeExpandableShare(int32_t pid, uint64_t segment_size,
                                              absl::Span<const int32_t> fds) {
  std::vector<uint8_t> out(kExpandableHeaderBytes + fds.size() * sizeof(int32_t), 0);
  const uint64_t pages = fds.size();
  std::memcpy(out.data(), &pid, sizeof(pid));
  std::memcpy(out.data() + 8, &segment_size, sizeof(segment_size));
  std::memcpy(out.data() + 16, &pages, sizeof(pages));
  for (size_t i = 0; i < fds.size(); ++i) {
    std::memcpy(out.data() + kExpandableHeaderBytes + i * sizeof(int32_t), &fds[i],
                sizeof(int32_t));
  }
  return out;
}

std::string FormatGpuUuid(const unsigned char b[16]) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out = "GPU-";
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) out += '-';
    out += kHex[b[i] >> 4];
    out += kHex[b[i] & 0xf];
  }
  return out;
}

}  // namespace rvd::cuda

// libFuzzer target: SafetensorsFile::Open on arbitrary file contents.
//
// The input is the whole file. It is written to a memfd (no disk I/O per
// input) that Open reads through /proc/self/fd/N, the same open/fstat/mmap
// path as a real file. Besides "no crash, no sanitizer report", a successful
// Open must keep safetensors.h's promises, checked here against the input
// itself: every tensor's span lies inside the data section and holds the
// input's bytes there, spans are sorted and disjoint, byte counts match
// shape x dtype, and every accessor answers for every tensor. (ASan does
// not watch mmap'ed memory, so the spans are compared byte by byte: a span
// past the end of the file would fault here.)
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "client/cpp/safetensors.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

int InputFd() {
  static const int fd = memfd_create("fuzz.safetensors", MFD_CLOEXEC);
  return fd;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const int fd = InputFd();
  FUZZ_CHECK(fd >= 0);
  FUZZ_CHECK(ftruncate(fd, 0) == 0);
  FUZZ_CHECK(pwrite(fd, data, size, 0) == static_cast<ssize_t>(size));
  const std::string path = "/proc/self/fd/" + std::to_string(fd);

  absl::StatusOr<rvd::SafetensorsFile> file = rvd::SafetensorsFile::Open(path);
  if (!file.ok()) {
    FUZZ_CHECK(!file.status().message().empty());
    return 0;
  }
  FUZZ_CHECK(size >= 8);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | data[i];
  FUZZ_CHECK(header_len <= rvd::kMaxSafetensorsHeaderBytes);
  FUZZ_CHECK(header_len <= size - 8);
  const uint8_t* section = data + 8 + header_len;
  const uint64_t section_size = size - 8 - header_len;

  const auto& tensors = file->tensors();
  FUZZ_CHECK(file->TensorNames().size() == tensors.size());
  uint64_t prev_end = 0;
  for (const rvd::SafetensorsTensorInfo& info : tensors) {
    FUZZ_CHECK(info.begin >= prev_end);  // sorted and disjoint
    FUZZ_CHECK(info.begin <= section_size);
    FUZZ_CHECK(info.bytes <= section_size - info.begin);
    prev_end = info.begin + info.bytes;

    uint64_t count = 1;
    for (int64_t d : info.shape) {
      FUZZ_CHECK(d >= 0);
      FUZZ_CHECK(!__builtin_mul_overflow(count, static_cast<uint64_t>(d),
                                         &count));
    }
    std::optional<size_t> elem = rvd::SafetensorsDTypeSize(info.dtype_name);
    FUZZ_CHECK(elem.has_value());
    uint64_t want = 0;
    FUZZ_CHECK(!__builtin_mul_overflow(count, *elem, &want));
    FUZZ_CHECK(want == info.bytes);

    FUZZ_CHECK(file->Find(info.name) == &info);
    const uint8_t* bytes = file->Data(info);
    FUZZ_CHECK(info.bytes == 0 ||
               std::memcmp(bytes, section + info.begin, info.bytes) == 0);
    absl::StatusOr<rvd::SafetensorsTensor> t = file->RvdTensor(info.name);
    FUZZ_CHECK(t.ok() == info.supported());
    if (t.ok()) {
      FUZZ_CHECK(t->info == &info);
      FUZZ_CHECK(t->data == bytes);
      FUZZ_CHECK(rvd::DTypeSize(t->dtype) == *elem);
    }
  }
  // Moving keeps the data pointers (they point into the mapping).
  rvd::SafetensorsFile moved = *std::move(file);
  if (!moved.tensors().empty()) {
    const rvd::SafetensorsTensorInfo& last = moved.tensors().back();
    FUZZ_CHECK(last.bytes == 0 ||
               std::memcmp(moved.Data(last), section + last.begin,
                           last.bytes) == 0);
  }
  return 0;
}

// Reads (and, for fixtures, writes) .safetensors files.
//
// A safetensors file is: an 8-byte little-endian header length N, N bytes of
// JSON mapping each tensor name to {dtype, shape, data_offsets: [begin, end]}
// (plus an optional "__metadata__" object of strings), then the data section,
// to which the offsets are relative.
//
// SafetensorsFile::Open maps the file read-only and validates the whole
// header before exposing anything: every tensor's byte span must match its
// shape and dtype, lie inside the data section and overlap no other tensor.
// After a successful Open every accessor is safe to call on any tensor the
// file names. Tensors of dtypes rvd does not compute on (F64, I64, U8, BOOL,
// F8_E4M3, ...) are listed with `supported() == false`, so a loader can skip
// them; asking for one as a V tensor (RvdTensor) is an error naming the dtype.
//
// Data pointers point into the mapping: they stay valid while the
// SafetensorsFile (or the object it was moved into) lives. They are aligned
// only as the file aligns them; read elements with memcpy.
//
// Thread-safety: a SafetensorsFile is immutable after Open; any number of
// threads may read it at once.
#ifndef RVD_CLIENT_CPP_SAFETENSORS_H_
#define RVD_CLIENT_CPP_SAFETENSORS_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/engine.h"

namespace rvd {

// The largest header Open accepts (real headers are a few hundred KB).
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100ull << 20;

// Bytes per element of a safetensors dtype string ("F32", "BF16", "I64",
// ...), or nullopt for a string safetensors does not define.
std::optional<size_t> SafetensorsDTypeSize(std::string_view dtype);
// The rvd DType of a safetensors dtype string: F32, F16, BF16; else nullopt.
std::optional<DType> SafetensorsToDType(std::string_view dtype);
// The safetensors dtype string of an rvd DType ("F32", "F16", "BF16").
const char* DTypeToSafetensors(DType dtype);

// One tensor as the header describes it.
struct SafetensorsTensorInfo {
  std::string name;
  std::string dtype_name;      // as in the header, e.g. "BF16"
  std::optional<DType> dtype;  // nullopt: a dtype rvd does not compute on
  std::vector<int64_t> shape;  // may be empty (a scalar)
  uint64_t begin = 0;          // byte offset in the data section
  uint64_t bytes = 0;          // end - begin == prod(shape) * element size

  bool supported() const { return dtype.has_value(); }
};

// A tensor rvd can compute on: a supported dtype, and its bytes.
struct SafetensorsTensor {
  const SafetensorsTensorInfo* info = nullptr;
  DType dtype = DType::kF32;
  const uint8_t* data = nullptr;  // info->bytes bytes, inside the mapping
};

class SafetensorsFile {
 public:
  // Maps and validates `path`. Errors name the file and, where one is at
  // fault, the tensor: NOT_FOUND when the file does not exist; DATA_LOSS
  // when it is shorter than its header says (truncated, or empty);
  // INVALID_ARGUMENT for a malformed header (not JSON, unknown dtype, span
  // != shape x dtype, overlapping tensors, ...); the errno-derived code for
  // other I/O failures.
  static absl::StatusOr<SafetensorsFile> Open(const std::string& path);

  SafetensorsFile(SafetensorsFile&& other) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&& other) noexcept;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;
  ~SafetensorsFile();

  const std::string& path() const { return path_; }
  // Tensor names in data-offset order (the order of the data section).
  std::vector<std::string> TensorNames() const;
  // Every tensor, in data-offset order.
  const std::vector<SafetensorsTensorInfo>& tensors() const { return tensors_; }
  // The header's "__metadata__" (string values only), possibly empty.
  const std::map<std::string, std::string>& metadata() const {
    return metadata_;
  }
  // The tensor called `name`, or nullptr.
  const SafetensorsTensorInfo* Find(std::string_view name) const;
  // The first byte of `info`'s data (info must come from this file).
  const uint8_t* Data(const SafetensorsTensorInfo& info) const;
  // `name` as a tensor rvd can compute on. NOT_FOUND when absent,
  // INVALID_ARGUMENT when its dtype is not F32/F16/BF16 (naming the dtype).
  absl::StatusOr<SafetensorsTensor> RvdTensor(std::string_view name) const;

 private:
  SafetensorsFile() = default;
  void Unmap();

  std::string path_;
  const uint8_t* map_ = nullptr;  // the whole file, PROT_READ, MAP_PRIVATE
  size_t map_size_ = 0;           // bytes mapped (the file's size)
  size_t data_offset_ = 0;        // 8 + header length: start of data section
  std::vector<SafetensorsTensorInfo> tensors_;        // sorted by begin
  std::map<std::string, size_t, std::less<>> index_;  // name -> tensors_[i]
  std::map<std::string, std::string> metadata_;
};

// A tensor for WriteSafetensors.
struct SafetensorsEntry {
  std::string name;
  std::string dtype;  // a safetensors dtype string, e.g. "F32"
  std::vector<int64_t> shape;
  std::string bytes;  // prod(shape) * element size bytes
};

// Writes `entries` (in order, packed) as a safetensors file at `path`, with
// the header padded to a multiple of 8 bytes. INVALID_ARGUMENT when an
// entry's dtype is unknown, its byte count does not match its shape, or a
// name repeats; an I/O error when the file cannot be written.
absl::Status WriteSafetensors(
    const std::string& path, const std::vector<SafetensorsEntry>& entries,
    const std::map<std::string, std::string>& metadata = {});

}  // namespace rvd

#endif  // RVD_CLIENT_CPP_SAFETENSORS_H_

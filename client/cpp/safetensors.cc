// SafetensorsFile and WriteSafetensors. See safetensors.h.
#include "client/cpp/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"

namespace rvd {
namespace {

using Json = nlohmann::json;

struct DTypeEntry {
  std::string_view name;
  size_t size;
};

// Every dtype safetensors defines with a whole number of bytes per element.
constexpr DTypeEntry kDTypes[] = {
    {"BOOL", 1},    {"U8", 1},      {"I8", 1},  {"F8_E5M2", 1},
    {"F8_E4M3", 1}, {"F8_E8M0", 1}, {"I16", 2}, {"U16", 2},
    {"F16", 2},     {"BF16", 2},    {"I32", 4}, {"U32", 4},
    {"F32", 4},     {"F64", 8},     {"I64", 8}, {"U64", 8},
};

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// Parses one header entry into `info` (name already set). The returned
// message says what is wrong, without the file name; `*truncated` is set
// when the entry is fine but the file is too short for it.
std::string ParseEntry(const Json& entry, uint64_t data_size,
                       SafetensorsTensorInfo* info, bool* truncated) {
  if (!entry.is_object()) return "entry is not a JSON object";
  auto dtype = entry.find("dtype");
  if (dtype == entry.end() || !dtype->is_string()) {
    return "missing or non-string \"dtype\"";
  }
  info->dtype_name = dtype->get<std::string>();
  std::optional<size_t> elem = SafetensorsDTypeSize(info->dtype_name);
  if (!elem) return absl::StrCat("unknown dtype \"", info->dtype_name, "\"");
  info->dtype = SafetensorsToDType(info->dtype_name);

  auto shape = entry.find("shape");
  if (shape == entry.end() || !shape->is_array()) {
    return "missing or non-array \"shape\"";
  }
  uint64_t count = 1;
  for (const Json& dim : *shape) {
    if (!dim.is_number_unsigned()) {
      return absl::StrCat("shape ", shape->dump(),
                          " has a dimension that is not a non-negative "
                          "integer");
    }
    const uint64_t n = dim.get<uint64_t>();
    if (n > static_cast<uint64_t>(INT64_MAX) ||
        __builtin_mul_overflow(count, n, &count)) {
      return absl::StrCat("shape ", shape->dump(), " overflows");
    }
    info->shape.push_back(static_cast<int64_t>(n));
  }
  uint64_t want_bytes = 0;
  if (__builtin_mul_overflow(count, *elem, &want_bytes)) {
    return absl::StrCat("shape ", shape->dump(), " overflows");
  }

  auto offsets = entry.find("data_offsets");
  if (offsets == entry.end() || !offsets->is_array() || offsets->size() != 2 ||
      !(*offsets)[0].is_number_unsigned() ||
      !(*offsets)[1].is_number_unsigned()) {
    return "\"data_offsets\" is not [begin, end] of non-negative integers";
  }
  const uint64_t begin = (*offsets)[0].get<uint64_t>();
  const uint64_t end = (*offsets)[1].get<uint64_t>();
  if (begin > end) {
    return absl::StrCat("data_offsets [", begin, ", ", end,
                        "] has begin > end");
  }
  if (end > data_size) {
    *truncated = true;
    return absl::StrCat("data_offsets [", begin, ", ", end,
                        "] end beyond the data section (", data_size,
                        " bytes): file truncated?");
  }
  if (end - begin != want_bytes) {
    return absl::StrCat("data_offsets [", begin, ", ", end, "] span ",
                        end - begin, " bytes, but shape ",
                        ShapeString(info->shape), " of ", info->dtype_name,
                        " needs ", want_bytes);
  }
  info->begin = begin;
  info->bytes = want_bytes;
  return "";
}

}  // namespace

std::optional<size_t> SafetensorsDTypeSize(std::string_view dtype) {
  for (const DTypeEntry& e : kDTypes) {
    if (e.name == dtype) return e.size;
  }
  return std::nullopt;
}

std::optional<DType> SafetensorsToDType(std::string_view dtype) {
  if (dtype == "F32") return DType::kF32;
  if (dtype == "F16") return DType::kF16;
  if (dtype == "BF16") return DType::kBF16;
  return std::nullopt;
}

const char* DTypeToSafetensors(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "F32";
    case DType::kF16:
      return "F16";
    case DType::kBF16:
      return "BF16";
  }
  return "?";
}

absl::StatusOr<SafetensorsFile> SafetensorsFile::Open(const std::string& path) {
  SafetensorsFile file;
  file.path_ = path;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    return absl::ErrnoToStatus(err, absl::StrCat("cannot open ", path));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return absl::ErrnoToStatus(err, absl::StrCat("cannot stat ", path));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": not a regular file"));
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size < 8) {
    ::close(fd);
    return absl::DataLossError(
        absl::StrCat(path, ": ", size,
                     " bytes, too short for a safetensors file (at least 8)"));
  }
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int map_err = errno;
  ::close(fd);  // the mapping keeps the file open
  if (map == MAP_FAILED) {
    return absl::ErrnoToStatus(map_err, absl::StrCat("cannot map ", path));
  }
  file.map_ = static_cast<const uint8_t*>(map);
  file.map_size_ = size;

  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | file.map_[i];
  if (header_len > kMaxSafetensorsHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": header length ", header_len, " exceeds the limit of ",
        kMaxSafetensorsHeaderBytes, " bytes (not a safetensors file?)"));
  }
  if (header_len > size - 8) {
    return absl::DataLossError(absl::StrCat(
        path, ": header length ", header_len, " runs past the end of the ",
        size, "-byte file (truncated?)"));
  }
  file.data_offset_ = 8 + header_len;
  const uint64_t data_size = size - file.data_offset_;

  const char* text = reinterpret_cast<const char*>(file.map_ + 8);
  Json header;
  try {
    header = Json::parse(text, text + header_len);
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": header is not valid JSON: ", e.what()));
  }
  if (!header.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": header is not a JSON object"));
  }

  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it.value().is_object()) {
        return absl::InvalidArgumentError(
            absl::StrCat(path, ": \"__metadata__\" is not an object"));
      }
      for (auto m = it.value().begin(); m != it.value().end(); ++m) {
        if (m.value().is_string()) {
          file.metadata_[m.key()] = m.value().get<std::string>();
        }
      }
      continue;
    }
    SafetensorsTensorInfo info;
    info.name = it.key();
    bool truncated = false;
    std::string error = ParseEntry(it.value(), data_size, &info, &truncated);
    if (!error.empty()) {
      return absl::Status(
          truncated ? absl::StatusCode::kDataLoss
                    : absl::StatusCode::kInvalidArgument,
          absl::StrCat(path, ": tensor \"", info.name, "\": ", error));
    }
    file.tensors_.push_back(std::move(info));
  }

  std::sort(file.tensors_.begin(), file.tensors_.end(),
            [](const SafetensorsTensorInfo& a, const SafetensorsTensorInfo& b) {
              return a.begin != b.begin ? a.begin < b.begin : a.bytes < b.bytes;
            });
  for (size_t i = 1; i < file.tensors_.size(); ++i) {
    const SafetensorsTensorInfo& prev = file.tensors_[i - 1];
    const SafetensorsTensorInfo& cur = file.tensors_[i];
    if (cur.begin < prev.begin + prev.bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": tensors \"", prev.name, "\" [", prev.begin, ", ",
          prev.begin + prev.bytes, ") and \"", cur.name, "\" [", cur.begin,
          ", ", cur.begin + cur.bytes, ") overlap"));
    }
  }
  for (size_t i = 0; i < file.tensors_.size(); ++i) {
    file.index_.emplace(file.tensors_[i].name, i);
  }
  return file;
}

SafetensorsFile::SafetensorsFile(SafetensorsFile&& other) noexcept {
  *this = std::move(other);
}

SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& other) noexcept {
  if (this != &other) {
    Unmap();
    path_ = std::move(other.path_);
    map_ = std::exchange(other.map_, nullptr);
    map_size_ = std::exchange(other.map_size_, 0);
    data_offset_ = other.data_offset_;
    tensors_ = std::move(other.tensors_);
    index_ = std::move(other.index_);
    metadata_ = std::move(other.metadata_);
  }
  return *this;
}

SafetensorsFile::~SafetensorsFile() { Unmap(); }

void SafetensorsFile::Unmap() {
  if (map_ != nullptr) {
    ::munmap(const_cast<uint8_t*>(map_), map_size_);
    map_ = nullptr;
    map_size_ = 0;
  }
}

std::vector<std::string> SafetensorsFile::TensorNames() const {
  std::vector<std::string> names;
  names.reserve(tensors_.size());
  for (const SafetensorsTensorInfo& t : tensors_) names.push_back(t.name);
  return names;
}

const SafetensorsTensorInfo* SafetensorsFile::Find(
    std::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

const uint8_t* SafetensorsFile::Data(const SafetensorsTensorInfo& info) const {
  return map_ + data_offset_ + info.begin;
}

absl::StatusOr<SafetensorsTensor> SafetensorsFile::RvdTensor(
    std::string_view name) const {
  const SafetensorsTensorInfo* info = Find(name);
  if (info == nullptr) {
    return absl::NotFoundError(
        absl::StrCat(path_, ": no tensor \"", std::string(name), "\""));
  }
  if (!info->supported()) {
    return absl::InvalidArgumentError(absl::StrCat(
        path_, ": tensor \"", std::string(name), "\" has dtype ",
        info->dtype_name, "; rvd computes on F32, F16 and BF16 only"));
  }
  SafetensorsTensor t;
  t.info = info;
  t.dtype = *info->dtype;
  t.data = Data(*info);
  return t;
}

absl::Status WriteSafetensors(
    const std::string& path, const std::vector<SafetensorsEntry>& entries,
    const std::map<std::string, std::string>& metadata) {
  Json header = Json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const SafetensorsEntry& e : entries) {
    std::optional<size_t> elem = SafetensorsDTypeSize(e.dtype);
    if (!elem) {
      return absl::InvalidArgumentError(
          absl::StrCat("WriteSafetensors ", path, ": tensor \"", e.name,
                       "\" has unknown dtype \"", e.dtype, "\""));
    }
    uint64_t count = 1;
    for (int64_t d : e.shape) {
      if (d < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("WriteSafetensors ", path, ": tensor \"", e.name,
                         "\" has a negative dimension"));
      }
      count *= static_cast<uint64_t>(d);
    }
    if (count * *elem != e.bytes.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "WriteSafetensors ", path, ": tensor \"", e.name, "\" of shape ",
          ShapeString(e.shape), " and dtype ", e.dtype, " needs ",
          count * *elem, " bytes, got ", e.bytes.size()));
    }
    if (header.contains(e.name) || e.name == "__metadata__") {
      return absl::InvalidArgumentError(absl::StrCat(
          "WriteSafetensors ", path, ": duplicate tensor \"", e.name, "\""));
    }
    header[e.name] = {{"dtype", e.dtype},
                      {"shape", e.shape},
                      {"data_offsets", {offset, offset + e.bytes.size()}}};
    offset += e.bytes.size();
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');

  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) {
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot create ", path));
  }
  char len[8];
  uint64_t n = text.size();
  for (int i = 0; i < 8; ++i, n >>= 8) len[i] = static_cast<char>(n & 0xff);
  out.write(len, 8);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  for (const SafetensorsEntry& e : entries) {
    out.write(e.bytes.data(), static_cast<std::streamsize>(e.bytes.size()));
  }
  out.close();
  if (!out) {
    return absl::DataLossError(absl::StrCat("error writing ", path));
  }
  return absl::OkStatus();
}

}  // namespace rvd

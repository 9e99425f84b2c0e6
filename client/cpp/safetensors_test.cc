#include "client/cpp/safetensors.h"

#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace rvd {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("safetensors_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string PathOf(const std::string& name) { return (dir_ / name).string(); }

  // Writes the raw bytes of a (possibly broken) file.
  std::string WriteRaw(const std::string& name, const std::string& bytes) {
    std::string path = PathOf(name);
    std::ofstream(path, std::ios::binary) << bytes;
    return path;
  }

  // An 8-byte little-endian length, `header`, then `data`.
  std::string WriteWithHeader(const std::string& name,
                              const std::string& header,
                              const std::string& data, uint64_t len_field) {
    std::string bytes(8, '\0');
    for (int i = 0; i < 8; ++i)
      bytes[i] = static_cast<char>(len_field >> (8 * i));
    return WriteRaw(name, bytes + header + data);
  }
  std::string WriteWithHeader(const std::string& name,
                              const std::string& header,
                              const std::string& data) {
    return WriteWithHeader(name, header, data, header.size());
  }

  std::filesystem::path dir_;
};

std::string FloatBytes(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()),
                     v.size() * sizeof(float));
}

void ExpectError(const absl::StatusOr<SafetensorsFile>& f,
                 absl::StatusCode code,
                 const std::vector<std::string>& needles) {
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), code) << f.status();
  for (const std::string& n : needles) {
    EXPECT_THAT(f.status().message(), HasSubstr(n));
  }
}

TEST_F(SafetensorsTest, RoundTrip) {
  std::vector<float> w = {1.5f, -2.0f, 3.25f, 4.0f, 5.0f, 6.0f};
  std::string bf16 = {'\x80', '\x3f', '\x00', '\x40'};  // 1.0, 2.0
  std::string i64(3 * 8, '\x07');
  std::string path = PathOf("m.safetensors");
  ASSERT_TRUE(WriteSafetensors(path,
                               {{"a.weight", "F32", {2, 3}, FloatBytes(w)},
                                {"b.weight", "BF16", {2}, bf16},
                                {"positions", "I64", {3}, i64},
                                {"empty", "F16", {0, 4}, ""}},
                               {{"format", "pt"}})
                  .ok());

  absl::StatusOr<SafetensorsFile> f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->path(), path);
  EXPECT_THAT(f->TensorNames(),
              ElementsAre("a.weight", "b.weight", "positions", "empty"));
  EXPECT_EQ(f->metadata().at("format"), "pt");

  const SafetensorsTensorInfo* a = f->Find("a.weight");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->dtype_name, "F32");
  EXPECT_EQ(a->dtype, DType::kF32);
  EXPECT_THAT(a->shape, ElementsAre(2, 3));
  EXPECT_EQ(a->bytes, 24u);
  std::vector<float> got(6);
  std::memcpy(got.data(), f->Data(*a), 24);
  EXPECT_EQ(got, w);

  absl::StatusOr<SafetensorsTensor> b = f->RvdTensor("b.weight");
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->dtype, DType::kBF16);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(b->data), 4), bf16);

  const SafetensorsTensorInfo* pos = f->Find("positions");
  ASSERT_NE(pos, nullptr);
  EXPECT_FALSE(pos->supported());
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(f->Data(*pos)), 24), i64);
  absl::StatusOr<SafetensorsTensor> bad = f->RvdTensor("positions");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(),
              AllOf(HasSubstr("I64"), HasSubstr("positions"), HasSubstr(path)));

  absl::StatusOr<SafetensorsTensor> missing = f->RvdTensor("nope");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(f->Find("nope"), nullptr);

  // Moving keeps the mapping (and the pointers into it) alive.
  const uint8_t* data = f->Data(*a);
  SafetensorsFile moved = std::move(*f);
  EXPECT_EQ(moved.Data(*moved.Find("a.weight")), data);
  EXPECT_EQ(std::memcmp(data, w.data(), 24), 0);
}

TEST_F(SafetensorsTest, HeaderIsPaddedToEightBytes) {
  std::string path = PathOf("p.safetensors");
  ASSERT_TRUE(
      WriteSafetensors(path, {{"x", "F32", {1}, FloatBytes({1.0f})}}).ok());
  std::ifstream in(path, std::ios::binary);
  uint8_t len[8];
  in.read(reinterpret_cast<char*>(len), 8);
  EXPECT_EQ(len[0] % 8, 0);
}

TEST_F(SafetensorsTest, WriterRejectsBadEntries) {
  EXPECT_EQ(WriteSafetensors(PathOf("w"), {{"x", "F32", {2}, "abc"}}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(WriteSafetensors(PathOf("w"), {{"x", "Q4", {1}, "a"}}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(WriteSafetensors(PathOf("w"),
                             {{"x", "U8", {1}, "a"}, {"x", "U8", {1}, "b"}})
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(SafetensorsTest, MissingFile) {
  ExpectError(SafetensorsFile::Open(PathOf("absent.safetensors")),
              absl::StatusCode::kNotFound, {"absent.safetensors"});
}

TEST_F(SafetensorsTest, EmptyFile) {
  ExpectError(SafetensorsFile::Open(WriteRaw("e.safetensors", "")),
              absl::StatusCode::kDataLoss, {"e.safetensors", "too short"});
}

TEST_F(SafetensorsTest, Directory) {
  ExpectError(SafetensorsFile::Open(dir_.string()),
              absl::StatusCode::kInvalidArgument, {"not a regular file"});
}

TEST_F(SafetensorsTest, TruncatedFile) {
  std::string path = PathOf("t.safetensors");
  ASSERT_TRUE(
      WriteSafetensors(path, {{"x", "F32", {4}, FloatBytes({1, 2, 3, 4})}})
          .ok());
  std::filesystem::resize_file(path, std::filesystem::file_size(path) - 4);
  ExpectError(SafetensorsFile::Open(path), absl::StatusCode::kDataLoss,
              {"t.safetensors", "\"x\"", "beyond the data section"});
}

TEST_F(SafetensorsTest, HeaderLengthBeyondFile) {
  std::string header =
      R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
  ExpectError(SafetensorsFile::Open(WriteWithHeader(
                  "h.safetensors", header, std::string(4, '\0'), 10000)),
              absl::StatusCode::kDataLoss,
              {"h.safetensors", "header length 10000"});
}

TEST_F(SafetensorsTest, HugeHeaderLength) {
  ExpectError(SafetensorsFile::Open(
                  WriteWithHeader("g.safetensors", "{}", "", 1ull << 40)),
              absl::StatusCode::kInvalidArgument, {"exceeds the limit"});
}

TEST_F(SafetensorsTest, NonJsonHeader) {
  ExpectError(SafetensorsFile::Open(
                  WriteWithHeader("j.safetensors", "{\"x\": [1, 2", "")),
              absl::StatusCode::kInvalidArgument,
              {"j.safetensors", "not valid JSON"});
  ExpectError(
      SafetensorsFile::Open(WriteWithHeader("k.safetensors", "[1]", "")),
      absl::StatusCode::kInvalidArgument, {"not a JSON object"});
}

TEST_F(SafetensorsTest, OffsetsBeyondFile) {
  std::string header =
      R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})";
  ExpectError(SafetensorsFile::Open(WriteWithHeader("o.safetensors", header,
                                                    std::string(8, '\0'))),
              absl::StatusCode::kDataLoss,
              {"o.safetensors", "\"x\"", "[4, 12]"});
}

TEST_F(SafetensorsTest, BeginAfterEnd) {
  std::string header =
      R"({"x":{"dtype":"U8","shape":[0],"data_offsets":[4,2]}})";
  ExpectError(SafetensorsFile::Open(WriteWithHeader("b.safetensors", header,
                                                    std::string(8, '\0'))),
              absl::StatusCode::kInvalidArgument, {"begin > end"});
}

TEST_F(SafetensorsTest, SpanDoesNotMatchShape) {
  std::string header =
      R"({"w":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,8]}})";
  ExpectError(SafetensorsFile::Open(WriteWithHeader("s.safetensors", header,
                                                    std::string(16, '\0'))),
              absl::StatusCode::kInvalidArgument,
              {"\"w\"", "8 bytes", "[2, 3]", "BF16", "needs 12"});
}

TEST_F(SafetensorsTest, UnknownDType) {
  std::string header =
      R"({"w":{"dtype":"Q4_K","shape":[2],"data_offsets":[0,2]}})";
  ExpectError(SafetensorsFile::Open(WriteWithHeader("u.safetensors", header,
                                                    std::string(2, '\0'))),
              absl::StatusCode::kInvalidArgument,
              {"u.safetensors", "\"w\"", "unknown dtype \"Q4_K\""});
}

TEST_F(SafetensorsTest, BadShapes) {
  for (std::string shape :
       {"[-1]", "[1.5]", "\"3\"", "[4294967296,4294967296,16]"}) {
    std::string header =
        R"({"w":{"dtype":"U8","shape":)" + shape + R"(,"data_offsets":[0,1]}})";
    ExpectError(SafetensorsFile::Open(WriteWithHeader("d.safetensors", header,
                                                      std::string(1, '\0'))),
                absl::StatusCode::kInvalidArgument, {"\"w\"", "shape"});
  }
}

TEST_F(SafetensorsTest, MissingFields) {
  for (std::string entry :
       {R"({"shape":[1],"data_offsets":[0,1]})",
        R"({"dtype":"U8","data_offsets":[0,1]})",
        R"({"dtype":"U8","shape":[1]})",
        R"({"dtype":"U8","shape":[1],"data_offsets":[0]})", R"(7)"}) {
    ExpectError(SafetensorsFile::Open(WriteWithHeader(
                    "f.safetensors", "{\"w\":" + entry + "}", "x")),
                absl::StatusCode::kInvalidArgument, {"\"w\""});
  }
}

TEST_F(SafetensorsTest, OverlappingTensors) {
  std::string header =
      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
      R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})";
  ExpectError(SafetensorsFile::Open(WriteWithHeader("v.safetensors", header,
                                                    std::string(12, '\0'))),
              absl::StatusCode::kInvalidArgument,
              {"\"a\"", "\"b\"", "overlap"});
}

TEST_F(SafetensorsTest, MetadataMustBeAnObject) {
  ExpectError(SafetensorsFile::Open(WriteWithHeader(
                  "m.safetensors", R"({"__metadata__":[1]})", "")),
              absl::StatusCode::kInvalidArgument, {"__metadata__"});
}

TEST_F(SafetensorsTest, HeaderOnlyFileIsValid) {
  absl::StatusOr<SafetensorsFile> f =
      SafetensorsFile::Open(WriteWithHeader("z.safetensors", "{}  ", ""));
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_TRUE(f->tensors().empty());
}

}  // namespace
}  // namespace rvd

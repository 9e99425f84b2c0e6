// libFuzzer target: LoadModel's parsing of a checkpoint directory's
// config.json and model.safetensors.index.json (and, optionally, its
// weights), against the compiled-in architecture table.
//
// LoadModel reads files only, so each input becomes a model directory in a
// private temporary directory. The input is up to three sections separated
// by the line "--8<--":
//
//   config.json [--8<-- model.safetensors.index.json [--8<-- weights]]
//
// An empty section means "no such file". Without an index the weights are
// model.safetensors: the third section's bytes, or when that is empty a
// fixed llama checkpoint (4 layers, 2 kv heads of 4 rows, hidden size 16,
// F32 v_proj; also q_proj and an I64 tensor). The fixed shards
// model-00001-of-00002.safetensors (layers 0, 1) and
// model-00002-of-00002.safetensors (layers 2, 3) are always present for an
// index to name. A successful load must keep model_loader.h's promises:
// layers 0 .. L-1 in order, each V tensor's bytes inside its file's
// mapping, and SliceV's views inside the tensor (or its gathered copy).
#include <fcntl.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "client/cpp/model_loader.h"
#include "client/cpp/safetensors.h"
#include "kernels/v_layout.h"
#include "tests/fuzz/fuzz_check.h"
#include "tests/fuzz/view_check.h"

namespace {

namespace fs = std::filesystem;

constexpr std::string_view kSeparator = "\n--8<--\n";

struct Fixture {
  std::string dir;
  std::string default_weights;  // the fixed model.safetensors' bytes
  rvd::ArchitectureTable table;
};

std::string F32Bytes(int64_t count, float scale) {
  std::string bytes(count * sizeof(float), '\0');
  for (int64_t i = 0; i < count; ++i) {
    const float v = scale * static_cast<float>((i * 7919) % 101 - 50);
    std::memcpy(&bytes[i * sizeof(float)], &v, sizeof(float));
  }
  return bytes;
}

std::vector<rvd::SafetensorsEntry> LayerEntries(int layer) {
  const std::string prefix = "model.layers." + std::to_string(layer);
  return {{prefix + ".self_attn.v_proj.weight", "F32", {8, 16},
           F32Bytes(8 * 16, 0.01f * (layer + 1))},
          {prefix + ".self_attn.q_proj.weight", "F32", {16, 16},
           F32Bytes(16 * 16, 0.02f)}};
}

void WriteFixture(const std::string& path,
                  const std::vector<rvd::SafetensorsEntry>& entries) {
  FUZZ_CHECK(rvd::WriteSafetensors(path, entries).ok());
}

std::string ReadFile(const std::string& path) {
  std::error_code ec;
  const uintmax_t size = fs::file_size(path, ec);
  FUZZ_CHECK(!ec);
  std::string bytes(size, '\0');
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  FUZZ_CHECK(fd >= 0);
  FUZZ_CHECK(read(fd, bytes.data(), size) == static_cast<ssize_t>(size));
  close(fd);
  return bytes;
}

const Fixture& GetFixture() {
  static const Fixture* const fixture = [] {
    auto* f = new Fixture;
    const char* tmp = std::getenv("TMPDIR");
    std::string tmpl = std::string(tmp != nullptr ? tmp : "/tmp") +
                       "/rvd-fuzz-model-loader-XXXXXX";
    FUZZ_CHECK(mkdtemp(tmpl.data()) != nullptr);
    f->dir = tmpl;
    std::vector<rvd::SafetensorsEntry> all, first, second;
    for (int layer = 0; layer < 4; ++layer) {
      for (rvd::SafetensorsEntry& e : LayerEntries(layer)) {
        all.push_back(e);
        (layer < 2 ? first : second).push_back(std::move(e));
      }
    }
    all.push_back({"model.embed_tokens.weight", "I64", {3, 4},
                   std::string(12 * 8, '\0')});
    WriteFixture(f->dir + "/model-00001-of-00002.safetensors", first);
    WriteFixture(f->dir + "/model-00002-of-00002.safetensors", second);
    const std::string single = f->dir + "/default.safetensors";
    WriteFixture(single, all);
    f->default_weights = ReadFile(single);
    fs::remove(single);
    absl::StatusOr<rvd::ArchitectureTable> table =
        rvd::DefaultArchitectureTable();
    FUZZ_CHECK(table.ok());
    f->table = *std::move(table);
    return f;
  }();
  return *fixture;
}

void RemoveFixture() {
  std::error_code ignored;
  fs::remove_all(GetFixture().dir, ignored);
}

// Writes `bytes` to dir/name, or removes dir/name when `bytes` is empty.
void Place(const std::string& dir, const char* name, std::string_view bytes) {
  const std::string path = dir + "/" + name;
  unlink(path.c_str());
  if (bytes.empty()) return;
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC,
                      0600);
  FUZZ_CHECK(fd >= 0);
  FUZZ_CHECK(write(fd, bytes.data(), bytes.size()) ==
             static_cast<ssize_t>(bytes.size()));
  close(fd);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  GetFixture();
  std::atexit(RemoveFixture);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const Fixture& fixture = GetFixture();
  std::string_view input(reinterpret_cast<const char*>(data), size);
  std::string_view sections[3];
  for (int i = 0; i < 2; ++i) {
    const size_t at = input.find(kSeparator);
    if (at == input.npos) break;
    sections[i] = input.substr(0, at);
    input.remove_prefix(at + kSeparator.size());
    if (i == 1) sections[2] = input;
  }
  if (sections[0].data() == nullptr) {
    sections[0] = input;  // no separator: the whole input is config.json
  } else if (sections[2].data() == nullptr) {
    sections[1] = input;  // one separator: config.json, index
  }
  const std::string_view weights =
      sections[2].empty() ? std::string_view(fixture.default_weights)
                          : sections[2];
  Place(fixture.dir, "config.json", sections[0]);
  Place(fixture.dir, "model.safetensors.index.json", sections[1]);
  Place(fixture.dir, "model.safetensors", sections[1].empty() ? weights : "");

  absl::StatusOr<rvd::LoadedModel> model =
      rvd::LoadModel(fixture.dir, fixture.table, {});
  if (!model.ok()) {
    FUZZ_CHECK(!model.status().message().empty());
    return 0;
  }
  FUZZ_CHECK(model->num_layers > 0);
  FUZZ_CHECK(model->tensors.size() == model->num_layers);
  for (size_t i = 0; i < model->tensors.size(); ++i) {
    const rvd::ModelTensor& t = model->tensors[i];
    FUZZ_CHECK(t.layer == i);
    FUZZ_CHECK(t.rows > 0 && t.cols > 0);
    uint64_t bytes = 0;
    FUZZ_CHECK(!__builtin_mul_overflow(
        static_cast<uint64_t>(t.rows) * static_cast<uint64_t>(t.cols),
        rvd::DTypeSize(t.dtype), &bytes));
    FUZZ_CHECK(bytes == t.bytes);
    // The bytes are the named tensor's, inside one of the mapped files.
    const rvd::SafetensorsTensorInfo* info = nullptr;
    for (const rvd::SafetensorsFile& f : model->files) {
      if (f.path() == t.file) info = f.Find(t.name);
      if (info != nullptr) {
        FUZZ_CHECK(f.Data(*info) == t.data);
        FUZZ_CHECK(info->bytes == t.bytes);
        break;
      }
    }
    FUZZ_CHECK(info != nullptr);
    FUZZ_CHECK(t.geometry.num_heads > 0 && t.geometry.num_kv_heads > 0 &&
               t.geometry.head_dim > 0);
    absl::StatusOr<rvd::VSlices> slices =
        rvd::SliceV(rvd::AsTensorView(t), t.layout, t.geometry);
    FUZZ_CHECK(slices.ok());  // LoadModel checked every tensor with SliceV
    FUZZ_CHECK(static_cast<int64_t>(slices->heads.size()) ==
               t.geometry.num_kv_heads);
    const void* base = slices->gathered.empty() ? t.data
                                                : slices->gathered.data();
    const size_t span =
        slices->gathered.empty() ? t.bytes : slices->gathered.size();
    FUZZ_CHECK(rvd_fuzz::ViewWithin(slices->layer, base, span));
    for (const rvd::MatrixView& head : slices->heads) {
      FUZZ_CHECK(rvd_fuzz::ViewWithin(head, base, span));
    }
  }
  return 0;
}

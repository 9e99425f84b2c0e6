// Finds the V projection of every layer of a Hugging Face checkpoint.
//
// A checkpoint is a model directory (config.json plus model.safetensors, or
// the shards that model.safetensors.index.json lists) or a single
// .safetensors file. config/architectures.yaml, parsed into an
// ArchitectureTable, says for each `model_type` which tensors hold V, in
// which VLayout, and which config.json keys give the head geometry.
// LoadModel maps the files, picks one V tensor per layer, derives the
// geometry, and checks every tensor with SliceV, so that a wrong layout or
// geometry fails here, before anything is sent to rvd.
//
//   absl::StatusOr<ArchitectureTable> table = DefaultArchitectureTable();
//   absl::StatusOr<LoadedModel> model = LoadModel(dir, *table, {});
//   for (const ModelTensor& t : model->tensors) { ... t.data, t.bytes ... }
//
// Thread-safety: an ArchitectureTable and a LoadedModel are immutable once
// built; any number of threads may read them.
#ifndef RVD_CLIENT_CPP_MODEL_LOADER_H_
#define RVD_CLIENT_CPP_MODEL_LOADER_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "client/cpp/safetensors.h"
#include "kernels/engine.h"
#include "kernels/v_layout.h"

namespace rvd {

// config/architectures.yaml, compiled in.
extern const std::string_view kArchitecturesYaml;

// config.json keys to read each geometry quantity from, in order of
// preference (absent and null keys are skipped).
struct GeometryKeys {
  std::vector<std::string> num_heads;     // H
  std::vector<std::string> num_kv_heads;  // K; none found: K = H
  std::vector<std::string> head_dim;      // d; none found: hidden_size / H
  std::vector<std::string> hidden_size;   // none found: tensor input dim
  std::vector<std::string> num_layers;    // checked when found
};

// A layout that applies when every `when` key of config.json has the given
// value (values compared as text: true, false, 3, "abc" -> abc).
struct LayoutVariant {
  std::map<std::string, std::string> when;  // empty: always applies
  VLayout layout = VLayout::kSeparate;
};

// One entry of architectures.yaml.
struct Architecture {
  std::string model_type;
  std::vector<std::string> aliases;
  std::vector<std::string> tensor_patterns;  // each has one "{layer}"
  std::vector<LayoutVariant> variants;       // first match wins; not empty
  std::map<std::string, std::string> config_defaults;  // for absent keys
  GeometryKeys geometry;  // default_geometry with this entry's overrides
};

class ArchitectureTable {
 public:
  // The entry for `model_type` (or one of its aliases), or nullptr.
  const Architecture* Find(std::string_view model_type) const;
  // Every model_type, sorted (aliases not included).
  std::vector<std::string> ModelTypes() const;
  // The geometry keys of architectures without an entry.
  const GeometryKeys& default_geometry() const { return default_geometry_; }

 private:
  friend absl::StatusOr<ArchitectureTable> LoadArchitectureTable(
      std::string_view yaml_text);

  GeometryKeys default_geometry_;
  std::map<std::string, Architecture, std::less<>> by_type_;
  std::map<std::string, std::string, std::less<>> alias_to_type_;
};

// Parses architectures.yaml text. INVALID_ARGUMENT for malformed YAML, an
// unknown key or layout name, or a pattern without exactly one "{layer}";
// the message says where.
absl::StatusOr<ArchitectureTable> LoadArchitectureTable(
    std::string_view yaml_text);
// The same, from a file (NOT_FOUND when it does not exist).
absl::StatusOr<ArchitectureTable> LoadArchitectureTableFile(
    const std::string& path);
// The compiled-in table, kArchitecturesYaml.
absl::StatusOr<ArchitectureTable> DefaultArchitectureTable();

// One layer's V tensor, as stored in the checkpoint.
struct ModelTensor {
  std::string name;    // checkpoint tensor name
  std::string file;    // the .safetensors file holding it
  uint32_t layer = 0;  // 0-based
  DType dtype = DType::kF32;
  int64_t rows = 0;  // stored shape [rows, cols]
  int64_t cols = 0;
  VLayout layout = VLayout::kSeparate;
  HeadGeometry geometry;          // checked against the shape with SliceV
  const uint8_t* data = nullptr;  // rows * cols elements inside the mapping;
                                  // valid while the LoadedModel lives
  size_t bytes = 0;
};

// A checkpoint's V tensors. Move-only; owns the mapped files, so keep it
// alive while ModelTensor::data is used (moving it keeps `data` valid).
struct LoadedModel {
  std::string model_type;  // the architecture used; "" for the fallback
  uint32_t num_layers = 0;
  std::vector<ModelTensor> tensors;  // one per layer, sorted by layer
  // How the geometry was obtained, for messages and verbose output, e.g.
  // "num_heads=32 (num_attention_heads), num_kv_heads=8
  // (num_key_value_heads), head_dim=128 (hidden_size 4096 / 32)".
  std::string geometry_source;
  std::vector<SafetensorsFile> files;  // the mapped checkpoint files
};

struct LoadOptions {
  // The model_type to use instead of config.json's; required (or the name
  // search fallback is used) when there is no config.json.
  std::string arch;
  // Geometry overrides, > 0 to apply; needed without config.json (head_dim
  // may then be left 0: hidden size / num_heads from the tensor).
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  // When set, every file LoadModel reads (config.json, the shard index, each
  // .safetensors file) is first passed through it, and the path it returns
  // is the one opened; an error ends the load with that error. The daemon's
  // checkpoint-root policy (server/path_policy.h) is one.
  std::function<absl::StatusOr<std::string>(const std::string& path)>
      resolve_file;
};

// Loads the V tensors of the checkpoint at `path`: a directory holding
// config.json (optional) and model.safetensors or
// model.safetensors.index.json, or a single .safetensors file (never paired
// with a config.json: give options.arch and the geometry).
// Errors: NOT_FOUND when the path or its weights do not exist, or no V
// tensor is found (the message lists some tensor names); INVALID_ARGUMENT
// for an unknown options.arch, missing or inconsistent geometry, a V tensor
// of a dtype other than F32/F16/BF16, a shape that does not fit the layout
// (the message names the tensor, file, layout and geometry); DATA_LOSS when
// layers are missing; safetensors errors as SafetensorsFile::Open returns.
absl::StatusOr<LoadedModel> LoadModel(const std::string& path,
                                      const ArchitectureTable& table,
                                      const LoadOptions& options);

// `t` as SliceV's input.
TensorView AsTensorView(const ModelTensor& t);

}  // namespace rvd

#endif  // RVD_CLIENT_CPP_MODEL_LOADER_H_

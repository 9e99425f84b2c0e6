// ArchitectureTable and LoadModel. See model_loader.h.
#include "client/cpp/model_loader.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"
#include "yaml-cpp/yaml.h"

namespace rvd {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

// How many tensor names an error lists before "...".
constexpr size_t kMaxNamesInError = 20;

// ---------------------------------------------------------------------------
// architectures.yaml

// yaml-cpp reports errors by throwing; every YAML access happens inside
// ParseTable's try block, and these helpers throw YAML-style errors too.
struct TableError {
  std::string message;
};

std::vector<std::string> StringList(const YAML::Node& node,
                                    const std::string& where) {
  if (node.IsScalar()) return {node.as<std::string>()};
  if (!node.IsSequence()) {
    throw TableError{absl::StrCat(where, ": expected a string or a list")};
  }
  std::vector<std::string> out;
  for (const YAML::Node& item : node) {
    if (!item.IsScalar()) {
      throw TableError{absl::StrCat(where, ": expected a list of strings")};
    }
    out.push_back(item.as<std::string>());
  }
  return out;
}

std::map<std::string, std::string> ScalarMap(const YAML::Node& node,
                                             const std::string& where) {
  if (!node.IsMap()) throw TableError{absl::StrCat(where, ": expected a map")};
  std::map<std::string, std::string> out;
  for (const auto& kv : node) {
    if (!kv.second.IsScalar()) {
      throw TableError{absl::StrCat(where, ".", kv.first.as<std::string>(),
                                    ": expected a scalar")};
    }
    out[kv.first.as<std::string>()] = kv.second.as<std::string>();
  }
  return out;
}

void CheckKeys(const YAML::Node& node, const std::set<std::string>& known,
               const std::string& where) {
  if (!node.IsMap()) throw TableError{absl::StrCat(where, ": expected a map")};
  for (const auto& kv : node) {
    const std::string key = kv.first.as<std::string>();
    if (known.count(key) == 0) {
      throw TableError{absl::StrCat(where, ": unknown key \"", key,
                                    "\"; known: ", absl::StrJoin(known, ", "))};
    }
  }
}

// Overwrites the fields of `keys` that `node` names.
void ReadGeometryKeys(const YAML::Node& node, const std::string& where,
                      GeometryKeys* keys) {
  CheckKeys(
      node,
      {"num_heads", "num_kv_heads", "head_dim", "hidden_size", "num_layers"},
      where);
  auto read = [&](const char* field, std::vector<std::string>* out) {
    if (node[field]) {
      *out = StringList(node[field], absl::StrCat(where, ".", field));
    }
  };
  read("num_heads", &keys->num_heads);
  read("num_kv_heads", &keys->num_kv_heads);
  read("head_dim", &keys->head_dim);
  read("hidden_size", &keys->hidden_size);
  read("num_layers", &keys->num_layers);
}

VLayout LayoutOf(const YAML::Node& node, const std::string& where) {
  absl::StatusOr<VLayout> layout = ParseVLayout(node.as<std::string>());
  if (!layout.ok()) {
    throw TableError{
        absl::StrCat(where, ": ", std::string(layout.status().message()))};
  }
  return *layout;
}

Architecture ReadArchitecture(const std::string& type, const YAML::Node& node,
                              const GeometryKeys& defaults) {
  const std::string where = absl::StrCat("architectures.", type);
  CheckKeys(node,
            {"aliases", "tensors", "layout", "variants", "config_defaults",
             "geometry"},
            where);
  Architecture arch;
  arch.model_type = type;
  arch.geometry = defaults;
  if (node["aliases"]) {
    arch.aliases = StringList(node["aliases"], where + ".aliases");
  }
  if (!node["tensors"]) throw TableError{where + ": \"tensors\" is missing"};
  arch.tensor_patterns = StringList(node["tensors"], where + ".tensors");
  if (arch.tensor_patterns.empty()) {
    throw TableError{where + ".tensors: empty"};
  }
  for (const std::string& p : arch.tensor_patterns) {
    const size_t at = p.find("{layer}");
    if (at == std::string::npos || p.find("{layer}", at + 1) != p.npos) {
      throw TableError{absl::StrCat(where, ".tensors: \"", p,
                                    "\" must contain {layer} exactly once")};
    }
  }
  if (node["layout"] && node["variants"]) {
    throw TableError{where + ": give either \"layout\" or \"variants\""};
  }
  if (node["layout"]) {
    arch.variants.push_back({{}, LayoutOf(node["layout"], where + ".layout")});
  } else if (node["variants"]) {
    const YAML::Node& variants = node["variants"];
    if (!variants.IsSequence() || variants.size() == 0) {
      throw TableError{where + ".variants: expected a non-empty list"};
    }
    for (size_t i = 0; i < variants.size(); ++i) {
      const std::string vwhere = absl::StrCat(where, ".variants[", i, "]");
      CheckKeys(variants[i], {"when", "layout"}, vwhere);
      if (!variants[i]["layout"]) {
        throw TableError{vwhere + ": \"layout\" is missing"};
      }
      LayoutVariant v;
      v.layout = LayoutOf(variants[i]["layout"], vwhere + ".layout");
      if (variants[i]["when"]) {
        v.when = ScalarMap(variants[i]["when"], vwhere + ".when");
      }
      arch.variants.push_back(std::move(v));
    }
  } else {
    throw TableError{where + ": \"layout\" (or \"variants\") is missing"};
  }
  if (node["config_defaults"]) {
    arch.config_defaults =
        ScalarMap(node["config_defaults"], where + ".config_defaults");
  }
  if (node["geometry"]) {
    ReadGeometryKeys(node["geometry"], where + ".geometry", &arch.geometry);
  }
  return arch;
}

// ---------------------------------------------------------------------------
// config.json

// A config.json value as text, to compare with a `when` value of the YAML.
std::optional<std::string> ScalarText(const Json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_boolean() || v.is_number()) return v.dump();
  return std::nullopt;
}

// The first of `keys` that `config` holds (not null) as a positive integer:
// {value, key}. nullopt when none is present; INVALID_ARGUMENT when the first
// present one is not a positive integer.
absl::StatusOr<std::optional<std::pair<int64_t, std::string>>> ConfigInt(
    const Json& config, const std::vector<std::string>& keys,
    const std::string& config_path) {
  if (!config.is_object()) return std::nullopt;
  for (const std::string& key : keys) {
    auto it = config.find(key);
    if (it == config.end() || it->is_null()) continue;
    if (!it->is_number_integer() || it->get<int64_t>() <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(config_path, ": \"", key, "\" is ", it->dump(),
                       ", expected a positive integer"));
    }
    return std::make_pair(it->get<int64_t>(), key);
  }
  return std::nullopt;
}

absl::StatusOr<Json> ReadJsonFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::stringstream text;
  text << in.rdbuf();
  try {
    Json j = Json::parse(text.str());
    if (!j.is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": not a JSON object"));
    }
    return j;
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": not valid JSON: ", e.what()));
  }
}

// ---------------------------------------------------------------------------
// Finding the V tensors

// A tensor of the checkpoint and the file that holds it.
struct Located {
  const SafetensorsTensorInfo* info;
  const SafetensorsFile* file;
};

// The layer number of `name` under `pattern` ("a.{layer}.b"), or nullopt.
std::optional<uint32_t> MatchPattern(const std::string& pattern,
                                     const std::string& name) {
  const size_t at = pattern.find("{layer}");
  const std::string_view prefix(pattern.data(), at);
  const std::string_view suffix(pattern.data() + at + 7,
                                pattern.size() - at - 7);
  if (name.size() <= prefix.size() + suffix.size()) return std::nullopt;
  if (name.compare(0, prefix.size(), prefix) != 0 ||
      name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) {
    return std::nullopt;
  }
  const std::string_view digits(name.data() + prefix.size(),
                                name.size() - prefix.size() - suffix.size());
  if (digits.size() > 9) return std::nullopt;
  uint32_t layer = 0;
  for (char c : digits) {
    if (!std::isdigit(static_cast<unsigned char>(c))) return std::nullopt;
    layer = layer * 10 + static_cast<uint32_t>(c - '0');
  }
  return layer;
}

// For the fallback: "a.12.b.v_proj.weight" -> "a.{layer}.b.v_proj.weight"
// (its first all-digit component is the layer), when the name looks like a
// per-layer V weight; else nullopt.
std::optional<std::string> FallbackPattern(const std::string& name) {
  constexpr std::string_view kWeight = ".weight";
  if (name.size() <= kWeight.size() ||
      name.compare(name.size() - kWeight.size(), kWeight.size(), kWeight) !=
          0) {
    return std::nullopt;
  }
  if (name.find("v_proj") == name.npos && name.find("value") == name.npos) {
    return std::nullopt;
  }
  size_t start = 0;
  while (start < name.size()) {
    size_t end = name.find('.', start);
    if (end == name.npos) end = name.size();
    const bool digits =
        end > start &&
        std::all_of(name.begin() + start, name.begin() + end, [](char c) {
          return std::isdigit(static_cast<unsigned char>(c));
        });
    if (digits) {
      return absl::StrCat(name.substr(0, start), "{layer}", name.substr(end));
    }
    start = end + 1;
  }
  return std::nullopt;
}

std::string SomeNames(const std::map<std::string, Located>& all) {
  std::vector<std::string> names;
  for (const auto& [name, loc] : all) {
    if (names.size() == kMaxNamesInError) {
      names.push_back(absl::StrCat("... (", all.size(), " in all)"));
      break;
    }
    names.push_back(name);
  }
  return names.empty() ? "(none)" : absl::StrJoin(names, ", ");
}

// The shard files of a model directory.
// The path to open for `path`: options.resolve_file's answer, or `path`.
absl::StatusOr<std::string> PathToOpen(const LoadOptions& options,
                                       const std::string& path) {
  if (!options.resolve_file) return path;
  return options.resolve_file(path);
}

absl::StatusOr<std::vector<std::string>> ShardPaths(
    const fs::path& dir, const LoadOptions& options) {
  const fs::path index = dir / "model.safetensors.index.json";
  std::error_code ec;
  if (fs::exists(index, ec)) {
    absl::StatusOr<std::string> index_path = PathToOpen(options, index.string());
    if (!index_path.ok()) return index_path.status();
    absl::StatusOr<Json> j = ReadJsonFile(*index_path);
    if (!j.ok()) return j.status();
    auto map = j->find("weight_map");
    if (map == j->end() || !map->is_object() || map->empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          index.string(), ": no \"weight_map\" object of tensor -> file"));
    }
    std::set<std::string> files;
    for (auto it = map->begin(); it != map->end(); ++it) {
      if (!it.value().is_string()) {
        return absl::InvalidArgumentError(
            absl::StrCat(index.string(), ": weight_map[\"", it.key(),
                         "\"] is not a string"));
      }
      const std::string file = it.value().get<std::string>();
      const fs::path rel(file);
      if (file.empty() || rel.is_absolute() ||
          std::find(rel.begin(), rel.end(), fs::path("..")) != rel.end()) {
        return absl::InvalidArgumentError(
            absl::StrCat(index.string(), ": shard \"", file,
                         "\" is not a path inside the model directory"));
      }
      files.insert(file);
    }
    std::vector<std::string> paths;
    for (const std::string& f : files) paths.push_back((dir / f).string());
    return paths;
  }
  const fs::path single = dir / "model.safetensors";
  if (fs::exists(single, ec)) return std::vector<std::string>{single.string()};
  std::string hint;
  if (fs::exists(dir / "pytorch_model.bin", ec) ||
      fs::exists(dir / "pytorch_model.bin.index.json", ec)) {
    hint =
        " (it has pytorch_model.bin: rvd reads safetensors only; convert "
        "the checkpoint, e.g. with save_pretrained(safe_serialization="
        "True))";
  }
  return absl::NotFoundError(absl::StrCat(dir.string(),
                                          ": neither model.safetensors nor "
                                          "model.safetensors.index.json",
                                          hint));
}

// The layout an architecture uses for `config` (variants in order).
absl::StatusOr<VLayout> PickLayout(const Architecture& arch,
                                   const Json& config) {
  for (const LayoutVariant& v : arch.variants) {
    bool match = true;
    for (const auto& [key, want] : v.when) {
      std::optional<std::string> have;
      auto it = config.is_object() ? config.find(key) : config.end();
      if (config.is_object() && it != config.end() && !it->is_null()) {
        have = ScalarText(*it);
      } else if (auto d = arch.config_defaults.find(key);
                 d != arch.config_defaults.end()) {
        have = d->second;
      }
      if (have != want) {
        match = false;
        break;
      }
    }
    if (match) return v.layout;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "architecture ", arch.model_type,
      ": no layout variant matches config.json; add one without \"when\""));
}

// Derives H, K, d (see architectures.yaml) and says how in *source.
absl::StatusOr<HeadGeometry> DeriveGeometry(
    const GeometryKeys& keys, const Json& config,
    const std::string& config_path, const LoadOptions& options, VLayout layout,
    int64_t tensor_hidden, std::string* source) {
  HeadGeometry g;
  std::vector<std::string> how;

  if (options.num_heads > 0) {
    g.num_heads = options.num_heads;
    how.push_back(absl::StrCat("num_heads=", g.num_heads, " (option)"));
  } else {
    auto v = ConfigInt(config, keys.num_heads, config_path);
    if (!v.ok()) return v.status();
    if (!v->has_value()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cannot tell the number of attention heads: ",
          config_path.empty()
              ? std::string("no config.json")
              : absl::StrCat(config_path, " has none of [",
                             absl::StrJoin(keys.num_heads, ", "), "]"),
          "; give num_heads (rvctl --num-heads)"));
    }
    g.num_heads = (*v)->first;
    how.push_back(
        absl::StrCat("num_heads=", g.num_heads, " (", (*v)->second, ")"));
  }

  if (options.num_kv_heads > 0) {
    g.num_kv_heads = options.num_kv_heads;
    how.push_back(absl::StrCat("num_kv_heads=", g.num_kv_heads, " (option)"));
  } else if (std::optional<int64_t> k = ForcedKvHeads(layout, g.num_heads)) {
    // The layout's own kv head count (kernels/v_layout.h owns the rule).
    g.num_kv_heads = *k;
    how.push_back(absl::StrCat("num_kv_heads=", g.num_kv_heads, " (layout ",
                               VLayoutName(layout), ")"));
  } else {
    auto v = ConfigInt(config, keys.num_kv_heads, config_path);
    if (!v.ok()) return v.status();
    if (v->has_value()) {
      g.num_kv_heads = (*v)->first;
      how.push_back(absl::StrCat("num_kv_heads=", g.num_kv_heads, " (",
                                 (*v)->second, ")"));
    } else {
      g.num_kv_heads = g.num_heads;
      how.push_back(
          absl::StrCat("num_kv_heads=", g.num_kv_heads, " (= num_heads)"));
    }
  }

  if (options.head_dim > 0) {
    g.head_dim = options.head_dim;
    how.push_back(absl::StrCat("head_dim=", g.head_dim, " (option)"));
  } else {
    auto v = ConfigInt(config, keys.head_dim, config_path);
    if (!v.ok()) return v.status();
    if (v->has_value()) {
      g.head_dim = (*v)->first;
      how.push_back(
          absl::StrCat("head_dim=", g.head_dim, " (", (*v)->second, ")"));
    } else {
      auto hidden = ConfigInt(config, keys.hidden_size, config_path);
      if (!hidden.ok()) return hidden.status();
      const int64_t d_model =
          hidden->has_value() ? (*hidden)->first : tensor_hidden;
      const std::string from =
          hidden->has_value() ? (*hidden)->second : "the tensor's input size";
      if (d_model % g.num_heads != 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("hidden size ", d_model, " (", from,
                         ") is not a multiple of num_heads ", g.num_heads,
                         "; give head_dim (rvctl --head-dim)"));
      }
      g.head_dim = d_model / g.num_heads;
      how.push_back(absl::StrCat("head_dim=", g.head_dim, " (", from, " ",
                                 d_model, " / ", g.num_heads, ")"));
    }
  }
  *source = absl::StrJoin(how, ", ");
  return g;
}

}  // namespace

// ---------------------------------------------------------------------------

const Architecture* ArchitectureTable::Find(std::string_view model_type) const {
  auto it = by_type_.find(model_type);
  if (it != by_type_.end()) return &it->second;
  auto alias = alias_to_type_.find(model_type);
  if (alias == alias_to_type_.end()) return nullptr;
  return &by_type_.find(alias->second)->second;
}

std::vector<std::string> ArchitectureTable::ModelTypes() const {
  std::vector<std::string> types;
  for (const auto& [type, arch] : by_type_) types.push_back(type);
  return types;
}

absl::StatusOr<ArchitectureTable> LoadArchitectureTable(
    std::string_view yaml_text) {
  ArchitectureTable table;
  try {
    const YAML::Node root = YAML::Load(std::string(yaml_text));
    CheckKeys(root, {"default_geometry", "architectures"},
              "architectures.yaml");
    if (root["default_geometry"]) {
      ReadGeometryKeys(root["default_geometry"], "default_geometry",
                       &table.default_geometry_);
    }
    const YAML::Node archs = root["architectures"];
    if (!archs || !archs.IsMap()) {
      throw TableError{"\"architectures\" map is missing"};
    }
    for (const auto& kv : archs) {
      const std::string type = kv.first.as<std::string>();
      if (table.by_type_.count(type) || table.alias_to_type_.count(type)) {
        throw TableError{absl::StrCat("model_type ", type, " appears twice")};
      }
      Architecture arch =
          ReadArchitecture(type, kv.second, table.default_geometry_);
      for (const std::string& alias : arch.aliases) {
        if (table.by_type_.count(alias) ||
            !table.alias_to_type_.emplace(alias, type).second) {
          throw TableError{absl::StrCat("alias ", alias, " appears twice")};
        }
      }
      table.by_type_.emplace(type, std::move(arch));
    }
  } catch (const TableError& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("architecture table: ", e.message));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("architecture table: ", e.what()));
  }
  return table;
}

absl::StatusOr<ArchitectureTable> LoadArchitectureTableFile(
    const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::stringstream text;
  text << in.rdbuf();
  absl::StatusOr<ArchitectureTable> table = LoadArchitectureTable(text.str());
  if (!table.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": ", std::string(table.status().message())));
  }
  return table;
}

absl::StatusOr<ArchitectureTable> DefaultArchitectureTable() {
  return LoadArchitectureTable(kArchitecturesYaml);
}

TensorView AsTensorView(const ModelTensor& t) {
  TensorView v;
  v.data = t.data;
  v.rows = t.rows;
  v.cols = t.cols;
  v.dtype = t.dtype;
  return v;
}

absl::StatusOr<LoadedModel> LoadModel(const std::string& path,
                                      const ArchitectureTable& table,
                                      const LoadOptions& options) {
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (!fs::exists(st)) {
    return absl::NotFoundError(
        absl::StrCat(path, ": no such file or directory"));
  }

  // 1. The files: config.json (optional) and the safetensors shards.
  LoadedModel model;
  Json config;  // null without config.json
  std::string config_path;
  std::vector<std::string> shard_paths;
  if (fs::is_directory(st)) {
    const fs::path dir(path);
    if (fs::exists(dir / "config.json", ec)) {
      config_path = (dir / "config.json").string();
      absl::StatusOr<std::string> open_path = PathToOpen(options, config_path);
      if (!open_path.ok()) return open_path.status();
      absl::StatusOr<Json> j = ReadJsonFile(*open_path);
      if (!j.ok()) return j.status();
      config = *std::move(j);
    }
    absl::StatusOr<std::vector<std::string>> shards = ShardPaths(dir, options);
    if (!shards.ok()) return shards.status();
    shard_paths = *std::move(shards);
  } else {
    shard_paths.push_back(path);
  }
  model.files.reserve(shard_paths.size());
  for (const std::string& p : shard_paths) {
    absl::StatusOr<std::string> open_path = PathToOpen(options, p);
    if (!open_path.ok()) return open_path.status();
    absl::StatusOr<SafetensorsFile> f = SafetensorsFile::Open(*open_path);
    if (!f.ok()) return f.status();
    model.files.push_back(*std::move(f));
  }
  // Reserved above, so these pointers into model.files stay put.
  std::map<std::string, Located> all;
  for (const SafetensorsFile& f : model.files) {
    for (const SafetensorsTensorInfo& info : f.tensors()) {
      auto [it, fresh] = all.emplace(info.name, Located{&info, &f});
      if (!fresh) {
        return absl::InvalidArgumentError(
            absl::StrCat("tensor \"", info.name, "\" is in both ",
                         it->second.file->path(), " and ", f.path()));
      }
    }
  }

  // 2. The architecture: options.arch, else config.json's model_type.
  std::string model_type = options.arch;
  if (model_type.empty() && config.is_object()) {
    if (auto it = config.find("model_type");
        it != config.end() && it->is_string()) {
      model_type = it->get<std::string>();
    }
  }
  const Architecture* arch = nullptr;
  if (!model_type.empty()) {
    arch = table.Find(model_type);
    if (arch == nullptr && !options.arch.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown architecture \"", options.arch,
                       "\"; known: ", absl::StrJoin(table.ModelTypes(), ", ")));
    }
  }

  // 3. The V tensors: the first pattern that matches, or the fallback's.
  std::vector<std::string> patterns;
  std::string pattern_source;
  if (arch != nullptr) {
    patterns = arch->tensor_patterns;
    pattern_source = absl::StrCat("architecture ", arch->model_type);
  } else {
    std::set<std::string> found;
    for (const auto& [name, loc] : all) {
      if (std::optional<std::string> p = FallbackPattern(name))
        found.insert(*p);
    }
    if (found.size() > 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": model_type \"", model_type,
          "\" is not in the architecture table and the V tensors are "
          "ambiguous; candidates: ",
          absl::StrJoin(found, ", "),
          "; add the architecture to architectures.yaml or give --arch"));
    }
    patterns.assign(found.begin(), found.end());
    pattern_source = absl::StrCat("the name search (model_type \"", model_type,
                                  "\" has no table entry)");
  }
  std::string used_pattern;
  std::map<uint32_t, const Located*> by_layer;
  for (const std::string& pattern : patterns) {
    for (const auto& [name, loc] : all) {
      if (std::optional<uint32_t> layer = MatchPattern(pattern, name)) {
        by_layer[*layer] = &loc;
      }
    }
    if (!by_layer.empty()) {
      used_pattern = pattern;
      break;
    }
  }
  if (by_layer.empty()) {
    return absl::NotFoundError(absl::StrCat(
        path, ": no V tensors found by ", pattern_source,
        patterns.empty()
            ? std::string(" (no tensor named *v_proj*.weight or "
                          "*value*.weight with a layer number)")
            : absl::StrCat(" (patterns: ", absl::StrJoin(patterns, ", "), ")"),
        "; tensors: ", SomeNames(all)));
  }

  // 4. Layers: 0 .. L-1, each present.
  const uint32_t num_layers = by_layer.rbegin()->first + 1;
  if (by_layer.size() != num_layers) {
    std::vector<uint32_t> missing;
    for (uint32_t l = 0; l < num_layers && missing.size() < 20; ++l) {
      if (!by_layer.count(l)) missing.push_back(l);
    }
    return absl::DataLossError(
        absl::StrCat(path, ": V tensors (", used_pattern,
                     ") missing for layers ", absl::StrJoin(missing, ", "),
                     " of ", num_layers, " (a shard missing?)"));
  }
  const GeometryKeys& keys =
      arch != nullptr ? arch->geometry : table.default_geometry();
  {
    auto declared = ConfigInt(config, keys.num_layers, config_path);
    if (!declared.ok()) return declared.status();
    if (declared->has_value() && (*declared)->first != num_layers) {
      return absl::DataLossError(absl::StrCat(
          path, ": ", config_path, " says ", (*declared)->second, "=",
          (*declared)->first, " but V tensors (", used_pattern,
          ") were found for ", num_layers, " layers"));
    }
  }

  // 5. Layout and geometry; every tensor checked with SliceV.
  VLayout layout = VLayout::kSeparate;
  if (arch != nullptr) {
    absl::StatusOr<VLayout> l = PickLayout(*arch, config);
    if (!l.ok()) return l.status();
    layout = *l;
  }
  model.model_type = arch != nullptr ? arch->model_type : "";
  model.num_layers = num_layers;
  for (const auto& [layer, loc] : by_layer) {
    const SafetensorsTensorInfo& info = *loc->info;
    absl::StatusOr<SafetensorsTensor> t = loc->file->RvdTensor(info.name);
    if (!t.ok()) return t.status();
    if (info.shape.size() != 2) {
      return absl::InvalidArgumentError(
          absl::StrCat(loc->file->path(), ": V tensor \"", info.name, "\" has ",
                       info.shape.size(), " dimensions, expected 2"));
    }
    ModelTensor mt;
    mt.name = info.name;
    mt.file = loc->file->path();
    mt.layer = layer;
    mt.dtype = t->dtype;
    mt.rows = info.shape[0];
    mt.cols = info.shape[1];
    mt.layout = layout;
    mt.data = t->data;
    mt.bytes = info.bytes;
    model.tensors.push_back(std::move(mt));
  }
  const ModelTensor& first = model.tensors.front();
  const int64_t tensor_hidden =
      layout == VLayout::kGpt2Conv1D ? first.rows : first.cols;
  absl::StatusOr<HeadGeometry> geometry =
      DeriveGeometry(keys, config, config_path, options, layout, tensor_hidden,
                     &model.geometry_source);
  if (!geometry.ok()) {
    return absl::Status(geometry.status().code(),
                        absl::StrCat(path, ": ", geometry.status().message()));
  }
  for (ModelTensor& t : model.tensors) {
    t.geometry = *geometry;
    absl::StatusOr<VSlices> slices =
        SliceV(AsTensorView(t), layout, t.geometry);
    if (!slices.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          t.file, ": V tensor \"", t.name, "\" (layer ", t.layer, ", ",
          model.model_type.empty() ? "name search" : model.model_type, "): ",
          slices.status().message(), "; geometry: ", model.geometry_source));
    }
  }
  return model;
}

}  // namespace rvd

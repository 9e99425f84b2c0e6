#include "client/cpp/model_loader.h"

#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "client/cpp/safetensors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/v_layout.h"
#include "nlohmann/json.hpp"

namespace rvd {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;
using ::testing::AllOf;
using ::testing::HasSubstr;

// --- Building checkpoints ----------------------------------------------------
//
// Every layer's V is a [K*d, D] matrix (the nn.Linear form) whose element
// (r, c) is 100000 * (layer + 1) + r * D + c; Q and K rows are negative. A
// builder assembles the stored tensor from V the way each architecture's
// Hugging Face modeling code reads it, and the checks compare what SliceV
// cuts out of the loaded tensor with V.

float VValue(int64_t layer, int64_t r, int64_t c, int64_t hidden) {
  return static_cast<float>(100000 * (layer + 1) + r * hidden + c);
}
float QkValue(int64_t layer, int64_t row, int64_t c, int64_t hidden) {
  return -VValue(layer, row, c, hidden);
}

// Encodes floats as `dtype` ("F32" or "BF16": exact for these integers only
// when small, so BF16 checks compare encodings, never decoded values).
std::string Encode(const std::vector<float>& v, const std::string& dtype) {
  if (dtype == "F32") {
    return std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4);
  }
  std::string out(v.size() * 2, '\0');
  for (size_t i = 0; i < v.size(); ++i) {
    uint32_t bits;
    std::memcpy(&bits, &v[i], 4);
    const uint16_t hi = static_cast<uint16_t>(bits >> 16);
    std::memcpy(&out[i * 2], &hi, 2);
  }
  return out;
}

// Stored row i of a row layout is V row `v_row[i]` (>= 0) or a Q/K row.
struct RowPlan {
  std::vector<int64_t> v_row;  // -1: a Q or K row
};

// The rows of each fused layout, from the modeling code's view()/split().
RowPlan PlanRows(VLayout layout, int64_t h, int64_t k, int64_t d) {
  RowPlan p;
  auto qk = [&](int64_t n) { p.v_row.insert(p.v_row.end(), n, -1); };
  auto v = [&](int64_t head) {
    for (int64_t i = 0; i < d; ++i) p.v_row.push_back(head * d + i);
  };
  switch (layout) {
    case VLayout::kSeparate:  // v_proj
      for (int64_t g = 0; g < k; ++g) v(g);
      break;
    case VLayout::kPhi3Qkv:  // qkv[..., :Hd] | [Hd, Hd+Kd) | [Hd+Kd, ...)
      qk(h * d);
      qk(k * d);
      for (int64_t g = 0; g < k; ++g) v(g);
      break;
    case VLayout::kGptNeoxQkv:     // view(..., H, 3d).split(d)
    case VLayout::kFalconClassic:  // view(..., H, 3, d)
      for (int64_t g = 0; g < h; ++g) {
        qk(2 * d);
        v(g);
      }
      break;
    case VLayout::kFalconMultiQuery:  // view(..., H + 2, d): Q.., k, v
      qk(h * d + d);
      v(0);
      break;
    case VLayout::kFalconGrouped:  // view(..., K, H/K + 2, d)
      for (int64_t g = 0; g < k; ++g) {
        qk((h / k + 1) * d);
        v(g);
      }
      break;
    case VLayout::kGpt2Conv1D:
      break;
  }
  return p;
}

// The stored V tensor of `layer`, as a safetensors entry.
SafetensorsEntry VTensor(const std::string& name, VLayout layout, int64_t h,
                         int64_t k, int64_t d, int64_t hidden, int64_t layer,
                         const std::string& dtype = "F32") {
  std::vector<float> values;
  std::vector<int64_t> shape;
  if (layout == VLayout::kGpt2Conv1D) {
    // Conv1D weight [in = D, out = 3D]: out columns Q | K | V; V's output
    // unit j is column 2D + j, so weight[i][2D + j] = V[j][i].
    shape = {hidden, 3 * hidden};
    for (int64_t i = 0; i < hidden; ++i) {
      for (int64_t c = 0; c < 3 * hidden; ++c) {
        values.push_back(c >= 2 * hidden
                             ? VValue(layer, c - 2 * hidden, i, hidden)
                             : QkValue(layer, c, i, hidden));
      }
    }
  } else {
    RowPlan plan = PlanRows(layout, h, k, d);
    shape = {static_cast<int64_t>(plan.v_row.size()), hidden};
    for (size_t r = 0; r < plan.v_row.size(); ++r) {
      for (int64_t c = 0; c < hidden; ++c) {
        values.push_back(plan.v_row[r] >= 0
                             ? VValue(layer, plan.v_row[r], c, hidden)
                             : QkValue(layer, r, c, hidden));
      }
    }
  }
  return {name, dtype, shape, Encode(values, dtype)};
}

SafetensorsEntry Filler(const std::string& name, std::vector<int64_t> shape,
                        const std::string& dtype = "F32") {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return {name, dtype, shape,
          std::string(n * *SafetensorsDTypeSize(dtype), '\x11')};
}

std::string Replace(std::string pattern, int64_t layer) {
  return pattern.replace(pattern.find("{layer}"), 7, std::to_string(layer));
}

class ModelLoaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("model_loader_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    absl::StatusOr<ArchitectureTable> t = DefaultArchitectureTable();
    ASSERT_TRUE(t.ok()) << t.status();
    table_ = *std::move(t);
  }
  void TearDown() override { fs::remove_all(dir_); }

  void WriteConfig(const Json& config) {
    std::ofstream(dir_ / "config.json") << config.dump(2);
  }
  void WriteSingle(const std::vector<SafetensorsEntry>& entries,
                   const std::string& name = "model.safetensors") {
    ASSERT_TRUE(WriteSafetensors((dir_ / name).string(), entries).ok());
  }
  // Splits `entries` into `shards` consecutive runs; writes the index.
  void WriteSharded(const std::vector<SafetensorsEntry>& entries, int shards) {
    std::vector<std::vector<SafetensorsEntry>> parts(shards);
    Json index = {{"metadata", {{"total_size", 0}}},
                  {"weight_map", Json::object()}};
    for (size_t i = 0; i < entries.size(); ++i) {
      const size_t s = i * shards / entries.size();
      const std::string file = "model-0000" + std::to_string(s + 1) +
                               "-of-0000" + std::to_string(shards) +
                               ".safetensors";
      parts[s].push_back(entries[i]);
      index["weight_map"][entries[i].name] = file;
    }
    for (int s = 0; s < shards; ++s) {
      WriteSingle(parts[s], "model-0000" + std::to_string(s + 1) + "-of-0000" +
                                std::to_string(shards) + ".safetensors");
    }
    std::ofstream(dir_ / "model.safetensors.index.json") << index.dump();
  }

  absl::StatusOr<LoadedModel> Load(const LoadOptions& options = {}) {
    return LoadModel(dir_.string(), table_, options);
  }

  fs::path dir_;
  ArchitectureTable table_;
};

// Checks the layers, layout and geometry of `m`, and that SliceV of every
// tensor gives back that layer's V (whole and per head), element by element.
void ExpectModel(const LoadedModel& m, const std::string& model_type,
                 int64_t layers, VLayout layout, HeadGeometry g, int64_t hidden,
                 const std::string& dtype = "F32") {
  EXPECT_EQ(m.model_type, model_type);
  ASSERT_EQ(m.num_layers, layers);
  ASSERT_EQ(m.tensors.size(), static_cast<size_t>(layers));
  const size_t es = *SafetensorsDTypeSize(dtype);
  for (int64_t l = 0; l < layers; ++l) {
    const ModelTensor& t = m.tensors[l];
    SCOPED_TRACE(t.name);
    EXPECT_EQ(t.layer, l);
    EXPECT_EQ(t.layout, layout);
    EXPECT_EQ(t.geometry.num_heads, g.num_heads);
    EXPECT_EQ(t.geometry.num_kv_heads, g.num_kv_heads);
    EXPECT_EQ(t.geometry.head_dim, g.head_dim);
    EXPECT_EQ(t.dtype, *SafetensorsToDType(dtype));
    EXPECT_EQ(t.bytes, static_cast<size_t>(t.rows * t.cols) * es);
    absl::StatusOr<VSlices> v = SliceV(AsTensorView(t), t.layout, t.geometry);
    ASSERT_TRUE(v.ok()) << v.status();
    const int64_t vrows = g.num_kv_heads * g.head_dim;
    const bool transposed = layout == VLayout::kGpt2Conv1D;
    ASSERT_EQ(v->heads.size(), static_cast<size_t>(g.num_kv_heads));
    for (int64_t r = 0; r < vrows; ++r) {
      for (int64_t c = 0; c < hidden; ++c) {
        const std::string want = Encode({VValue(l, r, c, hidden)}, dtype);
        // Element (r, c) of V is at (c, r) of the gpt2 views.
        const int64_t h = r / g.head_dim, hr = r % g.head_dim;
        const MatrixView& lv = v->layer;
        const MatrixView& hv = v->heads[h];
        const auto* lp = static_cast<const char*>(lv.data) +
                         (transposed ? c * lv.ld + r : r * lv.ld + c) * es;
        const auto* hp = static_cast<const char*>(hv.data) +
                         (transposed ? c * hv.ld + hr : hr * hv.ld + c) * es;
        ASSERT_EQ(std::string(lp, es), want)
            << "layer view V(" << r << "," << c << ")";
        ASSERT_EQ(std::string(hp, es), want)
            << "head " << h << " V(" << r << "," << c << ")";
      }
    }
  }
}

// A llama-like checkpoint: V plus q/k/o projections, an MLP weight, a bias,
// and an I64 tensor that the loader must skip.
std::vector<SafetensorsEntry> SeparateCheckpoint(
    const std::string& pattern, int64_t layers, int64_t h, int64_t k, int64_t d,
    int64_t hidden, const std::string& dtype = "F32") {
  std::vector<SafetensorsEntry> e;
  e.push_back(Filler("model.embed_tokens.weight", {10, hidden}, dtype));
  e.push_back(Filler("model.position_ids", {1, 7}, "I64"));
  for (int64_t l = 0; l < layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l);
    e.push_back(Filler(p + ".self_attn.q_proj.weight", {h * d, hidden}, dtype));
    e.push_back(Filler(p + ".self_attn.k_proj.weight", {k * d, hidden}, dtype));
    e.push_back(VTensor(Replace(pattern, l), VLayout::kSeparate, h, k, d,
                        hidden, l, dtype));
    e.push_back(Filler(p + ".self_attn.v_proj.bias", {k * d}, dtype));
    e.push_back(Filler(p + ".self_attn.o_proj.weight", {hidden, h * d}, dtype));
    e.push_back(Filler(p + ".mlp.up_proj.weight", {2 * hidden, hidden}, dtype));
  }
  return e;
}

const char kVProj[] = "model.layers.{layer}.self_attn.v_proj.weight";

// --- Architectures ---------------------------------------------------------

TEST_F(ModelLoaderTest, Llama) {
  WriteConfig({{"model_type", "llama"},
               {"architectures", {"LlamaForCausalLM"}},
               {"hidden_size", 12},
               {"num_attention_heads", 4},
               {"num_key_value_heads", 2},
               {"num_hidden_layers", 3},
               {"intermediate_size", 24},
               {"rms_norm_eps", 1e-5}});
  WriteSingle(SeparateCheckpoint(kVProj, 3, 4, 2, 3, 12));
  absl::StatusOr<LoadedModel> m = Load();
  ASSERT_TRUE(m.ok()) << m.status();
  ExpectModel(*m, "llama", 3, VLayout::kSeparate, {4, 2, 3}, 12);
  EXPECT_EQ(m->tensors[1].name, "model.layers.1.self_attn.v_proj.weight");
  EXPECT_THAT(m->geometry_source, AllOf(HasSubstr("num_key_value_heads"),
                                        HasSubstr("hidden_size")));
}

TEST_F(ModelLoaderTest, MistralInBf16) {
  WriteConfig({{"model_type", "mistral"},
               {"hidden_size", 16},
               {"num_attention_heads", 4},
               {"num_key_value_heads", 1},
               {"head_dim", nullptr},
               {"num_hidden_layers", 2},
               {"sliding_window", 4096}});
  WriteSingle(SeparateCheckpoint(kVProj, 2, 4, 1, 4, 16, "BF16"));
  absl::StatusOr<LoadedModel> m = Load();
  ASSERT_TRUE(m.ok()) << m.status();
  ExpectModel(*m, "mistral", 2, VLayout::kSeparate, {4, 1, 4}, 16, "BF16");
}

TEST_F(ModelLoaderTest, Qwen2WithBiases) {
  WriteConfig({{"model_type", "qwen2"},
               {"hidden_size", 8},
               {"num_attention_heads", 4},
               {"num_key_value_heads", 2},
               {"num_hidden_layers", 2},
               {"use_sliding_window", false}});
  WriteSingle(SeparateCheckpoint(kVProj, 2, 4, 2, 2, 8));
  absl::StatusOr<LoadedModel> m = Load();
  ASSERT_TRUE(m.ok()) << m.status();
  ExpectModel(*m, "qwen2", 2, VLayout::kSeparate, {4, 2, 2}, 8);
}

TEST_F(ModelLoaderTest, GemmaHeadDimIsNotHiddenOverHeads) {
  // gemma-7b's shape in miniature: 2 heads of 6 in a hidden size of 8.
  WriteConfig({{"model_type", "gemma"},
               {"hidden_size", 8},
               {"num_attention_heads", 2},
               {"num_key_value_heads", 1},
               {"head_dim", 6},
               {"num_hidden_layers", 2}});
  WriteSingle(SeparateCheckpoint(kVProj, 2, 2, 1, 6, 8));
  absl::StatusOr<LoadedModel> m = Load();
  ASSERT_TRUE(m.ok()) << m.status();
  ExpectModel(*m, "gemma", 2, VLayout::kSeparate, {2, 1, 6}, 8);
}

TEST_F(ModelLoaderTest, Gemma2) {
  WriteConfig({{"model_type", "gemma2"},
               {"hidden_size", 8},
               {"num_attention_heads", 4},
               {"num_key_value_heads", 2},
               {"head_dim", 5},
               {"num_hidden_layers", 3},
               {"query_pre_attn_scalar", 5}});
  WriteSingle(SeparateCheckpoint(kVProj, 3, 4, 2, 5, 8));
  absl::StatusOr<LoadedModel> m = Load();
  ASSERT_TRUE(m.ok()) << m.status();
  ExpectModel(*m, "gemma2", 3, VLayout::kSeparate, {4, 2, 5}, 8);
}

TEST_F(ModelLoaderTest, PhiWithNullKvHeads) {
  // phi-2's config.json: "num_key_value_heads": null.
  WriteConfig({{"model_type", "phi"},
               {"hidden_size", 8},
               {"num_attention_heads", 4},
               {"num_key_value_heads", nullptr},
               {"num_hidden_layers", 2},
               {"partial_rotary_factor", 0.4}});
  WriteSingle(SeparateCheckpoint(kVProj, 2, 4, 4, 2, 8));
  absl::StatusOr<LoadedModel> m = Load();
  ASSERT_TRUE(m.ok()) << m.status();
  ExpectModel(*m, "phi", 2, VLayout::kSeparate, {4, 4, 2}, 8);
}

TEST_F(ModelLoaderTest, Phi3FusedQkv) {
  WriteConfig({{"model_type", "phi3"},
               {"hidden_size", 8},
               {"num_attention_heads", 4},
               {"num_key_value_heads", 2},
               {"num_hidden_layers", 2}});
  std::vector<SafetensorsEntry> e = {
      Filler("model.embed_tokens.weight", {5, 8})};
  for (int l = 0; l < 2; ++l) {
    const std::string p = "model.layers." + std::to_string(l);
    e.push_back(VTensor(p + ".self_attn.qkv_proj.weight", VLayout::kPhi3Qkv, 4,
                        2, 2, 8, l));
    e.push_back(Filler(p + ".self_attn.o_proj.weight", {8, 8}));
    e.push_back(Filler(p + ".mlp.gate_up_proj.weight", {32, 8}));
  }
  WriteSingle(e);
  absl::StatusOr<LoadedModel> m = Load();
  ASSERT_TRUE(m.ok()) << m.status();
  ExpectModel(*m, "phi3", 2, VLayout::kPhi3Qkv, {4, 2, 2}, 8);
  EXPECT_EQ(m->tensors[0].rows, (4 + 2 * 2) * 2);
}

TEST_F(ModelLoaderTest, GptNeox) {
  WriteConfig({{"model_type", "gpt_neox"},
               {"hidden_size", 6},
               {"num_attention_heads", 3},
               {"num_hidden_layers", 2},
               {"rotary_pct", 0.25}});
  std::vector<SafetensorsEntry> e = {
      Filler("gpt_neox.embed_in.weight", {5, 6})};
  for (int l = 0; l < 2; ++l) {
    const std::string p = "gpt_neox.layers." + std::to_string(l);
    e.push_back(VTensor(p + ".attention.query_key_value.weight",
                        VLayout::kGptNeoxQkv, 3, 3, 2, 6, l));
    e.push_back(Filler(p + ".attention.query_key_value.bias", {18}));
    e.push_back(Filler(p + ".attention.dense.weight", {6, 6}));
    e.push_back(Filler(p + ".attention.bias", {1, 1, 4, 4}, "BOOL"));
  }
  WriteSingle(e);
  absl::StatusOr<LoadedModel> m = Load();
  ASSERT_TRUE(m.ok()) << m.status();
  ExpectModel(*m, "gpt_neox", 2, VLayout::kGptNeoxQkv, {3, 3, 2}, 6);
}

std::vector<SafetensorsEntry> FalconCheckpoint(VLayout layout, int64_t h,
                                               int64_t k, int64_t d,
                                               int64_t hidden) {
  std::vector<SafetensorsEntry> e = {
      Filler("transformer.word_embeddings.weight", {5, hidden})};
  for (int l = 0; l < 2; ++l) {
    const std::string p = "transformer.h." + std::to_string(l);
    e.push_back(VTensor(p + ".self_attention.query_key_value.weight", layout, h,
                        k, d, hidden, l));
    e.push_back(Filler(p + ".self_attention.dense.weight", {hidden, hidden}));
    e.push_back(Filler(p + ".mlp.dense_h_to_4h.weight", {4 * hidden, hidden}));
  }
  return e;
}

TEST_F(ModelLoaderTest, FalconNewDecoderArchitectureIsGrouped) {
  // falcon-40b/180b: new_decoder_architecture, num_kv_heads groups.
  WriteConfig({{"model_type", "falcon"},
               {"hidden_size", 8},
               {"num_attention_heads", 4},
               {"num_kv_heads", 2},
               {"new_decoder_architecture", true},
               {"multi_query", true},
               {"num_hidden_layers", 2},
               {"parallel_attn", true}});
  WriteSingle(FalconCheckpoint(VLayout::kFalconGrouped, 4, 2, 2, 8));
  absl::StatusOr<LoadedModel> m = Load();
  ASSERT_TRUE(m.ok()) << m.status();
  ExpectModel(*m, "falcon", 2, VLayout::kFalconGrouped, {4, 2, 2}, 8);
}

TEST_F(ModelLoaderTest, FalconMultiQueryIsTheDefault) {
  // falcon-7b: no new_decoder_architecture, multi_query absent (true).
  WriteConfig({{"model_type", "falcon"},
               {"hidden_size", 8},
               {"num_attention_heads", 4},
               {"num_kv_heads", 4},
               {"num_hidden_layers", 2}});
  WriteSingle(FalconCheckpoint(VLayout::kFalconMultiQuery, 4, 1, 2, 8));
  absl::StatusOr<LoadedModel> m = Load();
  ASSERT_TRUE(m.ok()) << m.status();
  ExpectModel(*m, "falcon", 2, VLayout::kFalconMultiQuery, {4, 1, 2}, 8);
  // K comes from the layout's rule (ForcedKvHeads), not config.json's 4.
  EXPECT_THAT(m->geometry_source,
              HasSubstr("num_kv_heads=1 (layout falcon_multi_query)"));
}

TEST_F(ModelLoaderTest, FalconClassic) {
  WriteConfig({{"model_type", "falcon"},
               {"hidden_size", 8},
               {"num_attention_heads", 4},
               {"multi_query", false},
               {"new_decoder_architecture", false},
               {"num_hidden_layers", 2}});
  WriteSingle(FalconCheckpoint(VLayout::kFalconClassic, 4, 4, 2, 8));
  absl::StatusOr<LoadedModel> m = Load();
  ASSERT_TRUE(m.ok()) << m.status();
  ExpectModel(*m, "falcon", 2, VLayout::kFalconClassic, {4, 4, 2}, 8);
}

TEST_F(ModelLoaderTest, FalconOldRefinedWebKeys) {
  WriteConfig({{"model_type", "RefinedWebModel"},
               {"n_embed", 8},
               {"n_head", 4},
               {"n_layer", 2},
               {"multi_query", true}});
  WriteSingle(FalconCheckpoint(VLayout::kFalconMultiQuery, 4, 1, 2, 8));
  absl::StatusOr<LoadedModel> m = Load();
  ASSERT_TRUE(m.ok()) << m.status();
  ExpectModel(*m, "falcon", 2, VLayout::kFalconMultiQuery, {4, 1, 2}, 8);
}

TEST_F(ModelLoaderTest, FalconWrongFlagIsCaught) {
  // A grouped checkpoint whose config lost new_decoder_architecture.
  WriteConfig({{"model_type", "falcon"},
               {"hidden_size", 8},
               {"num_attention_heads", 4},
               {"num_kv_heads", 2},
               {"num_hidden_layers", 2}});
  WriteSingle(FalconCheckpoint(VLayout::kFalconGrouped, 4, 2, 2, 8));
  absl::StatusOr<LoadedModel> m = Load();
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(m.status().message(),
              AllOf(HasSubstr("falcon_multi_query"), HasSubstr("[12, D]"),
                    HasSubstr("[16, 8]"), HasSubstr("layer 0")));
}

std::vector<SafetensorsEntry> Gpt2Checkpoint(const std::string& prefix) {
  std::vector<SafetensorsEntry> e = {Filler(prefix + "wte.weight", {5, 6})};
  for (int l = 0; l < 3; ++l) {
    const std::string p = prefix + "h." + std::to_string(l);
    e.push_back(VTensor(p + ".attn.c_attn.weight", VLayout::kGpt2Conv1D, 3, 3,
                        2, 6, l));
    e.push_back(Filler(p + ".attn.c_attn.bias", {18}));
    e.push_back(Filler(p + ".attn.c_proj.weight", {6, 6}));
    e.push_back(Filler(p + ".mlp.c_fc.weight", {6, 24}));
  }
  return e;
}

TEST_F(ModelLoaderTest, Gpt2WithoutPrefix) {
  WriteConfig({{"model_type", "gpt2"},
               {"n_embd", 6},
               {"n_head", 3},
               {"n_layer", 3},
               {"n_positions", 16}});
  WriteSingle(Gpt2Checkpoint(""));
  absl::StatusOr<LoadedModel> m = Load();
  ASSERT_TRUE(m.ok()) << m.status();
  ExpectModel(*m, "gpt2", 3, VLayout::kGpt2Conv1D, {3, 3, 2}, 6);
  EXPECT_EQ(m->tensors[2].name, "h.2.attn.c_attn.weight");
}

TEST_F(ModelLoaderTest, Gpt2WithTransformerPrefix) {
  WriteConfig(
      {{"model_type", "gpt2"}, {"n_embd", 6}, {"n_head", 3}, {"n_layer", 3}});
  WriteSingle(Gpt2Checkpoint("transformer."));
  absl::StatusOr<LoadedModel> m = Load();
  ASSERT_TRUE(m.ok()) << m.status();
  ExpectModel(*m, "gpt2", 3, VLayout::kGpt2Conv1D, {3, 3, 2}, 6);
  EXPECT_EQ(m->tensors[0].name, "transformer.h.0.attn.c_attn.weight");
}

// --- Files -----------------------------------------------------------------

TEST_F(ModelLoaderTest, ShardedCheckpoint) {
  WriteConfig({{"model_type", "llama"},
               {"hidden_size", 12},
               {"num_attention_heads", 4},
               {"num_key_value_heads", 2},
               {"num_hidden_layers", 4}});
  WriteSharded(SeparateCheckpoint(kVProj, 4, 4, 2, 3, 12), 3);
  absl::StatusOr<LoadedModel> m = Load();
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->files.size(), 3u);
  ExpectModel(*m, "llama", 4, VLayout::kSeparate, {4, 2, 3}, 12);
  std::set<std::string> files;
  for (const ModelTensor& t : m->tensors) files.insert(t.file);
  EXPECT_GT(files.size(), 1u);

  // The views stay valid when the model moves.
  LoadedModel moved = *std::move(m);
  ExpectModel(moved, "llama", 4, VLayout::kSeparate, {4, 2, 3}, 12);
}

TEST_F(ModelLoaderTest, MissingShardIsReported) {
  WriteConfig({{"model_type", "llama"},
               {"hidden_size", 12},
               {"num_attention_heads", 4},
               {"num_key_value_heads", 2}});
  WriteSharded(SeparateCheckpoint(kVProj, 4, 4, 2, 3, 12), 2);
  fs::remove(dir_ / "model-00002-of-00002.safetensors");
  absl::StatusOr<LoadedModel> m = Load();
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(m.status().message(), HasSubstr("model-00002-of-00002"));
}

TEST_F(ModelLoaderTest, SingleFileWithArch) {
  WriteSingle(SeparateCheckpoint(kVProj, 2, 4, 2, 3, 12),
              "weights.safetensors");
  LoadOptions options;
  options.arch = "llama";
  options.num_heads = 4;
  options.num_kv_heads = 2;  // head_dim: 12 (the tensor's input) / 4
  absl::StatusOr<LoadedModel> m =
      LoadModel((dir_ / "weights.safetensors").string(), table_, options);
  ASSERT_TRUE(m.ok()) << m.status();
  ExpectModel(*m, "llama", 2, VLayout::kSeparate, {4, 2, 3}, 12);

  options.num_heads = 0;
  m = LoadModel((dir_ / "weights.safetensors").string(), table_, options);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(m.status().message(), HasSubstr("num_heads"));

  options.num_heads = 4;
  options.arch = "llama3";
  m = LoadModel((dir_ / "weights.safetensors").string(), table_, options);
  ASSERT_FALSE(m.ok());
  EXPECT_THAT(m.status().message(),
              AllOf(HasSubstr("unknown architecture \"llama3\""),
                    HasSubstr("gpt_neox")));
}

TEST_F(ModelLoaderTest, OptionsOverrideConfig) {
  WriteConfig({{"model_type", "llama"},
               {"hidden_size", 12},
               {"num_attention_heads", 4},
               {"num_key_value_heads", 4}});
  WriteSingle(SeparateCheckpoint(kVProj, 2, 4, 2, 3, 12));
  LoadOptions options;
  options.num_kv_heads = 2;
  absl::StatusOr<LoadedModel> m = Load(options);
  ASSERT_TRUE(m.ok()) << m.status();
  ExpectModel(*m, "llama", 2, VLayout::kSeparate, {4, 2, 3}, 12);
}

TEST_F(ModelLoaderTest, MissingPathAndMissingWeights) {
  absl::StatusOr<LoadedModel> m =
      LoadModel((dir_ / "nope").string(), table_, {});
  EXPECT_EQ(m.status().code(), absl::StatusCode::kNotFound);
  WriteConfig({{"model_type", "llama"}});
  std::ofstream(dir_ / "pytorch_model.bin") << "x";
  m = Load();
  EXPECT_EQ(m.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(m.status().message(), AllOf(HasSubstr("model.safetensors"),
                                          HasSubstr("pytorch_model.bin")));
}

// --- Fallback and errors ---------------------------------------------------

TEST_F(ModelLoaderTest, UnknownModelTypeFallsBackToNameSearch) {
  WriteConfig({{"model_type", "mybert"},
               {"hidden_size", 8},
               {"num_attention_heads", 2},
               {"num_hidden_layers", 2}});
  std::vector<SafetensorsEntry> e;
  for (int l = 0; l < 2; ++l) {
    const std::string p =
        "encoder.layer." + std::to_string(l) + ".attention.self.";
    e.push_back(Filler(p + "query.weight", {8, 8}));
    e.push_back(VTensor(p + "value.weight", VLayout::kSeparate, 2, 2, 4, 8, l));
    e.push_back(Filler(p + "value.bias", {8}));
  }
  e.push_back(Filler("pooler.dense.weight", {8, 8}));
  WriteSingle(e);
  absl::StatusOr<LoadedModel> m = Load();
  ASSERT_TRUE(m.ok()) << m.status();
  ExpectModel(*m, "", 2, VLayout::kSeparate, {2, 2, 4}, 8);
  EXPECT_EQ(m->tensors[1].name, "encoder.layer.1.attention.self.value.weight");
}

TEST_F(ModelLoaderTest, SingleFileWithoutArchUsesNameSearch) {
  WriteSingle(SeparateCheckpoint(kVProj, 2, 4, 2, 3, 12), "w.safetensors");
  LoadOptions options;
  options.num_heads = 4;
  options.num_kv_heads = 2;
  absl::StatusOr<LoadedModel> m =
      LoadModel((dir_ / "w.safetensors").string(), table_, options);
  ASSERT_TRUE(m.ok()) << m.status();
  ExpectModel(*m, "", 2, VLayout::kSeparate, {4, 2, 3}, 12);
}

TEST_F(ModelLoaderTest, AmbiguousFallbackListsCandidates) {
  WriteConfig({{"model_type", "t5ish"},
               {"hidden_size", 8},
               {"num_attention_heads", 2}});
  std::vector<SafetensorsEntry> e;
  for (int l = 0; l < 2; ++l) {
    const std::string p = "decoder.layers." + std::to_string(l);
    e.push_back(VTensor(p + ".self_attn.v_proj.weight", VLayout::kSeparate, 2,
                        2, 4, 8, l));
    e.push_back(VTensor(p + ".encoder_attn.v_proj.weight", VLayout::kSeparate,
                        2, 2, 4, 8, l));
  }
  WriteSingle(e);
  absl::StatusOr<LoadedModel> m = Load();
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(
      m.status().message(),
      AllOf(HasSubstr("decoder.layers.{layer}.self_attn.v_proj.weight"),
            HasSubstr("decoder.layers.{layer}.encoder_attn.v_proj.weight"),
            HasSubstr("--arch")));
}

TEST_F(ModelLoaderTest, NoVTensorsListsNames) {
  WriteConfig({{"model_type", "llama"},
               {"hidden_size", 8},
               {"num_attention_heads", 2}});
  WriteSingle({Filler("model.layers.0.self_attn.wv.weight", {8, 8}),
               Filler("model.norm.weight", {8})});
  absl::StatusOr<LoadedModel> m = Load();
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(m.status().message(),
              AllOf(HasSubstr("model.layers.0.self_attn.wv.weight"),
                    HasSubstr("model.norm.weight"),
                    HasSubstr("model.layers.{layer}.self_attn.v_proj.weight")));

  // The same through the name search, with the list cut short.
  WriteConfig({{"model_type", "mystery"},
               {"hidden_size", 8},
               {"num_attention_heads", 2}});
  std::vector<SafetensorsEntry> many;
  for (int i = 0; i < 30; ++i) {
    many.push_back(Filler("blocks." + std::to_string(i) + ".wv.weight", {2}));
  }
  WriteSingle(many);
  m = Load();
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(m.status().message(),
              AllOf(HasSubstr("blocks.0.wv.weight"), HasSubstr("(30 in all)"),
                    HasSubstr("v_proj")));
}

TEST_F(ModelLoaderTest, WrongKvHeadsInConfigIsCaught) {
  WriteConfig({{"model_type", "llama"},
               {"hidden_size", 12},
               {"num_attention_heads", 4},
               {"num_key_value_heads", 4},
               {"num_hidden_layers", 2}});
  WriteSingle(SeparateCheckpoint(kVProj, 2, 4, 2, 3, 12));
  absl::StatusOr<LoadedModel> m = Load();
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(m.status().message(),
              AllOf(HasSubstr("model.layers.0.self_attn.v_proj.weight"),
                    HasSubstr("separate"), HasSubstr("[12, D]"),
                    HasSubstr("[6, 12]"), HasSubstr("num_key_value_heads")));
}

TEST_F(ModelLoaderTest, Phi3DeclaredAsLlamaIsCaught) {
  WriteConfig({{"model_type", "llama"},
               {"hidden_size", 8},
               {"num_attention_heads", 4},
               {"num_key_value_heads", 2}});
  WriteSingle({VTensor("model.layers.0.self_attn.v_proj.weight",
                       VLayout::kPhi3Qkv, 4, 2, 2, 8, 0)});
  absl::StatusOr<LoadedModel> m = Load();
  ASSERT_FALSE(m.ok());
  EXPECT_THAT(m.status().message(), HasSubstr("phi3_qkv"));
}

TEST_F(ModelLoaderTest, MissingLayerAndLayerCountMismatch) {
  WriteConfig({{"model_type", "llama"},
               {"hidden_size", 12},
               {"num_attention_heads", 4},
               {"num_key_value_heads", 2}});
  std::vector<SafetensorsEntry> e = SeparateCheckpoint(kVProj, 3, 4, 2, 3, 12);
  std::erase_if(e, [](const SafetensorsEntry& x) {
    return x.name == "model.layers.1.self_attn.v_proj.weight";
  });
  WriteSingle(e);
  absl::StatusOr<LoadedModel> m = Load();
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(m.status().message(), HasSubstr("missing for layers 1 of 3"));

  WriteConfig({{"model_type", "llama"},
               {"hidden_size", 12},
               {"num_attention_heads", 4},
               {"num_key_value_heads", 2},
               {"num_hidden_layers", 5}});
  WriteSingle(SeparateCheckpoint(kVProj, 3, 4, 2, 3, 12));
  m = Load();
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(m.status().message(),
              AllOf(HasSubstr("num_hidden_layers=5"), HasSubstr("3 layers")));
}

TEST_F(ModelLoaderTest, UnsupportedVDType) {
  WriteConfig({{"model_type", "llama"},
               {"hidden_size", 4},
               {"num_attention_heads", 2}});
  WriteSingle(
      {Filler("model.layers.0.self_attn.v_proj.weight", {4, 4}, "F64")});
  absl::StatusOr<LoadedModel> m = Load();
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(m.status().message(),
              AllOf(HasSubstr("F64"), HasSubstr("v_proj")));
}

TEST_F(ModelLoaderTest, BadConfigValues) {
  WriteConfig({{"model_type", "llama"},
               {"hidden_size", 12},
               {"num_attention_heads", "four"}});
  WriteSingle(SeparateCheckpoint(kVProj, 1, 4, 2, 3, 12));
  absl::StatusOr<LoadedModel> m = Load();
  ASSERT_FALSE(m.ok());
  EXPECT_THAT(m.status().message(), AllOf(HasSubstr("num_attention_heads"),
                                          HasSubstr("positive integer")));
  std::ofstream(dir_ / "config.json") << "{not json";
  m = Load();
  ASSERT_FALSE(m.ok());
  EXPECT_THAT(m.status().message(), HasSubstr("config.json"));
}

// --- The table -------------------------------------------------------------

TEST(ArchitectureTableTest, DefaultTableCoversTheDocumentedArchitectures) {
  absl::StatusOr<ArchitectureTable> t = DefaultArchitectureTable();
  ASSERT_TRUE(t.ok()) << t.status();
  for (const char* type : {"llama", "mistral", "qwen2", "gemma", "gemma2",
                           "phi", "phi3", "gpt_neox", "falcon", "gpt2"}) {
    EXPECT_NE(t->Find(type), nullptr) << type;
  }
  EXPECT_EQ(t->Find("RefinedWebModel"), t->Find("falcon"));
  EXPECT_EQ(t->Find("nonesuch"), nullptr);
  const Architecture* falcon = t->Find("falcon");
  EXPECT_EQ(falcon->variants.size(), 3u);
  EXPECT_TRUE(falcon->geometry.head_dim.empty());
  EXPECT_EQ(t->Find("gemma")->geometry.head_dim,
            std::vector<std::string>{"head_dim"});
  EXPECT_EQ(t->Find("gpt2")->tensor_patterns.size(), 2u);
}

TEST(ArchitectureTableTest, AddingAnArchitectureNeedsOnlyYaml) {
  absl::StatusOr<ArchitectureTable> t = LoadArchitectureTable(R"(
default_geometry:
  num_heads: [n_heads]
architectures:
  mine:
    tensors: "blocks.{layer}.attn.wv.weight"
    layout: separate
    geometry:
      num_kv_heads: [n_kv]
)");
  ASSERT_TRUE(t.ok()) << t.status();
  const Architecture* a = t->Find("mine");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->geometry.num_heads, std::vector<std::string>{"n_heads"});
  EXPECT_EQ(a->geometry.num_kv_heads, std::vector<std::string>{"n_kv"});
  EXPECT_EQ(a->variants[0].layout, VLayout::kSeparate);
}

TEST(ArchitectureTableTest, BadTablesAreRejected) {
  struct Case {
    const char* yaml;
    const char* needle;
  };
  for (const Case& c : {
           Case{"architectures: [", "architecture table"},
           Case{
               "architectures:\n  x:\n    tensors: a.b\n    layout: separate\n",
               "{layer}"},
           Case{"architectures:\n  x:\n    tensors: a.{layer}\n    layout: "
                "fused\n",
                "unknown V layout"},
           Case{"architectures:\n  x:\n    tensors: a.{layer}\n", "layout"},
           Case{"architectures:\n  x:\n    tensors: a.{layer}\n"
                "    layout: separate\n    tensor: b\n",
                "unknown key \"tensor\""},
           Case{"architectures:\n  x:\n    tensors: a.{layer}\n"
                "    variants:\n      - when: {a: 1}\n",
                "\"layout\" is missing"},
           Case{"other: 1\n", "unknown key"},
       }) {
    absl::StatusOr<ArchitectureTable> t = LoadArchitectureTable(c.yaml);
    ASSERT_FALSE(t.ok()) << c.yaml;
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(t.status().message(), HasSubstr(c.needle)) << c.yaml;
  }
}

}  // namespace
}  // namespace rvd

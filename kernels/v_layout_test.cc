#include "kernels/v_layout.h"

#include <cstdint>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace rvd {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// A row-major f32 tensor whose element (r, c) is r * cols + c, so every value
// names its position (exact in f32 for the small sizes used here).
struct Tensor {
  std::vector<float> values;
  TensorView view;
};

Tensor MakeTensor(int64_t rows, int64_t cols) {
  Tensor t;
  t.values.resize(rows * cols);
  for (int64_t i = 0; i < rows * cols; ++i) t.values[i] = static_cast<float>(i);
  t.view.data = t.values.data();
  t.view.rows = rows;
  t.view.cols = cols;
  t.view.dtype = DType::kF32;
  return t;
}

float At(const MatrixView& m, int64_t i, int64_t j) {
  float v;
  std::memcpy(&v,
              static_cast<const uint8_t*>(m.data) + (i * m.ld + j) * sizeof(v),
              sizeof(v));
  return v;
}

// Maps (kv head h, row i within the head's d rows) to the tensor row that
// holds it, written from the Hugging Face modeling code of each layout.
using RowOf = std::function<int64_t(int64_t h, int64_t i)>;

// Checks every element of the layer view and of every head view against
// the tensor rows `row_of` names.
void ExpectRowLayout(const Tensor& t, const VSlices& v, const HeadGeometry& g,
                     const RowOf& row_of) {
  const int64_t k = g.num_kv_heads, d = g.head_dim, cols = t.view.cols;
  ASSERT_EQ(v.layer.rows, k * d);
  ASSERT_EQ(v.layer.cols, cols);
  ASSERT_GE(v.layer.ld, cols);
  ASSERT_EQ(v.heads.size(), static_cast<size_t>(k));
  for (int64_t h = 0; h < k; ++h) {
    const MatrixView& head = v.heads[h];
    ASSERT_EQ(head.rows, d);
    ASSERT_EQ(head.cols, cols);
    for (int64_t i = 0; i < d; ++i) {
      for (int64_t c = 0; c < cols; ++c) {
        const float want = static_cast<float>(row_of(h, i) * cols + c);
        ASSERT_EQ(At(v.layer, h * d + i, c), want)
            << "layer row " << h * d + i << " col " << c;
        ASSERT_EQ(At(head, i, c), want) << "head " << h << " row " << i;
      }
    }
  }
}

bool PointsInto(const MatrixView& m, const Tensor& t) {
  const auto* p = static_cast<const uint8_t*>(m.data);
  const auto* b = reinterpret_cast<const uint8_t*>(t.values.data());
  return p >= b && p < b + t.values.size() * sizeof(float);
}

TEST(VLayoutTest, NamesRoundTrip) {
  for (int i = 1; i <= 7; ++i) {
    const auto layout = static_cast<VLayout>(i);
    absl::StatusOr<VLayout> parsed = ParseVLayout(VLayoutName(layout));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, layout);
  }
  absl::StatusOr<VLayout> bad = ParseVLayout("fused_qkv");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(),
              AllOf(HasSubstr("fused_qkv"), HasSubstr("phi3_qkv")));
}

TEST(SliceVTest, Separate) {
  const HeadGeometry g{8, 2, 3};
  Tensor t = MakeTensor(2 * 3, 7);  // [K*d, D]
  absl::StatusOr<VSlices> v = SliceV(t.view, VLayout::kSeparate, g);
  ASSERT_TRUE(v.ok()) << v.status();
  ExpectRowLayout(t, *v, g, [&](int64_t h, int64_t i) { return h * 3 + i; });
  EXPECT_TRUE(v->gathered.empty());
  EXPECT_EQ(v->layer.data, t.view.data);
}

TEST(SliceVTest, Phi3Qkv) {
  // qkv[..., :H*d] = Q, [H*d, (H+K)*d) = K, [(H+K)*d, ...) = V.
  const HeadGeometry g{6, 2, 4};
  Tensor t = MakeTensor((6 + 2 * 2) * 4, 5);
  absl::StatusOr<VSlices> v = SliceV(t.view, VLayout::kPhi3Qkv, g);
  ASSERT_TRUE(v.ok()) << v.status();
  ExpectRowLayout(
      t, *v, g, [&](int64_t h, int64_t i) { return (6 + 2) * 4 + h * 4 + i; });
  EXPECT_TRUE(v->gathered.empty());
  EXPECT_TRUE(PointsInto(v->layer, t));
}

TEST(SliceVTest, GptNeoxQkvGathersInterleavedHeads) {
  // qkv.view(..., H, 3*d): head h owns rows [h*3d, h*3d+3d) as (q, k, v).
  const HeadGeometry g{4, 4, 2};
  Tensor t = MakeTensor(4 * 3 * 2, 5);
  absl::StatusOr<VSlices> v = SliceV(t.view, VLayout::kGptNeoxQkv, g);
  ASSERT_TRUE(v.ok()) << v.status();
  ExpectRowLayout(t, *v, g,
                  [&](int64_t h, int64_t i) { return h * 6 + 2 * 2 + i; });
  EXPECT_EQ(v->gathered.size(), 4u * 2 * 5 * sizeof(float));
  EXPECT_EQ(v->layer.data, v->gathered.data());
}

TEST(SliceVTest, FalconClassicIsGptNeoxOrder) {
  // fused_qkv.view(..., H, 3, d)[..., 2, :].
  const HeadGeometry g{3, 3, 4};
  Tensor t = MakeTensor(3 * 3 * 4, 6);
  absl::StatusOr<VSlices> v = SliceV(t.view, VLayout::kFalconClassic, g);
  ASSERT_TRUE(v.ok()) << v.status();
  ExpectRowLayout(t, *v, g,
                  [&](int64_t h, int64_t i) { return (h * 3 + 2) * 4 + i; });
}

TEST(SliceVTest, FalconMultiQuery) {
  // fused_qkv.view(..., H + 2, d)[..., [-1], :].
  const HeadGeometry g{5, 1, 3};
  Tensor t = MakeTensor((5 + 2) * 3, 4);
  absl::StatusOr<VSlices> v = SliceV(t.view, VLayout::kFalconMultiQuery, g);
  ASSERT_TRUE(v.ok()) << v.status();
  ExpectRowLayout(t, *v, g, [&](int64_t, int64_t i) { return 6 * 3 + i; });
  EXPECT_TRUE(v->gathered.empty());
}

TEST(SliceVTest, FalconGroupedGathersEachGroupsLastBlock) {
  // qkv.view(..., K, H/K + 2, d)[:, :, :, [-1]].
  const HeadGeometry g{8, 2, 3};
  Tensor t = MakeTensor(2 * (8 / 2 + 2) * 3, 5);
  absl::StatusOr<VSlices> v = SliceV(t.view, VLayout::kFalconGrouped, g);
  ASSERT_TRUE(v.ok()) << v.status();
  ExpectRowLayout(t, *v, g, [&](int64_t h, int64_t i) {
    const int64_t per_group = 8 / 2 + 2;
    return (h * per_group + per_group - 1) * 3 + i;
  });
  EXPECT_FALSE(v->gathered.empty());
}

TEST(SliceVTest, FalconGroupedOneGroupNeedsNoCopy) {
  const HeadGeometry g{4, 1, 2};
  Tensor t = MakeTensor((4 + 2) * 2, 3);
  absl::StatusOr<VSlices> v = SliceV(t.view, VLayout::kFalconGrouped, g);
  ASSERT_TRUE(v.ok()) << v.status();
  ExpectRowLayout(t, *v, g, [&](int64_t, int64_t i) { return 5 * 2 + i; });
  EXPECT_TRUE(v->gathered.empty());
}

TEST(SliceVTest, FalconGroupedOneQueryHeadPerGroup) {
  const HeadGeometry g{4, 4, 2};
  Tensor t = MakeTensor(4 * 3 * 2, 3);
  absl::StatusOr<VSlices> v = SliceV(t.view, VLayout::kFalconGrouped, g);
  ASSERT_TRUE(v.ok()) << v.status();
  ExpectRowLayout(t, *v, g,
                  [&](int64_t h, int64_t i) { return (h * 3 + 2) * 2 + i; });
}

TEST(SliceVTest, Gpt2Conv1DIsAStridedViewOfTheColumns) {
  // Conv1D weight [D, 3D]; c_attn(x).split(D, dim=2)[2] is V, and head h is
  // its columns [h*d, h*d + d).
  const int64_t h = 3, d = 2, hidden = h * d;
  const HeadGeometry g{h, h, d};
  Tensor t = MakeTensor(hidden, 3 * hidden);
  absl::StatusOr<VSlices> v = SliceV(t.view, VLayout::kGpt2Conv1D, g);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_TRUE(v->gathered.empty());
  ASSERT_EQ(v->layer.rows, hidden);
  ASSERT_EQ(v->layer.cols, hidden);
  ASSERT_EQ(v->layer.ld, 3 * hidden);
  ASSERT_EQ(v->heads.size(), static_cast<size_t>(h));
  for (int64_t r = 0; r < hidden; ++r) {
    for (int64_t c = 0; c < hidden; ++c) {
      ASSERT_EQ(At(v->layer, r, c), r * 3 * hidden + 2 * hidden + c);
    }
  }
  for (int64_t head = 0; head < h; ++head) {
    const MatrixView& m = v->heads[head];
    ASSERT_EQ(m.rows, hidden);
    ASSERT_EQ(m.cols, d);
    ASSERT_EQ(m.ld, 3 * hidden);
    for (int64_t r = 0; r < hidden; ++r) {
      for (int64_t c = 0; c < d; ++c) {
        ASSERT_EQ(At(m, r, c), r * 3 * hidden + 2 * hidden + head * d + c);
      }
    }
  }
}

TEST(SliceVTest, GatheredViewsSurviveAMove) {
  const HeadGeometry g{4, 4, 2};
  Tensor t = MakeTensor(4 * 3 * 2, 5);
  absl::StatusOr<VSlices> v = SliceV(t.view, VLayout::kGptNeoxQkv, g);
  ASSERT_TRUE(v.ok());
  VSlices moved = std::move(*v);
  ExpectRowLayout(t, moved, g,
                  [&](int64_t h, int64_t i) { return h * 6 + 2 * 2 + i; });
}

TEST(SliceVTest, GathersHalfPrecisionBytesUnchanged) {
  const HeadGeometry g{2, 2, 2};
  std::vector<uint16_t> bits(2 * 3 * 2 * 3);
  for (size_t i = 0; i < bits.size(); ++i) bits[i] = 0x3c00 + i;
  TensorView t{bits.data(), 12, 3, DType::kBF16};
  absl::StatusOr<VSlices> v = SliceV(t, VLayout::kGptNeoxQkv, g);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->layer.dtype, DType::kBF16);
  ASSERT_EQ(v->gathered.size(), 2u * 2 * 3 * 2);
  for (int64_t h = 0; h < 2; ++h) {
    for (int64_t i = 0; i < 2; ++i) {
      for (int64_t c = 0; c < 3; ++c) {
        uint16_t got;
        std::memcpy(&got,
                    static_cast<const uint8_t*>(v->heads[h].data) +
                        (i * v->heads[h].ld + c) * 2,
                    2);
        EXPECT_EQ(got, bits[((h * 3 + 2) * 2 + i) * 3 + c]);
      }
    }
  }
}

// --- Mismatches -------------------------------------------------------------

void ExpectInvalid(const absl::StatusOr<VSlices>& v,
                   const std::vector<std::string>& needles) {
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument);
  for (const std::string& n : needles) {
    EXPECT_THAT(v.status().message(), HasSubstr(n));
  }
}

TEST(SliceVTest, WrongShapeNamesLayoutGeometryAndBothShapes) {
  Tensor t = MakeTensor(10, 7);
  ExpectInvalid(
      SliceV(t.view, VLayout::kSeparate, HeadGeometry{8, 2, 4}),
      {"separate", "num_kv_heads=2", "head_dim=4", "[8, D]", "[10, 7]"});
}

TEST(SliceVTest, Phi3TensorDeclaredSeparateIsCaughtWithAHint) {
  const HeadGeometry g{4, 4, 2};
  Tensor t = MakeTensor((4 + 2 * 4) * 2, 8);
  ExpectInvalid(SliceV(t.view, VLayout::kSeparate, g),
                {"separate", "[8, D]", "[24, 8]", "phi3_qkv"});
}

TEST(SliceVTest, SeparateTensorDeclaredPhi3IsCaught) {
  Tensor t = MakeTensor(8, 8);
  ExpectInvalid(SliceV(t.view, VLayout::kPhi3Qkv, HeadGeometry{4, 4, 2}),
                {"phi3_qkv", "[24, D]", "[8, 8]", "separate"});
}

TEST(SliceVTest, Gpt2ChecksTheHiddenSize) {
  Tensor t = MakeTensor(6, 12);  // [D, 2D], not [D, 3D]
  ExpectInvalid(SliceV(t.view, VLayout::kGpt2Conv1D, HeadGeometry{3, 3, 2}),
                {"gpt2_conv1d", "[6, 18]", "[6, 12]"});
}

TEST(SliceVTest, WrongKvHeadsForLayoutsThatFixIt) {
  Tensor t = MakeTensor(24, 4);
  ExpectInvalid(SliceV(t.view, VLayout::kGptNeoxQkv, HeadGeometry{4, 2, 2}),
                {"gpt_neox_qkv", "num_kv_heads must equal num_heads"});
  ExpectInvalid(SliceV(t.view, VLayout::kFalconClassic, HeadGeometry{4, 1, 2}),
                {"falcon_classic", "num_kv_heads must equal num_heads"});
  ExpectInvalid(SliceV(t.view, VLayout::kGpt2Conv1D, HeadGeometry{4, 1, 2}),
                {"gpt2_conv1d", "num_kv_heads must equal num_heads"});
  ExpectInvalid(
      SliceV(t.view, VLayout::kFalconMultiQuery, HeadGeometry{10, 2, 2}),
      {"falcon_multi_query", "num_kv_heads must be 1"});
}

// ForcedKvHeads is the rule, and SliceV enforces exactly it: for every
// layout and K, SliceV refuses K for its kv head count iff the rule fixes a
// different K.
TEST(ForcedKvHeadsTest, IsTheRuleSliceVEnforces) {
  EXPECT_EQ(ForcedKvHeads(VLayout::kGptNeoxQkv, 12), 12);
  EXPECT_EQ(ForcedKvHeads(VLayout::kFalconClassic, 12), 12);
  EXPECT_EQ(ForcedKvHeads(VLayout::kGpt2Conv1D, 12), 12);
  EXPECT_EQ(ForcedKvHeads(VLayout::kFalconMultiQuery, 12), 1);
  EXPECT_EQ(ForcedKvHeads(VLayout::kSeparate, 12), std::nullopt);
  EXPECT_EQ(ForcedKvHeads(VLayout::kPhi3Qkv, 12), std::nullopt);
  EXPECT_EQ(ForcedKvHeads(VLayout::kFalconGrouped, 12), std::nullopt);
  const int64_t h = 4, d = 2;
  for (VLayout layout : kAllVLayouts) {
    for (int64_t k : {1, 2, 4}) {
      const HeadGeometry g{h, k, d};
      const absl::StatusOr<VSlices> v =
          SliceV(MakeTensor(1, 1).view, layout, g);  // shape is checked later
      const bool refused_for_k =
          !v.ok() && absl::StrContains(v.status().message(), "num_kv_heads must");
      const std::optional<int64_t> forced = ForcedKvHeads(layout, h);
      EXPECT_EQ(refused_for_k, forced.has_value() && *forced != k)
          << VLayoutName(layout) << " K=" << k << ": " << v.status();
    }
  }
}

TEST(SliceVTest, BadGeometry) {
  Tensor t = MakeTensor(8, 4);
  ExpectInvalid(SliceV(t.view, VLayout::kSeparate, HeadGeometry{0, 1, 8}),
                {"positive"});
  ExpectInvalid(SliceV(t.view, VLayout::kSeparate, HeadGeometry{4, 1, -8}),
                {"positive"});
  ExpectInvalid(SliceV(t.view, VLayout::kSeparate, HeadGeometry{6, 4, 2}),
                {"multiple of num_kv_heads"});
  ExpectInvalid(SliceV(t.view, VLayout::kSeparate,
                       HeadGeometry{int64_t{1} << 62, int64_t{1} << 62, 8}),
                {"overflow"});
  ExpectInvalid(SliceV(t.view, static_cast<VLayout>(42), HeadGeometry{4, 4, 2}),
                {"unknown V layout"});
}

TEST(SliceVTest, EmptyTensor) {
  TensorView t{nullptr, 0, 0, DType::kF32};
  ExpectInvalid(SliceV(t, VLayout::kSeparate, HeadGeometry{1, 1, 1}),
                {"empty tensor"});
}

// ViewV is the one statement of V's rows and strides: on every layout (and
// geometries with one and several kv heads) its views, read through the
// blocked-view formula (an independent loop here), hold exactly the bytes of
// SliceV's views, whose layouts the tests above check against the
// modeling code. A layer whose heads are not adjacent is blocked (d rows per
// block), and only then; heads always point into the tensor.
TEST(ViewVTest, AgreesWithSliceVOnEveryLayout) {
  const HeadGeometry geometries[] = {{4, 2, 3}, {6, 6, 2}, {4, 1, 5}, {8, 4, 2}, {2, 2, 4}};
  int checked = 0;
  for (VLayout layout : kAllVLayouts) {
    for (HeadGeometry g : geometries) {
      if (std::optional<int64_t> k = ForcedKvHeads(layout, g.num_heads)) g.num_kv_heads = *k;
      const int64_t hidden = layout == VLayout::kGpt2Conv1D ? g.num_heads * g.head_dim : 7;
      int64_t rows = 0, cols = hidden;
      switch (layout) {
        case VLayout::kSeparate: rows = g.num_kv_heads * g.head_dim; break;
        case VLayout::kPhi3Qkv: rows = (g.num_heads + 2 * g.num_kv_heads) * g.head_dim; break;
        case VLayout::kGptNeoxQkv:
        case VLayout::kFalconClassic: rows = 3 * g.num_heads * g.head_dim; break;
        case VLayout::kFalconMultiQuery: rows = (g.num_heads + 2) * g.head_dim; break;
        case VLayout::kFalconGrouped:
          rows = g.num_kv_heads * (g.num_heads / g.num_kv_heads + 2) * g.head_dim;
          break;
        case VLayout::kGpt2Conv1D: rows = hidden; cols = 3 * hidden; break;
      }
      const Tensor t = MakeTensor(rows, cols);
      const std::string what =
          absl::StrCat(VLayoutName(layout), " H=", g.num_heads, " K=", g.num_kv_heads,
                       " d=", g.head_dim);
      absl::StatusOr<VViews> views = ViewV(t.view, layout, g);
      absl::StatusOr<VSlices> slices = SliceV(t.view, layout, g);
      ASSERT_TRUE(views.ok()) << what << ": " << views.status();
      ASSERT_TRUE(slices.ok()) << what << ": " << slices.status();
      const MatrixView& l = views->layer;
      ASSERT_EQ(l.rows, slices->layer.rows) << what;
      ASSERT_EQ(l.cols, slices->layer.cols) << what;
      EXPECT_TRUE(PointsInto(l, t)) << what;
      // Blocked exactly when SliceV had to copy.
      EXPECT_EQ(l.block_rows != 0, !slices->gathered.empty()) << what;
      if (l.block_rows != 0) {
        EXPECT_EQ(l.block_rows, g.head_dim) << what;
        EXPECT_EQ(l.rows % l.block_rows, 0) << what;
      }
      for (int64_t i = 0; i < l.rows; ++i) {
        const int64_t row = l.block_rows == 0
                                ? i * l.ld
                                : (i / l.block_rows) * l.block_stride + (i % l.block_rows) * l.ld;
        for (int64_t j = 0; j < l.cols; ++j) {
          float got;
          std::memcpy(&got, static_cast<const uint8_t*>(l.data) + (row + j) * sizeof(float),
                      sizeof(got));
          ASSERT_EQ(got, At(slices->layer, i, j)) << what << " layer row " << i << " col " << j;
        }
      }
      ASSERT_EQ(views->heads.size(), slices->heads.size()) << what;
      for (size_t h = 0; h < views->heads.size(); ++h) {
        const MatrixView& vh = views->heads[h];
        EXPECT_EQ(vh.block_rows, 0) << what;
        EXPECT_TRUE(PointsInto(vh, t)) << what << " head " << h;
        ASSERT_EQ(vh.rows, slices->heads[h].rows) << what;
        ASSERT_EQ(vh.cols, slices->heads[h].cols) << what;
        for (int64_t i = 0; i < vh.rows; ++i) {
          for (int64_t j = 0; j < vh.cols; ++j) {
            ASSERT_EQ(At(vh, i, j), At(slices->heads[h], i, j)) << what << " head " << h;
          }
        }
      }
      // The host gather of a blocked layer is SliceV's copy, byte for byte.
      if (l.block_rows != 0) {
        std::vector<uint8_t> gathered(slices->gathered.size());
        GatherBlockedRows(l, gathered.data());
        EXPECT_EQ(gathered, slices->gathered) << what;
      }
      ++checked;
    }
  }
  EXPECT_EQ(checked, static_cast<int>(std::size(kAllVLayouts) * std::size(geometries)));
}

// ViewV reads no byte of the tensor: an address that is not host memory
// (a device pointer) gives the same views, offset for offset.
TEST(ViewVTest, ComputesFromTheAddressAlone) {
  const HeadGeometry g{4, 4, 2};
  const Tensor t = MakeTensor(3 * 4 * 2, 5);
  TensorView fake = t.view;
  fake.data = reinterpret_cast<const void*>(uintptr_t{1} << 40);  // never mapped here
  absl::StatusOr<VViews> real = ViewV(t.view, VLayout::kGptNeoxQkv, g);
  absl::StatusOr<VViews> moved = ViewV(fake, VLayout::kGptNeoxQkv, g);
  ASSERT_TRUE(real.ok() && moved.ok());
  const auto offset = [](const MatrixView& m, const void* base) {
    return static_cast<const uint8_t*>(m.data) - static_cast<const uint8_t*>(base);
  };
  EXPECT_EQ(offset(real->layer, t.view.data), offset(moved->layer, fake.data));
  EXPECT_EQ(real->layer.block_stride, 3 * 2 * 5);
  for (size_t h = 0; h < real->heads.size(); ++h) {
    EXPECT_EQ(offset(real->heads[h], t.view.data), offset(moved->heads[h], fake.data));
  }
}

}  // namespace
}  // namespace rvd

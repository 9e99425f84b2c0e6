// ViewV and SliceV: find V in a stored attention weight. See v_layout.h.
//
// Every layout but gpt2's stores V as d-row blocks, one per kv head, at
// row offsets the layout fixes (HeadStartRow). When those blocks follow each
// other the views point into the tensor; when Q and K rows sit between them
// (gpt_neox, falcon classic, falcon grouped with K > 1) ViewV's layer is a
// blocked view of them and SliceV copies them into VSlices::gathered, in
// head order. gpt2's Conv1D stores V as columns
// [2D, 3D) of a [D, 3D] tensor; since PR(W) = PR(W^T), V is returned as a
// strided [D, D] view (and [D, d] per head) with ld = 3D, without a copy.
#include "kernels/v_layout.h"

#include <cstring>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace rvd {
namespace {

// Products here are of geometry values a caller supplies; refuse any that
// overflow int64 rather than computing a wrong shape.
bool MulOk(int64_t a, int64_t b, int64_t* out) {
  return !__builtin_mul_overflow(a, b, out);
}

std::string GeometryString(const HeadGeometry& g) {
  return absl::StrCat("{num_heads=", g.num_heads,
                      ", num_kv_heads=", g.num_kv_heads,
                      ", head_dim=", g.head_dim, "}");
}

// The shape the layout implies. cols < 0 means "any positive number of
// columns" (the hidden size D, which only gpt2's layout ties to H*d).
struct ExpectedShape {
  int64_t rows = 0;
  int64_t cols = -1;

  std::string ToString() const {
    return absl::StrCat("[", rows, ", ", cols < 0 ? "D" : absl::StrCat(cols),
                        "]");
  }
  bool Matches(int64_t r, int64_t c) const {
    return r == rows && (cols < 0 || c == cols);
  }
};

// The shape `layout` implies for `g` (which must be positive with
// H % K == 0). Fails only on overflow.
absl::StatusOr<ExpectedShape> ShapeFor(VLayout layout, const HeadGeometry& g) {
  const int64_t h = g.num_heads, k = g.num_kv_heads, d = g.head_dim;
  int64_t blocks = 0;  // rows in units of d (or gpt2's H*d)
  ExpectedShape shape;
  bool ok = true;
  switch (layout) {
    case VLayout::kSeparate:
      blocks = k;
      break;
    case VLayout::kPhi3Qkv:
      ok = !__builtin_add_overflow(h, 2 * k, &blocks);
      break;
    case VLayout::kGptNeoxQkv:
    case VLayout::kFalconClassic:
      ok = MulOk(h, 3, &blocks);
      break;
    case VLayout::kFalconMultiQuery:
      ok = !__builtin_add_overflow(h, 2, &blocks);
      break;
    case VLayout::kFalconGrouped:
      ok = MulOk(k, h / k + 2, &blocks);
      break;
    case VLayout::kGpt2Conv1D: {
      int64_t hidden = 0;
      ok = MulOk(h, d, &hidden) && MulOk(hidden, 3, &shape.cols);
      shape.rows = hidden;
      if (!ok) break;
      return shape;
    }
  }
  if (!ok || !MulOk(blocks, d, &shape.rows)) {
    return absl::InvalidArgumentError(
        absl::StrCat("layout ", VLayoutName(layout), ": geometry ",
                     GeometryString(g), " overflows the tensor shape"));
  }
  return shape;
}

// The first tensor row of kv head `head`'s V block (row layouts only).
int64_t HeadStartRow(VLayout layout, const HeadGeometry& g, int64_t head) {
  const int64_t h = g.num_heads, k = g.num_kv_heads, d = g.head_dim;
  switch (layout) {
    case VLayout::kSeparate:
      return head * d;
    case VLayout::kPhi3Qkv:
      return (h + k + head) * d;
    case VLayout::kGptNeoxQkv:
    case VLayout::kFalconClassic:
      return (head * 3 + 2) * d;
    case VLayout::kFalconMultiQuery:
      return (h + 1) * d;
    case VLayout::kFalconGrouped: {
      const int64_t per_group = h / k + 2;
      return (head * per_group + per_group - 1) * d;
    }
    case VLayout::kGpt2Conv1D:
      break;
  }
  return 0;
}

// Layouts whose format fixes K (ForcedKvHeads): the geometry must agree.
absl::Status CheckForcedKvHeads(VLayout layout, const HeadGeometry& g) {
  const std::optional<int64_t> k = ForcedKvHeads(layout, g.num_heads);
  if (!k.has_value() || g.num_kv_heads == *k) return absl::OkStatus();
  if (layout == VLayout::kFalconMultiQuery) {
    return absl::InvalidArgumentError(
        absl::StrCat("layout ", VLayoutName(layout),
                     " has a single kv head: num_kv_heads must be 1, got ",
                     g.num_kv_heads));
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "layout ", VLayoutName(layout),
      " stores one kv head per query head: num_kv_heads must equal "
      "num_heads (",
      g.num_heads, "), got ", g.num_kv_heads));
}

// Names the layouts (other than `wrong`) that `rows` x `cols` would fit
// with geometry `g`, to point at a mislabelled tensor.
std::string FittingLayoutsHint(VLayout wrong, const HeadGeometry& g,
                               int64_t rows, int64_t cols) {
  std::vector<std::string> fits;
  for (VLayout layout : kAllVLayouts) {
    if (layout == wrong || !CheckForcedKvHeads(layout, g).ok()) continue;
    absl::StatusOr<ExpectedShape> shape = ShapeFor(layout, g);
    if (shape.ok() && shape->Matches(rows, cols)) {
      fits.push_back(VLayoutName(layout));
    }
  }
  if (fits.empty()) return "";
  return absl::StrCat(" (this shape would fit layout ",
                      absl::StrJoin(fits, " or "), ")");
}

MatrixView View(const TensorView& t, const void* data, int64_t rows,
                int64_t cols, int64_t ld) {
  MatrixView v;
  v.data = data;
  v.rows = rows;
  v.cols = cols;
  v.ld = ld;
  v.dtype = t.dtype;
  return v;
}

}  // namespace

std::optional<int64_t> ForcedKvHeads(VLayout layout, int64_t num_heads) {
  switch (layout) {
    case VLayout::kGptNeoxQkv:
    case VLayout::kFalconClassic:
    case VLayout::kGpt2Conv1D:
      return num_heads;
    case VLayout::kFalconMultiQuery:
      return 1;
    case VLayout::kSeparate:
    case VLayout::kPhi3Qkv:
    case VLayout::kFalconGrouped:
      break;
  }
  return std::nullopt;
}

const char* VLayoutName(VLayout layout) {
  switch (layout) {
    case VLayout::kSeparate:
      return "separate";
    case VLayout::kPhi3Qkv:
      return "phi3_qkv";
    case VLayout::kGptNeoxQkv:
      return "gpt_neox_qkv";
    case VLayout::kFalconMultiQuery:
      return "falcon_multi_query";
    case VLayout::kFalconGrouped:
      return "falcon_grouped";
    case VLayout::kFalconClassic:
      return "falcon_classic";
    case VLayout::kGpt2Conv1D:
      return "gpt2_conv1d";
  }
  return "unknown";
}

absl::StatusOr<VLayout> ParseVLayout(const std::string& name) {
  std::vector<std::string> names;
  for (VLayout layout : kAllVLayouts) {
    if (name == VLayoutName(layout)) return layout;
    names.push_back(VLayoutName(layout));
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown V layout \"", name, "\"; known: ", absl::StrJoin(names, ", ")));
}

absl::StatusOr<VViews> ViewV(const TensorView& tensor, VLayout layout,
                             const HeadGeometry& g) {
  const std::string where = absl::StrCat("layout ", VLayoutName(layout),
                                         ", geometry ", GeometryString(g));
  bool known = false;
  for (VLayout l : kAllVLayouts) known |= (l == layout);
  if (!known) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown V layout value ", static_cast<int>(layout)));
  }
  if (g.num_heads <= 0 || g.num_kv_heads <= 0 || g.head_dim <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": every geometry value must be positive"));
  }
  if (g.num_heads % g.num_kv_heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": num_heads must be a multiple of num_kv_heads"));
  }
  if (absl::Status s = CheckForcedKvHeads(layout, g); !s.ok()) return s;
  if (tensor.data == nullptr || tensor.rows <= 0 || tensor.cols <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": empty tensor of shape [", tensor.rows, ", ",
                     tensor.cols, "]"));
  }
  absl::StatusOr<ExpectedShape> expected = ShapeFor(layout, g);
  if (!expected.ok()) return expected.status();
  if (!expected->Matches(tensor.rows, tensor.cols)) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": expected a tensor of shape ", expected->ToString(), ", got [",
        tensor.rows, ", ", tensor.cols, "]",
        FittingLayoutsHint(layout, g, tensor.rows, tensor.cols)));
  }

  const size_t elem = DTypeSize(tensor.dtype);
  const auto* base = static_cast<const uint8_t*>(tensor.data);
  const int64_t k = g.num_kv_heads, d = g.head_dim;
  VViews out;
  out.heads.reserve(static_cast<size_t>(k));

  if (layout == VLayout::kGpt2Conv1D) {
    // V^T: columns [2D, 3D) of [D, 3D]; head h is columns 2D + [h*d, h*d+d).
    const int64_t hidden = tensor.rows, ld = tensor.cols;
    out.layer = View(tensor, base + 2 * hidden * elem, hidden, hidden, ld);
    for (int64_t h = 0; h < k; ++h) {
      out.heads.push_back(
          View(tensor, base + (2 * hidden + h * d) * elem, hidden, d, ld));
    }
    return out;
  }

  // Row layouts: head h's V is rows [HeadStartRow(h), + d). Consecutive
  // heads are a fixed number of rows apart in every layout (d when V is
  // contiguous, 3d for gpt_neox and falcon classic, (H/K + 2) d for falcon
  // grouped), so the layer is one view, blocked when that distance is not d.
  const int64_t cols = tensor.cols;
  const size_t row_bytes = static_cast<size_t>(cols) * elem;
  const int64_t first = HeadStartRow(layout, g, 0);
  const int64_t step = k > 1 ? HeadStartRow(layout, g, 1) - first : d;
  for (int64_t h = 0; h < k; ++h) {
    out.heads.push_back(View(
        tensor, base + static_cast<size_t>(HeadStartRow(layout, g, h)) * row_bytes, d,
        cols, cols));
  }
  out.layer = View(tensor, base + static_cast<size_t>(first) * row_bytes, k * d, cols, cols);
  if (step != d) {
    out.layer.block_rows = d;
    out.layer.block_stride = step * cols;
  }
  return out;
}

void GatherBlockedRows(const MatrixView& v, uint8_t* dst) {
  const size_t elem = DTypeSize(v.dtype);
  const size_t row_bytes = static_cast<size_t>(v.cols) * elem;
  const auto* src = static_cast<const uint8_t*>(v.data);
  for (int64_t r = 0; r < v.rows; ++r) {
    const int64_t offset = (r / v.block_rows) * v.block_stride + (r % v.block_rows) * v.ld;
    std::memcpy(dst + static_cast<size_t>(r) * row_bytes,
                src + static_cast<size_t>(offset) * elem, row_bytes);
  }
}

absl::StatusOr<VSlices> SliceV(const TensorView& tensor, VLayout layout,
                               const HeadGeometry& g) {
  absl::StatusOr<VViews> views = ViewV(tensor, layout, g);
  if (!views.ok()) return views.status();
  VSlices out;
  out.layer = views->layer;
  out.heads = std::move(views->heads);
  if (out.layer.block_rows == 0) return out;
  // Q and K rows sit between the heads: copy head after head, so that V is
  // [K*d, D] again, and point the heads at their rows of the copy (a host
  // batch then shares those bytes: one upload on the CUDA host path).
  const size_t row_bytes = static_cast<size_t>(out.layer.cols) * DTypeSize(tensor.dtype);
  out.gathered.resize(static_cast<size_t>(out.layer.rows) * row_bytes);
  GatherBlockedRows(out.layer, out.gathered.data());
  // A vector's heap buffer survives moves of the vector, so these views
  // stay valid when the VSlices is moved.
  const uint8_t* v_base = out.gathered.data();
  out.layer.data = v_base;
  out.layer.block_rows = 0;
  out.layer.block_stride = 0;
  const int64_t d = g.head_dim;
  for (size_t h = 0; h < out.heads.size(); ++h) {
    out.heads[h].data = v_base + h * static_cast<size_t>(d) * row_bytes;
  }
  return out;
}

}  // namespace rvd

// Where V sits in a stored attention weight, and how to cut it out.
//
// A checkpoint stores the V projection either alone (v_proj) or fused with Q
// and K in one tensor, in one of several orders. ViewV says where the
// layer's whole V block and each kv head's block are, as MatrixViews
// computed from the tensor's address alone (host or device memory alike);
// SliceV does the same for host memory and gathers V when it is not one
// strided matrix. PR is invariant under transposition, so the gpt2 Conv1D
// form (V stored as columns) is viewed as-is without transposing.
//
// Thread-compatible: plain data and pure functions.
#ifndef RVD_KERNELS_V_LAYOUT_H_
#define RVD_KERNELS_V_LAYOUT_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/engine.h"

namespace rvd {

// Mirrors rvd.v1.VLayout (same numbering); see proto/rvd/v1/rvd.proto.
// The one conversion between the two (server/measure.cc) checks at compile
// time that they stay in step.
enum class VLayout {
  kSeparate = 1,
  kPhi3Qkv = 2,
  kGptNeoxQkv = 3,
  kFalconMultiQuery = 4,
  kFalconGrouped = 5,
  kFalconClassic = 6,
  kGpt2Conv1D = 7,
};

// Every layout, numbered 1, 2, ... without a gap.
inline constexpr VLayout kAllVLayouts[] = {
    VLayout::kSeparate,      VLayout::kPhi3Qkv,
    VLayout::kGptNeoxQkv,    VLayout::kFalconMultiQuery,
    VLayout::kFalconGrouped, VLayout::kFalconClassic,
    VLayout::kGpt2Conv1D,
};
inline constexpr bool VLayoutsNumberedInOrder() {
  for (size_t i = 0; i < std::size(kAllVLayouts); ++i) {
    if (static_cast<size_t>(kAllVLayouts[i]) != i + 1) return false;
  }
  return true;
}
static_assert(VLayoutsNumberedInOrder(), "kAllVLayouts must list 1, 2, ...");

// "separate", "phi3_qkv", "gpt_neox_qkv", "falcon_multi_query",
// "falcon_grouped", "falcon_classic", "gpt2_conv1d".
const char* VLayoutName(VLayout layout);
absl::StatusOr<VLayout> ParseVLayout(const std::string& name);

struct HeadGeometry {
  int64_t num_heads = 0;     // query heads H
  int64_t num_kv_heads = 0;  // key/value heads K (V has K heads)
  int64_t head_dim = 0;      // d
};

// The kv head count a layout's format fixes, the one statement of that
// rule (SliceV enforces it; the checkpoint loader derives K from it):
// num_heads for gpt_neox_qkv, falcon_classic and gpt2_conv1d (one kv head
// per query head), 1 for falcon_multi_query, nullopt for the layouts whose
// K comes from the model's config.
std::optional<int64_t> ForcedKvHeads(VLayout layout, int64_t num_heads);

// A stored tensor: row-major, contiguous, shape {rows, cols}.
struct TensorView {
  const void* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  DType dtype = DType::kF32;
};

// The V of one layer.
struct VSlices {
  // The layer's whole V block ([K*d, D], or its transpose for gpt2).
  // Points into the tensor when V is contiguous there or a strided view
  // suffices, else into `gathered`.
  MatrixView layer;
  // One view per kv head (d rows of V each, or d columns for gpt2).
  std::vector<MatrixView> heads;
  // Owns the copy of V when the layout interleaves it with Q and K.
  std::vector<uint8_t> gathered;
};

// V in the tensor, without reading or copying a byte (tensor.data may be
// device memory): the one statement of which rows and strides V has in
// each layout. `layer` is a plain view when V is one strided matrix there,
// else a blocked view (MatrixView::block_rows = head_dim, block_stride the
// head-to-head distance: gpt_neox, falcon classic, falcon grouped with
// K > 1), which ComputePRDevice gathers on the device. `heads` are plain
// views into the tensor. Errors as SliceV's.
struct VViews {
  MatrixView layer;
  std::vector<MatrixView> heads;
};
absl::StatusOr<VViews> ViewV(const TensorView& tensor, VLayout layout,
                             const HeadGeometry& geometry);

// Copies the rows of a blocked view (MatrixView::block_rows > 0) of host
// memory into `dst`, row after row, ld = cols: the host's gather.
void GatherBlockedRows(const MatrixView& blocked, uint8_t* dst);

// Checks that the tensor's shape matches the layout and geometry (the error
// names the expected and the actual shape) and cuts out V: ViewV, with a
// blocked layer gathered into `gathered` (and the heads pointed there, so
// that a host batch's views share the gathered bytes). The returned
// views point into `tensor.data` or into the result's `gathered`, so keep
// both alive while the views are used. Moving a VSlices keeps its views valid.
absl::StatusOr<VSlices> SliceV(const TensorView& tensor, VLayout layout,
                               const HeadGeometry& geometry);

}  // namespace rvd

#endif  // RVD_KERNELS_V_LAYOUT_H_

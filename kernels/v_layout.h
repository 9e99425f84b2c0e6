// Where V sits in a stored attention weight, and how to cut it out.
//
// A checkpoint stores the V projection either alone (v_proj) or fused with Q
// and K in one tensor, in one of several orders. SliceV turns a tensor of a
// known layout into the layer's whole V block and one block per kv head, as
// MatrixViews. PR is invariant under transposition, so the gpt2 Conv1D form
// (V stored as columns) is sliced as-is without transposing.
//
// Thread-compatible: plain data and pure functions.
#ifndef RVD_KERNELS_V_LAYOUT_H_
#define RVD_KERNELS_V_LAYOUT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/engine.h"

namespace rvd {

// Mirrors rvd.v1.VLayout (same numbering); see proto/rvd/v1/rvd.proto.
enum class VLayout {
  kSeparate = 1,
  kPhi3Qkv = 2,
  kGptNeoxQkv = 3,
  kFalconMultiQuery = 4,
  kFalconGrouped = 5,
  kFalconClassic = 6,
  kGpt2Conv1D = 7,
};

// "separate", "phi3_qkv", "gpt_neox_qkv", "falcon_multi_query",
// "falcon_grouped", "falcon_classic", "gpt2_conv1d".
const char* VLayoutName(VLayout layout);
absl::StatusOr<VLayout> ParseVLayout(const std::string& name);

struct HeadGeometry {
  int64_t num_heads = 0;     // query heads H
  int64_t num_kv_heads = 0;  // key/value heads K (V has K heads)
  int64_t head_dim = 0;      // d
};

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

// Checks that the tensor's shape matches the layout and geometry (the error
// names the expected and the actual shape) and cuts out V. The returned
// views point into `tensor.data` or into the result's `gathered`, so keep
// both alive while the views are used. Moving a VSlices keeps its views valid.
absl::StatusOr<VSlices> SliceV(const TensorView& tensor, VLayout layout,
                               const HeadGeometry& geometry);

}  // namespace rvd

#endif  // RVD_KERNELS_V_LAYOUT_H_

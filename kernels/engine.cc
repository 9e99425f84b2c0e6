// Backend-independent parts of the engine contract (see engine.h).
#include "kernels/engine.h"

#include <algorithm>
#include <string>
#include <vector>

namespace rvd {

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return 4;
    case DType::kF16:
    case DType::kBF16:
      return 2;
  }
  return 0;
}

const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "f32";
    case DType::kF16:
      return "f16";
    case DType::kBF16:
      return "bf16";
  }
  return "unknown";
}

const std::vector<std::string>& KnownVariants() {
  static const auto* const kVariants = new std::vector<std::string>{
      "algebraic", "naive", "power_iter", "sketch", "fused"};
  return *kVariants;
}

bool IsExactVariant(const std::string& name) {
  return name == "algebraic" || name == "naive" || name == "fused";
}

}  // namespace rvd

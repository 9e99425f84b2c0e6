#include "kernels/cuda/kernel_registry.h"

namespace rvd::cuda {
namespace {

constexpr FusedKernel kShapeClasses[] = {FusedKernel::kV4, FusedKernel::kV4Triangle,
                                         FusedKernel::kV3, FusedKernel::kV1Tall};
constexpr DType kDtypes[] = {DType::kF32, DType::kF16, DType::kBF16};

std::pair<int, int> Key(DType dtype, FusedKernel shape_class) {
  return {static_cast<int>(dtype), static_cast<int>(shape_class)};
}

}  // namespace

const char* FusedTechnique(FusedKernel kernel, DType dtype) {
  switch (kernel) {
    case FusedKernel::kV4: return "tma-wgmma-square";
    case FusedKernel::kV4Triangle: return "tma-wgmma-triangle";
    case FusedKernel::kV3:
      // v3's policy runs f32 on v2's code (chain_ksteps_f32 0).
      return dtype == DType::kF32 ? "mma-sync-3xtf32-wide" : "mma-sync-wide";
    case FusedKernel::kV1Tall: return "wmma-tall";
  }
  return "unknown";
}

const KernelEntry& KernelTable::Find(DType dtype, FusedKernel shape_class) const {
  return entries_.at(Key(dtype, shape_class));
}

KernelRegistry::KernelRegistry(int sm_major, int sm_minor)
    : sm_major_(sm_major), sm_minor_(sm_minor), table_(ProductTable()) {}

std::shared_ptr<KernelTable> KernelRegistry::ProductTable() const {
  auto t = std::make_shared<KernelTable>();
  for (DType dt : kDtypes) {
    for (FusedKernel k : kShapeClasses) {
      KernelEntry e;
      e.technique = FusedTechnique(k, dt);
      e.policy = FusedPolicyOf(k).name;
      t->entries_[Key(dt, k)] = e;
    }
  }
  return t;
}

std::shared_ptr<const KernelTable> KernelRegistry::Snapshot() const {
  absl::MutexLock lock(&mu_);
  return table_;
}

uint64_t KernelRegistry::Swap(DType dtype, FusedKernel shape_class, KernelEntry entry) {
  absl::MutexLock lock(&mu_);
  auto t = std::make_shared<KernelTable>(*table_);
  t->generation_ = ++generation_;
  entry.generation = generation_;
  t->entries_[Key(dtype, shape_class)] = std::move(entry);
  table_ = std::move(t);
  return generation_;
}

uint64_t KernelRegistry::Reset() {
  std::shared_ptr<KernelTable> t = ProductTable();
  absl::MutexLock lock(&mu_);
  t->generation_ = ++generation_;
  for (auto& [key, e] : t->entries_) e.generation = generation_;
  table_ = std::move(t);
  return generation_;
}

}  // namespace rvd::cuda

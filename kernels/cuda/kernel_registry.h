// The fused kernels in service, swappable at run time (private to
// kernels/cuda/): the seam the self-tuning worker replaces a kernel through,
// and the tests their deliberately wrong ones.
//
// An entry is keyed by (dtype, shape class): the shape class is the fused
// kernel ChooseFusedKernel picks for a matrix (square, triangle, wide, tall);
// the architecture is the engine's device (one registry per engine); the
// variant is fused (the other variants call vendor libraries). It holds the
// launcher, the technique's stable name (what /metrics and tests count), its
// tuning knobs and a generation.
//
// Readers take a Snapshot: an immutable table shared by pointer, so a swap
// never changes a table a call is using (no torn read: a call launches every
// matrix with one table). Every swap bumps the table's generation; a fused
// plan remembers the generation it was made for and is not reused across a
// swap. Thread-safe.
#ifndef RVD_KERNELS_CUDA_KERNEL_REGISTRY_H_
#define RVD_KERNELS_CUDA_KERNEL_REGISTRY_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "kernels/cuda/kernels.h"
#include "kernels/cuda/launch_policy.h"
#include "kernels/engine.h"

namespace rvd::cuda {

// The launchers' signatures by kind of kernel; an entry uses the one of its
// shape class (v1 for tall, v2 for wide, v4 for square and triangle).
struct FusedLaunchers {
  FusedLauncher v1 = &LaunchFused;
  FusedV2Launcher v2 = &LaunchFusedV2;
  FusedV4Launcher v4 = &LaunchFusedV4;
};

struct KernelEntry {
  std::string technique;    // e.g. "tma-wgmma-square"; counted as fused/<technique>
  std::string policy;       // the tuning knobs, e.g. "fused-v4-tma-wgmma-bt128s6c8w16d3p8"
  FusedLaunchers launchers;
  uint64_t generation = 0;  // the table generation this entry was last set in
};

// The product technique name of a shape class on `dtype`: the kernel, and
// for v3 on f32 the v2 code it runs.
const char* FusedTechnique(FusedKernel kernel, DType dtype);

class KernelTable {
 public:
  // The entry for (dtype, shape class); every pair has one.
  const KernelEntry& Find(DType dtype, FusedKernel shape_class) const;
  uint64_t generation() const { return generation_; }

 private:
  friend class KernelRegistry;
  std::map<std::pair<int, int>, KernelEntry> entries_;  // (dtype, shape class)
  uint64_t generation_ = 0;
};

class KernelRegistry {
 public:
  // The product kernels of a device of compute capability sm_major.sm_minor.
  KernelRegistry(int sm_major, int sm_minor);

  std::shared_ptr<const KernelTable> Snapshot() const;
  // Serves (dtype, shape class) with `entry` from now on (calls already
  // running finish on their table); returns the new table's generation.
  uint64_t Swap(DType dtype, FusedKernel shape_class, KernelEntry entry);
  // Every entry back to the product kernels (a new generation).
  uint64_t Reset();

 private:
  std::shared_ptr<KernelTable> ProductTable() const;

  const int sm_major_, sm_minor_;
  mutable absl::Mutex mu_;
  std::shared_ptr<const KernelTable> table_ ABSL_GUARDED_BY(mu_);
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;  // of table_
};

}  // namespace rvd::cuda

#endif  // RVD_KERNELS_CUDA_KERNEL_REGISTRY_H_

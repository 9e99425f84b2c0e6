#include "kernels/cuda/launch_policy.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace rvd::cuda {

bool FusedV4Runs(int sm_major, int sm_minor) { return sm_major == 9 && sm_minor == 0; }

std::string KernelVersion(int sm_major, int sm_minor) {
  // Techniques by name (the served counts' names); the policies' knobs are
  // logged by the daemon at start-up (KernelPolicies).
  const char* wide = FusedV4Runs(sm_major, sm_minor)
                         ? "tma-wgmma-square+tma-wgmma-triangle+mma-sync-wide"
                         : "mma-sync-wide";
  return absl::StrCat("cuda/sm", sm_major, sm_minor, "/fused:", wide, "+wmma-tall");
}

std::map<std::string, std::string> KernelPolicies(int sm_major, int sm_minor) {
  std::map<std::string, std::string> p = {{"mma-sync-wide", kFusedPolicyV3Sm90.name},
                                          {"mma-sync-3xtf32-wide", kFusedPolicyV3Sm90.name},
                                          {"wmma-tall", kFusedPolicySm90.name}};
  if (FusedV4Runs(sm_major, sm_minor)) {
    p["tma-wgmma-square"] = kFusedPolicyV4Sm90.name;
    p["tma-wgmma-triangle"] = kFusedPolicyV4TriangleSm90.name;
  }
  return p;
}

FusedKernel ChooseFusedKernel(int sm_major, int sm_minor, DType dtype, int64_t rows,
                              int64_t cols, bool aligned) {
  if (rows > cols) {
    return kFusedPolicyV4TriangleSm90.tall != 0 && FusedV4TallRuns(dtype, rows, cols, aligned) &&
                   FusedV4Runs(sm_major, sm_minor)
               ? FusedKernel::kV4Triangle
               : FusedKernel::kV1Tall;
  }
  const bool small = rows <= kFusedPolicyV4Sm90.block_tile;
  const bool v4 = FusedV4Runs(sm_major, sm_minor) && aligned &&
                  (dtype != DType::kF32 || small || kFusedPolicyV4Sm90.f32_pairs != 0);
  if (!v4) return FusedKernel::kV3;
  return small && dtype != DType::kF32 ? FusedKernel::kV4Triangle : FusedKernel::kV4;
}

const LaunchPolicy& FusedPolicyOf(FusedKernel kernel) {
  switch (kernel) {
    case FusedKernel::kV4: return kFusedPolicyV4Sm90;
    case FusedKernel::kV4Triangle: return kFusedPolicyV4TriangleSm90;
    case FusedKernel::kV3: return kFusedPolicyV3Sm90;
    case FusedKernel::kV1Tall: break;
  }
  return kFusedPolicySm90;
}

void AppendFusedJobsV2(int32_t matrix, int64_t side, const LaunchPolicy& p,
                       std::vector<FusedJobV2>* jobs) {
  const int64_t ct = p.col_tile > 0 ? p.col_tile : p.block_tile;
  for (int64_t r = 0; r < side; r += p.block_tile) {
    jobs->push_back(FusedJobV2{matrix, static_cast<int32_t>(r),
                               static_cast<int32_t>(r), 1});
    for (int64_t c = r + p.block_tile; c < side; c += ct) {
      jobs->push_back(FusedJobV2{matrix, static_cast<int32_t>(r),
                                 static_cast<int32_t>(c), 0});
    }
  }
}

FusedV4Plan PlanFusedV4(int jobs, int sms, int min_slices, int tail_pieces) {
  FusedV4Plan plan;
  plan.jobs = plan.units = jobs;
  plan.grid = std::min(jobs, sms);
  const int tail = plan.grid > 0 ? jobs % plan.grid : 0;
  if (jobs <= sms || tail == 0) return plan;
  // The busiest block's share of the tail, in jobs: ceil(tail p / grid) / p.
  auto share = [&](int p) { return static_cast<double>((tail * p + sms - 1) / sms) / p; };
  const int most = std::min(tail_pieces, min_slices / kFusedV4MinPieceSlices);
  int best = 1;
  for (int p = 2; p <= most; ++p) {
    if (share(p) < share(best)) best = p;
  }
  if (best == 1) return plan;
  plan.pieces = best;
  plan.cut = tail;
  plan.units = jobs - tail + tail * best;
  return plan;
}

int FusedV4TailPieces(FusedKernel kernel, DType dtype) {
  const LaunchPolicy& p = FusedPolicyOf(kernel);
  return dtype == DType::kF32 ? p.tail_pieces_f32 : p.tail_pieces;
}

int64_t FusedV4PartialBytes(const FusedV4Plan& plan) {
  return int64_t{plan.cut} * plan.pieces * kFusedV4PartialFloats * int64_t{sizeof(float)};
}

int64_t GramSide(int64_t rows, int64_t cols) { return std::min(rows, cols); }

void EnumerateFusedJobs(absl::Span<const int64_t> sides, int block_tile,
                        std::vector<FusedJob>* jobs,
                        std::vector<int32_t>* job_begin) {
  jobs->clear();
  job_begin->clear();
  for (size_t m = 0; m < sides.size(); ++m) {
    job_begin->push_back(static_cast<int32_t>(jobs->size()));
    const int64_t t = (sides[m] + block_tile - 1) / block_tile;
    for (int64_t i = 0; i < t; ++i) {
      for (int64_t j = i; j < t; ++j) {
        jobs->push_back(FusedJob{static_cast<int32_t>(m),
                                 static_cast<int32_t>(i),
                                 static_cast<int32_t>(j), i == j ? 1 : 0});
      }
    }
  }
  job_begin->push_back(static_cast<int32_t>(jobs->size()));
}

std::vector<ShapeGroup> GroupByShape(absl::Span<const MatrixView> batch) {
  std::vector<ShapeGroup> groups;
  for (size_t i = 0; i < batch.size(); ++i) {
    const ShapeKey key{batch[i].rows, batch[i].cols, batch[i].ld,
                       batch[i].dtype};
    auto it = std::find_if(groups.begin(), groups.end(),
                           [&](const ShapeGroup& g) { return g.key == key; });
    if (it == groups.end()) {
      groups.push_back(ShapeGroup{key, {}});
      it = groups.end() - 1;
    }
    it->members.push_back(i);
  }
  return groups;
}

std::vector<size_t> ChunkByBytes(absl::Span<const uint64_t> sizes,
                                 uint64_t budget) {
  std::vector<size_t> bounds = {0};
  uint64_t acc = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (i > bounds.back() && acc + sizes[i] > budget) {
      bounds.push_back(i);
      acc = 0;
    }
    acc += sizes[i];
  }
  if (bounds.back() != sizes.size()) bounds.push_back(sizes.size());
  return bounds;
}

uint64_t PackedBytes(const MatrixView& v, int64_t* ld_out) {
  const int64_t es = static_cast<int64_t>(DTypeSize(v.dtype));
  const int64_t per16 = 16 / es;
  const int64_t ld = (v.cols + per16 - 1) / per16 * per16;
  if (ld_out != nullptr) *ld_out = ld;
  const uint64_t bytes = static_cast<uint64_t>(v.rows * ld * es);
  return (bytes + 255) / 256 * 256;
}

}  // namespace rvd::cuda

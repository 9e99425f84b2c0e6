#include "kernels/cuda/fused_plan.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <numeric>

#include "kernels/cuda/byte_layout.h"
#include "kernels/cuda/cuda_check.h"

namespace rvd::cuda {

DeviceInfo PlanningDevice(int sm_major, int sm_minor, int device_sms, int max_sms) {
  DeviceInfo d;
  d.sm_major = sm_major;
  d.sm_minor = sm_minor;
  d.capped = max_sms > 0 && max_sms < device_sms;
  d.sms = d.capped ? max_sms : device_sms;
  return d;
}

int ProductGrid(int blocks, const DeviceInfo& device) {
  return device.capped ? std::min(blocks, std::max(device.sms, 1)) : blocks;
}

absl::Status PlanFusedCall(absl::Span<const MatrixView> views, const DeviceInfo& device,
                           FusedCall* out, TensorMapEncoder encode) {
  FusedCall call;
  const size_t m = views.size();
  std::vector<MatrixDesc> by_index(m);
  std::vector<FusedKernel> kernel(m);
  for (size_t i = 0; i < m; ++i) {
    by_index[i] = MakeDesc(views[i]);
    kernel[i] = ChooseFusedKernel(device.sm_major, device.sm_minor, views[i].dtype,
                                  views[i].rows, views[i].cols, by_index[i].aligned != 0);
  }
  auto pairs = [&](size_t i) { return FusedV4Pairs(kernel[i], views[i].dtype, by_index[i].n); };
  auto tall = [&](size_t i) {
    return kernel[i] == FusedKernel::kV4Triangle && by_index[i].tall != 0;
  };
  auto key = [&](size_t i) {  // (dtype, kernel, paired tiles or tall)
    return 256 * static_cast<int>(views[i].dtype) + 2 * static_cast<int>(kernel[i]) +
           (pairs(i) || tall(i) ? 1 : 0);
  };
  std::vector<size_t>& order = call.order;
  order.resize(m);
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return key(a) < key(b); });
  std::vector<MatrixDesc> descs(m);
  std::vector<FusedJob> jobs;     // v1 (tall matrices)
  std::vector<FusedJobV2> jobs2;  // v3 and v4 (wide matrices)
  std::vector<int32_t> job_begin(1, 0);
  std::vector<int32_t> list_begin(m + 1, 0);  // offset in jobs or jobs2
  bool any_v4 = false;
  for (size_t s = 0; s < m; ++s) {
    descs[s] = by_index[order[s]];
    const FusedKernel k = kernel[order[s]];
    const int64_t side[1] = {descs[s].n};
    if (k == FusedKernel::kV1Tall) {
      list_begin[s] = static_cast<int32_t>(jobs.size());
      std::vector<FusedJob> one;
      std::vector<int32_t> jb;
      EnumerateFusedJobs(side, kFusedPolicySm90.block_tile, &one, &jb);
      for (FusedJob j : one) {
        j.matrix = static_cast<int32_t>(s);
        jobs.push_back(j);
      }
      job_begin.push_back(job_begin.back() + static_cast<int32_t>(one.size()));
    } else {
      any_v4 |= IsFusedV4(k);
      list_begin[s] = static_cast<int32_t>(jobs2.size());
      AppendFusedJobsV2(static_cast<int32_t>(s), side[0], FusedPolicyOf(k), &jobs2);
      job_begin.push_back(static_cast<int32_t>(jobs.size() + jobs2.size()));
    }
  }
  // One launch per run of matrices with the same (dtype, kernel); v4's with
  // its schedule, whose partial Grams (a cut plan's) share one region of the
  // work memory: the launches run in stream order.
  int64_t partial_bytes = 0;
  for (size_t s0 = 0; s0 < m;) {
    FusedCall::Launch l;
    l.kernel = kernel[order[s0]];
    l.dtype = views[order[s0]].dtype;
    l.pairs = pairs(order[s0]);
    l.tall = tall(order[s0]);
    size_t s1 = s0;
    int min_slices = std::numeric_limits<int>::max();
    for (; s1 < m && key(order[s1]) == key(order[s0]); ++s1) {
      min_slices = std::min(min_slices, FusedV4Slices(descs[s1].k));
    }
    l.matrices = static_cast<int64_t>(s1 - s0);
    l.j0 = job_begin[s0];
    l.jobs = job_begin[s1] - l.j0;
    l.list0 = list_begin[s0];
    for (int j = 0; j < l.jobs; ++j) {
      l.offdiag |= !(l.kernel == FusedKernel::kV1Tall ? jobs[l.list0 + j].diagonal
                                                       : jobs2[l.list0 + j].diagonal);
    }
    if (IsFusedV4(l.kernel)) {
      l.plan = PlanFusedV4(l.jobs, device.sms, min_slices, FusedV4TailPieces(l.kernel, l.dtype));
      partial_bytes = std::max(partial_bytes, FusedV4PartialBytes(l.plan));
      l.grid = l.plan.grid;
    } else {
      l.grid = ProductGrid(l.jobs, device);
    }
    call.launches.push_back(l);
    s0 = s1;
  }
  // A call whose matrices fused v4 finishes in the kernel needs no finalize.
  for (size_t s = 0; s < m; ++s) {
    call.finished &= FusedV4FinishesMatrix(kernel[order[s]], descs[s].n);
  }
  call.finalize_grid = ProductGrid(FinalizeBlocks(static_cast<int>(m)), device);
  call.needs_tickets = partial_bytes > 0;
  const size_t nj = jobs.size() + jobs2.size();
  Layout up;
  call.o_desc = up.Add(m * sizeof(MatrixDesc));
  call.o_jobs = up.Add(jobs.size() * sizeof(FusedJob));
  call.o_jobs2 = up.Add(jobs2.size() * sizeof(FusedJobV2));
  call.o_jb = up.Add((m + 1) * sizeof(int32_t));
  call.o_maps = up.Add(any_v4 ? m * kTensorMapBytes : 0);  // 256-aligned
  Layout work;
  call.o_g2 = work.Add(nj * sizeof(double));
  call.o_tr = work.Add(nj * sizeof(double));
  call.o_mx = work.Add(nj * sizeof(float));
  call.o_pr = work.Add(m * (sizeof(double) + sizeof(int32_t)));
  call.o_st = call.o_pr + m * sizeof(double);
  call.o_part = work.Add(partial_bytes);
  call.work_bytes = work.size();
  call.upload.assign(up.size(), 0);
  void* blob = call.upload.data();
  std::memcpy(At<void>(blob, call.o_desc), descs.data(), m * sizeof(MatrixDesc));
  if (!jobs.empty()) {
    std::memcpy(At<void>(blob, call.o_jobs), jobs.data(), jobs.size() * sizeof(FusedJob));
  }
  if (!jobs2.empty()) {
    std::memcpy(At<void>(blob, call.o_jobs2), jobs2.data(), jobs2.size() * sizeof(FusedJobV2));
  }
  std::memcpy(At<void>(blob, call.o_jb), job_begin.data(), (m + 1) * sizeof(int32_t));
  for (size_t s = 0; any_v4 && s < m; ++s) {
    if (!IsFusedV4(kernel[order[s]])) continue;
    // The driver writes a tensor map only to 64-byte aligned memory.
    alignas(64) unsigned char map[kTensorMapBytes];
    RVD_CUDA_RETURN_IF_ERROR(encode(views[order[s]].dtype, descs[s], map));
    std::memcpy(At<unsigned char>(blob, call.o_maps) + s * kTensorMapBytes, map,
                kTensorMapBytes);
  }
  call.views.assign(views.begin(), views.end());
  *out = std::move(call);
  return absl::OkStatus();
}

cudaError_t LaunchFusedCall(const FusedCall& call, const KernelTable& table, const void* d,
                            void* w, int32_t* tickets, cudaStream_t stream) {
  const auto* d_desc = At<MatrixDesc>(d, call.o_desc);
  const auto* d_jobs = At<FusedJob>(d, call.o_jobs);
  const auto* d_jobs2 = At<FusedJobV2>(d, call.o_jobs2);
  const void* d_maps = At<unsigned char>(d, call.o_maps);
  for (const FusedCall::Launch& l : call.launches) {
    double* g2 = At<double>(w, call.o_g2) + l.j0;
    double* tr = At<double>(w, call.o_tr) + l.j0;
    float* mx = At<float>(w, call.o_mx) + l.j0;
    const FusedLaunchers& launchers = table.Find(l.dtype, l.kernel).launchers;
    cudaError_t e = cudaSuccess;
    switch (l.kernel) {
      case FusedKernel::kV1Tall:
        e = launchers.v1(l.dtype, d_desc, d_jobs + l.list0, l.jobs, l.offdiag, g2, tr, mx,
                         stream, l.grid);
        break;
      case FusedKernel::kV3:
        e = launchers.v2(l.dtype, d_desc, d_jobs2 + l.list0, l.jobs, l.offdiag, g2, tr, mx,
                         stream, l.grid);
        break;
      case FusedKernel::kV4:
      case FusedKernel::kV4Triangle: {
        const FusedV4Launch v4{d_maps,
                               d_desc,
                               d_jobs2 + l.list0,
                               l.plan,
                               At<float>(w, call.o_part),
                               tickets,
                               l.kernel == FusedKernel::kV4Triangle,
                               l.pairs,
                               l.tall,
                               g2,
                               tr,
                               mx,
                               At<double>(w, call.o_pr),
                               At<int32_t>(w, call.o_st)};
        e = launchers.v4(l.dtype, v4, stream);
        break;
      }
    }
    if (e != cudaSuccess) return e;
  }
  if (call.finished) return cudaSuccess;
  return LaunchFinalize(d_desc, At<int32_t>(d, call.o_jb), static_cast<int>(call.views.size()),
                        At<double>(w, call.o_g2), At<double>(w, call.o_tr),
                        At<float>(w, call.o_mx), At<double>(w, call.o_pr),
                        At<int32_t>(w, call.o_st), stream, call.finalize_grid);
}

}  // namespace rvd::cuda

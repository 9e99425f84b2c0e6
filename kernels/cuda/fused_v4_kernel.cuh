// The fused PR kernel, version 4 (device code, private to kernels/cuda/;
// launched by fused_v4_launch.cuh; no host-only includes: NVRTC compiles
// it for sm_90a): Hopper's tensor
// copy engine (TMA) and warpgroup MMAs (wgmma), for wide W whose rows start
// on 16-byte boundaries: bf16/f16 and f32 of any size (f32 with a Gram side
// <= 128: diagonal jobs, ConvertSlices; larger: paired tiles,
// ConvertPairedTiles). sm_90a only (wgmma): the translation units that
// include this file are compiled for sm_90a alone, and the engine launches
// v4 only on compute capability 9.0.
//
// Why a new kernel: v2/v3 (mma.sync fed by cp.async) were issue-bound on the
// H200 (docs/history/kernel-notes.md: loads alone 0.24 ms, MMAs alone 0.18 ms for 480 x
// 128x4096 bf16, against a 0.12 ms floor). Here one thread issues all loads
// (one TMA copy per 128 x 64 tile) and each warpgroup issues 4 wgmma per
// 64-wide K-slice instead of ~40 mma.sync per warp.
// H200 (docs/history/kernel-notes.md, fused v4; kernel + finalize, v3 -> v4, A-B medians of
// runs s3-9 and s4-9): 480 x 128x4096 bf16 0.36 -> 0.142 ms (floor 0.119),
// f32 1.78 -> 0.34 (floor 0.238), 256 x 128x4096 bf16 0.19 -> 0.076, 32 x
// 1024x4096 bf16 0.97 -> 0.28.
//
// Work split. A job is a 128 x 128 tile (row0, col0) of one Gram, col0 >=
// row0 (launch_policy.h, FusedJobV2 with col_tile 128). A diagonal job
// computes its upper triangle's three 64 x 64 blocks (16-bit) or its whole
// symmetric square (f32: see ConvertSlices); an off-diagonal one, weight
// 2. Grid: one persistent block per SM, units round-robin: a unit is a
// job, or, when a launch's last round would leave SMs idle (FusedV4Plan;
// f32 only, by policy), a K-piece of one of its first jobs, whose partial
// sums the block finishing the job's last piece adds up (CombinePieces):
// 480 x 128x4096 f32 0.3070 -> 0.2951 ms in isolated calls (H200 s8-7).
//
// Block: 2 consumer warpgroups (warps 0-7), then for 16-bit a producer
// warpgroup (384 threads; setmaxnreg 40 / 232: two accumulator sets and
// the sums need ~200), for f32 two converter warpgroups (512 threads;
// 104 / 152: one accumulator set; see ConvertSlices). The triangle
// (16-bit Grams of side <= 128, Consumers<true>): 3 consumer warpgroups,
// one 64 x 64 block each, and the producer (512 threads; 56 / 152). At the
// H200's 700 W power cap, where back-to-back launches run (docs/history/kernel-notes.md,
// session 6), its 3/4 of the tensor work is 3-6% faster.
//   producer (16-bit): one thread streams each job's K-slices into a
//     ring of kStages stages with cp.async.bulk.tensor (128B swizzle, the
//     layout wgmma reads), signalling `full[s]` through the mbarrier's
//     transaction count; a diagonal job loads one 128 x 64 tile per slice
//     (it is both operands), an off-diagonal job two.
//   consumer warpgroup c: Gram rows 64c .. 64c+63 of the tile, all 128
//     columns (wgmma m64n128k16, A and B from shared memory, K-major);
//     16-bit diagonal jobs: block (c,c) and half of (0,1)'s k-steps
//     (m64n64; see the consumers).
//     Per slice (two slices for 16-bit Grams of side > 128): a chain of 4
//     (8) wgmma starting from zero (scale-d = 0) into one of two
//     accumulator sets; while they run, the previous chain's set is added
//     into the running f32 sums with round to nearest (the tensor cores'
//     accumulation truncates: docs/history/kernel-notes.md, v1 and v3; chains of 4 and 8
//     k-steps keep the PR within 2e-7 and 5e-7) and its stages freed (each
//     warp arrives on `empty[s]`). f32: one accumulator set, each slice
//     added once its wgmma are done (the conversion, not the tensor
//     cores, sets the pace).
// Epilogue per job (ReduceJob): sum of squares of the running sums per
// thread, four at a time in f32 and then in float64 (32 x 1024x4096 bf16
// 0.2451 -> 0.2408 ms isolated, H200 s9-4), the diagonal entries' sum
// (||W||_F^2 = trace G, as v3: its truncation bias matches ||G||^2's and
// cancels in t^2 / g) and largest value; xor-shuffle trees, the 8 consumer
// warps in index order: the same bits on every run.
//
// maxabs output: v4 reads W only through the tensor cores, so it reports
// sqrt(max_i G_ii / k) instead of max |w|: max |w|^2 lies in [D / k, D] for
// D = max_i G_ii, so the finalize's range test (D / k >= 1e-30 and D <=
// 1e36, since |G_ij| <= D) is as safe as with max |w|. D = 0 (all zero, or
// squares that underflowed) reports +Inf (untrusted: the engine falls back
// to the float64 oracle), non-finite D reports 0 (Inf trace with finite max:
// untrusted; a NaN input makes the trace NaN: non-finite).
#ifndef RVD_KERNELS_CUDA_FUSED_V4_KERNEL_CUH_
#define RVD_KERNELS_CUDA_FUSED_V4_KERNEL_CUH_

#include <cuda/std/cstdint>
#include <cuda/std/type_traits>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernels/cuda/descriptors.h"
#include "kernels/cuda/finalize.cuh"

namespace rvd::cuda::fused_v4 {

constexpr int kTile = 128;                   // Gram rows and columns of a job
constexpr int kSliceK = 64;                  // K elements per stage
constexpr int kHalfTileBytes = kTile * kSliceK * 2;  // one 16-bit operand tile

// The consumer warpgroups. Square: 2, each 64 Gram rows x all 128 columns
// of the job (wgmma m64n128). Triangle (16-bit Grams of side <= 128, all
// jobs diagonal): 3, the 64 x 64 blocks (0,0), (0,1) and (1,1) of the
// symmetric square (m64n64; (0,1) counts twice): 3/4 of the square's
// tensor-core work, with the same instruction sequence in every warpgroup
// (only the operand addresses differ, computed without a branch: a branch
// on the warpgroup around wgmma serializes them, ptxas C7520).
template <bool kTriangle>
struct Consumers {
  static constexpr int kGroups = kTriangle ? 3 : 2;
  static constexpr int kWarps = 4 * kGroups;
  static constexpr int kN = kTriangle ? 64 : 128;  // wgmma N: Gram columns per warpgroup
  static constexpr int kAcc = kN / 2;              // accumulators per thread
};
constexpr int kMaxConsumerWarps = Consumers<true>::kWarps;

// Shared memory per input type: the TMA ring of kStages stages (1024-byte
// aligned for the 128B swizzle), f32's converted sets, then the mbarriers,
// f32's per-set s^-2 and the epilogue's per-warp partials (two sets).
//   16-bit: 6 stages of 32 KB (two operands for an off-diagonal job), which
//           the consumers read.
//   f32:    4 stages of one 128 x 64 f32 tile (diagonal jobs only, n <=
//           128), which the converter warpgroups turn into 3 sets of f16
//           hi (16 KB) + 2 lo (16 KB), which the consumers read.
// The consumers' ring (`Ring*`: full / empty barriers, slots) is the stages
// for 16-bit, the sets for f32. (The sets written in place of the f32
// stages, 7 of them and no sets, were 9% slower: a stage then stays taken
// until the consumers are done with it, run s4-7.)
//   f32 pairs (Gram side > 128, kPairs): the same 7 x 32 KB as 2 stages
//           (one per converter warpgroup) and 5 sets, each stage and set
//           one 128 x 64 tile: an off-diagonal job's slice takes two of
//           each (its row block A, then its column block B), a diagonal
//           job's one (see ConvertPairedTiles).
template <typename T, bool kTriangle = false, bool kPairs = false>
struct Layout {
  static constexpr bool kF32 = ::cuda::std::is_same_v<T, float>;
  static_assert(!(kF32 && kTriangle), "f32 runs square jobs only");
  static_assert(kF32 || !kPairs, "paired tiles are f32's");
  static constexpr int kStages = kF32 ? (kPairs ? 2 : 4) : 6;
  static constexpr int kTileBytes = kTile * kSliceK * (kF32 ? 4 : 2);  // one TMA copy
  static constexpr int kStageBytes = kF32 ? kTileBytes : 2 * kTileBytes;
  static constexpr int kSets = kF32 ? (kPairs ? 5 : 3) : 0;
  static constexpr int kSetBytes = 2 * kHalfTileBytes;
  static constexpr int kSetOffset = kStages * kStageBytes;
  static constexpr int kFullOffset = kSetOffset + kSets * kSetBytes;
  static constexpr int kEmptyOffset = kFullOffset + 8 * kStages;  // 16-bit
  static constexpr int kSetFullOffset = kEmptyOffset + 8 * kStages;
  static constexpr int kSetEmptyOffset = kSetFullOffset + 8 * kSets;
  static constexpr int kInvOffset = kSetEmptyOffset + 8 * kSets;
  static constexpr int kReduceOffset = kInvOffset + (kSets * 4 + 15) / 16 * 16;
  // Epilogue partials (2 sets x 3 doubles per warp), then 3 x 8 words of
  // per-warp maxima (f32's scales), then a cut job's ticket (CombinePieces).
  // Then, for 16-bit square jobs, the second warpgroup's part of a
  // diagonal job's block (0,1) (64 x 64 f32; see the consumers).
  static constexpr int kTicketOffset =
      kReduceOffset + 2 * kMaxConsumerWarps * 24 + 3 * kMaxConsumerWarps * 4;
  static constexpr int kSwapOffset = (kTicketOffset + 64 + 15) / 16 * 16;
  static constexpr int kSwapBytes = !kF32 && !kTriangle ? 64 * 64 * 4 : 0;
  static constexpr int kSmemBytes = 1024 + kSwapOffset + kSwapBytes;
  // Block: the consumers, then one warpgroup (16-bit: its first thread
  // issues the copies) or, f32, two that convert (and issue the copies).
  static constexpr int kThirdWarpgroups = kF32 ? 2 : 1;
  static constexpr int kThreads = 128 * (Consumers<kTriangle>::kGroups + kThirdWarpgroups);
  static constexpr int kRingSlots = kF32 ? kSets : kStages;
  static constexpr int kRingOffset = kF32 ? kSetOffset : 0;
  static constexpr int kRingSlotBytes = kF32 ? kSetBytes : kStageBytes;
  static constexpr int kRingFullOffset = kF32 ? kSetFullOffset : kFullOffset;
  static constexpr int kRingEmptyOffset = kF32 ? kSetEmptyOffset : kEmptyOffset;
  static_assert(kSmemBytes <= 227 * 1024, "the H200's shared memory per block");
};

// The kernel's purpose (Mode, a template argument): kernels.h.

// setmaxnreg moves registers between the warpgroups of a block launched
// with kLaunch each (64K registers / threads, multiple of 8): the
// consumers' increase must equal what the others give up, or
// setmaxnreg.inc waits forever (an 80 / 216 split did, H200 run s2-5).
// 16-bit: the producer warpgroup only issues TMA copies (40; 56 next to
// three consumer warpgroups); the consumers hold two accumulator sets and
// the sums (232 for m64n128; 152 for m64n64). f32: two converter
// warpgroups (104 each: eight float4 in flight per thread), and the
// consumers hold one accumulator set and the sums (152): the tensor cores
// are not what limits f32, the conversion is (run s4-3).
template <typename T, bool kTriangle = false>
struct Registers {
  using L = Layout<T, kTriangle>;
  static constexpr int kLaunch = 65536 / L::kThreads / 8 * 8;
  static constexpr int kThird = L::kF32 ? 104 : (kTriangle ? 56 : 40);
  static constexpr int kConsumer = L::kF32 || kTriangle ? 152 : 232;
  static_assert(Consumers<kTriangle>::kGroups * (kConsumer - kLaunch) ==
                    L::kThirdWarpgroups * (kLaunch - kThird),
                "register budget");
};

// The launch policy as data (launch_policy.h) and this code agree.
constexpr LaunchPolicy kPolicy = kFusedPolicyV4Sm90;
static_assert(kPolicy.block_tile == kTile && kPolicy.col_tile == kTile);
static_assert(kPolicy.warps * 32 == Layout<__nv_bfloat16>::kThreads &&
              kPolicy.warps_f32 * 32 == Layout<float>::kThreads && kPolicy.warp_tile == 64);
static_assert(kPolicy.k_slice_bytes == kSliceK * 2);
static_assert(kPolicy.stages == Layout<__nv_bfloat16>::kStages &&
              kPolicy.stages_offdiag == Layout<__nv_bfloat16>::kStages);
static_assert(kPolicy.chain_ksteps == kSliceK / 16 && kPolicy.chain_ksteps_f32 == kSliceK / 16);
// Slices per accumulator chain of a 16-bit Gram of side > 128 (the
// consumer loop is written for 1 or 2).
constexpr int kLargeChainSlices = kPolicy.chain_ksteps_large / (kSliceK / 16);
static_assert(kLargeChainSlices == 2 && kPolicy.chain_ksteps_large % (kSliceK / 16) == 0);
static_assert(kPolicy.f32_split == 2);  // hi hi^T + hi (2 lo)^T
static_assert(kPolicy.blocks_per_sm == 1);
constexpr LaunchPolicy kTrianglePolicy = kFusedPolicyV4TriangleSm90;
static_assert(kTrianglePolicy.block_tile == kTile && kTrianglePolicy.warp_tile == 64 &&
              kTrianglePolicy.warps * 32 == Layout<__nv_bfloat16, true>::kThreads &&
              kTrianglePolicy.stages == Layout<__nv_bfloat16, true>::kStages &&
              kTrianglePolicy.chain_ksteps == kSliceK / 16);

static_assert(FusedV4Slices(kSliceK + 1) == 2);
static_assert(Consumers<false>::kAcc * 128 * Consumers<false>::kGroups <= kFusedV4PartialFloats &&
              Consumers<true>::kAcc * 128 * Consumers<true>::kGroups <= kFusedV4PartialFloats);

// The launch's units (launch_policy.h, FusedV4Plan): jobs 0 .. cut - 1 as
// `pieces` units each, one per K-range, then the other jobs whole. A
// piece's partial sums go to `partials` (kFusedV4PartialFloats per piece,
// in piece order per cut job); `tickets` (two per cut job, zero at launch,
// left zero) count the pieces done and stored (CombinePieces).
struct Schedule {
  int cut, pieces, units;
  float* partials;
  int32_t* tickets;
};

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define RVD_FUSED_V4_DEVICE 1
#endif

#ifdef RVD_FUSED_V4_DEVICE

__device__ __forceinline__ uint32_t SmemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void MbarInit(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count));
}

__device__ __forceinline__ void MbarArriveExpectTx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar),
               "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void MbarArrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}

__device__ __forceinline__ void MbarWait(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  while (!done) {
    asm volatile(
        "{\n .reg .pred p;\n"
        " mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        " selp.u32 %0, 1, 0, p;\n}"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  }
}

// One 128 x 64 tile (rows c1.., K elements c0..) of the matrix behind `map`
// into shared memory at `dst`; rows or columns past the matrix read as zero
// (and still count in the transaction bytes).
__device__ __forceinline__ void TmaLoadTile(uint32_t dst, const TensorMap* map, int c0,
                                            int c1, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3}], [%4];" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar)
      : "memory");
}

// The maps were written by a host-to-device copy (generic proxy); the copy
// engine reads them through the tensormap proxy.
__device__ __forceinline__ void AcquireTensorMap(const TensorMap* map) {
  asm volatile("fence.proxy.tensormap::generic.acquire.gpu [%0], 128;" ::"l"(
                   reinterpret_cast<uint64_t>(map))
               : "memory");
}

// wgmma shared-memory descriptor of a K-major operand in the 128B-swizzle
// layout TMA writes: rows of 128 bytes, 8-row groups 1024 bytes apart.
__device__ __forceinline__ uint64_t SwizzledDesc(uint32_t addr) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (uint64_t{1} << 16) |
         (uint64_t{1024 >> 4} << 32) | (uint64_t{1} << 62);
}

__device__ __forceinline__ void WgmmaFence() {
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
}
__device__ __forceinline__ void WgmmaCommit() {
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}
// Waits until at most `kPending` committed groups of this warpgroup run.
template <int kPending>
__device__ __forceinline__ void WgmmaWait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(kPending) : "memory");
}

// Pins the accumulators to this point of the instruction stream: wgmma
// writes them asynchronously, which the compiler cannot see.
template <int kAcc>
__device__ __forceinline__ void FenceAccumulators(float (&d)[kAcc]) {
#pragma unroll
  for (int i = 0; i < kAcc; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// The accumulator operand lists of wgmma m64nNk16 (N / 2 per thread):
// "{%0, .., %31}" or "{%0, .., %63}", then descriptors %32, %33 or %64, %65.
#define RVD_V4_D32                                                              \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, " \
  "%17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define RVD_V4_D64                                                               \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, " \
  "%17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "  \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, "   \
  "%47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, "   \
  "%62, %63}"
// The accumulator operands with constraint c: "+f" (read and written) or
// "=f" (written only).
#define RVD_V4_D32_ARGS(c, d)                                                   \
  c(d[0]), c(d[1]), c(d[2]), c(d[3]), c(d[4]), c(d[5]), c(d[6]), c(d[7]), \
      c(d[8]), c(d[9]), c(d[10]), c(d[11]), c(d[12]), c(d[13]), c(d[14]), \
      c(d[15]), c(d[16]), c(d[17]), c(d[18]), c(d[19]), c(d[20]), c(d[21]), \
      c(d[22]), c(d[23]), c(d[24]), c(d[25]), c(d[26]), c(d[27]), c(d[28]), \
      c(d[29]), c(d[30]), c(d[31])
#define RVD_V4_D64_ARGS(c, d)                                                   \
  RVD_V4_D32_ARGS(c, d), c(d[32]), c(d[33]), c(d[34]), c(d[35]), c(d[36]),  \
      c(d[37]), c(d[38]), c(d[39]), c(d[40]), c(d[41]), c(d[42]), c(d[43]), \
      c(d[44]), c(d[45]), c(d[46]), c(d[47]), c(d[48]), c(d[49]), c(d[50]), \
      c(d[51]), c(d[52]), c(d[53]), c(d[54]), c(d[55]), c(d[56]), c(d[57]), \
      c(d[58]), c(d[59]), c(d[60]), c(d[61]), c(d[62]), c(d[63])

// d = A (64 x 16, K-major) * B^T (B: kN x 16, K-major) (+ d unless
// kFirst: the first k-step of a chain writes d without reading it, so the
// compiler need not keep d's old values alive). kMn: both operands
// MN-major instead (wgmma's transpose bits; 16-bit only): a tall W's
// K-slice as TMA copies it, Gram indices contiguous.
template <typename T, int kN, bool kFirst, int kOff = 0, bool kMn = false, int kSize>
__device__ __forceinline__ void Wgmma(float (&acc)[kSize], uint64_t a, uint64_t b) {
  static_assert(::cuda::std::is_same_v<T, __nv_bfloat16> || ::cuda::std::is_same_v<T, __half>);
  static_assert(kN == 64 || kN == 128);
  static_assert(kOff + kN / 2 <= kSize);
  float* const d = acc + kOff;  // this wgmma's kN / 2 accumulators
  // One asm per (N, first, types): PTX wants the shape and operand types in
  // the text.
#define RVD_V4_WGMMA_FIRST(n, list, outs, a_at, b_at, types)                             \
  asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, 0, 0;\n"                             \
               " wgmma.mma_async.sync.aligned.m64n" #n "k16.f32." types " " list ", %" \
               #a_at ", %" #b_at ", p, 1, 1, " RVD_V4_TRANSPOSES ";\n}"                      \
               : outs                                                                    \
               : "l"(a), "l"(b))
#define RVD_V4_WGMMA_ACCUMULATE(n, list, ops, a_at, b_at, types)                   \
  asm volatile("wgmma.mma_async.sync.aligned.m64n" #n "k16.f32." types " " list \
               ", %" #a_at ", %" #b_at ", 1, 1, 1, " RVD_V4_TRANSPOSES ";"              \
               : ops                                                               \
               : "l"(a), "l"(b))
  // The (first, types) choice for one shape: n, its operand list and
  // arguments, and where the descriptors sit.
#define RVD_V4_WGMMA_SHAPE(n, list, args, a_at, b_at)                              \
  if constexpr (kFirst && kBf16) {                                               \
    RVD_V4_WGMMA_FIRST(n, list, args("=f", d), a_at, b_at, "bf16.bf16");         \
  } else if constexpr (kFirst) {                                                 \
    RVD_V4_WGMMA_FIRST(n, list, args("=f", d), a_at, b_at, "f16.f16");           \
  } else if constexpr (kBf16) {                                                  \
    RVD_V4_WGMMA_ACCUMULATE(n, list, args("+f", d), a_at, b_at, "bf16.bf16");    \
  } else {                                                                       \
    RVD_V4_WGMMA_ACCUMULATE(n, list, args("+f", d), a_at, b_at, "f16.f16");      \
  }
  constexpr bool kBf16 = ::cuda::std::is_same_v<T, __nv_bfloat16>;
  if constexpr (kN == 128 && !kMn) {
#define RVD_V4_TRANSPOSES "0, 0"
    RVD_V4_WGMMA_SHAPE(128, RVD_V4_D64, RVD_V4_D64_ARGS, 64, 65)
#undef RVD_V4_TRANSPOSES
  } else if constexpr (!kMn) {
#define RVD_V4_TRANSPOSES "0, 0"
    RVD_V4_WGMMA_SHAPE(64, RVD_V4_D32, RVD_V4_D32_ARGS, 32, 33)
#undef RVD_V4_TRANSPOSES
  } else {
    static_assert(kN == 64, "MN-major operands: the triangle's m64n64 only");
#define RVD_V4_TRANSPOSES "1, 1"
    RVD_V4_WGMMA_SHAPE(64, RVD_V4_D32, RVD_V4_D32_ARGS, 32, 33)
#undef RVD_V4_TRANSPOSES
  }
#undef RVD_V4_WGMMA_SHAPE
#undef RVD_V4_WGMMA_FIRST
#undef RVD_V4_WGMMA_ACCUMULATE
}

#undef RVD_V4_D32
#undef RVD_V4_D64
#undef RVD_V4_D32_ARGS
#undef RVD_V4_D64_ARGS

template <typename T>
__device__ __forceinline__ T WarpSum(T v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float WarpMaxKeepNaN(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float u = __shfl_xor_sync(0xffffffffu, v, o);
    v = (u > v || u != u) ? u : v;
  }
  return v;
}

// Unit u: its job (index and tile), its K-slices [k0, k1) and its piece
// (-1: the whole job).
struct Unit {
  int j, k0, k1, piece;
  FusedJobV2 job;
};

__device__ __forceinline__ Unit UnitAt(int u, const Schedule& s, const FusedJobV2* jobs,
                                       const MatrixDesc* mats) {
  Unit r;
  const int pieces = s.cut * s.pieces;
  r.j = u < pieces ? u / s.pieces : s.cut + (u - pieces);
  r.piece = u < pieces ? u % s.pieces : -1;
  r.job = jobs[r.j];
  const int slices = FusedV4Slices(mats[r.job.matrix].k);  // (wide: cols)
  r.k0 = r.piece < 0 ? 0 : PieceBegin(r.piece, s.pieces, slices);
  r.k1 = r.piece < 0 ? slices : PieceBegin(r.piece + 1, s.pieces, slices);
  return r;
}

#endif  // RVD_FUSED_V4_DEVICE

#ifdef RVD_FUSED_V4_DEVICE

// The producer thread: each unit's K-slices into the ring, in unit order.
// kTall (a tall W's Gram W^T W, side <= 128: the triangle's diagonal jobs):
// a K-slice is 64 rows of W, copied as two 64 x 64 boxes (columns 0-63,
// 64-127) into the tile's two halves, each 64 rows of K of 128 bytes: the
// MN-major layout, 128B-swizzled, that the consumers' transposed wgmma read.
template <typename T, int kMode, bool kTall = false>
__device__ __forceinline__ void ProduceSlices(const TensorMap* maps, const MatrixDesc* mats,
                                              const FusedJobV2* jobs, const Schedule& sched,
                                              uint32_t tiles, uint32_t full0, uint32_t empty0) {
  using L = Layout<T>;
  int stage = 0;
  uint32_t phase = 0;
  for (int u = blockIdx.x; u < sched.units; u += gridDim.x) {
    const Unit unit = UnitAt(u, sched, jobs, mats);
    const FusedJobV2 job = unit.job;
    const TensorMap* map = maps + job.matrix;
    AcquireTensorMap(map);
    const bool one_tile = job.diagonal != 0 || kMode == kProbeBIsA;
    for (int k = unit.k0; k < unit.k1; ++k) {
      MbarWait(empty0 + 8 * stage, phase ^ 1);
      const uint32_t full = full0 + 8 * stage;
      const uint32_t a = tiles + stage * L::kStageBytes;
      if constexpr (kMode == kProbeNoLoad) {
        MbarArrive(full);
      } else {
        MbarArriveExpectTx(full, one_tile ? L::kTileBytes : 2 * L::kTileBytes);
        if constexpr (kTall) {
          TmaLoadTile(a, map, 0, k * kSliceK, full);
          TmaLoadTile(a + L::kTileBytes / 2, map, kTile / 2, k * kSliceK, full);
        } else {
          TmaLoadTile(a, map, k * kSliceK, job.row0, full);
          if (!one_tile) TmaLoadTile(a + L::kTileBytes, map, k * kSliceK, job.col0, full);
        }
      }
      if (++stage == L::kStages) {
        stage = 0;
        phase ^= 1;
      }
    }
  }
}

// Job j's outputs from each consumer thread's kAcc running sums: its
// warpgroup's block of the tile has its first row and column at (row0,
// col0) and counts `weight` times (1 or 2) in ||G||^2. Fragment entry i:
// tile row row0 + 16 (warp % 4) + lane / 4 + 8 ((i / 2) % 2), column col0
// + 8 (i / 4) + 2 (lane % 4) + i % 2.
template <int kGroups, int kAcc>
__device__ __forceinline__ void ReduceJob(const float (&sum)[kAcc], bool diag, int row0, int col0,
                                          double weight, double upper_weight, int k, int j,
                                          double* red, int parity, double* g2, double* trace,
                                          float* maxabs, const MatrixDesc& desc, double* pr,
                                          int32_t* status) {
  constexpr int kWarps = 4 * kGroups;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  // The squares four at a time in f32, each group then added in float64:
  // a quarter of the float64 conversions (16 per clock per SM: 0.5 us of a
  // 16-bit square job's epilogue). The terms are positive, so a group is
  // within 4 roundings (2.4e-7) of its exact sum. A thread whose squares
  // could overflow f32 (a sum over 2^127) or lose bits to its subnormals
  // (under 2^-100), or that holds a NaN, sums them in float64.
  double g = 0.0, gu = 0.0;
#pragma unroll
  for (int q = 0; q < kAcc; q += 4) {
    float s = __fmul_rn(sum[q], sum[q]);
#pragma unroll
    for (int i = q + 1; i < q + 4; ++i) s = __fmaf_rn(sum[i], sum[i], s);
    if (q < kAcc / 2) {
      g += s;
    } else {
      gu += s;
    }
  }
  if (!(g + gu >= 0x1p-100 && g + gu <= 0x1p127)) {
    g = gu = 0.0;
#pragma unroll
    for (int i = 0; i < kAcc; ++i) {
      const double v = sum[i];
      if (i < kAcc / 2) {
        g = fma(v, v, g);
      } else {
        gu = fma(v, v, gu);
      }
    }
  }
  double t = 0.0;
  float dmax = 0.0f;
  if (diag) {
#pragma unroll
    for (int i = 0; i < kAcc; ++i) {
      const int row = row0 + 16 * (warp % 4) + lane / 4 + 8 * ((i / 2) % 2);
      const int col = col0 + 8 * (i / 4) + 2 * (lane % 4) + i % 2;
      if (row == col) {
        t += sum[i];
        dmax = (sum[i] > dmax || sum[i] != sum[i]) ? sum[i] : dmax;
      }
    }
  }
  g = g * weight + gu * upper_weight;  // weights 1 or 2: exact products
  g = WarpSum(g);
  t = WarpSum(t);
  dmax = WarpMaxKeepNaN(dmax);
  double* slot = red + parity * kWarps * 3;
  if (lane == 0) {
    slot[3 * warp] = g;
    slot[3 * warp + 1] = t;
    slot[3 * warp + 2] = dmax;
  }
  asm volatile("bar.sync 1, %0;" ::"n"(128 * kGroups) : "memory");
  if (threadIdx.x == 0) {
    double bg = 0.0, bt = 0.0;
    float bd = 0.0f;
    for (int w = 0; w < kWarps; ++w) {
      bg += slot[3 * w];
      bt += slot[3 * w + 1];
      const float d = static_cast<float>(slot[3 * w + 2]);
      bd = (d > bd || d != d) ? d : bd;
    }
    const double g = diag ? bg : 2.0 * bg;
    g2[j] = g;
    trace[j] = bt;
    float mx = 0.0f;
    if (diag) {
      if (bd == 0.0f) {
        mx = __int_as_float(0x7f800000);  // +Inf: untrusted
      } else if (isfinite(bd)) {
        mx = sqrtf(bd / static_cast<float>(k));
      }
    }
    maxabs[j] = mx;
    // The matrix's only job: its PR here (pr, status: the matrix's, or
    // null), not in a finalize kernel.
    if (pr != nullptr) FinalizeMatrix(desc, g, bt, mx, pr, status);
  }
}

// A piece of cut job unit.j is done, its partial sums in `sum`. Each
// block takes the job's ticket first (tickets[2 cut]). The others store
// their sums, fence and count the store (tickets[2 cut + 1]); the block
// holding the last ticket waits until they have stored (they hold earlier
// tickets, so they run and will store), adds every piece in piece order
// into `sum` (returns true: the job's epilogue is this block's) and sets
// both counters back to zero. When that block's piece is piece 0, the
// largest (PieceBegin) and so, starting with the others, usually the last
// to finish, its sums stay in registers: it loads the other pieces only
// (against storing every piece and loading them all, s8-4: half the L2
// traffic, no fence). The loads go to L2 (ld.cg). (The mutant adds piece
// 0 where piece 1 belongs.)
template <int kMode, int kGroups, int kAcc>
__device__ __forceinline__ bool CombinePieces(float (&sum)[kAcc], const Unit& unit,
                                              const Schedule& s, int* ticket) {
  constexpr int kThreads = 128 * kGroups;
  const int t = threadIdx.x;
  const int cut = unit.j;
  int32_t* const done = s.tickets + 2 * cut;
  int32_t* const stored = done + 1;
  float* const first = s.partials + static_cast<size_t>(cut) * s.pieces * kFusedV4PartialFloats;
  float* const mine = first + unit.piece * kFusedV4PartialFloats;
  if (t == 0) *ticket = atomicAdd(done, 1);
  asm volatile("bar.sync 1, %0;" ::"n"(kThreads) : "memory");
  const bool last = *ticket == s.pieces - 1;
  const bool keep = last && unit.piece == 0 && kMode != kMutant;  // piece 0 stays here
  if (!keep) {
#pragma unroll
    for (int i = 0; i < kAcc; ++i) __stcg(mine + i * kThreads + t, sum[i]);
  }
  if (!last) {
    __threadfence();
    asm volatile("bar.sync 1, %0;" ::"n"(kThreads) : "memory");
    if (t == 0) atomicAdd(stored, 1);
    return false;
  }
  if (t == 0) {
    int n = 0;
    do {
      asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(n) : "l"(stored) : "memory");
    } while (n != s.pieces - 1);
    *done = 0;  // every piece has counted and stored: ready for the next launch
    *stored = 0;
  }
  asm volatile("bar.sync 1, %0;" ::"n"(kThreads) : "memory");
  __threadfence();
  if (!keep) {  // (this block's own piece, if not 0, reads back as it stored it)
#pragma unroll
    for (int i = 0; i < kAcc; ++i) sum[i] = __ldcg(first + i * kThreads + t);
  }
  for (int q = 1; q < s.pieces; ++q) {
    const float* const piece = first + (kMode == kMutant && q == 1 ? 0 : q) * kFusedV4PartialFloats;
#pragma unroll
    for (int i = 0; i < kAcc; ++i) sum[i] = __fadd_rn(sum[i], __ldcg(piece + i * kThreads + t));
  }
  return true;
}

// f32: the converter warpgroups split each 128 x 64 tile into f16 hi + lo
// (w s = hi + lo + O(2^-22 |w s|), s a power of 2 that puts the tile's
// largest |w| in [2^14, 2^15): f16's range holds it and lo keeps 11 more
// bits), and a slice's product is hi hi^T + hi (2 lo)^T = P + 2X (8 chained
// wgmma in the consumers), unscaled by s^-2 when added to the sums. The
// Gram is P + X + X^T; only diagonal jobs run here (n <= 128), so the sums
// hold the whole square and
//   trace(P + 2X) = trace(G),
//   sum (P + 2X)_ij^2 = sum G_ij^2 + sum (X_ij - X_ji)^2    (P symmetric),
// the last term second order in the rounding residuals (like the lo lo^T
// that 3xTF32 drops): one product fewer than hi hi^T + hi lo^T + lo hi^T.
//
// The scale of a slice after the group's first in a job is the exact scale
// of the group's slice before it, kept when the slice's own largest |w|
// w_max fits under it: 2^10 <= w_max s < 65504 (no overflow in hi; at most
// 4 bits of headroom lost, so lo stays normal for all but entries 2^-13
// below w_max). Else the slice is converted again at its exact scale
// (rare: a jump in magnitude). Power-of-2 scales are exact, so the
// products do not depend on which admissible scale was used beyond
// subnormal residuals; the choice depends on the matrix alone
// (deterministic). One read of the tile instead of two (run s3-8); the
// exact scale of every slice from a tile held in registers (two barriers
// per slice) was 8% slower (run s4-8).
//
// Two converter warpgroups, each converting every other slice on its own
// (slice n: group n % 2): one warpgroup alone issued in 27% of its cycles
// (latency-bound, run s4-3); two at once: 0.365 -> 0.344 ms (run s4-5).
constexpr int kConverterGroups = 2;
constexpr int kConverters = 128;                                   // threads per group
constexpr int kConvertTasks = kTile * kSliceK / 4 / kConverters;  // float4s per thread
static_assert(12 * kConverterGroups <= 3 * kMaxConsumerWarps, "red_max words per group");

struct TileScale {
  float scale;  // s
  float inv;    // s^-2, clamped at 2^126: a tile that large overflows the
                // f32 Gram anyway, and the finalize then falls back
};

// The scale that puts w_max (its f32 bits in `max_bits`) in [2^14, 2^15):
// s = 2^(e - 127) with e = 268 - biased exponent, clamped to [64, 254].
__device__ __forceinline__ TileScale ExactScale(uint32_t max_bits) {
  int e = 268 - static_cast<int>(max_bits >> 23);
  e = e < 64 ? 64 : (e > 254 ? 254 : e);
  // s^-2 = 2^p, p = 254 - 2e in [-254, 126]: normal, subnormal or 0 (the
  // bits directly: ldexpf took ~30 dependent instructions per slice).
  const int p = 254 - 2 * e;
  const uint32_t inv = p >= -126 ? static_cast<uint32_t>(p + 127) << 23
                                 : (p >= -149 ? 1u << (p + 149) : 0u);
  return {__uint_as_float(static_cast<uint32_t>(e) << 23), __uint_as_float(inv)};
}

__device__ __forceinline__ bool ScaleFits(uint32_t max_bits, float scale) {
  const float x = __uint_as_float(max_bits) * scale;
  return max_bits == 0 || (x >= 1024.0f && x < 65504.0f);  // NaN: false
}

__device__ __forceinline__ float MaxAbs(float4 v) {
  return fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
}

// Group g's largest |w| `mx`, as f32 bits, through `slot` (one word per
// warp of the group). Also a barrier (2 + g) of the group. (fmaxf drops a
// NaN; a NaN input still makes the Gram NaN, which the finalize reports.)
__device__ __forceinline__ uint32_t ConverterMax(float mx, int g, uint32_t* slot) {
  uint32_t bits = __reduce_max_sync(0xffffffffu, __float_as_uint(mx));
  if (threadIdx.x % 32 == 0) slot[(threadIdx.x / 32) % 4] = bits;
  asm volatile("bar.sync %0, %1;" ::"r"(2 + g), "n"(kConverters) : "memory");
#pragma unroll
  for (int w = 0; w < kConverters / 32; ++w) bits = max(bits, slot[w]);
  return bits;
}

// Writes v, float4 t of the tile (row t / 16, floats 4 (t % 16) .. + 3), as
// hi and 2 lo at scale `scale` (kDoubleLo false: hi and lo; paired tiles).
template <bool kDoubleLo = true>
__device__ __forceinline__ void ConvertFloat4(float4 v, float scale, uint32_t hi, uint32_t lo,
                                              int t) {
  const int row = t / 16, h = t % 16;
  const float x[4] = {v.x * scale, v.y * scale, v.z * scale, v.w * scale};
  __half2 h01 = __floats2half2_rn(x[0], x[1]), h23 = __floats2half2_rn(x[2], x[3]);
  const float2 b01 = __half22float2(h01), b23 = __half22float2(h23);
  // lo = x - hi is exact in f32; doubling it in f16 is exact (|lo| <= 8).
  __half2 l01 = __floats2half2_rn(x[0] - b01.x, x[1] - b01.y);
  __half2 l23 = __floats2half2_rn(x[2] - b23.x, x[3] - b23.y);
  if constexpr (kDoubleLo) {
    l01 = __hadd2(l01, l01);
    l23 = __hadd2(l23, l23);
  }
  // 16-byte chunk h / 2 of the row, swizzled with row % 8; this half of it.
  const uint32_t at = row * 128 + (((h / 2) ^ (row % 8)) << 4) + (h % 2) * 8;
  asm volatile("st.shared.v2.b32 [%0], {%1, %2};" ::"r"(hi + at),
               "r"(*reinterpret_cast<uint32_t*>(&h01)), "r"(*reinterpret_cast<uint32_t*>(&h23))
               : "memory");
  asm volatile("st.shared.v2.b32 [%0], {%1, %2};" ::"r"(lo + at),
               "r"(*reinterpret_cast<uint32_t*>(&l01)), "r"(*reinterpret_cast<uint32_t*>(&l23))
               : "memory");
}

// Task q of converter ct is float4 ct + 128 q of the tile; each 8 lanes
// read 128 contiguous bytes.
__device__ __forceinline__ int TaskIndex(int ct, int q) { return ct + kConverters * q; }

// A job's first slice (per group): one read of the tile for its largest
// |w|.
__device__ __forceinline__ TileScale ScaleOfTile(const float* src, int ct, int g,
                                                 uint32_t* slot) {
  const float4* tile = reinterpret_cast<const float4*>(src);
  float mx = 0.0f;
#pragma unroll
  for (int q = 0; q < kConvertTasks; ++q) mx = fmaxf(mx, MaxAbs(tile[TaskIndex(ct, q)]));
  return ExactScale(ConverterMax(mx, g, slot));
}

// Converter ct's part of the tile at `scale` into hi and 2 lo; returns its
// largest |w|. The loads go in batches ahead of the stores: each store's
// asm orders memory, so a load written after it would wait for it (one
// float4 in flight per warp: 0.41 -> 0.44 ms, run s4-1).
__device__ __forceinline__ float ConvertTile(const float* src, float scale, uint32_t hi,
                                             uint32_t lo, int ct) {
  constexpr int kBatch = 8;
  static_assert(kConvertTasks % kBatch == 0);
  const float4* tile = reinterpret_cast<const float4*>(src);
  float mx = 0.0f;
#pragma unroll
  for (int q0 = 0; q0 < kConvertTasks; q0 += kBatch) {
    float4 v[kBatch];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) v[b] = tile[TaskIndex(ct, q0 + b)];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      mx = fmaxf(mx, MaxAbs(v[b]));
      ConvertFloat4(v[b], scale, hi, lo, TaskIndex(ct, q0 + b));
    }
  }
  return mx;
}

// This block's K-slices in order: unit u's slice k, the n-th.
struct SliceCursor {
  int u, k, n;
  Unit unit;

  __device__ __forceinline__ void Start(const FusedJobV2* jobs, const MatrixDesc* mats,
                                        const Schedule& sched) {
    u = blockIdx.x;
    n = 0;
    Load(jobs, mats, sched);
  }
  __device__ __forceinline__ void Next(const FusedJobV2* jobs, const MatrixDesc* mats,
                                       const Schedule& sched) {
    ++n;
    if (++k == unit.k1) {
      u += gridDim.x;
      Load(jobs, mats, sched);
    }
  }
  __device__ __forceinline__ void Load(const FusedJobV2* jobs, const MatrixDesc* mats,
                                       const Schedule& sched) {
    if (u >= sched.units) return;
    unit = UnitAt(u, sched, jobs, mats);
    k = unit.k0;
  }
};

// The converter warpgroups (f32): group g takes slices n = g, g + 2, ...
// of the block, each from its TMA stage (n % kStages) into a hi/lo set (n %
// kSets), which `set_full` hands to the consumers (in slice order) with
// its s^-2 in `set_inv`; `set_empty` hands it back. Each group's first
// thread also issues its copies: slice n + kStages into the stage slice n
// was read from, once the group's barrier at the end of the conversion
// says it is read (so the f32 stages need no `empty` barriers).
template <int kMode>
__device__ __forceinline__ void ConvertSlices(const TensorMap* maps, const MatrixDesc* mats,
                                              const FusedJobV2* jobs, const Schedule& sched,
                                              uint32_t tiles, const unsigned char* base,
                                              uint32_t full0, uint32_t set_full0,
                                              uint32_t set_empty0, float* set_inv,
                                              uint32_t* red_max) {
  using L = Layout<float>;
  static_assert(L::kStages % kConverterGroups == 0);
  const int g = (threadIdx.x - 128 * Consumers<false>::kGroups) / kConverters;
  const int ct = threadIdx.x % kConverters;
  // This group's words of red_max: 4 for ScaleOfTile, 2 x 4 alternating.
  uint32_t* const slots = red_max + 12 * g;
  auto step = [&](SliceCursor& c) {
    for (int i = 0; i < kConverterGroups; ++i) c.Next(jobs, mats, sched);
  };
  SliceCursor cur;
  cur.Start(jobs, mats, sched);
  for (int i = 0; i < g; ++i) cur.Next(jobs, mats, sched);
  // The copies (converter 0): `load` runs kStages slices ahead of `cur`.
  SliceCursor load = cur;
  int acquired = -1;  // the unit whose tensor map was last acquired
  int last_matrix = -1;
  auto issue_load = [&] {
    if (load.u >= sched.units) return;
    int matrix = load.unit.job.matrix;
    // (The f32 mutant reads a unit's first slice from the matrix of the
    // block's unit before it.)
    if (kMode == kMutant && load.k == load.unit.k0 && last_matrix >= 0) matrix = last_matrix;
    last_matrix = load.unit.job.matrix;
    const TensorMap* map = maps + matrix;
    if (load.u != acquired) {
      AcquireTensorMap(map);
      acquired = load.u;
    }
    const int stage = load.n % L::kStages;
    const uint32_t full = full0 + 8 * stage;
    if constexpr (kMode == kProbeNoLoad || kMode == kProbeMmaOnly) {
      MbarArrive(full);
    } else {
      MbarArriveExpectTx(full, L::kTileBytes);
      TmaLoadTile(tiles + stage * L::kStageBytes, map, load.k * kSliceK, load.unit.job.row0,
                  full);
    }
    step(load);
  };
  if (ct == 0) {
    for (int i = 0; i < L::kStages / kConverterGroups; ++i) issue_load();
  }
  int converted = 0;
  int scaled_unit = -1;              // the unit of next_scale
  TileScale next_scale{1.0f, 1.0f};  // the group's last slice's exact scale
  for (; cur.u < sched.units; step(cur)) {
    const int stage = cur.n % L::kStages, set = cur.n % L::kSets;
    MbarWait(full0 + 8 * stage, (cur.n / L::kStages) & 1);
    MbarWait(set_empty0 + 8 * set, ((cur.n / L::kSets) & 1) ^ 1);
    const float* src = reinterpret_cast<const float*>(base + stage * L::kStageBytes);
    const uint32_t hi = tiles + L::kSetOffset + set * L::kSetBytes;
    // Converts at `ts` into the set; returns the slice's largest |w|
    // (bits) once every converter of the group has written its part.
    auto convert = [&](const TileScale& ts) {
      const float mx = ConvertTile(src, ts.scale, hi, hi + kHalfTileBytes, ct);
      // The tensor cores read the set through the async proxy.
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
      // Two slots, alternating: a warp may write the next slice's maximum
      // before a slower one has read this one's.
      return ConverterMax(mx, g, slots + 4 + 4 * (converted & 1));
    };
    float inv = 1.0f;
    if constexpr (kMode != kProbeNoConvert && kMode != kProbeMmaOnly) {
      const bool exact = cur.u != scaled_unit;
      TileScale ts = exact ? ScaleOfTile(src, ct, g, slots) : next_scale;
      const uint32_t mx = convert(ts);
      next_scale = ExactScale(mx);
      scaled_unit = cur.u;
      // (The f32 mutant keeps a scale that does not fit.)
      if (!exact && kMode != kMutant && !ScaleFits(mx, ts.scale)) {  // uniform
        // (Converting again rewrites the same maxima into the slot.)
        ts = next_scale;
        convert(ts);
      }
      inv = ts.inv;
    } else {
      asm volatile("bar.sync %0, %1;" ::"r"(2 + g), "n"(kConverters) : "memory");
    }
    ++converted;
    if (ct == 0) {
      set_inv[set] = inv;
      MbarArrive(set_full0 + 8 * set);
      issue_load();
    }
  }
}

// f32 Grams of side > 128 (kPairs): an off-diagonal job (row blocks A and
// B, scales s and t) needs G_AB = W_A W_B^T itself, not just a square
// whose sums of squares equal G's (hi hi^T + hi (2 lo)^T above holds only
// over the whole symmetric square, where X - X^T cancels). With W_A s =
// hA + lA + O(2^-22 |W_A s|) and likewise B, a slice's product is
//   hA hB^T + hA lB^T + lA hB^T = s t G_AB - lA lB^T + (residuals),
// three chained wgmma per k-step, unscaled by (s t)^-1 when added to the
// sums (the 3xTF32 scheme with f16 halves: lA lB^T is second order). A
// diagonal job runs the same three products with B = A (one tile), so one
// instruction sequence serves both kinds of job.
//
// The tiles, in block order: each unit's slices, a slice's tile A (rows
// row0..) then, off the diagonal, its tile B (rows col0..). Converter
// group g takes tiles n = g, g + 2, ... (within an off-diagonal job one
// group converts every A, the other every B), each from its own stage (n %
// 2 = g) into set n % kSets, with its own exact scale: every tile is read
// into registers first (16 float4 per thread), so the group's barrier after
// the reads both gives the tile's largest |w| and frees the stage for the
// group's next copy, which is in flight while the tile is converted. No
// scale is carried between tiles (nothing to re-convert); set_inv holds
// each tile's s^-1, and the consumers multiply the two of a slice.
struct TileCursor {
  int u, k, op, n;  // unit, its slice k, tile op (0: A, 1: B), block tile n
  bool pair;        // the unit's job is off the diagonal: two tiles a slice
  Unit unit;

  __device__ __forceinline__ void Start(const FusedJobV2* jobs, const MatrixDesc* mats,
                                        const Schedule& sched) {
    u = blockIdx.x;
    n = 0;
    Load(jobs, mats, sched);
  }
  __device__ __forceinline__ void Next(const FusedJobV2* jobs, const MatrixDesc* mats,
                                       const Schedule& sched) {
    ++n;
    if (pair && op == 0) {
      op = 1;
      return;
    }
    op = 0;
    if (++k == unit.k1) {
      u += gridDim.x;
      Load(jobs, mats, sched);
    }
  }
  __device__ __forceinline__ void Load(const FusedJobV2* jobs, const MatrixDesc* mats,
                                       const Schedule& sched) {
    op = 0;
    if (u >= sched.units) return;
    unit = UnitAt(u, sched, jobs, mats);
    k = unit.k0;
    pair = unit.job.diagonal == 0;
  }
  // The first W row of the tile.
  __device__ __forceinline__ int Row() const { return op == 0 ? unit.job.row0 : unit.job.col0; }
};

// s^-1 for the scale s = 2^(e - 127) of ExactScale (bits e << 23): 2^(127 -
// e), e in [64, 254], so 2^63 down to 2^-127 (subnormal, exact).
__device__ __forceinline__ float InverseScale(float scale) {
  const int e = static_cast<int>(__float_as_uint(scale) >> 23);
  const int p = 127 - e;
  return __uint_as_float(p >= -126 ? static_cast<uint32_t>(p + 127) << 23 : 1u << 22);
}

template <int kMode>
__device__ __forceinline__ void ConvertPairedTiles(const TensorMap* maps, const MatrixDesc* mats,
                                                   const FusedJobV2* jobs, const Schedule& sched,
                                                   uint32_t tiles, uint32_t full0,
                                                   uint32_t set_full0, uint32_t set_empty0,
                                                   float* set_inv, uint32_t* red_max) {
  using L = Layout<float, false, true>;
  static_assert(L::kStages == kConverterGroups, "one stage per converter group");
  const int g = (threadIdx.x - 128 * Consumers<false>::kGroups) / kConverters;
  const int ct = threadIdx.x % kConverters;
  // This group's 4 words of red_max (ConverterMax): written before the
  // group's first barrier of a tile, read before its second.
  uint32_t* const slots = red_max + 12 * g;
  auto step = [&](TileCursor& c) {
    for (int i = 0; i < kConverterGroups; ++i) c.Next(jobs, mats, sched);
  };
  TileCursor cur;
  cur.Start(jobs, mats, sched);
  for (int i = 0; i < g; ++i) cur.Next(jobs, mats, sched);
  // The copies (converter 0): tile `t` into its stage. One cursor, stepped
  // to the group's next tile at the top of each round, before the tile's 64
  // registers are live (a second cursor for the copies, or the step next
  // to the registers, spilled at setmaxnreg 104).
  int acquired = -1;  // the unit whose tensor map was last acquired
  auto issue_load = [&](const TileCursor& t) {
    if (t.u >= sched.units) return;
    const TensorMap* map = maps + t.unit.job.matrix;
    if (t.u != acquired) {
      AcquireTensorMap(map);
      acquired = t.u;
    }
    const uint32_t full = full0 + 8 * (t.n % L::kStages);
    if constexpr (kMode == kProbeNoLoad || kMode == kProbeMmaOnly) {
      MbarArrive(full);
    } else {
      MbarArriveExpectTx(full, L::kTileBytes);
      TmaLoadTile(tiles + (t.n % L::kStages) * L::kStageBytes, map, t.k * kSliceK, t.Row(),
                  full);
    }
  };
  if (ct == 0) issue_load(cur);
  while (cur.u < sched.units) {
    const int stage = cur.n % L::kStages, set = cur.n % L::kSets;
    const uint32_t set_phase = ((cur.n / L::kSets) & 1) ^ 1;
    const uint32_t full_phase = (cur.n / L::kStages) & 1;
    step(cur);  // now the group's next tile
    MbarWait(full0 + 8 * stage, full_phase);
    // (32-bit shared addresses: registers are what this loop is short of.)
    const uint32_t src = tiles + stage * L::kStageBytes + 16 * ct;
    float4 v[kConvertTasks];
    float mx = 0.0f;
#pragma unroll
    for (int q = 0; q < kConvertTasks; ++q) {
      asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];"
                   : "=f"(v[q].x), "=f"(v[q].y), "=f"(v[q].z), "=f"(v[q].w)
                   : "r"(src + 16 * kConverters * q)
                   : "memory");
      mx = fmaxf(mx, MaxAbs(v[q]));
    }
    // The group's barrier: every thread has read the stage, which takes
    // the group's next tile now.
    const TileScale ts = ExactScale(ConverterMax(mx, g, slots));
    if (ct == 0) issue_load(cur);
    MbarWait(set_empty0 + 8 * set, set_phase);
    const uint32_t hi = tiles + L::kSetOffset + set * L::kSetBytes;
    if constexpr (kMode != kProbeNoConvert && kMode != kProbeMmaOnly) {
#pragma unroll
      for (int q = 0; q < kConvertTasks; ++q) {
        ConvertFloat4<false>(v[q], ts.scale, hi, hi + kHalfTileBytes, TaskIndex(ct, q));
      }
    }
    // The tensor cores read the set through the async proxy; the barrier:
    // the whole set is written.
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    asm volatile("bar.sync %0, %1;" ::"r"(2 + g), "n"(kConverters) : "memory");
    if (ct == 0) {
      set_inv[set] = InverseScale(ts.scale);
      MbarArrive(set_full0 + 8 * set);
    }
  }
}

#endif  // RVD_FUSED_V4_DEVICE

template <typename T, int kMode, bool kTriangle, bool kPairs = false, bool kTall = false>
__global__ void __launch_bounds__(Layout<T, kTriangle>::kThreads, 1)
    FusedV4Kernel(const TensorMap* maps, const MatrixDesc* mats, const FusedJobV2* jobs,
                  Schedule sched, double* g2, double* trace, float* maxabs, double* pr,
                  int32_t* status) {
#ifdef RVD_FUSED_V4_DEVICE
  using L = Layout<T, kTriangle, kPairs>;
  static_assert(!kTall || (kTriangle && !L::kF32), "tall W: the 16-bit triangle");
  using R = Registers<T, kTriangle>;  // (kPairs: the same warpgroups)
  using C = Consumers<kTriangle>;
  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw = SmemAddr(smem_raw);
  const uint32_t tiles = (raw + 1023) & ~1023u;
  unsigned char* const base = smem_raw + (tiles - raw);
  const uint32_t full0 = tiles + L::kFullOffset;  // full[s] at full0 + 8 s
  const uint32_t empty0 = tiles + L::kEmptyOffset;
  const uint32_t set_full0 = tiles + L::kSetFullOffset;  // f32
  const uint32_t set_empty0 = tiles + L::kSetEmptyOffset;
  float* const set_inv = reinterpret_cast<float*>(base + L::kInvOffset);
  double* const red = reinterpret_cast<double*>(base + L::kReduceOffset);
  uint32_t* const red_max = reinterpret_cast<uint32_t*>(red + 2 * kMaxConsumerWarps * 3);
  int* const ticket = reinterpret_cast<int*>(base + L::kTicketOffset);

  const int warp = threadIdx.x / 32;  // consumers 0 .. 7, then the third warpgroup(s)
  const int lane = threadIdx.x % 32;
  if (threadIdx.x == 0) {
    for (int s = 0; s < L::kStages; ++s) {
      MbarInit(full0 + 8 * s, 1);
      MbarInit(empty0 + 8 * s, C::kWarps);
    }
    for (int s = 0; s < L::kSets; ++s) {
      MbarInit(set_full0 + 8 * s, 1);
      MbarInit(set_empty0 + 8 * s, C::kWarps);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();

  if (warp >= C::kWarps) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(R::kThird));
    if constexpr (kPairs) {
      ConvertPairedTiles<kMode>(maps, mats, jobs, sched, tiles, full0, set_full0, set_empty0,
                                set_inv, red_max);
    } else if constexpr (L::kF32) {
      ConvertSlices<kMode>(maps, mats, jobs, sched, tiles, base, full0, set_full0, set_empty0,
                           set_inv, red_max);
    } else if (warp == C::kWarps && lane == 0) {
      ProduceSlices<T, kMode, kTall>(maps, mats, jobs, sched, tiles, full0, empty0);
    }
    return;
  }
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(R::kConsumer));

  // Consumers. A slice passes three steps: prepare (wait until its ring
  // slot is full: 16-bit, the TMA stage; f32, the converted set), issue
  // (wgmma into part0 or part1), retire (add into the sums, free the slot).
  //
  // 16-bit Grams of side > 128 chain two slices (8 k-steps) per
  // accumulator: half the adds, 5-6% faster on 32 x 1024x4096; 128-row
  // Grams keep one slice per chain (two were 3-5% slower there: a chain
  // holds two stages). Chosen from the matrix alone, so that a matrix gets
  // the same bits in every launch; max error 5e-7 (run s3-3). f32 chains
  // one slice (each has its own scale).
  //
  // Warpgroup c's block of the tile: square, rows 64c.., all columns;
  // triangle, block (c / 2, (c + 1) / 2) (in units of 64), counted twice
  // when off the diagonal. Operand offsets by arithmetic, not a branch
  // (a branch around wgmma on the warpgroup index serializes them: C7520,
  // runs s3-5, s3-6).
  //
  // Square kernel, 16-bit diagonal jobs (kBlocks): the 64 x 64 blocks
  // (0,0), (0,1), (1,1), not the whole square (whose (1,0) repeats (0,1)):
  // warpgroup c multiplies its block (c,c) over every k-step (m64n64, into
  // accumulators 0-31) and block (0,1) over k-steps 2c and 2c + 1 (into
  // 32-63); at the job's end warpgroup 1's sums of (0,1) are added to
  // warpgroup 0's through shared memory, and (0,1) counts twice. 3/4 of
  // the square's tensor-core work with the same instruction sequence in
  // both warpgroups; 32 x 1024x4096 bf16 0.2532 -> 0.2497 ms in isolated
  // calls (H200 run s7-1). The chains' pipeline is written out once per kind
  // of job with its own accumulator arrays: one pipeline choosing the
  // wgmma shape per job, or two sharing the arrays, made ptxas serialize
  // the wgmma (C7511).
  constexpr int kAcc = C::kAcc;
  constexpr bool kBlocks = !L::kF32 && !kTriangle;
  const int c = warp / 4;
  const int row0 = kTriangle ? 64 * (c / 2) : 64 * c;
  const int col0 = kTriangle ? 64 * ((c + 1) / 2) : 0;
  const double weight = kTriangle && c == 1 ? 2.0 : 1.0;
  const uint32_t ring_full0 = tiles + L::kRingFullOffset;
  const uint32_t ring_empty0 = tiles + L::kRingEmptyOffset;
  int next = 0, done = 0;
  uint32_t next_phase = 0;
  int parity = 0;  // which set of epilogue partials
  float part0[kAcc], part1[kAcc];
  for (int w = blockIdx.x; w < sched.units; w += gridDim.x) {
    const Unit unit = UnitAt(w, sched, jobs, mats);
    const int j = unit.j;
    const FusedJobV2 job = unit.job;
    const MatrixDesc desc = mats[job.matrix];
    const int cols = desc.k;  // K: the long side
    const int slices = unit.k1 - unit.k0;
    const int chain =
        !L::kF32 && kMode != kProbeChain1 && desc.n > kTile ? kLargeChainSlices : 1;
    // The matrix's only job (Gram side <= 128): its PR from this block.
    const bool one_job = pr != nullptr && desc.n <= kTile;
    double* const job_pr = one_job ? pr + job.matrix : nullptr;
    int32_t* const job_status = one_job ? status + job.matrix : nullptr;
    const int chains = (slices + chain - 1) / chain;
    const bool diag = job.diagonal != 0;
    const bool one_tile = diag || kMode == kProbeBIsA;
    const bool diag_blocks = kBlocks && diag;
    float sum[kAcc];
#pragma unroll
    for (int i = 0; i < kAcc; ++i) sum[i] = 0.0f;
    auto free_slot = [&] {
      if (lane == 0) MbarArrive(ring_empty0 + 8 * done);
      if (++done == L::kRingSlots) done = 0;
    };
    // The prepared slice's operand tiles (16-bit: the stage; f32: its hi
    // set, 2 lo at + kHalfTileBytes) and, f32, its s^-2.
    uint32_t ready = 0;
    float ready_inv = 1.0f;
    auto prepare = [&] {
      MbarWait(ring_full0 + 8 * next, next_phase);
      ready = tiles + L::kRingOffset + next * L::kRingSlotBytes;
      if constexpr (L::kF32) ready_inv = set_inv[next];
      if (++next == L::kRingSlots) {
        next = 0;
        next_phase ^= 1;
      }
    };
    // The prepared slice into `part` (from zero when `fresh`); f32: hi hi^T
    // + hi (2 lo)^T; `blocks`: the diagonal job's blocks.
    auto issue = [&](bool blocks, float (&part)[kAcc], bool fresh) {
      using MmaT = ::cuda::std::conditional_t<L::kF32, __half, T>;
      if constexpr (kBlocks) {
        if (blocks) {
          // Block (c, c) into part[0..31] over every k-step; block (0, 1)
          // into part[32..63] over k-steps 2c and 2c + 1 (the mutant: 2c
          // twice).
          const uint32_t rows = ready + 64 * c * 128;
#pragma unroll
          for (int kk = 0; kk < kSliceK / 16; ++kk) {
            const uint64_t d = SwizzledDesc(rows + 32 * kk);
            if (kk == 0 && fresh) {
              Wgmma<T, 64, true>(part, d, d);
            } else {
              Wgmma<T, 64, false>(part, d, d);
            }
          }
#pragma unroll
          for (int i = 0; i < 2; ++i) {
            const int kk = 2 * c + i;
            const int kb = kMode == kMutant ? 2 * c : kk;
            const uint64_t da = SwizzledDesc(ready + 32 * kk);
            const uint64_t db = SwizzledDesc(ready + 64 * 128 + 32 * kb);
            if (i == 0 && fresh) {
              Wgmma<T, 64, true, 32>(part, da, db);
            } else {
              Wgmma<T, 64, false, 32>(part, da, db);
            }
          }
          return;
        }
      }
      // (Rows of 128 bytes: row r of a tile at + 128 r; K-major, a k-step
      // 32 bytes along the rows. kTall: a half tile per 64 Gram indices,
      // row r holding K index r, so the same offsets and a k-step of 16
      // rows: 2048 bytes, the 8-row groups 1024 apart as SwizzledDesc says.)
      constexpr int kKStepBytes = kTall ? 16 * 128 : 32;
      const uint32_t a = ready + row0 * 128;
      const uint32_t b = (L::kF32 || one_tile ? ready : ready + L::kTileBytes) + col0 * 128;
#pragma unroll
      for (int kk = 0; kk < kSliceK / 16; ++kk) {
        const int kb = kMode == kMutant && !L::kF32 && kk == kSliceK / 16 - 1 ? 0 : kk;
        const uint64_t da = SwizzledDesc(a + kKStepBytes * kk);
        const uint64_t db = SwizzledDesc(b + kKStepBytes * kb);
        if (kk == 0 && fresh) {
          Wgmma<MmaT, C::kN, true, 0, kTall>(part, da, db);
        } else {
          Wgmma<MmaT, C::kN, false, 0, kTall>(part, da, db);
        }
        if constexpr (L::kF32) {
          Wgmma<MmaT, C::kN, false>(part, da, SwizzledDesc(b + kHalfTileBytes + 32 * kb));
        }
      }
    };
    // Slices in chain u: `chain`, except a first chain of one when the count
    // is odd.
    auto chain_slices = [&](int u) { return u == 0 && chain * chains != slices ? 1 : chain; };
    // Chain u's slices into `part`, one commit group. Every path from the
    // fence to the commit issues wgmma: on a path without, ptxas adds an
    // empty wgmma group, and the wait for one pending group then waits for
    // the slice just issued (run s3-2).
    auto issue_chain = [&](bool blocks, float (&part)[kAcc], float& inv, int u) {
      prepare();
      inv = ready_inv;
      FenceAccumulators(part);
      WgmmaFence();
      issue(blocks, part, true);
      if (chain_slices(u) == 2) {
        prepare();
        issue(blocks, part, false);
      }
      WgmmaCommit();
    };
    auto retire = [&](float (&part)[kAcc], float inv, int u) {
      FenceAccumulators(part);
      free_slot();
      if (chain_slices(u) == 2) free_slot();
      if constexpr (kMode == kProbeRetire1) {
        // One add keeps every wgmma (ptxas drops those whose results are
        // never read: with no adds at all, 4 of 19 were left, run s3-2).
        sum[0] = __fadd_rn(sum[0], part[0]);
      } else {
#pragma unroll
        for (int i = 0; i < kAcc; ++i) {
          sum[i] = L::kF32 ? __fmaf_rn(part[i], inv, sum[i]) : __fadd_rn(sum[i], part[i]);
        }
      }
    };
    float inv0 = 1.0f, inv1 = 1.0f;
    auto reduce_job = [&](float (&sums)[kAcc]) {
      if (diag_blocks) {
        // Warpgroup 1's sums of block (0,1) into warpgroup 0's (the
        // barrier at the end of ReduceJob keeps warpgroup 1 from writing
        // the next job's before these are read).
        float* swap = reinterpret_cast<float*>(base + L::kSwapOffset);
        const int t = threadIdx.x % 128;
        if (c == 1) {
#pragma unroll
          for (int i = 0; i < kAcc / 2; ++i) {
            swap[128 * i + t] = sums[kAcc / 2 + i];
            sums[kAcc / 2 + i] = 0.0f;
          }
        }
        asm volatile("bar.sync 2, %0;" ::"n"(128 * C::kGroups) : "memory");
        if (c == 0) {
#pragma unroll
          for (int i = 0; i < kAcc / 2; ++i) {
            sums[kAcc / 2 + i] = __fadd_rn(sums[kAcc / 2 + i], swap[128 * i + t]);
          }
        }
        ReduceJob<C::kGroups>(sums, diag, 64 * c, 64 * c, 1.0, 2.0, cols, j, red, parity, g2,
                              trace, maxabs, desc, job_pr, job_status);
        return;
      }
      ReduceJob<C::kGroups>(sums, diag, row0, col0, weight, weight, cols, j, red, parity, g2,
                            trace, maxabs, desc, job_pr, job_status);
    };
    // The unit's end: a whole job's epilogue, or a piece's partial sums
    // (CombinePieces; the job's epilogue in the block of its last piece).
    auto finish = [&] {
      if (unit.piece < 0 || kMode == kProbeNoCombine ||
          CombinePieces<kMode, C::kGroups>(sum, unit, sched, ticket)) {
        reduce_job(sum);
        parity ^= 1;
      }
    };
    // One step: chain u runs in `run`, chain u + 1 (< chains) goes into
    // `nxt`, then u is retired.
    auto step = [&](bool blocks, float (&run)[kAcc], float run_inv, float (&nxt)[kAcc],
                    float& nxt_inv, int u) {
      issue_chain(blocks, nxt, nxt_inv, u + 1);
      WgmmaWait<1>();
      retire(run, run_inv, u);
    };
    if constexpr (kPairs) {
      // f32 Grams of side > 128 (ConvertPairedTiles): per slice, the sets
      // of tile A and (off the diagonal) tile B, hA hB^T + hA lB^T + lA
      // hB^T in one chain of 12 wgmma (the same sequence for both kinds of
      // job: B's set is A's on the diagonal), added at (s t)^-1. (The
      // mutant's last k-step reads B at the slice's first, as the 16-bit
      // one: a plausible, wrong Gram. A mutant in the lo products would
      // not do: with hi rounded to nearest, errors of order lo in G mostly
      // cancel in ||G||^2, which is also why hi hi^T + hi (2 lo)^T works.)
      const bool pair = !diag;
      for (int s = 0; s < slices; ++s) {
        prepare();
        const uint32_t a = ready + row0 * 128;
        const float inv_a = ready_inv;
        if (pair) prepare();
        const uint32_t b = ready;
        const float inv = __fmul_rn(inv_a, ready_inv);
        FenceAccumulators(part0);
        WgmmaFence();
#pragma unroll
        for (int kk = 0; kk < kSliceK / 16; ++kk) {
          const int kb = kMode == kMutant && kk == kSliceK / 16 - 1 ? 0 : kk;
          const uint64_t ah = SwizzledDesc(a + 32 * kk);
          const uint64_t al = SwizzledDesc(a + kHalfTileBytes + 32 * kk);
          const uint64_t bh = SwizzledDesc(b + 32 * kb);
          const uint64_t bl = SwizzledDesc(b + kHalfTileBytes + 32 * kb);
          if (kk == 0) {
            Wgmma<__half, C::kN, true>(part0, ah, bh);
          } else {
            Wgmma<__half, C::kN, false>(part0, ah, bh);
          }
          Wgmma<__half, C::kN, false>(part0, ah, bl);
          Wgmma<__half, C::kN, false>(part0, al, bh);
        }
        WgmmaCommit();
        WgmmaWait<0>();
        FenceAccumulators(part0);
        free_slot();
        if (pair) free_slot();
#pragma unroll
        for (int i = 0; i < kAcc; ++i) sum[i] = __fmaf_rn(part0[i], inv, sum[i]);
      }
      finish();
      continue;
    }
    if constexpr (kMode == kProbeLoadOnly) {
      for (int s = 0; s < slices; ++s) {
        prepare();
        free_slot();
      }
      finish();
      continue;
    }
    if constexpr (L::kF32) {
      // One accumulator set: each slice is added once its wgmma are done.
      for (int u = 0; u < chains; ++u) {
        issue_chain(false, part0, inv0, u);
        WgmmaWait<0>();
        retire(part0, inv0, u);
      }
      finish();
      continue;
    }
    // The chains' pipeline; `blocks`: a diagonal job as 64 x 64 blocks (one
    // copy of the pipeline per kind of job, each with its own arrays).
    auto run_chains = [&](bool blocks, float (&p0)[kAcc], float (&p1)[kAcc]) {
      issue_chain(blocks, p0, inv0, 0);
      // A fixed pair structure, so that each wgmma names one accumulator
      // array (else ptxas serializes them: warning C7514).
      int u = 0;
      for (; u + 2 < chains; u += 2) {
        step(blocks, p0, inv0, p1, inv1, u);
        step(blocks, p1, inv1, p0, inv0, u + 1);
      }
      if (u + 1 < chains) {
        step(blocks, p0, inv0, p1, inv1, u);
        WgmmaWait<0>();
        retire(p1, inv1, u + 1);
      } else {
        WgmmaWait<0>();
        retire(p0, inv0, u);
      }
    };
    if (diag_blocks) {
      float q0[kAcc], q1[kAcc];
      run_chains(true, q0, q1);
    } else {
      run_chains(false, part0, part1);
    }
    finish();
  }
#endif  // RVD_FUSED_V4_DEVICE
}

}  // namespace rvd::cuda::fused_v4

#endif  // RVD_KERNELS_CUDA_FUSED_V4_KERNEL_CUH_

// The fused PR kernel, versions 2 and 3 (device code, private to
// kernels/cuda/; launched by fused_launch.cuh; no host-only includes:
// NVRTC compiles it), for wide
// W (rows <= cols, G = W W^T). Tall W still takes v1 (fused_kernel.cuh).
//
// Versions (llm.c order; v3 is live for wide bf16/f16 W, v2 for wide f32):
//   v1  WMMA 32 x 32 warp tiles, one block per 128 x 128 Gram tile, 226-254
//       registers, 1 block per SM (fused_kernel.cuh).
//   v2  raw mma.sync (m16n8k16 bf16/f16; m16n8k8 tf32 as 3xTF32) fed by
//       ldmatrix.x4 from padded shared memory (144-byte rows: the 8 rows of
//       an 8 x 8 ldmatrix hit 8 different 16-byte bank groups), cp.async
//       16-byte loads into a ring of 128-byte K-slices (6 stages when a
//       launch has diagonal jobs only, 4 with off-diagonal ones: 108 KB
//       either way), <= 128 registers (__launch_bounds__(256, 2)): 2 blocks
//       of 8 warps per SM. H200 numbers: docs/history/kernel-notes.md.
//   v3  v2's tiling, ring and registers (kChain > 0 below) with fewer
//       instructions per MMA: a fresh accumulator per K-slice (chains of 4
//       k-steps, kFusedPolicyV3Sm90.chain_ksteps), warp roles as template
//       code (RoleSliceMma: no selects, no per-slot predicates; edge jobs
//       take SliceMmaChain), and for 16-bit inputs ||W||_F^2 from the
//       Gram's diagonal with a row pass that only takes max |w|. f32 keeps
//       v2's code (3xTF32 with chains was slower: docs/history/kernel-notes.md, fused v3).
//
// Work split. A job is either the upper triangle of a 128 x 128 diagonal Gram
// tile (36 blocks of 16 x 16: 8 row strips x 8 column groups, g >= strip) or
// a 128 x 64 off-diagonal tile (32 blocks). A warp owns at most 5 such
// blocks ("slots"), each 2 MMAs of n8 per k-step. Diagonal tile, warp w,
// pair p = w / 2 (strips p and 7 - p hold 18 blocks together):
//   w even: strip p, groups p .. p+4;
//   w odd:  strip p, groups p+5 .. 7, then strip 7-p, groups 7-p .. 7 (4).
// Off-diagonal tile: warp w = strip w, groups 0..3. Within a 16 x 16 block on
// the diagonal the entries below it get weight 0, on it 1, above it 2.
//
// One fragment load serves both operands: ldmatrix.x4 of 16 W rows x 32
// bytes of K gives the A fragment {r0..r3} of those rows and the B fragments
// {r0, r2} (rows 0-7) and {r1, r3} (rows 8-15): B = W^T's columns are W's
// rows, so the same smem rows feed both (for tf32 too: an 8 x 8 b16 matrix
// is an 8 x 4 f32 matrix, lane l holding (l / 4, l % 4)).
//
// Accuracy guard (v1's, made stricter in v2): every MMA starts a fresh
// accumulator (C = 0; for 3xTF32 the chain of its 3 products), added to the
// running f32 sums with IEEE round to nearest (__fadd_rn): the tensor cores'
// accumulation truncates (H200 run 1: 1e-5 of PR with one chain over
// K = 4096; v1 restarted every 4 k-steps). v3 chains the 4 k-steps of a
// slice before the rounded add (v1's interval; H200 run 13: max rel error
// 9e-8 bf16, 1.7e-7 f16 on flat/power-law/rank-1/Gaussian spectra).
// ||W||_F^2, v2 and f32: 16-bit inputs square exactly in f32; each 8-element
// chunk's f32 sum goes to a float64 sum, unless the chunk's magnitudes could
// under- or overflow f32 squares (then the chunk is summed in float64); f32
// inputs are squared in float64 (as v1). v3, 16-bit: the sum of the Gram's
// diagonal entries in float64 (its truncation bias matches that of ||G||^2,
// so it cancels to first order in t^2 / g); entries that overflow make it
// Inf, which the finalize reports as untrusted (the engine falls back).
//
// Determinism: fixed order everywhere (per lane, xor-shuffle tree, warps in
// index order; jobs in index order in the finalize kernel); no atomics.
#ifndef RVD_KERNELS_CUDA_FUSED_V2_KERNEL_CUH_
#define RVD_KERNELS_CUDA_FUSED_V2_KERNEL_CUH_

#include <cuda/std/cstdint>
#include <cuda/std/type_traits>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernels/cuda/block_sums.cuh"
#include "kernels/cuda/descriptors.h"

namespace rvd::cuda::fused_v2 {

constexpr int kRowTile = 128;             // Gram rows of a job (A rows)
constexpr int kColTile = 64;              // Gram columns of an off-diagonal job
constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kSliceBytes = 128;          // bytes of each W row per stage
constexpr int kRowBytes = kSliceBytes + 16;  // padded smem row
constexpr int kStagesDiag = 6;  // launches of diagonal jobs only
constexpr int kStagesMixed = 4;  // launches with off-diagonal jobs
constexpr int kSlots = 5;                 // 16 x 16 Gram blocks per warp
constexpr int kKSteps = kSliceBytes / 32;  // MMA k-steps per slice
constexpr int kABytes = kRowTile * kRowBytes;  // 18432
constexpr int kBBytes = kColTile * kRowBytes;  // 9216

static_assert(kRowTile == kFusedPolicyV3Sm90.block_tile, "policy: block_tile");
static_assert(kColTile == kFusedPolicyV3Sm90.col_tile, "policy: col_tile");
static_assert(kWarps == kFusedPolicyV3Sm90.warps, "policy: warps");
static_assert(16 == kFusedPolicyV3Sm90.warp_tile, "policy: 16 x 16 blocks");
static_assert(kSliceBytes == kFusedPolicyV3Sm90.k_slice_bytes, "policy: slice");
static_assert(kStagesDiag == kFusedPolicyV3Sm90.stages, "policy: stages");
static_assert(kStagesMixed == kFusedPolicyV3Sm90.stages_offdiag, "policy: stages");
static_assert(kStagesDiag * kABytes <= kStagesMixed * (kABytes + kBBytes),
              "one shared-memory opt-in for both");
static_assert(kFusedPolicyV3Sm90.f32_split == 3, "policy: 3xTF32 only");
static_assert(kFusedPolicyV3Sm90.blocks_per_sm == 2, "policy: 2 blocks/SM");
static_assert(kRowTile == 8 * 16 && kColTile == 4 * 16, "strips and groups");
// k-steps per fresh accumulator of the live kernel: v3 for 16-bit inputs;
// f32 (3xTF32) keeps v2's code (chain 0), as the policy says.
constexpr int kLiveChain = kFusedPolicyV3Sm90.chain_ksteps;
constexpr int kLiveChainF32 = kFusedPolicyV3Sm90.chain_ksteps_f32;
static_assert(kLiveChain >= 1 && kKSteps % kLiveChain == 0, "policy: chain");
static_assert(kKSteps % (kLiveChainF32 > 0 ? kLiveChainF32 : 1) == 0, "policy: chain");
template <typename T>
__host__ __device__ constexpr int LiveChain() {
  return ::cuda::std::is_same_v<T, float> ? kLiveChainF32 : kLiveChain;
}

template <typename T>
struct V2Traits;
template <>
struct V2Traits<float> {
  using Bits = uint32_t;
};
template <>
struct V2Traits<__half> {
  using Bits = uint16_t;
};
template <>
struct V2Traits<__nv_bfloat16> {
  using Bits = uint16_t;
};

__device__ __forceinline__ void V2CpAsync16(uint32_t smem, const void* gmem,
                                            int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem),
               "l"(gmem), "r"(src_bytes));
}
__device__ __forceinline__ void V2CpAsyncCommit() {
  asm volatile("cp.async.commit_group;\n" ::);
}
template <int N>
__device__ __forceinline__ void V2CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void Ldsm4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// d += a * b on the tensor cores, one m16n8 tile.
template <typename T>
__device__ __forceinline__ void Mma(float (&d)[4], const uint32_t (&a)[4],
                                    uint32_t b0, uint32_t b1) {
  if constexpr (::cuda::std::is_same_v<T, __nv_bfloat16>) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else if constexpr (::cuda::std::is_same_v<T, __half>) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// d = a * b (a fresh accumulator: C = 0).
template <typename T>
__device__ __forceinline__ void MmaZ(float (&d)[4], const uint32_t (&a)[4],
                                     uint32_t b0, uint32_t b1) {
#pragma unroll
  for (int r = 0; r < 4; ++r) d[r] = 0.0f;
  Mma<T>(d, a, b0, b1);
}

__device__ __forceinline__ uint32_t ToTf32(float x) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
  return r;
}

// x = hi + lo, both tf32 (hi: x rounded to tf32; lo: the rest, rounded).
__device__ __forceinline__ void SplitTf32(const uint32_t (&x)[4],
                                          uint32_t (&hi)[4],
                                          uint32_t (&lo)[4]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float f = __uint_as_float(x[i]);
    hi[i] = ToTf32(f);
    lo[i] = ToTf32(f - __uint_as_float(hi[i]));
  }
}

// One K-slice of kRows W rows (row0 ..) into smem at dst (shared address):
// 16-byte chunks, 8 per row, chunk c = threadIdx.x + i * kThreads. Elements
// past the matrix are zero-filled. Rows that are not 16-byte aligned take a
// scalar path (plain shared stores; ordered by the next __syncthreads).
template <typename T, int kRows>
__device__ __forceinline__ void LoadRows(const MatrixDesc& m, int row0, int ks,
                                         unsigned char* dst) {
  using Bits = typename V2Traits<T>::Bits;
  constexpr int kEs = sizeof(T);
  constexpr int kEpc = 16 / kEs;
  constexpr int kBK = kSliceBytes / kEs;
  constexpr int kPer = kRows * 8 / kThreads;
  static_assert(kRows * 8 % kThreads == 0, "whole chunks per thread");
  const auto* base = static_cast<const unsigned char*>(m.data);
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int c = threadIdx.x + i * kThreads;
    const int o = c >> 3, q = c & 7;
    const int64_t go = int64_t{row0} + o;
    const int64_t gi = int64_t{ks} * kBK + q * kEpc;
    int valid = 0;
    if (go < m.rows && gi < m.cols) {
      valid = static_cast<int>(m.cols - gi < kEpc ? m.cols - gi : kEpc);
    }
    const unsigned char* src = valid > 0 ? base + (go * m.ld + gi) * kEs : base;
    unsigned char* d = dst + o * kRowBytes + q * 16;
    if (m.aligned) {
      V2CpAsync16(static_cast<uint32_t>(__cvta_generic_to_shared(d)), src,
                  valid * kEs);
    } else {
      const Bits* s = reinterpret_cast<const Bits*>(src);
      Bits* dd = reinterpret_cast<Bits*>(d);
#pragma unroll
      for (int e = 0; e < kEpc; ++e) dd[e] = e < valid ? s[e] : Bits{0};
    }
  }
}

// ||rows||^2 (float64) and max |w| over this thread's chunks of an A tile
// (the chunks it loaded; zero fill adds nothing).
template <typename T>
__device__ __forceinline__ void RowStats(const unsigned char* tile,
                                         double* sum, float* mx) {
#pragma unroll
  for (int i = 0; i < kRowTile * 8 / kThreads; ++i) {
    const int c = threadIdx.x + i * kThreads;
    const uint4 v = *reinterpret_cast<const uint4*>(tile + (c >> 3) * kRowBytes +
                                                    (c & 7) * 16);
    if constexpr (::cuda::std::is_same_v<T, float>) {
      const float f[4] = {__uint_as_float(v.x), __uint_as_float(v.y),
                          __uint_as_float(v.z), __uint_as_float(v.w)};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        *sum = fma(static_cast<double>(f[e]), static_cast<double>(f[e]), *sum);
        *mx = fmaxf(*mx, fabsf(f[e]));
      }
    } else {
      const uint32_t w[4] = {v.x, v.y, v.z, v.w};
      float f[8];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        if constexpr (::cuda::std::is_same_v<T, __nv_bfloat16>) {
          f[2 * e] = __uint_as_float(w[e] << 16);
          f[2 * e + 1] = __uint_as_float(w[e] & 0xffff0000u);
        } else {
          f[2 * e] = __half2float(__ushort_as_half(
              static_cast<unsigned short>(w[e] & 0xffffu)));
          f[2 * e + 1] = __half2float(
              __ushort_as_half(static_cast<unsigned short>(w[e] >> 16)));
        }
      }
      float s = 0.0f, cm = 0.0f;
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        s = fmaf(f[e], f[e], s);  // exact products (8- or 11-bit mantissas)
        cm = fmaxf(cm, fabsf(f[e]));
      }
      // f32 squares can underflow (|w| < 2^-63) or overflow; NaN/Inf fail
      // the test too and are summed in float64 (where they propagate).
      const bool fast = cm == 0.0f || (s >= 0x1p-90f && s <= 0x1p120f);
      if (__builtin_expect(fast, 1)) {
        *sum += static_cast<double>(s);
      } else {
        double d = 0.0;
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          d = fma(static_cast<double>(f[e]), static_cast<double>(f[e]), d);
        }
        *sum += d;
      }
      *mx = fmaxf(*mx, cm);
    }
  }
}

// v3, 16-bit inputs: the largest |w| bits over this thread's chunks of an A
// tile, as two u16 lanes (sign bits cleared: NaN > Inf > finite in that
// order, so NaN and Inf survive the max). 8 instructions per 16-byte chunk
// (RowStats: ~33); ||W||_F^2 comes from the Gram's diagonal (epilogue).
__device__ __forceinline__ uint32_t MaxU16x2(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  uint32_t r;
  asm("max.u16x2 %0, %1, %2;\n" : "=r"(r) : "r"(a), "r"(b));
  return r;
#else
  return __vmaxu2(a, b);
#endif
}
__device__ __forceinline__ void RowMax16(const unsigned char* tile, uint32_t* m2) {
#pragma unroll
  for (int i = 0; i < kRowTile * 8 / kThreads; ++i) {
    const int c = threadIdx.x + i * kThreads;
    const uint4 v = *reinterpret_cast<const uint4*>(tile + (c >> 3) * kRowBytes +
                                                    (c & 7) * 16);
    *m2 = MaxU16x2(*m2, v.x & 0x7fff7fffu);
    *m2 = MaxU16x2(*m2, v.y & 0x7fff7fffu);
    *m2 = MaxU16x2(*m2, v.z & 0x7fff7fffu);
    *m2 = MaxU16x2(*m2, v.w & 0x7fff7fffu);
  }
}
// |w| bits (u16, sign cleared) as a float.
template <typename T>
__device__ __forceinline__ float AbsBitsToFloat(uint32_t b) {
  if constexpr (::cuda::std::is_same_v<T, __nv_bfloat16>) {
    return __uint_as_float(b << 16);
  } else {
    return __half2float(__ushort_as_half(static_cast<unsigned short>(b)));
  }
}
// max that keeps NaN (fmaxf drops it).
__device__ __forceinline__ float MaxKeepNaN(float a, float b) {
  return (a != a || b != b) ? __int_as_float(0x7fffffff) : fmaxf(a, b);
}

// One K-slice of MMAs for the first kS slots: per k-step all fragments
// first (independent loads in flight), then the MMAs. Each MMA starts a
// fresh accumulator (C = 0) whose result is added to acc with round to
// nearest, so no MMA waits on another and the tensor cores never accumulate
// across k-steps.
template <typename T, int kS>
__device__ __forceinline__ void SliceMma(uint32_t a_base, uint32_t a0_off,
                                         uint32_t a1_off, uint32_t b_base,
                                         const uint32_t (&b_off)[kSlots],
                                         const bool (&use1)[kSlots],
                                         float (&acc)[kSlots][2][4]) {
  constexpr bool kTf32 = ::cuda::std::is_same_v<T, float>;
#pragma unroll
  for (int kk = 0; kk < kKSteps; ++kk) {
    uint32_t a0[4], a1[4], b[kS][4];
    Ldsm4(a0, a_base + a0_off + kk * 32);
    Ldsm4(a1, a_base + a1_off + kk * 32);
#pragma unroll
    for (int s = 0; s < kS; ++s) Ldsm4(b[s], b_base + b_off[s] + kk * 32);
#pragma unroll
    for (int s = 0; s < kS; ++s) {
      float p[2][4];
      uint32_t a[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) a[i] = use1[s] ? a1[i] : a0[i];
      if constexpr (kTf32) {
        uint32_t ah[4], al[4], bh[4], bl[4];
        SplitTf32(a, ah, al);
        SplitTf32(b[s], bh, bl);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          // Small products first (as v1): lo*hi, hi*lo, hi*hi.
          MmaZ<T>(p[h], al, bh[h], bh[h + 2]);
          Mma<T>(p[h], ah, bl[h], bl[h + 2]);
          Mma<T>(p[h], ah, bh[h], bh[h + 2]);
        }
      } else {
        MmaZ<T>(p[0], a, b[s][0], b[s][2]);
        MmaZ<T>(p[1], a, b[s][1], b[s][3]);
      }
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int r = 0; r < 4; ++r) acc[s][h][r] = __fadd_rn(acc[s][h][r], p[h][r]);
    }
  }
}

// v3: one chain of kChain k-steps (kk0 ..) for one slot: a fresh
// accumulator (C = 0) for the first MMA, the next ones accumulate on the
// tensor cores (truncating, but over kChain k-steps of one slot, not over
// K), and the chain's result is added to acc with round to nearest. a / ah,
// al: the slot's A fragments per k-step (3xTF32: hi and lo parts).
template <typename T, int kChain>
__device__ __forceinline__ void ChainMma(const uint32_t (&a)[kChain][4],
                                         const uint32_t (&ah)[kChain][4],
                                         const uint32_t (&al)[kChain][4],
                                         uint32_t b_addr, float (&acc)[2][4]) {
  constexpr bool kTf32 = ::cuda::std::is_same_v<T, float>;
  uint32_t b[kChain][4];
#pragma unroll
  for (int j = 0; j < kChain; ++j) Ldsm4(b[j], b_addr + j * 32);
  float p[2][4];
#pragma unroll
  for (int j = 0; j < kChain; ++j) {
    if constexpr (kTf32) {
      uint32_t bh[4], bl[4];
      SplitTf32(b[j], bh, bl);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        // Small products first (as v1): lo*hi, hi*lo, hi*hi.
        if (j == 0) {
          MmaZ<T>(p[h], al[j], bh[h], bh[h + 2]);
        } else {
          Mma<T>(p[h], al[j], bh[h], bh[h + 2]);
        }
        Mma<T>(p[h], ah[j], bl[h], bl[h + 2]);
        Mma<T>(p[h], ah[j], bh[h], bh[h + 2]);
      }
    } else {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        if (j == 0) {
          MmaZ<T>(p[h], a[j], b[j][h], b[j][h + 2]);
        } else {
          Mma<T>(p[h], a[j], b[j][h], b[j][h + 2]);
        }
      }
    }
  }
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int r = 0; r < 4; ++r) acc[h][r] = __fadd_rn(acc[h][r], p[h][r]);
}

// The A fragments of one strip for kChain k-steps from kk0 (and, for
// 3xTF32, their hi and lo parts).
template <typename T, int kChain>
__device__ __forceinline__ void LoadA(uint32_t addr, uint32_t (&a)[kChain][4],
                                      uint32_t (&ah)[kChain][4],
                                      uint32_t (&al)[kChain][4]) {
#pragma unroll
  for (int j = 0; j < kChain; ++j) {
    Ldsm4(a[j], addr + j * 32);
    if constexpr (::cuda::std::is_same_v<T, float>) SplitTf32(a[j], ah[j], al[j]);
  }
}

// v3: one K-slice of MMAs for the first kS slots, in chains of kChain
// k-steps, slot by slot (each slot's B fragments are loaded right before
// its MMAs: 8 live registers per chain instead of 8 per slot). Branch-free:
// slot s takes strip1's A fragments when use1[s] (selects).
template <typename T, int kS, int kChain>
__device__ __forceinline__ void SliceMmaChain(uint32_t a_base, uint32_t a0_off,
                                              uint32_t a1_off, uint32_t b_base,
                                              const uint32_t (&b_off)[kSlots],
                                              const bool (&use1)[kSlots],
                                              float (&acc)[kSlots][2][4]) {
  static_assert(kKSteps % kChain == 0, "whole chains per slice");
#pragma unroll
  for (int c = 0; c < kKSteps; c += kChain) {
    uint32_t a0[kChain][4], a0h[kChain][4], a0l[kChain][4];
    uint32_t a1[kChain][4], a1h[kChain][4], a1l[kChain][4];
    LoadA<T, kChain>(a_base + a0_off + c * 32, a0, a0h, a0l);
    LoadA<T, kChain>(a_base + a1_off + c * 32, a1, a1h, a1l);
#pragma unroll
    for (int s = 0; s < kS; ++s) {
      uint32_t a[kChain][4], ah[kChain][4], al[kChain][4];
#pragma unroll
      for (int j = 0; j < kChain; ++j)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          a[j][i] = use1[s] ? a1[j][i] : a0[j][i];
          ah[j][i] = use1[s] ? a1h[j][i] : a0h[j][i];
          al[j][i] = use1[s] ? a1l[j][i] : a0l[j][i];
        }
      ChainMma<T, kChain>(a, ah, al, b_base + b_off[s] + c * 32, acc[s]);
    }
  }
}

// v3: the same arithmetic as SliceMmaChain (bitwise: each acc entry sees the
// same chains in the same order) for a warp whose role is known at compile
// time: slots 0 .. kNA0-1 take strip0's A fragments, the next kNA1 strip1's.
// No selects, no per-slot predicates, each strip's A fragments loaded (and
// for 3xTF32 split) once per chain. Served only when all of the warp's
// slots lie inside the matrix (the kernel checks; edge jobs take
// SliceMmaChain).
// B fragments: slot s of strip0 at b0_off + s * kBStride, slot kNA0 + s of
// strip1 at b1_off + s * kBStride (a warp's groups are consecutive:
// kBStride = 16 rows; the mutant's wrong index: 0).
template <typename T, int kNA0, int kNA1, int kChain, int kBStride>
__device__ __forceinline__ void RoleSliceMma(uint32_t a_base, uint32_t a0_off,
                                             uint32_t a1_off, uint32_t b_base,
                                             uint32_t b0_off, uint32_t b1_off,
                                             float (&acc)[kSlots][2][4]) {
  static_assert(kNA0 + kNA1 <= kSlots && kKSteps % kChain == 0, "role");
#pragma unroll
  for (int c = 0; c < kKSteps; c += kChain) {
    if constexpr (kNA0 > 0) {
      uint32_t a[kChain][4], ah[kChain][4], al[kChain][4];
      LoadA<T, kChain>(a_base + a0_off + c * 32, a, ah, al);
#pragma unroll
      for (int s = 0; s < kNA0; ++s) {
        ChainMma<T, kChain>(a, ah, al, b_base + b0_off + s * kBStride + c * 32,
                            acc[s]);
      }
    }
    if constexpr (kNA1 > 0) {
      uint32_t a[kChain][4], ah[kChain][4], al[kChain][4];
      LoadA<T, kChain>(a_base + a1_off + c * 32, a, ah, al);
#pragma unroll
      for (int s = 0; s < kNA1; ++s) {
        ChainMma<T, kChain>(a, ah, al, b_base + b1_off + s * kBStride + c * 32,
                            acc[kNA0 + s]);
      }
    }
  }
}

// Slot s of warp `warp` (see the header comment): its strip, column group,
// whether it takes strip1's A fragment, and whether it lies inside the
// matrix (vr, vc: rows and columns of the job inside the Gram). v3 calls
// this where a slot is needed instead of keeping per-slot arrays live
// through the K loop (registers).
struct SlotMap {
  int strip, grp;
  bool use1, act;
};
__device__ __forceinline__ SlotMap SlotAt(bool diag, int warp, int s, int vr,
                                          int vc) {
  SlotMap m;
  if (diag) {
    const int p = warp >> 1, n0 = 3 - p;
    if ((warp & 1) == 0) {
      m.grp = p + s;
      m.use1 = false;
      m.act = true;
    } else {
      m.use1 = s >= n0;
      m.grp = s < n0 ? p + 5 + s : 7 - p + (s - n0);
      m.act = s < 4;
    }
    m.strip = m.use1 ? 7 - p : p;
  } else {
    m.strip = warp;
    m.grp = s;
    m.use1 = false;
    m.act = s < 4;
  }
  m.act = m.act && 16 * m.strip < vr && 16 * m.grp < vc;
  return m;
}

// The product's choices at the points a GPU test's mutant
// (fused_mutant.cu) or a benchmark probe (bench/dev/fused_probes.cu)
// changes: each instantiates the kernel with its own struct of the same
// members. The product's are the plain code (every call inlines to what
// the kernel would read without them).
struct Product {
  // The column group whose W rows slot (strip, grp) reads as B: its own.
  static __device__ __forceinline__ int BGroup(int /*strip*/, int grp, bool /*diag*/) {
    return grp;
  }
  // B rows between a strip's consecutive slots (RoleSliceMma).
  static constexpr int kBStride = 16 * kRowBytes;
  // Unit u of a launch is job u with all its K-slices in order: slice i of
  // the unit is K-slice Slice(i, first, nks, rot) for the range Slices sets.
  static __device__ __forceinline__ int Job(int unit) { return unit; }
  static __device__ __forceinline__ void Slices(int /*unit*/, int /*job*/, int* /*first*/,
                                                int* /*nks*/, int* /*rot*/) {}
  static __device__ __forceinline__ int Slice(int i, int /*first*/, int /*nks*/, int /*rot*/) {
    return i;
  }
  // Whether the slices after the prologue's are loaded, and multiplied.
  static __device__ __forceinline__ bool LoadsAfterPrologue() { return true; }
  static __device__ __forceinline__ bool Multiplies() { return true; }
};

// Shared-memory offset of slot m's B fragment rows for this lane (the
// group Hooks::BGroup picks). Inactive slots read group 0 (a valid address;
// their sums are left out).
template <class Hooks>
__device__ __forceinline__ uint32_t BOff(const SlotMap& m, bool diag, int lane) {
  const int bg = Hooks::BGroup(m.strip, m.grp, diag);
  return (16 * (m.act ? bg : 0) + (lane & 15)) * kRowBytes + (lane >> 4) * 16;
}

// kChain: 0 = v2 (a fresh accumulator per MMA, per-slot branches in
// diagonal-only launches, SliceMma otherwise); >= 1 = v3 (kChain k-steps per
// fresh accumulator, RoleSliceMma for jobs inside the matrix).
// One unit of a launch (job Hooks::Job(unit): the product's unit u is job
// u), its sums to slot `unit`.
template <typename T, class Hooks, int kStages, int kChain>
__device__ __forceinline__ void FusedV2Unit(const MatrixDesc* __restrict__ mats,
                                            const FusedJobV2* __restrict__ jobs, int unit,
                                            int stage_bytes, double* __restrict__ g2,
                                            double* __restrict__ trace,
                                            float* __restrict__ maxabs) {
  extern __shared__ __align__(128) unsigned char smem[];
  constexpr bool kTf32 = ::cuda::std::is_same_v<T, float>;
  constexpr int kBK = kSliceBytes / static_cast<int>(sizeof(T));
  const int job_index = Hooks::Job(unit);
  const FusedJobV2 job = jobs[job_index];
  const MatrixDesc m = mats[job.matrix];
  const bool diag = job.diagonal != 0;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;

  // This warp's strips and slots (see the header comment).
  int strip0, strip1;
  int grp[kSlots];
  bool use1[kSlots], act[kSlots];
  if (diag) {
    const int p = warp >> 1;
    strip0 = p;
    strip1 = 7 - p;
    const bool odd = (warp & 1) != 0;
    const int n0 = 3 - p;  // odd warps: strip p's slots
#pragma unroll
    for (int s = 0; s < kSlots; ++s) {
      if (!odd) {
        grp[s] = p + s;
        use1[s] = false;
        act[s] = true;
      } else {
        use1[s] = s >= n0;
        grp[s] = s < n0 ? p + 5 + s : 7 - p + (s - n0);
        act[s] = s < 4;
      }
    }
  } else {
    strip0 = warp;
    strip1 = warp;
#pragma unroll
    for (int s = 0; s < kSlots; ++s) {
      grp[s] = s;
      use1[s] = false;
      act[s] = s < 4;
    }
  }

  const bool has1 = diag && (warp & 1) != 0;
  // Skip blocks wholly past the Gram's side (zero rows add nothing).
  const int vr = m.n - job.row0, vc = m.n - job.col0;
  bool any = false;
#pragma unroll
  for (int s = 0; s < kSlots; ++s) {
    act[s] = act[s] && 16 * (use1[s] ? strip1 : strip0) < vr && 16 * grp[s] < vc;
    any |= act[s];
  }

  // v3: the warp's role (RoleSliceMma's template arguments), when every
  // slot of the job lies inside the matrix: 0 off-diagonal (4 slots of
  // strip0), 1 diagonal even warp (5 of strip0), 2 + n0 diagonal odd warp
  // (n0 = 3 - p slots of strip p, then 4 - n0 of strip 7 - p); -1: edge job.
  int role = -1;
  uint32_t rb0 = 0, rb1 = 0;  // RoleSliceMma's B offsets
  if constexpr (kChain > 0) {
    const bool full = vr >= kRowTile && vc >= (diag ? kRowTile : kColTile);
    if (full) role = !diag ? 0 : ((warp & 1) == 0 ? 1 : 2 + (3 - (warp >> 1)));
    // The first slot of each strip (odd warps: strip1's first is n0).
    const int n0 = (warp & 1) != 0 && diag ? 3 - (warp >> 1) : 0;
    rb0 = BOff<Hooks>(SlotAt(diag, warp, 0, vr, vc), diag, lane);
    rb1 = BOff<Hooks>(SlotAt(diag, warp, n0, vr, vc), diag, lane);
  }
  constexpr int kBStride = Hooks::kBStride;

  const uint32_t sbase = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const int lrow = lane & 15, lbyte = (lane >> 4) * 16;
  const uint32_t a0_off = (16 * strip0 + lrow) * kRowBytes + lbyte;
  const uint32_t a1_off = (16 * strip1 + lrow) * kRowBytes + lbyte;
  uint32_t b_off[kSlots];
#pragma unroll
  for (int s = 0; s < kSlots; ++s) {
    // Inactive slots read group 0 (a valid address; their sums are left out).
    const int bg = Hooks::BGroup(use1[s] ? strip1 : strip0, grp[s], diag);
    b_off[s] = (16 * (act[s] ? bg : 0) + lrow) * kRowBytes + lbyte;
  }

  float acc[kSlots][2][4];
#pragma unroll
  for (int s = 0; s < kSlots; ++s)
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int r = 0; r < 4; ++r) acc[s][h][r] = 0.0f;

  // v3, 16-bit inputs: ||W||_F^2 is the sum of the Gram's diagonal
  // entries (f32, as exact as the other entries: the same chains), and the
  // row pass only takes max |w| (RowMax16). Overflow of those entries
  // (|w| > ~1e19) makes the trace Inf with a finite max: the finalize then
  // says "untrusted", as for any f32 overflow, and the engine falls back.
  constexpr bool kTraceFromGram = kChain > 0 && !kTf32;
  double tsum = 0.0;
  float tmax = 0.0f;
  uint32_t tbits = 0;  // kTraceFromGram: RowMax16's two u16 lanes
  int nks = (m.k + kBK - 1) / kBK;
  int first = 0, rot = 0;
  Hooks::Slices(unit, job_index, &first, &nks, &rot);
  // Slice i of this unit: K-slice Hooks::Slice(i, first, nks, rot) (the product's: i).
  auto load = [&](int i) {
    unsigned char* st = smem + (i % kStages) * stage_bytes;
    const int ks = Hooks::Slice(i, first, nks, rot);
    LoadRows<T, kRowTile>(m, job.row0, ks, st);
    if (!diag) LoadRows<T, kColTile>(m, job.col0, ks, st + kABytes);
  };
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < nks) load(s);
    V2CpAsyncCommit();
  }

  for (int ks = 0; ks < nks; ++ks) {
    V2CpAsyncWait<kStages - 2>();
    __syncthreads();  // slice ks landed; slice ks - 1's stage is free
    if (ks + kStages - 1 < nks && Hooks::LoadsAfterPrologue()) {
      load(ks + kStages - 1);
    }
    V2CpAsyncCommit();

    const int st = (ks % kStages) * stage_bytes;
    if (diag) {
      if constexpr (kTraceFromGram) {
        RowMax16(smem + st, &tbits);
      } else {
        RowStats<T>(smem + st, &tsum, &tmax);
      }
    }
    if (!any || !Hooks::Multiplies()) continue;
    const uint32_t a_base = sbase + st;
    const uint32_t b_base = diag ? a_base : a_base + kABytes;

    if constexpr (kChain > 0) {
      // v3. The switch is warp-uniform and taken once per slice.
      switch (role) {
        case 0:
          RoleSliceMma<T, 4, 0, kChain, kBStride>(a_base, a0_off, a1_off, b_base, rb0,
                                                   rb1, acc);
          break;
        case 1:
          RoleSliceMma<T, 5, 0, kChain, kBStride>(a_base, a0_off, a1_off, b_base, rb0,
                                                   rb1, acc);
          break;
        case 2:
          RoleSliceMma<T, 0, 4, kChain, kBStride>(a_base, a0_off, a1_off, b_base, rb0,
                                                   rb1, acc);
          break;
        case 3:
          RoleSliceMma<T, 1, 3, kChain, kBStride>(a_base, a0_off, a1_off, b_base, rb0,
                                                   rb1, acc);
          break;
        case 4:
          RoleSliceMma<T, 2, 2, kChain, kBStride>(a_base, a0_off, a1_off, b_base, rb0,
                                                   rb1, acc);
          break;
        case 5:
          RoleSliceMma<T, 3, 1, kChain, kBStride>(a_base, a0_off, a1_off, b_base, rb0,
                                                   rb1, acc);
          break;
        default: {
          // Edge jobs: slots recomputed here, not kept live (registers).
          uint32_t eb[kSlots];
          bool eu[kSlots];
#pragma unroll
          for (int s = 0; s < kSlots; ++s) {
            const SlotMap sm = SlotAt(diag, warp, s, vr, vc);
            eb[s] = BOff<Hooks>(sm, diag, lane);
            eu[s] = sm.use1;
          }
          if (diag) {
            SliceMmaChain<T, kSlots, kChain>(a_base, a0_off, a1_off, b_base, eb, eu, acc);
          } else {
            SliceMmaChain<T, 4, kChain>(a_base, a0_off, a1_off, b_base, eb, eu, acc);
          }
        }
      }
    } else if constexpr (kStages == kStagesDiag) {
      // v2, diagonal-only launches: per-slot branches (H200, 2026-11-29: 0.398
      // ms for 480 x 128x4096 bf16, against 0.418 with SliceMma).
#pragma unroll
      for (int kk = 0; kk < kKSteps; ++kk) {
        // All of this k-step's fragments first (independent loads in flight),
        // then the MMAs: each MMA starts a fresh accumulator (C = 0) whose
        // result is added to acc with round to nearest, so no MMA waits on
        // another and the tensor cores never accumulate across k-steps.
        uint32_t a0[4], a1[4], b[kSlots][4];
        Ldsm4(a0, a_base + a0_off + kk * 32);
        if (has1) {
          Ldsm4(a1, a_base + a1_off + kk * 32);
        } else {
#pragma unroll
          for (int i = 0; i < 4; ++i) a1[i] = a0[i];
        }
#pragma unroll
        for (int s = 0; s < kSlots; ++s) {
          if (act[s]) Ldsm4(b[s], b_base + b_off[s] + kk * 32);
        }
#pragma unroll
        for (int s = 0; s < kSlots; ++s) {
          if (!act[s]) continue;
          float p[2][4];
          if constexpr (kTf32) {
            uint32_t ah[4], al[4], bh[4], bl[4], t[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) t[i] = use1[s] ? a1[i] : a0[i];
            SplitTf32(t, ah, al);
            SplitTf32(b[s], bh, bl);
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              // Small products first (as v1): lo*hi, hi*lo, hi*hi.
              MmaZ<T>(p[h], al, bh[h], bh[h + 2]);
              Mma<T>(p[h], ah, bl[h], bl[h + 2]);
              Mma<T>(p[h], ah, bh[h], bh[h + 2]);
            }
          } else {
            uint32_t a[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) a[i] = use1[s] ? a1[i] : a0[i];
            MmaZ<T>(p[0], a, b[s][0], b[s][2]);
            MmaZ<T>(p[1], a, b[s][1], b[s][3]);
          }
#pragma unroll
          for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int r = 0; r < 4; ++r) acc[s][h][r] = __fadd_rn(acc[s][h][r], p[h][r]);
        }
      }
    } else {
      // Launches with off-diagonal jobs: SliceMma (H200, 2026-11-29: 1.03 ms
      // for 32 x 1024x4096 bf16, against 1.36 with per-slot branches).
      if (diag) {
        SliceMma<T, kSlots>(a_base, a0_off, a1_off, b_base, b_off, use1, acc);
      } else {
        SliceMma<T, 4>(a_base, a0_off, a1_off, b_base, b_off, use1, acc);
      }
    }
  }
  V2CpAsyncWait<0>();

  // Weighted sum of squares of this warp's entries. C fragment: c0, c1 at
  // (lane / 4, 2 (lane % 4) + {0, 1}), c2, c3 eight rows below.
  double sacc = 0.0;
#pragma unroll
  for (int s = 0; s < kSlots; ++s) {
    // v3 recomputes the slot (registers); v2 keeps its arrays (as measured).
    SlotMap sm;
    if constexpr (kChain > 0) {
      sm = SlotAt(diag, warp, s, vr, vc);
    } else {
      sm = SlotMap{use1[s] ? strip1 : strip0, grp[s], use1[s], act[s]};
    }
    if (!sm.act) continue;
    const int row = 16 * sm.strip + (lane >> 2);
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int rr = row + 8 * (r >> 1);
        const int cc = 16 * sm.grp + 8 * h + 2 * (lane & 3) + (r & 1);
        // Diagonal jobs: row0 == col0, so local indices compare as global.
        const double w = !diag ? 2.0 : (rr < cc ? 2.0 : (rr == cc ? 1.0 : 0.0));
        const double v = acc[s][h][r];
        sacc = fma(w * v, v, sacc);
        if constexpr (kTraceFromGram) {
          if (diag && rr == cc) tsum += v;
        }
      }
  }
  if constexpr (kTraceFromGram) {
    uint32_t b = max(tbits >> 16, tbits & 0xffffu);
#pragma unroll
    for (int off = 16; off > 0; off /= 2) b = max(b, __shfl_xor_sync(0xffffffffu, b, off));
    tmax = AbsBitsToFloat<T>(b);
  }
  // (With the trace from the Gram, tmax is already the warp's: the lanes'
  // step leaves it as it is.)
  WriteBlockSums<kWarps>(
      sacc, tsum, tmax, [](float a, float b) { return MaxKeepNaN(a, b); },  // never NaN here
      g2 + unit, trace + unit, maxabs + unit);
}

// Block b runs unit b (the grid is the unit count), or with kStrided units
// b, b + gridDim.x, ... of `units` (fewer blocks under the SM cap:
// fused_plan.h, ProductGrid); each unit's sums go to its own slot, so the
// grid changes no result. Two instances, so that an uncapped launch runs
// the one-unit code it was measured as (a loop around the body changes its
// register allocation and spills).
template <typename T, class Hooks, int kStages, int kChain, bool kStrided = false>
__global__ void __launch_bounds__(kThreads, 2)
    FusedV2Kernel(const MatrixDesc* __restrict__ mats,
                  const FusedJobV2* __restrict__ jobs, int units, int stage_bytes,
                  double* __restrict__ g2, double* __restrict__ trace,
                  float* __restrict__ maxabs) {
  if constexpr (!kStrided) {
    FusedV2Unit<T, Hooks, kStages, kChain>(mats, jobs, blockIdx.x, stage_bytes, g2, trace,
                                           maxabs);
  } else {
    for (int u = blockIdx.x; u < units; u += gridDim.x) {
      FusedV2Unit<T, Hooks, kStages, kChain>(mats, jobs, u, stage_bytes, g2, trace, maxabs);
      __syncthreads();  // the next unit's loads reuse the stages and the block sums
    }
  }
}

}  // namespace rvd::cuda::fused_v2

#endif  // RVD_KERNELS_CUDA_FUSED_V2_KERNEL_CUH_

// The data the fused kernels and their host planning share (private to
// kernels/cuda/): launch policies, matrix and job descriptors, fused v4's
// launch. Plain C++ with no includes beyond <cstdint> (NVRTC: its
// cuda/std form), so the host compiler, nvcc and NVRTC all read it
// (nvrtc_headers_test.cc).
#ifndef RVD_KERNELS_CUDA_DESCRIPTORS_H_
#define RVD_KERNELS_CUDA_DESCRIPTORS_H_

#ifdef __CUDACC_RTC__
#include <cuda/std/cstdint>
#else
#include <cstdint>
#endif

namespace rvd::cuda {

// The fused kernel's knobs, CUB style: data, not code. The kernel in
// fused_kernel.cuh is written for these values (static_asserts there);
// a policy is chosen per matrix by ChooseFusedKernel.
struct LaunchPolicy {
  const char* name;      // the knobs by name: the log and rvd_kernel_info (not the counts)
  int block_tile;        // Gram rows (and columns) per block tile
  int warps;             // warps per block
  int warp_tile;         // Gram rows (and columns) per warp tile
  int k_slice_bytes;     // bytes of each W row per pipeline stage
  int stages;            // cp.async pipeline depth (K-slices in flight)
  int f32_split;         // f32 inputs: products per MMA step (3 = 3xTF32)
  int col_tile = 0;      // Gram columns of an off-diagonal job (v2); 0: block_tile
  int blocks_per_sm = 1;  // resident blocks per SM the kernel is built for
  int stages_offdiag = 0;  // stages in launches with off-diagonal jobs (v2); 0: stages
  int chain_ksteps = 1;  // MMA k-steps per fresh f32 accumulator (v3; v2: 1)
  int chain_ksteps_f32 = 0;  // the same for f32 inputs; 0: v2's code
  int chain_ksteps_large = 0;  // 16-bit Grams of side > col_tile (v4); 0: chain_ksteps
  int warps_f32 = 0;     // warps per block for f32 inputs (v4); 0: warps
  int tail_pieces = 1;   // v4: most K-pieces a job of a last round is cut into (16-bit)
  int tail_pieces_f32 = 1;  // the same for f32 inputs
  int f32_pairs = 0;     // v4: 1, f32 Grams of side > block_tile too (paired tiles); 0: v3's
  int tall = 0;          // v4 triangle: 1, tall 16-bit W of Gram side <= block_tile too
                         // (MN-major tiles, unmeasured: off); 0: v1's
};

// sm_90 (H200), the only tuned target. Values and where they came from:
//   block_tile 128: one block per 128 x 4096 matrix (the seed's shape) reads
//     W once; 4 x 4 warp tiles of 32, of which the upper 10 are computed on
//     a diagonal block tile (62.5% of the full Gram's MMAs).
//   warps 8: two warp tiles per warp on off-diagonal tiles (16 / 8), 64 f32
//     accumulator registers per thread plus 32 for the per-slice partial
//     (tensor-core accumulation truncates: H200 run 1 measured 1e-5 bias
//     of PR with one accumulator over K = 4096); 1 block of 8 warps per SM
//     by registers.
//   k_slice_bytes 128: one 128-byte line per W row per stage (32 f32 or 64
//     bf16/f16 elements), 16 KB per operand tile, loaded as 16-byte cp.async.
//   stages 4: 3 slices (48 KB per diagonal block) in flight while one is
//     computed; 4.14 TB/s x ~1 us latency / 132 SMs ~ 31 KB per SM needed,
//     with one block per SM.
//   f32_split 3: 3xTF32 (hi*hi + hi*lo + lo*hi); plain TF32 loses ~4e-5 of
//     PR (GPU.md, torch TF32 row), the split keeps ~22 mantissa bits.
// First-version values from the arithmetic above; not yet tuned by
// measurement (see the benchmark's table for what they achieve).
// v1 serves tall W only (rows > cols).
inline constexpr LaunchPolicy kFusedPolicySm90{"fused-v1-bt128w8s4", 128, 8, 32,
                                               128, 4, 3};

// v2's values (fused_v2_kernel.cuh, wide W on sm_80 and newer), which v3
// below keeps and f32 still runs on (chain_ksteps_f32 0), and where they came from (H200 numbers: this
// session's rvd_bench_gpu runs of 2026-11-29, kernel alone, steady clocks;
// docs/history/kernel-notes.md has the table):
//   block_tile 128, col_tile 64: a diagonal job is the upper triangle of a
//     128 x 128 Gram tile (one 128 x 4096 matrix: one job, W read once); an
//     off-diagonal job is 128 x 64, so that a warp holds at most 5 blocks of
//     16 x 16 (40 f32 accumulators) and the kernel fits 128 registers.
//   warps 8, warp_tile 16: 36 blocks of 16 x 16 per diagonal tile (56% of
//     the square's MMAs; v1's 32 x 32 tiles needed 62.5%), 4 or 5 per warp.
//   k_slice_bytes 128: 4 k-steps of 32 bytes per stage, as v1. Each MMA
//     starts a fresh accumulator, added to the running f32 sums with round
//     to nearest (a stricter form of v1's per-slice guard against the
//     tensor cores' truncating accumulation, H200 run 1): max rel error
//     4e-8 (bf16), 2.8e-7 (f32) against v1's 1.8e-7 / 5.4e-7.
//   stages 6 (diagonal-only launches: 6 x 18 KB) / stages_offdiag 4 (27 KB
//     stages): 108 KB of shared memory per block either way. Measured: with
//     4 stages, loads + row statistics alone (no MMAs) of 480 x 128x4096
//     bf16 took 0.31 ms; with 6, 0.16 ms; whole kernel 0.54 -> 0.40 ms.
//   blocks_per_sm 2: 256 threads x 128 registers x 2 = the register file
//     (v1: 226-254 registers, 1 block). ncu on the 480 bf16 launch: 3.6
//     active warps and 0.62 issued instructions per scheduler per cycle,
//     top stall a fixed-latency dependency: issue- and latency-bound.
//   f32_split 3: 3xTF32 as v1.

// v3 (live for wide bf16/f16 W since 2026-11-29, H200 device run 13): v2's
// tiling, stages and registers with fewer instructions per MMA (same kernel
// file, kChain > 0). Measured in one binary, interleaved A-B-C
// (rvd_bench_gpu --ab, kernel + finalize ms, spread <= 0.005 for bf16):
//                       v2      v3 chain 2  v3 chain 4  v3 chain 4
//                                (row pass)  (row pass)  (Gram trace, live)
//   480 x 128x4096 bf16 0.418   0.448       0.318       0.346
//   256 x 128x4096 bf16 0.213   0.233       0.186       0.180
//   32 x 1024x4096 bf16 1.034   1.545       1.022       0.895
//   480 x 128x4096 f32  1.716   1.922       1.807       (f32: row pass)
// (chain 2: run 12; the other columns: run 13, where v2 and the row-pass
// column repeat run 12's values within 0.004 ms.)
//   chain_ksteps 4: a fresh accumulator per K-slice (v2: every MMA),
//     chained on the tensor cores and added to the f32 sums with round to
//     nearest: a quarter of v2's FADDs. Chains of 2 were slower than v2
//     (ptxas -v: 80-120 bytes of spills, against 44-68 for chains of 4).
//     Max rel error vs float64 SVD (run 13; flat, power-law, rank-1,
//     Gaussian; 128 and 256 x 4096): bf16 9.1e-8, f16 1.7e-7 with the
//     Gram trace (row pass: 2.0e-7, 3.9e-7; v2: 9.9e-8, 1.1e-7); 2e-6 is
//     the tolerance.
//   chain_ksteps_f32 0: 3xTF32 keeps v2's code: with chains of 4 it was 5%
//     slower (1.807 vs 1.716 ms; ptxas: 632 bytes of spills) and less exact
//     (5.5e-7 vs 2.1e-7). (In launches with off-diagonal jobs chains were
//     faster, 32 x 1024x4096 f32 6.21 -> 5.53 ms, but a matrix must get the
//     same bits in every launch, so the choice is per dtype.)
//   16-bit inputs: ||W||_F^2 from the Gram's diagonal, row pass = max |w|
//     only (RowMax16). Faster where off-diagonal jobs dominate (1024 case
//     -12%), slower for 480 x 128 (+9% against the row pass; cause not yet
//     measured, see docs/history/kernel-notes.md).
//   warp roles as code (RoleSliceMma): each warp's strips and slots are
//     template arguments (no selects, no per-slot predicates; each strip's
//     A fragments loaded once per chain); edge jobs take SliceMmaChain.
// Other values and where they were measured: v2's, above.
inline constexpr LaunchPolicy kFusedPolicyV3Sm90{
    "fused-v3-bt128x64w8s6b2c4", 128, 8, 16, 128, 6, 3, 64, 2, 4, 4, 0};

// v4 (fused_v4_kernel.cuh; live for wide W with 16-byte aligned rows on
// compute capability 9.0: bf16/f16, and f32 of Gram side <= 128): TMA
// copies into a 6-stage ring of 128 x 64 tiles (32 KB per stage: two
// operands for an off-diagonal job),
// 2 consumer warpgroups of wgmma m64n128k16 (64 Gram rows each) and one
// producer warpgroup; jobs are whole 128 x 128 Gram tiles (col_tile 128),
// a diagonal job computing its whole symmetric square; one persistent block
// per SM (192 KB of shared memory, 384 threads; setmaxnreg 40 / 232). Two
// accumulator sets per consumer (wgmma of slice k + 1 runs while slice k is
// added to the sums): 0.157 -> 0.142 ms on 480 x 128x4096 bf16 (H200 runs
// s2-1, s2-2). Chains of 4 k-steps per fresh accumulator as v3 (same max
// errors as v3 to the digits printed); chains of 8 (two slices) for 16-bit
// Grams of side > 128: 32 x 1024x4096 bf16 0.286 -> 0.277 ms (A-B, H200
// runs s3-3 .. s3-9), max error 5e-7; 128-row Grams keep 4 (8 was 3-5%
// slower there). f32 (Gram side <= 128): two converter warpgroups split
// each tile into scaled f16 hi + 2 lo (warps_f32 16: 512 threads), the
// consumers run 8 wgmma per slice. "d3" (session 7): a 16-bit diagonal job
// multiplies the three 64 x 64 blocks of its upper triangle, not the whole
// square (32 x 1024x4096 bf16 0.2532 -> 0.2497 ms isolated, H200 s7-1).
// "p8" (session 8): tail_pieces_f32 8, f32 jobs of a last round that would
// leave SMs idle cut into up to 8 K-pieces (FusedV4Plan): 480 x 128x4096
// f32 0.3075 -> 0.2953 ms isolated (H200 s8-7). 16-bit launches keep whole
// jobs (tail_pieces 1): cut, 480 bf16 and the 1024 case were slower (the
// partial Grams' combining costs more than their shorter last round saves).
// "x3" (f32_pairs 1): f32 Grams of side > 128 on v4 too, each slice of an
// off-diagonal job as two tiles (row block A, column block B) split into
// f16 hi + lo and multiplied as hA hB^T + hA lB^T + lA hB^T (12 wgmma a
// slice; ConvertPairedTiles), 2 stages and 5 sets; before, v3's 3xTF32
// mma.sync (32 x 1024x4096 f32 6.2 ms). f32_pairs 0 sends them back to v3.
// Measurements: docs/history/kernel-notes.md, fused v4; docs/history/bench-results.md, sessions 2 to 8.
inline constexpr LaunchPolicy kFusedPolicyV4Sm90{
    "fused-v4-tma-wgmma-bt128s6c8w16d3p8x3", 128, 12, 64, 128, 6, 2, 128, 1, 6, 4, 4, 8, 16, 1, 8,
    1};

// v4 for 16-bit Grams of side <= 128 (one diagonal job per matrix): the
// same ring and producer, and three consumer warpgroups, one per 64 x 64
// block (0,0), (0,1), (1,1) of the symmetric square (wgmma m64n64, (0,1)
// counted twice): 3/4 of the square's tensor-core work. Why: the H200
// runs these kernels at its 700 W power cap (SM clock 1980 -> ~1550 MHz
// after ~0.1 s of back-to-back launches, run s6-1), so work the result
// does not need costs time. 512 threads; setmaxnreg 56 / 152 (two m64n64
// accumulator sets and the sums). Measurements: docs/history/kernel-notes.md, session 6.
inline constexpr LaunchPolicy kFusedPolicyV4TriangleSm90{
    "fused-v4-triangle-tma-wgmma-3x64s6c4", 128, 16, 64, 128, 6, 0, 128, 1, 6, 4};

// One block of the fused kernel: the tile (ti, tj), ti <= tj, of matrix m's
// Gram, in units of block_tile.
struct FusedJob {
  int32_t matrix;
  int32_t ti;
  int32_t tj;
  int32_t diagonal;  // ti == tj: also reduces ||W||_F^2 over its rows
};

// One block of the v2 kernel on matrix m (wide): diagonal jobs cover the
// upper triangle of the block_tile square at (row0, row0); off-diagonal jobs
// the block_tile x col_tile tile at (row0, col0), col0 >= row0 + block_tile.
struct FusedJobV2 {
  int32_t matrix;
  int32_t row0;      // first Gram row (the A operand's first W row)
  int32_t col0;      // first Gram column (the B operand's first W row)
  int32_t diagonal;  // 1: also reduces ||W||_F^2 and max |w| over its rows
};

// Fused v4's schedule of one launch of `jobs` jobs: `grid` persistent
// blocks take units round-robin. When the jobs would leave blocks idle in
// their last round, the first `cut` jobs are cut into `pieces` K-ranges
// each: units 0 .. cut * pieces - 1 are their pieces (job u / pieces,
// piece u % pieces), the units after them the other jobs whole, in order.
// The block finishing a cut job's last piece adds the partial Grams in
// piece order. Cut jobs go first so that this combining (L2 traffic, the
// consumers waiting) overlaps the blocks' later jobs instead of ending the
// launch. The plan depends only on the job count, the SM count and the
// shortest job: the same launch gives the same bits. (A cut matrix's bits
// differ from its bits alone, within the same error of the oracle.)
struct FusedV4Plan {
  int jobs = 0;
  int grid = 0;
  int cut = 0;
  int pieces = 1;
  int units = 0;
};

// A cut job's pieces have at least kFusedV4MinPieceSlices K-slices each.
inline constexpr int kFusedV4MinPieceSlices = 4;

#ifdef __CUDACC__
#define RVD_HOST_DEVICE __host__ __device__
#else
#define RVD_HOST_DEVICE
#endif
// K-slices (64 elements) of a v4 job on a matrix of `cols` columns.
RVD_HOST_DEVICE constexpr int FusedV4Slices(int64_t cols) {
  return static_cast<int>((cols + 63) / 64);
}
// Piece p of a job of `slices` K-slices cut into `pieces`: slices
// [PieceBegin(p), PieceBegin(p + 1)); the first pieces take the extra
// slices (CombinePieces: piece 0 is the largest).
RVD_HOST_DEVICE constexpr int PieceBegin(int p, int pieces, int slices) {
  return slices - static_cast<int>(static_cast<int64_t>(pieces - p) * slices / pieces);
}
#undef RVD_HOST_DEVICE

// Device memory of a cut v4 plan: one 128 x 128 f32 partial Gram per piece
// of a cut job, and two int32 tickets per cut job (pieces done, pieces
// stored; FusedV4Launch), kFusedV4TicketInts in all: cut jobs are never
// more than the SMs (they are a last round's). Zeroed once, the kernel
// leaves them zero.
inline constexpr int kFusedV4PartialFloats = 128 * 128;
inline constexpr int kFusedV4MaxCutJobs = 1024;
inline constexpr int kFusedV4TicketInts = 2 * kFusedV4MaxCutJobs;

// A matrix as the kernels see it (device pointer).
struct MatrixDesc {
  const void* data;  // element (i, j) at data + (i * ld + j) * esize
  int64_t ld;
  int32_t rows, cols;
  int32_t n;        // the Gram's side, min(rows, cols)
  int32_t k;        // the long side, max(rows, cols)
  int32_t tall;     // rows > cols: G = W^T W
  int32_t aligned;  // data and ld * esize are multiples of 16 bytes
};

// Per-matrix status written by the finalize kernel.
enum MatrixStatus : int32_t {
  kStatusOk = 0,
  kStatusNonFinite = 1,  // NaN or Inf in the matrix
  kStatusUntrusted = 2,  // magnitudes where f32 Gram entries over/underflow
};

// The fused kernel v4 (sm_90a: TMA + wgmma; fused_v4_kernel.cuh) for the
// matrices ChooseFusedKernel (launch_policy.h) gives it. Jobs are FusedJobV2
// with 128 x 128 tiles (kFusedPolicyV4Sm90), scheduled by a FusedV4Plan.
inline constexpr int kTensorMapBytes = 128;
// A CUtensorMap (cuda.h is host-only; fused_v4.cu checks size and alignment).
struct alignas(128) TensorMap {
  unsigned char bytes[kTensorMapBytes];
};
struct FusedV4Launch {
  const void* maps;  // a kTensorMapBytes tensor map per matrix index (EncodeFusedV4Map),
                     // 64-byte aligned device memory
  const MatrixDesc* mats;
  const FusedJobV2* jobs;
  FusedV4Plan plan;       // PlanFusedV4 over the jobs
  float* partials;        // a cut plan's FusedV4PartialBytes of device memory, or null
  int32_t* tickets;       // a cut plan's kFusedV4TicketInts int32, zero (left zero), or null
  bool triangle;          // FusedKernel::kV4Triangle's matrices (16-bit, Gram side <= 128),
                          // else kV4's
  bool pairs;             // kV4's f32 matrices of Gram side > 128 (FusedV4Pairs: paired
                          // tiles, three products a slice), else none of them
  bool tall;              // kV4Triangle's tall matrices (16-bit, rows > cols <= 128: G =
                          // W^T W from MN-major tiles), else none of them
  // Outputs per job as LaunchFused, except maxabs (sqrt(max_i G_ii / k):
  // see fused_v4_kernel.cuh).
  double* g2;
  double* trace;
  float* maxabs;
  // Per matrix index, or null: a matrix of Gram side <= 128 (one job) gets
  // its PR and status from the kernel itself, the same bits as
  // LaunchFinalize's (so a launch of only such matrices needs no finalize).
  double* pr;
  int32_t* status;
};

namespace fused_v4 {
// Fused v4's purpose, the kernel's template argument: the product runs
// kLive, the GPU test a deliberately wrong kernel, the bench's probes
// (LaunchFusedV4Probe) the kernel with one part changed, to place its time.
enum Mode : int {
  kLive,
  // 16-bit: the last k-step of each slice reads B at the slice's first
  // k-step (one wrong index): a Gram that is wrong yet plausible (about 3/4
  // of W W^T), which the finalize's range test does not turn into a
  // fallback; the checks against the oracle must catch it. f32: a slice
  // keeps the scale of the slice converted before it, whether or not it
  // fits (its hi overflows when the magnitude jumps up), and a job's first
  // slice is copied from the matrix of the block's job before it.
  kMutant,
  kProbeBIsA,      // every job loads and multiplies its row tile only
  kProbeNoLoad,    // the producer signals stages without loading them
  kProbeChain1,    // 16-bit: one slice per accumulator chain for every Gram
  kProbeRetire1,   // one add per finished slice instead of 64
  kProbeNoConvert, // f32: the stages are not converted (wrong)
  kProbeMmaOnly,   // f32: neither loads nor conversion, the consumers' part alone
  kProbeLoadOnly,  // the consumers free each slice without multiplying it
  kProbeNoCombine, // a cut job's pieces each end as a whole job (no partial sums)
};
}  // namespace fused_v4

}  // namespace rvd::cuda

#endif  // RVD_KERNELS_CUDA_DESCRIPTORS_H_

// The built-in search space and its kernel templates. Each template is the
// body of one family; Emit puts the point's knobs in front of it as
// constants, so the source of a candidate says every value it was built
// with.
#include "self_improve/space.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace rvd::tune {
namespace {

// What a block may opt into on sm_90 (227 KiB), less 1 KiB for the
// reduction's static shared slots (block_sums.cuh).
constexpr int kMaxSmem = 226 * 1024;
constexpr int kMaxAccumulators = 64;  // f32 accumulators per thread (registers)

// Shared by every family: the element type's conversion, a Gram operand's
// element (Gram row r at position k: row r of W when wide, column r when
// tall), and the fixed-order block reduction of the product kernels.
constexpr char kPrelude[] = R"(
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernels/cuda/block_sums.cuh"
#include "kernels/cuda/descriptors.h"
#include "self_improve/candidate_abi.h"

namespace {
__device__ __forceinline__ float ToF(float x) { return x; }
__device__ __forceinline__ float ToF(__half x) { return __half2float(x); }
__device__ __forceinline__ float ToF(__nv_bfloat16 x) { return __bfloat162float(x); }

__device__ __forceinline__ float GramOperand(const rvd::cuda::MatrixDesc& d, int r, int k) {
  const Elem* w = static_cast<const Elem*>(d.data);
  return ToF(d.tall ? w[static_cast<long long>(k) * d.ld + r]
                    : w[static_cast<long long>(r) * d.ld + k]);
}

struct MaxOp {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
}  // namespace
)";

// naive: each thread a strided share of the job's Gram entries (c >= r), each
// entry a float64 dot product over K read from global memory; then the
// largest |w| of the rows the job covers.
constexpr char kNaiveBody[] = R"(
extern "C" __global__ void __launch_bounds__(kWarps * 32)
rvd_tune_candidate(const rvd::cuda::MatrixDesc* mats, const rvd::tune::TuneJob* jobs,
                   int num_jobs, double* g2, double* trace, float* maxabs) {
  for (int j = blockIdx.x; j < num_jobs; j += gridDim.x) {
    const rvd::tune::TuneJob job = jobs[j];
    const rvd::cuda::MatrixDesc d = mats[job.matrix];
    double s2 = 0.0, st = 0.0;
    float mx = 0.0f;
    const int entries = job.rows * job.cols;
    for (int e = threadIdx.x; e < entries; e += blockDim.x) {
      const int r = job.row0 + e / job.cols, c = job.col0 + e % job.cols;
      if (c < r) continue;
      double acc = 0.0;
      for (int k = 0; k < d.k; ++k) {
        acc += static_cast<double>(GramOperand(d, r, k)) * GramOperand(d, c, k);
      }
      s2 += (c == r ? 1.0 : 2.0) * acc * acc;
      if (c == r) st += acc;
    }
    // The rows the job read: its row range, and its column range.
    const long long row_elems = static_cast<long long>(job.rows) * d.k;
    const long long all_elems = row_elems + static_cast<long long>(job.cols) * d.k;
    for (long long i = threadIdx.x; i < all_elems; i += blockDim.x) {
      const int r = i < row_elems ? job.row0 + static_cast<int>(i / d.k)
                                  : job.col0 + static_cast<int>((i - row_elems) / d.k);
      const int k = static_cast<int>(i % d.k);
      mx = fmaxf(mx, fabsf(GramOperand(d, r, k)));
    }
    rvd::cuda::WriteBlockSums<kWarps>(s2, st, mx, MaxOp(), &g2[j], &trace[j], &maxabs[j]);
    __syncthreads();  // the reduction's shared slots are reused by the next job
  }
}
)";

// tiled_fma: see space.h. Shared memory (dynamic): per group kStages
// buffers of A and B, each kKS x kLd floats (k-major: a thread's operands
// of one k are a row), then (kSplit - 1) x kT x kT doubles for adding the
// groups' sums.
constexpr char kTiledBody[] = R"(
constexpr int kGroupThreads = kWarps * 32 / kSplit;
constexpr int kTx = 16;
constexpr int kTy = kGroupThreads / kTx;
constexpr int kMR = kT / kTy;  // micro-tile rows per thread
constexpr int kMC = kT / kTx;  // micro-tile columns per thread
constexpr int kLd = kT + 1;    // padded shared row (floats)
constexpr int kBufFloats = kKS * kLd;
// Chunks of kVec elements per operand tile, and per thread.
constexpr int kChunks = kT * kKS / kVec;
constexpr int kChunksPerThread = (kChunks + kGroupThreads - 1) / kGroupThreads;
static_assert(kTy * kTx == kGroupThreads && kT % kTy == 0 && kT % kTx == 0, "tiling");

// f32 inputs accumulate in float64 (their products are exact there);
// 16-bit inputs in f32 for one slice (their products are exact in f32).
template <typename T> struct AccOf { typedef float type; };
template <> struct AccOf<float> { typedef double type; };
typedef AccOf<Elem>::type Acc;
// Fused multiply-adds of the accumulator's own width (no promotion).
__device__ __forceinline__ float Fma(float a, float b, float c) { return fmaf(a, b, c); }
__device__ __forceinline__ double Fma(double a, double b, double c) { return fma(a, b, c); }

template <int N> struct alignas(sizeof(Elem) * N) VecOf { Elem v[N]; };

// Loads chunk `c` of the operand tile whose first Gram row is `base` (rows
// up to `end`) at K offset k0 into `out`, zero outside the matrix; `mx`
// takes the largest |w| loaded.
__device__ __forceinline__ void LoadChunk(const rvd::cuda::MatrixDesc& d, int base, int end,
                                          int k0, int c, float* out, float& mx) {
  const Elem* w = static_cast<const Elem*>(d.data);
  if (!d.tall) {  // a row of W: kVec consecutive k
    const int r = base + c / (kKS / kVec), k = k0 + (c % (kKS / kVec)) * kVec;
    if (r < end && d.aligned && k + kVec <= d.k) {
      const VecOf<kVec> v =
          *reinterpret_cast<const VecOf<kVec>*>(w + static_cast<long long>(r) * d.ld + k);
#pragma unroll
      for (int i = 0; i < kVec; ++i) out[i] = ToF(v.v[i]);
    } else {
#pragma unroll
      for (int i = 0; i < kVec; ++i) {
        out[i] = (r < end && k + i < d.k) ? GramOperand(d, r, k + i) : 0.0f;
      }
    }
  } else {  // a row of W^T: kVec consecutive Gram rows at one k
    const int k = k0 + c / (kT / kVec), r = base + (c % (kT / kVec)) * kVec;
    if (k < d.k && d.aligned && r + kVec <= end) {
      const VecOf<kVec> v =
          *reinterpret_cast<const VecOf<kVec>*>(w + static_cast<long long>(k) * d.ld + r);
#pragma unroll
      for (int i = 0; i < kVec; ++i) out[i] = ToF(v.v[i]);
    } else {
#pragma unroll
      for (int i = 0; i < kVec; ++i) {
        out[i] = (k < d.k && r + i < end) ? GramOperand(d, r + i, k) : 0.0f;
      }
    }
  }
#pragma unroll
  for (int i = 0; i < kVec; ++i) mx = fmaxf(mx, fabsf(out[i]));
}

// Where chunk c's element i goes in a k-major buffer.
__device__ __forceinline__ int SharedIndex(bool tall, int c, int i) {
  if (!tall) return ((c % (kKS / kVec)) * kVec + i) * kLd + c / (kKS / kVec);
  return (c / (kT / kVec)) * kLd + (c % (kT / kVec)) * kVec + i;
}

struct Staged {
  float a[kChunksPerThread][kVec];
  float b[kChunksPerThread][kVec];
};

__device__ __forceinline__ void Fetch(const rvd::cuda::MatrixDesc& d, const rvd::tune::TuneJob& job,
                                      int slice, int t, Staged& s, float& mx) {
  const int k0 = slice * kKS;
#pragma unroll
  for (int q = 0; q < kChunksPerThread; ++q) {
    const int c = t + q * kGroupThreads;
    if (c < kChunks) {
      LoadChunk(d, job.row0, job.row0 + job.rows, k0, c, s.a[q], mx);
      LoadChunk(d, job.col0, job.col0 + job.cols, k0, c, s.b[q], mx);
    }
  }
}

__device__ __forceinline__ void Store(bool tall, int t, const Staged& s, float* a, float* b) {
#pragma unroll
  for (int q = 0; q < kChunksPerThread; ++q) {
    const int c = t + q * kGroupThreads;
    if (c < kChunks) {
#pragma unroll
      for (int i = 0; i < kVec; ++i) {
        a[SharedIndex(tall, c, i)] = s.a[q][i];
        b[SharedIndex(tall, c, i)] = s.b[q][i];
      }
    }
  }
}

__device__ __forceinline__ void Compute(const float* a, const float* b, int tx, int ty,
                                        double (&sum)[kMR][kMC]) {
  Acc acc[kMR][kMC];
#pragma unroll
  for (int i = 0; i < kMR; ++i)
#pragma unroll
    for (int j = 0; j < kMC; ++j) acc[i][j] = 0;
#pragma unroll 4
  for (int kk = 0; kk < kKS; ++kk) {
    Acc av[kMR], bv[kMC];
#pragma unroll
    for (int i = 0; i < kMR; ++i) av[i] = a[kk * kLd + ty + kTy * i];
#pragma unroll
    for (int j = 0; j < kMC; ++j) bv[j] = b[kk * kLd + tx + kTx * j];
#pragma unroll
    for (int i = 0; i < kMR; ++i)
#pragma unroll
      for (int j = 0; j < kMC; ++j) acc[i][j] = Fma(av[i], bv[j], acc[i][j]);
  }
#pragma unroll
  for (int i = 0; i < kMR; ++i)
#pragma unroll
    for (int j = 0; j < kMC; ++j) sum[i][j] += static_cast<double>(acc[i][j]);
}

extern "C" __global__ void __launch_bounds__(kWarps * 32)
rvd_tune_candidate(const rvd::cuda::MatrixDesc* mats, const rvd::tune::TuneJob* jobs,
                   int num_jobs, double* g2, double* trace, float* maxabs) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int g = threadIdx.x / kGroupThreads, t = threadIdx.x % kGroupThreads;
  const int tx = t % kTx, ty = t / kTx;
  float* bufs = reinterpret_cast<float*>(smem) + g * kStages * 2 * kBufFloats;
  double* red = reinterpret_cast<double*>(smem + kSplit * kStages * 2 * kBufFloats * sizeof(float));
  for (int j = blockIdx.x; j < num_jobs; j += gridDim.x) {
    const rvd::tune::TuneJob job = jobs[j];
    const rvd::cuda::MatrixDesc d = mats[job.matrix];
    double sum[kMR][kMC];
#pragma unroll
    for (int i = 0; i < kMR; ++i)
#pragma unroll
      for (int q = 0; q < kMC; ++q) sum[i][q] = 0.0;
    float mx = 0.0f;
    const int slices = (d.k + kKS - 1) / kKS;
    // Every group runs the same number of rounds (block-wide syncs); a
    // group's slice past the end loads zeros.
    const int rounds = (slices + kSplit - 1) / kSplit;
    Staged s;
    int cur = 0;
    Fetch(d, job, g, t, s, mx);
    Store(d.tall, t, s, bufs, bufs + kBufFloats);
    __syncthreads();
    for (int round = 0; round < rounds; ++round) {
      const bool next = round + 1 < rounds;
      if (kStages == 2 && next) Fetch(d, job, g + (round + 1) * kSplit, t, s, mx);
      float* a = bufs + cur * 2 * kBufFloats;
      Compute(a, a + kBufFloats, tx, ty, sum);
      if (kStages == 2) {
        if (next) {
          float* o = bufs + (cur ^ 1) * 2 * kBufFloats;
          Store(d.tall, t, s, o, o + kBufFloats);
        }
        __syncthreads();
        cur ^= 1;
      } else {
        __syncthreads();
        if (next) {
          Fetch(d, job, g + (round + 1) * kSplit, t, s, mx);
          Store(d.tall, t, s, bufs, bufs + kBufFloats);
          __syncthreads();
        }
      }
    }
    // Groups 1.. hand their sums to group 0, which adds them in group order.
    if (kSplit > 1) {
      if (g > 0) {
#pragma unroll
        for (int i = 0; i < kMR; ++i)
#pragma unroll
          for (int q = 0; q < kMC; ++q)
            red[((g - 1) * kT + ty + kTy * i) * kT + tx + kTx * q] = sum[i][q];
      }
      __syncthreads();
      if (g == 0) {
        for (int h = 1; h < kSplit; ++h)
#pragma unroll
          for (int i = 0; i < kMR; ++i)
#pragma unroll
            for (int q = 0; q < kMC; ++q)
              sum[i][q] += red[((h - 1) * kT + ty + kTy * i) * kT + tx + kTx * q];
      }
    }
    double s2 = 0.0, st = 0.0;
    if (g == 0) {
#pragma unroll
      for (int i = 0; i < kMR; ++i) {
        const int r = job.row0 + ty + kTy * i;
#pragma unroll
        for (int q = 0; q < kMC; ++q) {
          const int c = job.col0 + tx + kTx * q;
          if (r < job.row0 + job.rows && c < job.col0 + job.cols && c >= r) {
            const double v = sum[i][q];
            s2 += (c == r ? 1.0 : 2.0) * v * v;
            if (c == r) st += v;
          }
        }
      }
    }
    rvd::cuda::WriteBlockSums<kWarps>(s2, st, mx, MaxOp(), &g2[j], &trace[j], &maxabs[j]);
    __syncthreads();  // shared memory is reused by the next job
  }
}
)";

const char* ElemType(DType dtype) {
  switch (dtype) {
    case DType::kF32: return "float";
    case DType::kF16: return "__half";
    case DType::kBF16: return "__nv_bfloat16";
  }
  return "float";
}

int TiledSmem(const SpacePoint& p) {
  const int buf_floats = p.k_slice * (p.tile + 1);
  return p.split_k * p.stages * 2 * buf_floats * 4 + (p.split_k - 1) * p.tile * p.tile * 8;
}

bool Fail(std::string* why, std::string text) {
  if (why != nullptr) *why = std::move(text);
  return false;
}

}  // namespace

const char* FamilyName(Family f) {
  switch (f) {
    case Family::kNaive: return "naive";
    case Family::kTiledFma: return "tiled_fma";
  }
  return "unknown";
}

const char* MmaPathName(MmaPath m) {
  switch (m) {
    case MmaPath::kFma: return "fma";
  }
  return "unknown";
}

// The declared space. Ranges and why:
//   tiles 0 (naive only: one job per matrix, the starting point), 32, 64,
//     128: 128 is the product kernels' job (one job per 128 x 4096 head);
//     smaller tiles give more jobs (more blocks) for few large Grams.
//   warps 2 .. 16: a block of 64 to 512 threads (the product runs 8 to 16).
//   stages 1, 2: without and with the next slice prefetched into registers.
//   split_k 1, 2, 4: thread groups over interleaved K-slices (more threads
//     on one tile without more accumulators each).
//   vector widths 1 .. 8 elements: up to 16-byte loads (f32: up to 4).
//   k slices 16, 32, 64 elements: the f32 chain of 16-bit inputs (exact
//     products, rounding over at most 64 terms before float64).
const SearchSpace& DefaultSpace() {
  static const SearchSpace kSpace = {
      {Family::kNaive, Family::kTiledFma},
      {0, 32, 64, 128},
      {2, 4, 8, 16},
      {1, 2},
      {1, 2, 4},
      {1, 2, 4, 8},
      {16, 32, 64},
  };
  return kSpace;
}

SpacePoint NaivePoint() {
  SpacePoint p;
  p.family = Family::kNaive;
  p.tile = 0;
  p.warps = 4;
  return p;
}

bool Valid(const SpacePoint& p, DType dtype, std::string* why) {
  if (p.warps < 1 || p.warps > 32) return Fail(why, "warps outside [1, 32]");
  if (p.mma != MmaPath::kFma) return Fail(why, "no template for this MMA path");
  if (p.tile != 0 && (p.tile < 16 || p.tile % 16 != 0 || p.tile > 4096)) {
    return Fail(why, "tile neither 0 nor a multiple of 16 in [16, 4096]");
  }
  if (p.family == Family::kNaive) {
    if (p.stages != 1 || p.split_k != 1 || p.vector_width != 1 || p.k_slice != 0) {
      return Fail(why, "naive has no stages, split-K, vector loads or K-slices");
    }
    return true;
  }
  // tiled_fma
  const int group_threads = p.warps * 32 / std::max(p.split_k, 1);
  if (p.tile == 0) return Fail(why, "tiled_fma needs a tile");
  if (p.stages < 1 || p.stages > 2) return Fail(why, "stages outside [1, 2]");
  if (p.split_k < 1 || p.warps * 32 % p.split_k != 0 || group_threads < 32) {
    return Fail(why, "split_k does not divide the block into groups of warps");
  }
  const int ty = group_threads / 16;
  if (p.tile % 16 != 0 || p.tile % ty != 0) {
    return Fail(why, "the group's 16 x (threads / 16) thread grid does not tile the job");
  }
  const int acc = (p.tile / ty) * (p.tile / 16);
  if (acc > kMaxAccumulators) return Fail(why, "more than 64 accumulators per thread");
  if (p.vector_width < 1 || (p.vector_width & (p.vector_width - 1)) != 0 ||
      p.vector_width * static_cast<int>(DTypeSize(dtype)) > 16) {
    return Fail(why, "vector width not a power of two of at most 16 bytes");
  }
  if (p.k_slice < 16 || p.k_slice % p.vector_width != 0 || p.tile % p.vector_width != 0) {
    return Fail(why, "K-slice below 16 or not a multiple of the vector width");
  }
  if (TiledSmem(p) > kMaxSmem) return Fail(why, "shared memory above 227 KiB");
  return true;
}

std::vector<SpacePoint> Points(const SearchSpace& s, DType dtype) {
  std::vector<SpacePoint> out;
  for (Family f : s.families) {
    for (int tile : s.tiles)
      for (int warps : s.warps) {
        if (f == Family::kNaive) {
          SpacePoint p;
          p.family = f;
          p.tile = tile;
          p.warps = warps;
          if (Valid(p, dtype)) out.push_back(p);
          continue;
        }
        for (int stages : s.stages)
          for (int split : s.split_k)
            for (int vec : s.vector_widths)
              for (int ks : s.k_slices) {
                SpacePoint p{f, tile, warps, stages, split, vec, ks, MmaPath::kFma};
                if (Valid(p, dtype)) out.push_back(p);
              }
      }
  }
  return out;
}

std::string PointKey(const SpacePoint& p) {
  return absl::StrCat(FamilyName(p.family), ":", MmaPathName(p.mma), ":t", p.tile, ":w",
                      p.warps, ":s", p.stages, ":k", p.split_k, ":v", p.vector_width, ":ks",
                      p.k_slice);
}

absl::StatusOr<SpacePoint> ParsePointKey(absl::string_view key) {
  std::vector<absl::string_view> parts = absl::StrSplit(key, ':');
  const auto bad = [&] {
    return absl::InvalidArgumentError(absl::StrCat("not a point key: \"", key, "\""));
  };
  if (parts.size() != 8) return bad();
  SpacePoint p;
  if (parts[0] == "naive") {
    p.family = Family::kNaive;
  } else if (parts[0] == "tiled_fma") {
    p.family = Family::kTiledFma;
  } else {
    return bad();
  }
  if (parts[1] != "fma") return bad();
  struct Field {
    absl::string_view prefix;
    int* value;
  } fields[] = {{"t", &p.tile},         {"w", &p.warps},        {"s", &p.stages},
                {"k", &p.split_k},      {"v", &p.vector_width}, {"ks", &p.k_slice}};
  for (int i = 0; i < 6; ++i) {
    absl::string_view part = parts[i + 2];
    if (!absl::ConsumePrefix(&part, fields[i].prefix) ||
        !absl::SimpleAtoi(part, fields[i].value)) {
      return bad();
    }
  }
  return p;
}

std::string KeyOfDescription(absl::string_view description) {
  const size_t colon_space = description.find(": ");
  const absl::string_view key =
      colon_space == absl::string_view::npos ? description : description.substr(0, colon_space);
  return ParsePointKey(key).ok() ? std::string(key) : std::string();
}

CandidateLaunch LaunchOf(const SpacePoint& p, DType /*dtype*/) {
  CandidateLaunch l;
  l.threads = p.warps * 32;
  l.smem = p.family == Family::kTiledFma ? TiledSmem(p) : 0;
  l.tile_rows = p.tile;
  l.tile_cols = p.tile;
  return l;
}

absl::StatusOr<Candidate> Emit(const SpacePoint& p, DType dtype) {
  std::string why;
  if (!Valid(p, dtype, &why)) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid point ", PointKey(p), " for ", DTypeName(dtype), ": ", why));
  }
  const std::string key = PointKey(p);
  Candidate c;
  c.source = absl::StrCat("// rvd tuning candidate ", key, " for ", DTypeName(dtype),
                          " (self_improve/space.cc)\n",
                          FormatLaunchAnnotation(LaunchOf(p, dtype)), "\n");
  // Elem first: the prelude's helpers use it.
  absl::StrAppend(&c.source, "#include <cuda_bf16.h>\n#include <cuda_fp16.h>\ntypedef ",
                  ElemType(dtype), " Elem;\nconstexpr int kWarps = ", p.warps, ";\n");
  if (p.family == Family::kNaive) {
    absl::StrAppend(&c.source, kPrelude, kNaiveBody);
    c.description =
        absl::StrCat(key, ": ",
                     p.tile == 0 ? "one block per matrix"
                                 : absl::StrCat("one block per ", p.tile, "x", p.tile, " tile"),
                     ", ", p.warps, " warps, float64 dot products from global memory");
  } else {
    absl::StrAppend(&c.source, "constexpr int kT = ", p.tile, ";\nconstexpr int kKS = ",
                    p.k_slice, ";\nconstexpr int kStages = ", p.stages,
                    ";\nconstexpr int kSplit = ", p.split_k, ";\nconstexpr int kVec = ",
                    p.vector_width, ";\n", kPrelude, kTiledBody);
    c.description = absl::StrCat(
        key, ": ", p.tile, "x", p.tile, " Gram tiles, ", p.warps, " warps in ", p.split_k,
        " K-group(s), K-slices of ", p.k_slice, " through shared memory",
        p.stages == 2 ? " with register prefetch" : "", ", ", p.vector_width,
        "-element loads, FMA micro-tiles");
  }
  return c;
}

int EnumerateTuneJobs(int32_t matrix, int n, const CandidateLaunch& launch,
                      std::vector<TuneJob>* jobs) {
  if (n <= 0) return 0;
  if (launch.tile_rows == 0) {
    jobs->push_back(TuneJob{matrix, 0, 0, n, n, 1});
    return 1;
  }
  const int tr = launch.tile_rows, tc = launch.tile_cols;
  int added = 0;
  for (int r0 = 0; r0 < n; r0 += tr) {
    const int rows = std::min(tr, n - r0);
    for (int c0 = 0; c0 < n; c0 += tc) {
      const int cols = std::min(tc, n - c0);
      // The tile holds an entry with col >= row iff its last column reaches
      // its first row; it meets the diagonal iff the ranges overlap.
      if (c0 + cols - 1 < r0) continue;
      const int diagonal = (c0 < r0 + rows && r0 < c0 + cols) ? 1 : 0;
      jobs->push_back(TuneJob{matrix, r0, c0, rows, cols, diagonal});
      ++added;
    }
  }
  return added;
}

}  // namespace rvd::tune

// The built-in generator's search space (self_improve/, public), declared
// next to the benchmark as CUB declares its tuning spaces: kernel templates
// (families) and their knobs as data, each point turned into a candidate's
// device source by Emit. The space starts at a deliberately naive point
// (one block per matrix, plain float64 FMAs, no shared memory, no tensor
// cores) so that a search can be seen climbing from it.
//
// Families with templates today:
//   naive      one block per job (tile 0: per matrix), each thread a strided
//              share of the Gram entries, each entry a float64 dot product
//              read straight from global memory.
//   tiled_fma  a tile x tile Gram tile per job, K in slices staged through
//              shared memory (vector loads, optional register prefetch),
//              thread micro-tiles of FMAs accumulated in f32 for one slice
//              (16-bit inputs: exact products) or float64 (f32 inputs), each
//              slice's sums added in float64; split_k groups of threads take
//              interleaved slices and are added in group order.
// The tensor-core paths (WMMA, mma.sync, wgmma: the product kernels'
// techniques, kernels/cuda/*_kernel.cuh) are the next families; the knob
// `mma` is kept in the key so that they extend the space without renaming
// a point.
//
// Thread-safe: pure functions and constants.
#ifndef RVD_SELF_IMPROVE_SPACE_H_
#define RVD_SELF_IMPROVE_SPACE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/engine.h"
#include "self_improve/candidate_abi.h"
#include "self_improve/generator.h"

namespace rvd::tune {

enum class Family { kNaive, kTiledFma };
enum class MmaPath { kFma };  // planned: kWmma, kMmaSync, kWgmma

// "naive", "tiled_fma"; "fma".
const char* FamilyName(Family f);
const char* MmaPathName(MmaPath m);

// One point: a family and its knobs.
struct SpacePoint {
  Family family = Family::kNaive;
  int tile = 0;          // Gram rows and columns per job (0: the whole Gram)
  int warps = 4;         // warps per block
  int stages = 1;        // 1: load, sync, compute; 2: the next slice prefetched into registers
  int split_k = 1;       // thread groups taking interleaved K-slices, added in order
  int vector_width = 1;  // elements per global load (<= 16 bytes)
  int k_slice = 0;       // K elements per shared-memory stage (tiled families)
  MmaPath mma = MmaPath::kFma;
  bool operator==(const SpacePoint&) const = default;
};

// The values each knob may take. A point of the space is any combination
// that Valid accepts for the dtype.
struct SearchSpace {
  std::vector<Family> families;
  std::vector<int> tiles;
  std::vector<int> warps;
  std::vector<int> stages;
  std::vector<int> split_k;
  std::vector<int> vector_widths;
  std::vector<int> k_slices;
};

// The declared space (space.cc says why each range).
const SearchSpace& DefaultSpace();

// The starting point: naive, one block (4 warps) per matrix.
SpacePoint NaivePoint();

// Whether `p` is a point a template can be emitted for on `dtype`; `why`
// (optional) says what rule it breaks.
bool Valid(const SpacePoint& p, DType dtype, std::string* why = nullptr);

// Every valid point of `space` for `dtype`, in a fixed order (families,
// then knobs in declaration order): the same list on every machine.
std::vector<SpacePoint> Points(const SearchSpace& space, DType dtype);

// The point's stable key, e.g. "tiled_fma:fma:t64:w8:s2:k1:v4:ks32"; a
// candidate's description starts with it (KeyOfDescription).
std::string PointKey(const SpacePoint& p);
absl::StatusOr<SpacePoint> ParsePointKey(absl::string_view key);
// The key a built-in candidate's description starts with ("" for others).
std::string KeyOfDescription(absl::string_view description);

// The launch geometry of `p` on `dtype` (threads, dynamic shared memory,
// job tile), as its source's annotation says.
CandidateLaunch LaunchOf(const SpacePoint& p, DType dtype);

// The candidate for `p` on `dtype`: device source (annotation, the entry
// kCandidateEntry, includes of the NVRTC-clean headers only) and a
// description "<key>: <what it does>". INVALID_ARGUMENT for an invalid point.
absl::StatusOr<Candidate> Emit(const SpacePoint& p, DType dtype);

// Appends matrix `matrix`'s jobs for a Gram of side n under `launch`'s tile
// (0: one job for the whole Gram): the tiles of a uniform tile_rows x
// tile_cols grid holding an entry with col >= row, row tile by row tile, in
// column order, edge tiles cut at n. Returns how many it appended.
int EnumerateTuneJobs(int32_t matrix, int n, const CandidateLaunch& launch,
                      std::vector<TuneJob>* jobs);

}  // namespace rvd::tune

#endif  // RVD_SELF_IMPROVE_SPACE_H_

// The data a tuning candidate's kernel receives besides MatrixDesc
// (kernels/cuda/descriptors.h): its jobs. Plain C++ with no includes beyond
// <cstdint> (NVRTC: its cuda/std form), so the host planner, nvcc and
// NVRTC all read it, as descriptors.h. The contract a candidate implements
// on these is in self_improve/generator.h.
#ifndef RVD_SELF_IMPROVE_CANDIDATE_ABI_H_
#define RVD_SELF_IMPROVE_CANDIDATE_ABI_H_

#ifdef __CUDACC_RTC__
#include <cuda/std/cstdint>
#else
#include <cstdint>
#endif

namespace rvd::tune {

// One job: the tile [row0, row0 + rows) x [col0, col0 + cols) of matrix
// `matrix`'s Gram, of which only the entries with col >= row count (the
// Gram is symmetric). rvd enumerates a matrix's jobs as the tiles of a
// uniform tile_rows x tile_cols grid that hold such an entry, row tile by
// row tile, in column order (EnumerateTuneJobs, space.h); edge tiles are
// cut to the Gram's side.
struct TuneJob {
  int32_t matrix;
  int32_t row0;
  int32_t col0;
  int32_t rows;
  int32_t cols;
  int32_t diagonal;  // 1: the tile holds entries of G's diagonal (trace is its to sum)
};

}  // namespace rvd::tune

#endif  // RVD_SELF_IMPROVE_CANDIDATE_ABI_H_

// The verifier's CPU side (self_improve/, public): what a check's inputs
// are, how outputs are poisoned, and what the candidate's outputs say, as
// pure functions; the GPU side (next to the CUDA module) only uploads,
// launches and downloads. Rules, each against an exploit of the published
// loops:
//   - inputs drawn from the check's seed (TuneLoop::DeriveSeed of the job's
//     secret), fresh for every check: a candidate cannot know them;
//   - every input is a full batch of every target shape; the float64
//     reference is computed for a drawn subset of its matrices (secret:
//     partial work is caught with the subset's probability per input, and
//     20 inputs make missing it negligible) and for every special one;
//   - each input holds special matrices, rotating over the kinds so that a
//     check of >= 6 inputs has all: zeros, a NaN, an Inf, and huge, tiny and
//     subnormal magnitudes (where the f32 trust rule must fire);
//   - outputs poisoned before each run with a NaN whose payload names the
//     run, so a slot left from another run or buffer is told from one
//     written (and a NaN the kernel writes has the canonical payload);
//   - two runs on the same inputs must give the same bits.
//
// Thread-safe: pure functions.
#ifndef RVD_SELF_IMPROVE_VERIFICATION_H_
#define RVD_SELF_IMPROVE_VERIFICATION_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "kernels/engine.h"
#include "self_improve/acceptance.h"
#include "self_improve/candidate_abi.h"
#include "self_improve/generator.h"
#include "self_improve/reference.h"

namespace rvd::tune {

// What one matrix of an input is.
enum class MatrixKind {
  kFlat,       // singular values equal
  kPowerLaw,   // s_i = i^-0.7
  kRankOne,    // u v^T
  kSpiked,     // one singular value 100x the flat rest
  kGaussian,   // i.i.d. N(0, 1) entries
  kZeros,      // all zero: PR 0
  kNaN,        // one NaN at (bad_row, bad_col): must be reported
  kInf,        // one +-Inf there: must be reported
  kHuge,       // entries of 1e19: f32 squares overflow (the trust rule fires)
  kTiny,       // entries of 1e-20: f32 products underflow (the trust rule fires)
  kSubnormal,  // entries below f32's normal range (bf16/f32: 1e-39)
};
const char* MatrixKindName(MatrixKind k);
inline constexpr int kSpecialKinds = 6;  // kZeros .. kSubnormal

struct MatrixPlan {
  int rows = 0, cols = 0;
  MatrixKind kind = MatrixKind::kGaussian;
  uint64_t seed = 0;        // the matrix's own draw
  int bad_row = 0, bad_col = 0;  // kNaN, kInf: where
  bool checked = false;     // its reference is computed (always for special kinds)
};

// One input: the target's shapes in order, each `count` matrices.
struct InputPlan {
  std::vector<MatrixPlan> matrices;
};

// `inputs` inputs for `target` from `seed`; `checked_per_shape` matrices of
// each shape (besides the special ones) get a reference.
std::vector<InputPlan> PlanInputs(const TuneTarget& target, uint64_t seed, int inputs,
                                  int checked_per_shape = 4);

// The bits of run `run`'s poison: a quiet NaN with payload 0x5eed0000 + run
// (double) and 0x5e0000 + run (float), never what arithmetic produces.
uint64_t PoisonBits64(int run);
uint32_t PoisonBits32(int run);
bool IsPoison(double v, int run);
bool IsPoison(float v, int run);

// One run's outputs, per job.
struct RunOutputs {
  std::vector<double> g2;
  std::vector<double> trace;
  std::vector<float> maxabs;
};

// What the reference says for one checked matrix of an input.
struct MatrixReference {
  int matrix = 0;              // index in the input's batch
  std::vector<int> jobs;       // its jobs' indices in the launch
  std::vector<JobSums> sums;   // their float64 sums, in the same order
  double pr = 0;               // the SVD oracle's PR (NaN: non-finite input)
  MatrixKind kind = MatrixKind::kGaussian;
  // The engine's f32 trust rule (finalize.cuh) rejects this matrix's
  // magnitudes: the engine recomputes it with the oracle, so its sums need
  // not match; its maxabs must (the rule reads it).
  bool untrusted = false;
};

// The evidence of one input's two runs (the candidate's outputs of the same
// launch twice), against `refs` (its checked matrices). `inputs_unchanged`:
// the inputs equal their private copy after both runs. Adds into `e`.
void Evaluate(absl::Span<const MatrixReference> refs, const RunOutputs& first,
              const RunOutputs& second, int first_run, int second_run, bool inputs_unchanged,
              const Tolerance& tolerance, CorrectnessEvidence* e);

// The finalize's trust rule on a matrix's largest magnitude and long side
// (finalize.cuh: max^2 >= 1e-30 and k max^2 <= 1e36).
bool TrustedMagnitude(double maxabs, int64_t k);

}  // namespace rvd::tune

#endif  // RVD_SELF_IMPROVE_VERIFICATION_H_

// The exact sums of a matrix whose rows are split across ranks (issue 18:
// tensor parallelism splits V by heads, FSDP2 splits every parameter along
// its first dimension), so that rvd instances that each hold one shard
// produce the PR one rvd would compute on the whole matrix.
//
// W = [W_0; W_1; ...; W_{p-1}], W_i of r_i rows and D columns:
//   t = ||W||_F^2     = sum_i ||W_i||_F^2                      (local)
//   g = ||W W^T||_F^2 = sum_i sum_j ||W_i W_j^T||_F^2
//                     = sum_i ||W_i W_i^T||_F^2 + 2 sum_{i<j} ||W_i W_j^T||_F^2
// and PR(W) = t^2 / g. The cross blocks need two ranks' rows in one place:
// PairsOfRank spreads the p(p-1)/2 of them evenly, each computed once, so
// that every rank receives at most ceil((p-1)/2) peer shards and the group
// reduces two scalars (SumPartials). Whether a pair's product is done by
// the host (ShardPartial, float64: the reference) or a device is the
// caller's; the plan and the reduction are the same.
#ifndef RVD_KERNELS_SHARDED_GRAM_H_
#define RVD_KERNELS_SHARDED_GRAM_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/engine.h"

namespace rvd {

// The blocks (a, b), a <= b, whose ||W_a W_b^T||_F^2 rank `rank` of
// `world` computes: its own diagonal (rank, rank) and the cross blocks
// (rank, (rank + k) mod world) for k = 1 .. floor((world - 1) / 2), plus,
// when world is even, k = world / 2 for the lower half of the ranks (the
// pair opposite it would otherwise be counted twice). Over all ranks every
// unordered pair appears exactly once; a rank needs the shards of the
// peers its pairs name (PeersOfRank). Pairs are returned with a < b
// normalized (a == b for the diagonal).
std::vector<std::pair<int, int>> PairsOfRank(int rank, int world);
// The peers whose shard `rank` needs for its cross blocks, in pair order.
std::vector<int> PeersOfRank(int rank, int world);

// A rank's share of the sums: t of its own shard, and the weighted
// ||W_a W_b^T||_F^2 of its pairs (weight 1 for the diagonal, 2 for a
// cross block). The group's t and g are the sums over ranks.
struct GramPartial {
  double trace = 0;    // ||W_rank||_F^2
  double gram_sq = 0;  // sum over PairsOfRank of weight * ||W_a W_b^T||_F^2
};

// ||A B^T||_F^2 in float64 (A: ra x D, B: rb x D, the same D and dtype),
// host views; the reference the device path is checked against.
absl::StatusOr<double> CrossGramSq(const MatrixView& a, const MatrixView& b);

// Rank `rank`'s GramPartial, computed on the host from its own shard and
// the peer shards it received: `shards[i]` is rank i's shard for i == rank
// and every peer of PeersOfRank(rank, world); the others are not read (may
// be empty views). Every view must have the same cols and dtype.
absl::StatusOr<GramPartial> ShardPartial(int rank, int world,
                                         absl::Span<const MatrixView> shards);

// The group's PR from every rank's partial (0 for a matrix of zeros, as the
// engines answer). INVALID_ARGUMENT for no partials or a negative sum.
absl::StatusOr<double> PRFromPartials(absl::Span<const GramPartial> partials);

}  // namespace rvd

#endif  // RVD_KERNELS_SHARDED_GRAM_H_

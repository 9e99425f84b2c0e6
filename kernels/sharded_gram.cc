#include "kernels/sharded_gram.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "kernels/dtype_convert.h"

namespace rvd {
namespace {

absl::Status CheckWorld(int rank, int world) {
  if (world < 1 || rank < 0 || rank >= world) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " of a group of ", world, " ranks"));
  }
  return absl::OkStatus();
}

// Row i of a host view as doubles (every dtype converts to f32 exactly).
void LoadRow(const MatrixView& m, int64_t i, std::vector<double>& row) {
  std::vector<float> f(static_cast<size_t>(m.cols));
  const auto* base = static_cast<const uint8_t*>(m.data) +
                     static_cast<size_t>(i * m.ld) * DTypeSize(m.dtype);
  ConvertRowToFloat(base, m.dtype, m.cols, f.data());
  row.assign(f.begin(), f.end());
}

}  // namespace

std::vector<std::pair<int, int>> PairsOfRank(int rank, int world) {
  std::vector<std::pair<int, int>> pairs;
  if (!CheckWorld(rank, world).ok()) return pairs;
  pairs.emplace_back(rank, rank);
  const int half = (world - 1) / 2;
  for (int k = 1; k <= half; ++k) {
    const int peer = (rank + k) % world;
    pairs.emplace_back(std::min(rank, peer), std::max(rank, peer));
  }
  // Even world: rank r and r + world/2 are opposite; the lower one takes it.
  if (world % 2 == 0 && world > 1 && rank < world / 2) {
    pairs.emplace_back(rank, rank + world / 2);
  }
  return pairs;
}

std::vector<int> PeersOfRank(int rank, int world) {
  std::vector<int> peers;
  for (const auto& [a, b] : PairsOfRank(rank, world)) {
    if (a != b) peers.push_back(a == rank ? b : a);
  }
  return peers;
}

absl::StatusOr<double> CrossGramSq(const MatrixView& a, const MatrixView& b) {
  if (a.cols != b.cols || a.dtype != b.dtype) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shards disagree: ", a.cols, " columns of ", DTypeName(a.dtype), " against ", b.cols,
        " of ", DTypeName(b.dtype)));
  }
  if (a.block_rows != 0 || b.block_rows != 0 || a.ld < a.cols || b.ld < b.cols ||
      a.rows < 0 || b.rows < 0 || (a.data == nullptr && a.rows > 0) ||
      (b.data == nullptr && b.rows > 0)) {
    return absl::InvalidArgumentError("a shard is not a strided host view");
  }
  std::vector<std::vector<double>> brows(static_cast<size_t>(b.rows));
  for (int64_t j = 0; j < b.rows; ++j) LoadRow(b, j, brows[static_cast<size_t>(j)]);
  std::vector<double> arow;
  double sum = 0;
  for (int64_t i = 0; i < a.rows; ++i) {
    LoadRow(a, i, arow);
    for (const std::vector<double>& brow : brows) {
      double dot = 0;
      for (size_t k = 0; k < arow.size(); ++k) dot += arow[k] * brow[k];
      sum += dot * dot;
    }
  }
  return sum;
}

absl::StatusOr<GramPartial> ShardPartial(int rank, int world,
                                         absl::Span<const MatrixView> shards) {
  if (absl::Status s = CheckWorld(rank, world); !s.ok()) return s;
  if (shards.size() != static_cast<size_t>(world)) {
    return absl::InvalidArgumentError(
        absl::StrCat(shards.size(), " shard slots for a group of ", world));
  }
  GramPartial partial;
  const MatrixView& own = shards[static_cast<size_t>(rank)];
  std::vector<double> row;
  for (int64_t i = 0; i < own.rows; ++i) {
    LoadRow(own, i, row);
    for (double x : row) partial.trace += x * x;
  }
  for (const auto& [a, b] : PairsOfRank(rank, world)) {
    absl::StatusOr<double> sq =
        CrossGramSq(shards[static_cast<size_t>(a)], shards[static_cast<size_t>(b)]);
    if (!sq.ok()) return sq.status();
    partial.gram_sq += (a == b ? 1.0 : 2.0) * *sq;
  }
  return partial;
}

absl::StatusOr<double> PRFromPartials(absl::Span<const GramPartial> partials) {
  if (partials.empty()) return absl::InvalidArgumentError("no partial sums");
  double t = 0, g = 0;
  for (const GramPartial& p : partials) {
    if (!(p.trace >= 0) || !(p.gram_sq >= 0)) {
      return absl::InvalidArgumentError("a partial sum is negative or NaN");
    }
    t += p.trace;
    g += p.gram_sq;
  }
  if (g == 0) return 0.0;  // all zeros: no spectrum
  return t * t / g;
}

}  // namespace rvd

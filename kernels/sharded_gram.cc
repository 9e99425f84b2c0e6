#include "kernels/sharded_gram.h"

#include <algorithm>
#include <map>

#include <cblas.h>

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

absl::Status CheckHostView(const MatrixView& m) {
  if (m.block_rows != 0 || m.ld < m.cols || m.rows < 0 || (m.data == nullptr && m.rows > 0)) {
    return absl::InvalidArgumentError("a shard is not a strided host view");
  }
  return absl::OkStatus();
}

// A host view's rows as a dense row-major float64 matrix: every dtype
// converts to f32 exactly, and f32 to float64.
std::vector<double> ToDouble(const MatrixView& m) {
  std::vector<double> out(static_cast<size_t>(m.rows * m.cols));
  std::vector<float> f(static_cast<size_t>(m.cols));
  for (int64_t i = 0; i < m.rows; ++i) {
    const auto* row = static_cast<const uint8_t*>(m.data) +
                      static_cast<size_t>(i * m.ld) * DTypeSize(m.dtype);
    ConvertRowToFloat(row, m.dtype, m.cols, f.data());
    std::copy(f.begin(), f.end(), out.begin() + i * m.cols);
  }
  return out;
}

// ||A B^T||_F^2 of dense row-major float64 A (ra x cols) and B (rb x cols):
// A B^T is formed a band of A's rows at a time by dgemm (at most
// kBandDoubles of it held), and each band's squares summed.
double ProductFrobeniusSq(const std::vector<double>& a, int64_t ra,
                          const std::vector<double>& b, int64_t rb, int64_t cols) {
  constexpr int64_t kBandDoubles = int64_t{1} << 20;  // 8 MiB
  if (ra == 0 || rb == 0 || cols == 0) return 0;
  const int64_t band = std::max<int64_t>(1, std::min(ra, kBandDoubles / rb));
  std::vector<double> c(static_cast<size_t>(band * rb));
  double sum = 0;
  for (int64_t i = 0; i < ra; i += band) {
    const int64_t m = std::min(band, ra - i);
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(m),
                static_cast<int>(rb), static_cast<int>(cols), 1.0, a.data() + i * cols,
                static_cast<int>(cols), b.data(), static_cast<int>(cols), 0.0, c.data(),
                static_cast<int>(rb));
    for (int64_t k = 0; k < m * rb; ++k) sum += c[static_cast<size_t>(k)] * c[static_cast<size_t>(k)];
  }
  return sum;
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
  if (absl::Status s = CheckHostView(a); !s.ok()) return s;
  if (absl::Status s = CheckHostView(b); !s.ok()) return s;
  return ProductFrobeniusSq(ToDouble(a), a.rows, ToDouble(b), b.rows, a.cols);
}

absl::StatusOr<GramPartial> ShardPartial(int rank, int world,
                                         absl::Span<const MatrixView> shards) {
  if (absl::Status s = CheckWorld(rank, world); !s.ok()) return s;
  if (shards.size() != static_cast<size_t>(world)) {
    return absl::InvalidArgumentError(
        absl::StrCat(shards.size(), " shard slots for a group of ", world));
  }
  // Each shard a pair names, validated and converted to float64 once.
  std::map<int, std::vector<double>> dense;
  for (const auto& [a, b] : PairsOfRank(rank, world)) {
    for (int r : {a, b}) {
      const MatrixView& v = shards[static_cast<size_t>(r)];
      if (dense.count(r) != 0) continue;
      if (v.cols != shards[static_cast<size_t>(rank)].cols ||
          v.dtype != shards[static_cast<size_t>(rank)].dtype) {
        return absl::InvalidArgumentError(absl::StrCat(
            "shards disagree: rank ", r, "'s ", v.cols, " columns of ", DTypeName(v.dtype),
            " against ", shards[static_cast<size_t>(rank)].cols, " of ",
            DTypeName(shards[static_cast<size_t>(rank)].dtype)));
      }
      if (absl::Status s = CheckHostView(v); !s.ok()) return s;
      dense[r] = ToDouble(v);
    }
  }
  GramPartial partial;
  for (double x : dense[rank]) partial.trace += x * x;
  const int64_t cols = shards[static_cast<size_t>(rank)].cols;
  for (const auto& [a, b] : PairsOfRank(rank, world)) {
    const double sq = ProductFrobeniusSq(dense[a], shards[static_cast<size_t>(a)].rows, dense[b],
                                         shards[static_cast<size_t>(b)].rows, cols);
    partial.gram_sq += (a == b ? 1.0 : 2.0) * sq;
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

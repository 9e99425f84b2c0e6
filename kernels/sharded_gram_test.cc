// The sharded sums against the float64 SVD of the whole matrix: every row
// split of varied spectra, shapes, dtypes and group sizes (seed printed by
// test_matrices; RVD_TEST_SEED replays).
#include "kernels/sharded_gram.h"

#include <map>
#include <set>

#include "gtest/gtest.h"
#include "kernels/pr_check.h"
#include "kernels/test_matrices.h"

namespace rvd {
namespace {

TEST(PairsOfRankTest, EveryPairOnceAndBalanced) {
  for (int world = 1; world <= 9; ++world) {
    std::map<std::pair<int, int>, int> seen;
    size_t most = 0;
    for (int r = 0; r < world; ++r) {
      const auto pairs = PairsOfRank(r, world);
      ASSERT_FALSE(pairs.empty());
      EXPECT_EQ(pairs[0], std::make_pair(r, r));
      for (const auto& p : pairs) ++seen[p];
      most = std::max(most, PeersOfRank(r, world).size());
    }
    EXPECT_EQ(seen.size(), static_cast<size_t>(world * (world + 1) / 2)) << world;
    for (const auto& [p, n] : seen) EXPECT_EQ(n, 1) << world << ": " << p.first << "," << p.second;
    EXPECT_LE(most, static_cast<size_t>(world / 2)) << world;  // ceil((p-1)/2)
  }
  EXPECT_TRUE(PairsOfRank(3, 3).empty());
  EXPECT_TRUE(PairsOfRank(-1, 2).empty());
}

// Splits rows into `world` contiguous shards at random cut points (some
// shards may be empty, as a rank holding no row of a layer).
std::vector<MatrixView> Split(const MatrixView& m, int world, std::mt19937_64& rng) {
  std::vector<int64_t> cuts = {0, m.rows};
  std::uniform_int_distribution<int64_t> at(0, m.rows);
  for (int i = 1; i < world; ++i) cuts.push_back(at(rng));
  std::sort(cuts.begin(), cuts.end());
  std::vector<MatrixView> shards;
  for (int i = 0; i < world; ++i) {
    MatrixView s = m;
    s.data = static_cast<const uint8_t*>(m.data) +
             static_cast<size_t>(cuts[i] * m.ld) * DTypeSize(m.dtype);
    s.rows = cuts[i + 1] - cuts[i];
    shards.push_back(s);
  }
  return shards;
}

TEST(ShardedGramTest, MatchesTheOracleOfTheWholeMatrix) {
  std::mt19937_64 rng = SeededRng("ShardedGramTest.MatchesTheOracleOfTheWholeMatrix");
  struct Shape { int64_t rows, cols; };
  // 2600 rows: A B^T is formed in several bands of rows (over 2^20 entries).
  const Shape shapes[] = {{64, 96}, {96, 48}, {33, 70}, {128, 128}, {2600, 24}};
  const DType dtypes[] = {DType::kF32, DType::kBF16, DType::kF16};
  int checked = 0;
  for (const Shape& shape : shapes) {
    for (Spectrum spec : kAllSpectra) {
      const DType dtype = dtypes[checked % 3];
      const std::vector<double> w = MakeMatrix(rng, shape.rows, shape.cols, spec, 1.0);
      const StoredMatrix m = Store(w, shape.rows, shape.cols, dtype, 3, "sharded");
      absl::StatusOr<double> ref = OraclePR(m.view);
      ASSERT_TRUE(ref.ok()) << ref.status();
      for (int world : {1, 2, 3, 4, 7}) {
        const std::vector<MatrixView> shards = Split(m.view, world, rng);
        std::vector<GramPartial> partials;
        for (int r = 0; r < world; ++r) {
          // A rank sees only its own shard and its peers'.
          std::vector<MatrixView> visible(static_cast<size_t>(world));
          visible[static_cast<size_t>(r)] = shards[static_cast<size_t>(r)];
          for (int p : PeersOfRank(r, world)) visible[static_cast<size_t>(p)] = shards[static_cast<size_t>(p)];
          absl::StatusOr<GramPartial> part = ShardPartial(r, world, visible);
          ASSERT_TRUE(part.ok()) << part.status();
          partials.push_back(*part);
        }
        absl::StatusOr<double> pr = PRFromPartials(partials);
        ASSERT_TRUE(pr.ok()) << pr.status();
        EXPECT_TRUE(WithinTolerance(*pr, *ref, kExactPrTolerance))
            << m.label << " " << SpectrumName(spec) << " " << DTypeName(dtype) << " world "
            << world << ": " << *pr << " vs oracle " << *ref;
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, 5 * 5 * 5);
}

TEST(ShardedGramTest, RefusesBadInput) {
  std::vector<float> a(4 * 8, 1.0f), b(4 * 6, 1.0f);
  const MatrixView va{a.data(), 4, 8, 8, DType::kF32};
  const MatrixView vb{b.data(), 4, 6, 6, DType::kF32};
  EXPECT_EQ(CrossGramSq(va, vb).status().code(), absl::StatusCode::kInvalidArgument);
  const MatrixView shards[] = {va};
  EXPECT_EQ(ShardPartial(0, 2, shards).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ShardPartial(1, 1, shards).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PRFromPartials({}).status().code(), absl::StatusCode::kInvalidArgument);
  const GramPartial zero[] = {GramPartial{}, GramPartial{}};
  EXPECT_EQ(*PRFromPartials(zero), 0.0);
  // ||A A^T||^2 of a 4 x 8 matrix of ones: 16 entries of 8^2.
  EXPECT_EQ(*CrossGramSq(va, va), 16.0 * 64.0);
}

}  // namespace
}  // namespace rvd

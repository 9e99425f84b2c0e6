// RankPartials and CombineReports, the host path of a group measurement
// without gRPC: every rank's partials from its rows and the peer rows its
// pairs need, combined, equal the float64 oracle of the whole matrices; a
// peer's rows that came short, shifted or not at all, and shards that do
// not cover a layer exactly once, fail the step naming the layer and rank.
#include "server/shard_group.h"

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/sharded_gram.h"

namespace rvd {
namespace {

using rvd::v1::LayerPartial;
using rvd::v1::ReportPartialRequest;
using rvd::v1::ShardData;

constexpr int kLayers = 2;
constexpr int64_t kRows = 24;  // 4 heads of 6 rows
constexpr int64_t kCols = 16;
constexpr uint32_t kHeadDim = 6;

// Row-major kRows x kCols f32, columns scaled so the spectrum decays.
std::vector<float> Matrix(std::mt19937& gen, double decay) {
  std::normal_distribution<float> n;
  std::vector<float> m(static_cast<size_t>(kRows * kCols));
  for (int64_t i = 0; i < kRows; ++i) {
    for (int64_t j = 0; j < kCols; ++j) {
      m[static_cast<size_t>(i * kCols + j)] =
          n(gen) * static_cast<float>(std::pow(static_cast<double>(j + 1), -decay));
    }
  }
  return m;
}

// PR = ||W||_F^4 / ||W W^T||_F^2 of rows [lo, hi), in float64.
double OraclePR(const std::vector<float>& m, int64_t lo, int64_t hi) {
  double t = 0, g = 0;
  for (int64_t i = lo; i < hi; ++i) {
    for (int64_t k = lo; k < hi; ++k) {
      double dot = 0;
      for (int64_t j = 0; j < kCols; ++j) {
        dot += static_cast<double>(m[static_cast<size_t>(i * kCols + j)]) *
               m[static_cast<size_t>(k * kCols + j)];
      }
      if (i == k) t += dot;
      g += dot * dot;
    }
  }
  return t * t / g;
}

ShardData Shard(const std::vector<float>& m, uint32_t layer, int64_t first, int64_t rows) {
  ShardData s;
  s.mutable_rows()->set_layer(layer);
  s.mutable_rows()->set_first_row(first);
  s.mutable_rows()->set_total_rows(kRows);
  s.set_dtype(rvd::v1::DTYPE_F32);
  s.set_num_rows(rows);
  s.set_cols(kCols);
  s.set_head_dim(kHeadDim);
  s.set_data(std::string(reinterpret_cast<const char*>(m.data() + first * kCols),
                         static_cast<size_t>(rows * kCols) * sizeof(float)));
  return s;
}

class ShardGroupTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const uint32_t seed = 1800;
    std::printf("seed %u\n", seed);
    std::mt19937 gen(seed);
    for (int l = 0; l < kLayers; ++l) vs_.push_back(Matrix(gen, 0.3 + 0.4 * l));
  }

  // Every rank's own shards for `cuts` (rank r holds [cuts[r], cuts[r+1])
  // of every layer).
  std::vector<std::vector<ShardData>> Own(const std::vector<int64_t>& cuts) const {
    std::vector<std::vector<ShardData>> own(cuts.size() - 1);
    for (size_t r = 0; r + 1 < cuts.size(); ++r) {
      for (int l = 0; l < kLayers; ++l) {
        own[r].push_back(Shard(vs_[static_cast<size_t>(l)], static_cast<uint32_t>(l), cuts[r],
                               cuts[r + 1] - cuts[r]));
      }
    }
    return own;
  }

  // What rank `rank` receives: each peer of its pairs' own shards.
  static std::map<int, std::vector<ShardData>> Received(
      const std::vector<std::vector<ShardData>>& own, int rank) {
    std::map<int, std::vector<ShardData>> got;
    for (int q : PeersOfRank(rank, static_cast<int>(own.size()))) {
      got[q] = own[static_cast<size_t>(q)];
    }
    return got;
  }

  static ReportPartialRequest Report(int rank, int world, std::vector<LayerPartial> layers) {
    ReportPartialRequest r;
    r.set_group_id("g");
    r.set_world_size(static_cast<uint32_t>(world));
    r.set_rank(static_cast<uint32_t>(rank));
    r.set_incarnation(1);
    r.mutable_header()->set_model_id("sharded");
    r.mutable_header()->set_step(3);
    r.mutable_header()->set_per_head(true);
    r.mutable_header()->mutable_shard_group()->set_group_id("g");
    for (LayerPartial& p : layers) {
      p.set_tensor_name("layers." + std::to_string(p.rows().layer()) + ".v_proj");
      *r.add_layers() = std::move(p);
    }
    return r;
  }

  // Every rank's partials from `own` and what each received (`received`
  // defaults to Received), combined.
  absl::StatusOr<rvd::v1::Measurement> Combine(
      const std::vector<std::vector<ShardData>>& own,
      const std::map<int, std::map<int, std::vector<ShardData>>>& received = {}) const {
    const int world = static_cast<int>(own.size());
    std::map<int, ReportPartialRequest> reports;
    for (int r = 0; r < world; ++r) {
      auto it = received.find(r);
      absl::StatusOr<std::vector<LayerPartial>> p =
          RankPartials(r, world, own[static_cast<size_t>(r)],
                       it != received.end() ? it->second : Received(own, r));
      if (!p.ok()) return p.status();
      reports[r] = Report(r, world, *std::move(p));
    }
    return CombineReports(reports, *engine_);
  }

  std::vector<std::vector<float>> vs_;
  std::unique_ptr<Engine> engine_ = NewCpuEngine(1);
};

TEST_F(ShardGroupTest, PartialsCombineToTheOracle) {
  for (const std::vector<int64_t>& cuts :
       {std::vector<int64_t>{0, 11, kRows}, std::vector<int64_t>{0, 5, 13, kRows},
        std::vector<int64_t>{0, 6, 12, 18, kRows}}) {
    absl::StatusOr<rvd::v1::Measurement> m = Combine(Own(cuts));
    ASSERT_TRUE(m.ok()) << m.status();
    ASSERT_EQ(m->layers_size(), kLayers);
    for (const rvd::v1::LayerPR& x : m->layers()) {
      const std::vector<float>& v = vs_[x.layer()];
      const double want = OraclePR(v, 0, kRows);
      EXPECT_NEAR(x.pr(), want, 1e-12 * want) << "world " << cuts.size() - 1;
      ASSERT_EQ(x.head_pr_size(), kRows / kHeadDim);
      for (int h = 0; h < x.head_pr_size(); ++h) {
        const double head = OraclePR(v, h * kHeadDim, (h + 1) * kHeadDim);
        EXPECT_NEAR(x.head_pr(h), head, 1e-12 * head) << "layer " << x.layer() << " head " << h;
      }
    }
  }
}

// Rank 0 of 2 computes the cross block with rank 1 (PeersOfRank(0, 2)).
TEST_F(ShardGroupTest, APeersRowsThatCameShortFailNamingLayerAndRanks) {
  const std::vector<std::vector<ShardData>> own = Own({0, 11, kRows});
  std::map<int, std::vector<ShardData>> got = Received(own, 0);
  ShardData& s = got[1][1];  // rank 1's layer 1, its last row lost
  s.set_num_rows(s.num_rows() - 1);
  s.mutable_data()->resize(static_cast<size_t>(s.num_rows() * kCols) * sizeof(float));
  absl::StatusOr<rvd::v1::Measurement> m = Combine(own, {{0, got}});
  ASSERT_FALSE(m.ok()) << "PR " << m->layers(1).pr() << ", oracle " << OraclePR(vs_[1], 0, kRows);
  EXPECT_EQ(m.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(m.status().message().find("layer 1: rank 0 computed its cross block with rank 1 "
                                      "from rows [11, 23), but rank 1 holds [11, 24)"),
            std::string::npos)
      << m.status();
}

TEST_F(ShardGroupTest, APeersLayerThatNeverCameFails) {
  const std::vector<std::vector<ShardData>> own = Own({0, 5, 13, kRows});
  // Rank 1's pair is (1, 2): rank 2's rows of layer 0 are missing.
  std::map<int, std::vector<ShardData>> got = Received(own, 1);
  got[2].erase(got[2].begin());
  absl::StatusOr<rvd::v1::Measurement> m = Combine(own, {{1, got}});
  ASSERT_FALSE(m.ok()) << "PR " << m->layers(0).pr() << ", oracle " << OraclePR(vs_[0], 0, kRows);
  EXPECT_EQ(m.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(m.status().message().find("layer 0: rank 1 computed its cross block with rank 2 "
                                      "from rows [0, 0)"),
            std::string::npos)
      << m.status();
}

TEST_F(ShardGroupTest, APeersShiftedRowsFail) {
  const std::vector<std::vector<ShardData>> own = Own({0, 11, kRows});
  std::map<int, std::vector<ShardData>> got = Received(own, 0);
  // Rank 1's 13 rows of layer 0 as it holds them, said to start a row early.
  got[1][0].mutable_rows()->set_first_row(10);
  absl::StatusOr<rvd::v1::Measurement> m = Combine(own, {{0, got}});
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(m.status().message().find("layer 0: rank 0 computed its cross block with rank 1 "
                                      "from rows [10, 23)"),
            std::string::npos)
      << m.status();
}

TEST_F(ShardGroupTest, ShardsThatOverlapOrLeaveAGapFail) {
  // Rank 1 holds [10, 24) of layer 1 too: row 10 twice.
  std::vector<std::vector<ShardData>> own = Own({0, 11, kRows});
  own[1][1] = Shard(vs_[1], 1, 10, kRows - 10);
  absl::StatusOr<rvd::v1::Measurement> m = Combine(own);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(m.status().message().find("layer 1: the group's shards do not tile"),
            std::string::npos)
      << m.status();
  // Rank 1 holds [12, 24) of layer 0: row 11 by nobody.
  own = Own({0, 11, kRows});
  own[1][0] = Shard(vs_[0], 0, 12, kRows - 12);
  m = Combine(own);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("layer 0: the group's shards do not tile"),
            std::string::npos)
      << m.status();
  // Rank 1 holds [11, 23) of layer 0: the last row by nobody.
  own = Own({0, 11, kRows});
  own[1][0] = Shard(vs_[0], 0, 11, kRows - 12);
  m = Combine(own);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("layer 0: the group's shards cover rows [0, 23) of 24"),
            std::string::npos)
      << m.status();
}

TEST_F(ShardGroupTest, AReportMissingFails) {
  const std::vector<std::vector<ShardData>> own = Own({0, 5, 13, kRows});
  std::map<int, ReportPartialRequest> reports;
  for (int r = 0; r < 2; ++r) {  // rank 2's report left out
    absl::StatusOr<std::vector<LayerPartial>> p =
        RankPartials(r, 3, own[static_cast<size_t>(r)], Received(own, r));
    ASSERT_TRUE(p.ok()) << p.status();
    reports[r] = Report(r, 3, *std::move(p));
  }
  absl::StatusOr<rvd::v1::Measurement> m = CombineReports(reports, *engine_);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(m.status().message().find("2 reports (ranks 0 .. 1) for a group of 3 ranks"),
            std::string::npos)
      << m.status();
}

}  // namespace
}  // namespace rvd

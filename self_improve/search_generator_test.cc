#include "self_improve/search_generator.h"

#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "self_improve/space.h"

namespace rvd::tune {
namespace {

CandidateRequest StartRequest(DType dtype = DType::kBF16) {
  CandidateRequest r;
  r.target.dtype = dtype;
  r.target.shape_class = "triangle";
  r.target.arch = "sm_90a";
  r.iteration = 1;
  absl::StatusOr<Candidate> naive = Emit(NaivePoint(), dtype);
  r.best_source = naive->source;
  r.best_description = naive->description;
  return r;
}

TEST(SearchGeneratorTest, SameSeedSameSearchOtherSeedAnother) {
  // Ten iterations, each rejected, twice with seed 7 and once with seed 8.
  const auto run = [](uint64_t seed) {
    SearchGenerator gen(seed);
    CandidateRequest r = StartRequest();
    std::vector<std::string> keys;
    for (int it = 1; it <= 10; ++it) {
      r.iteration = it;
      absl::StatusOr<Candidate> c = gen.Generate(r);
      EXPECT_TRUE(c.ok()) << c.status();
      keys.push_back(KeyOfDescription(c->description));
      r.history.push_back({it, c->description, Verdict::kSlower, "slower", 1.0});
    }
    return keys;
  };
  const std::vector<std::string> a = run(7), b = run(7), c = run(8);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  // Never the same point twice.
  EXPECT_EQ(std::set<std::string>(a.begin(), a.end()).size(), a.size());
}

TEST(SearchGeneratorTest, StartsFromTheNaivePointsNeighbours) {
  SearchGenerator gen(1);
  const std::vector<SpacePoint> nb = gen.Neighbours(NaivePoint(), DType::kBF16);
  ASSERT_FALSE(nb.empty());
  std::set<std::string> keys;
  for (const SpacePoint& p : nb) keys.insert(PointKey(p));
  // The family switch to shared-memory tiles is one of them.
  bool tiled = false;
  for (const SpacePoint& p : nb) tiled |= p.family == Family::kTiledFma;
  EXPECT_TRUE(tiled);
  absl::StatusOr<Candidate> c = gen.Generate(StartRequest());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(keys.count(KeyOfDescription(c->description)), 1u) << c->description;
  EXPECT_NE(c->description.find("a neighbour of naive:"), std::string::npos);
}

TEST(SearchGeneratorTest, BottleneckWeighsTheKnobs) {
  // Memory-bandwidth-bound at a tiled point: vector width and stages moves
  // are drawn 4x as often as the others.
  const SpacePoint from{Family::kTiledFma, 64, 8, 1, 1, 2, 32, MmaPath::kFma};
  int favoured = 0, draws = 0;
  for (uint64_t seed = 0; seed < 400; ++seed) {
    SearchGenerator gen(seed);
    CandidateRequest r = StartRequest();
    r.best_description = PointKey(from) + ": start";
    r.bottleneck.bottleneck = Bottleneck::kMemoryBandwidth;
    absl::StatusOr<Candidate> c = gen.Generate(r);
    ASSERT_TRUE(c.ok());
    absl::StatusOr<SpacePoint> p = ParsePointKey(KeyOfDescription(c->description));
    ASSERT_TRUE(p.ok());
    ++draws;
    favoured += p->vector_width != from.vector_width || p->stages != from.stages;
  }
  const std::vector<SpacePoint> nb = SearchGenerator(0).Neighbours(from, DType::kBF16);
  int fav_moves = 0;
  for (const SpacePoint& p : nb) {
    fav_moves += p.vector_width != from.vector_width || p.stages != from.stages;
  }
  const double expected = 4.0 * fav_moves / (4.0 * fav_moves + (nb.size() - fav_moves));
  EXPECT_NEAR(static_cast<double>(favoured) / draws, expected, 0.08)
      << fav_moves << " favoured moves of " << nb.size();
}

TEST(SearchGeneratorTest, ACompileRetrySkipsTheFailedPoint) {
  SearchGenerator gen(3);
  CandidateRequest r = StartRequest();
  absl::StatusOr<Candidate> first = gen.Generate(r);
  ASSERT_TRUE(first.ok());
  r.attempt = 1;
  r.failed_source = first->source;
  r.compile_log = "error: something";
  absl::StatusOr<Candidate> retry = gen.Generate(r);
  ASSERT_TRUE(retry.ok());
  EXPECT_NE(KeyOfDescription(retry->description), KeyOfDescription(first->description));
}

TEST(SearchGeneratorTest, ExhaustsTheSpaceThenSaysSo) {
  // A small space: naive only, 2 tiles x 2 warps = 4 points.
  SearchSpace small = DefaultSpace();
  small.families = {Family::kNaive};
  small.tiles = {0, 32};
  small.warps = {4, 8};
  SearchGenerator gen(5, small);
  CandidateRequest r = StartRequest();
  std::set<std::string> seen = {KeyOfDescription(r.best_description)};
  for (int it = 1; it <= 3; ++it) {
    r.iteration = it;
    absl::StatusOr<Candidate> c = gen.Generate(r);
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_TRUE(seen.insert(KeyOfDescription(c->description)).second);
    r.history.push_back({it, c->description, Verdict::kIncorrect, "", 0});
  }
  r.iteration = 4;
  absl::StatusOr<Candidate> none = gen.Generate(r);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kOutOfRange) << none.status();
}

TEST(SearchGeneratorTest, FromAStartOutsideTheSpaceDrawsAnyPoint) {
  SearchGenerator gen(9);
  CandidateRequest r = StartRequest();
  r.best_description = "the product kernel (fused v4 triangle)";
  absl::StatusOr<Candidate> c = gen.Generate(r);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(KeyOfDescription(c->description).empty());
  EXPECT_NE(c->description.find("a random point"), std::string::npos);
}

TEST(SearchGeneratorTest, CancelledIsCancelled) {
  SearchGenerator gen(1);
  std::atomic<bool> cancelled{true};
  CandidateRequest r = StartRequest();
  r.cancelled = &cancelled;
  EXPECT_EQ(gen.Generate(r).status().code(), absl::StatusCode::kCancelled);
}

}  // namespace
}  // namespace rvd::tune

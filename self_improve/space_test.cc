#include "self_improve/space.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/engine.h"
#include "kernels/test_matrices.h"
#include "self_improve/reference.h"

namespace rvd::tune {
namespace {

constexpr DType kDtypes[] = {DType::kF32, DType::kF16, DType::kBF16};

TEST(SpaceTest, EveryPointIsValidDistinctAndRoundTrips) {
  for (DType dtype : kDtypes) {
    const std::vector<SpacePoint> points = Points(DefaultSpace(), dtype);
    ASSERT_GT(points.size(), 50u) << DTypeName(dtype);
    std::set<std::string> keys;
    for (const SpacePoint& p : points) {
      std::string why;
      EXPECT_TRUE(Valid(p, dtype, &why)) << PointKey(p) << ": " << why;
      EXPECT_TRUE(keys.insert(PointKey(p)).second) << "repeated " << PointKey(p);
      absl::StatusOr<SpacePoint> back = ParsePointKey(PointKey(p));
      ASSERT_TRUE(back.ok()) << back.status();
      EXPECT_EQ(*back, p);
    }
    // The same list every time (a search's seed replays it).
    EXPECT_EQ(Points(DefaultSpace(), dtype), points);
  }
}

TEST(SpaceTest, StartsAtTheNaivePoint) {
  const SpacePoint naive = NaivePoint();
  EXPECT_EQ(naive.family, Family::kNaive);
  EXPECT_EQ(naive.tile, 0);  // one block per matrix
  EXPECT_EQ(naive.mma, MmaPath::kFma);
  for (DType dtype : kDtypes) {
    const std::vector<SpacePoint> points = Points(DefaultSpace(), dtype);
    EXPECT_NE(std::find(points.begin(), points.end(), naive), points.end());
  }
}

TEST(SpaceTest, ValidRefusesWhatNoTemplateRuns) {
  SpacePoint p{Family::kTiledFma, 64, 8, 2, 1, 4, 32, MmaPath::kFma};
  std::string why;
  ASSERT_TRUE(Valid(p, DType::kBF16, &why)) << why;
  SpacePoint q = p;
  q.vector_width = 8;  // 32 bytes of f32
  EXPECT_FALSE(Valid(q, DType::kF32, &why));
  EXPECT_NE(why.find("16 bytes"), std::string::npos) << why;
  EXPECT_TRUE(Valid(q, DType::kBF16));
  q = p;
  q.tile = 0;
  EXPECT_FALSE(Valid(q, DType::kBF16, &why));
  q = p;
  q.warps = 2;  // 4 x 4 thread grid on 64 x 64: 16 x 4 = 64 accumulators
  EXPECT_TRUE(Valid(q, DType::kBF16, &why)) << why;
  q.tile = 128;  // 256 accumulators
  EXPECT_FALSE(Valid(q, DType::kBF16, &why));
  EXPECT_NE(why.find("accumulators"), std::string::npos) << why;
  q = p;
  q.tile = 128;
  q.k_slice = 64;
  q.split_k = 2;
  q.warps = 16;  // 64 accumulators; 2 x 2 x 2 x 64 x 129 x 4 + 128^2 x 8 bytes
  EXPECT_FALSE(Valid(q, DType::kBF16, &why));
  EXPECT_NE(why.find("shared memory"), std::string::npos) << why;
  SpacePoint n = NaivePoint();
  n.stages = 2;
  EXPECT_FALSE(Valid(n, DType::kBF16));
}

TEST(SpaceTest, ParsePointKeyRefusesOthers) {
  for (const char* bad : {"", "naive", "wgmma:fma:t0:w4:s1:k1:v1:ks0",
                          "naive:fma:t0:w4:s1:k1:v1", "naive:fma:t0:w4:s1:k1:v1:ksX",
                          "naive:mma:t0:w4:s1:k1:v1:ks0"}) {
    EXPECT_FALSE(ParsePointKey(bad).ok()) << bad;
  }
  EXPECT_EQ(KeyOfDescription("naive:fma:t0:w4:s1:k1:v1:ks0: one block per matrix"),
            "naive:fma:t0:w4:s1:k1:v1:ks0");
  EXPECT_EQ(KeyOfDescription("an LLM's kernel: float4 loads"), "");
}

TEST(SpaceTest, EmitDeclaresTheLaunchAndTheEntry) {
  for (DType dtype : kDtypes) {
    for (const SpacePoint& p : Points(DefaultSpace(), dtype)) {
      absl::StatusOr<Candidate> c = Emit(p, dtype);
      ASSERT_TRUE(c.ok()) << c.status();
      absl::StatusOr<CandidateLaunch> launch = ParseLaunchAnnotation(c->source);
      ASSERT_TRUE(launch.ok()) << launch.status() << " in " << PointKey(p);
      EXPECT_EQ(*launch, LaunchOf(p, dtype));
      EXPECT_NE(c->source.find("rvd_tune_candidate(const rvd::cuda::MatrixDesc* mats, "
                               "const rvd::tune::TuneJob* jobs,\n                   int "
                               "num_jobs, double* g2, double* trace, float* maxabs)"),
                std::string::npos);
      EXPECT_EQ(KeyOfDescription(c->description), PointKey(p));
      // Device code only: no host header, no launch of its own.
      EXPECT_EQ(c->source.find("cuda_runtime"), std::string::npos);
      EXPECT_EQ(c->source.find("<<<"), std::string::npos);
    }
  }
  SpacePoint bad = NaivePoint();
  bad.split_k = 2;
  EXPECT_EQ(Emit(bad, DType::kBF16).status().code(), absl::StatusCode::kInvalidArgument);
}

// Every Gram entry on or above the diagonal is in exactly one job, and a
// job is diagonal exactly when it holds diagonal entries.
TEST(SpaceTest, JobsCoverTheUpperTriangleOnce) {
  for (int n : {1, 15, 16, 17, 64, 100, 128, 129, 300}) {
    for (int tile : {0, 16, 32, 64, 128}) {
      std::vector<TuneJob> jobs;
      const int added = EnumerateTuneJobs(3, n, CandidateLaunch{128, 0, tile, tile}, &jobs);
      ASSERT_EQ(added, static_cast<int>(jobs.size()));
      std::vector<int> hits(static_cast<size_t>(n) * n, 0);
      for (const TuneJob& j : jobs) {
        EXPECT_EQ(j.matrix, 3);
        bool holds_diagonal = false, holds_upper = false;
        for (int r = j.row0; r < j.row0 + j.rows; ++r)
          for (int c = j.col0; c < j.col0 + j.cols; ++c) {
            ASSERT_LT(r, n);
            ASSERT_LT(c, n);
            if (c >= r) {
              ++hits[r * n + c];
              holds_upper = true;
            }
            holds_diagonal |= c == r;
          }
        EXPECT_TRUE(holds_upper);
        EXPECT_EQ(j.diagonal != 0, holds_diagonal) << "n " << n << " tile " << tile;
      }
      for (int r = 0; r < n; ++r)
        for (int c = r; c < n; ++c) ASSERT_EQ(hits[r * n + c], 1) << r << "," << c;
      if (tile == 0) {
        EXPECT_EQ(jobs.size(), 1u);
      }
    }
  }
  std::vector<TuneJob> none;
  EXPECT_EQ(EnumerateTuneJobs(0, 0, CandidateLaunch{}, &none), 0);
}

// The host reference of the per-job contract: a matrix's jobs add up to
// ||G||_F^2 and ||W||_F^2, whatever the tiling, so PR from them is the SVD
// oracle's; wide and tall alike.
TEST(ReferenceTest, JobSumsGiveTheOraclesPr) {
  std::mt19937_64 rng = SeededRng("ReferenceTest.JobSumsGiveTheOraclesPr");
  struct Shape {
    int rows, cols;
  } shapes[] = {{48, 200}, {200, 48}, {33, 33}};
  for (const Shape& s : shapes) {
    for (Spectrum spec : {Spectrum::kPowerLaw, Spectrum::kRankOne, Spectrum::kGaussian}) {
      for (DType dtype : kDtypes) {
        StoredMatrix m = Store(MakeMatrix(rng, s.rows, s.cols, spec), s.rows, s.cols, dtype, 3,
                               "ref");
        absl::StatusOr<double> oracle = OraclePR(m.view);
        ASSERT_TRUE(oracle.ok()) << oracle.status();
        const int n = std::min(s.rows, s.cols);
        for (int tile : {0, 16, 32}) {
          std::vector<TuneJob> jobs;
          EnumerateTuneJobs(0, n, CandidateLaunch{128, 0, tile, tile}, &jobs);
          std::vector<JobSums> sums;
          for (const TuneJob& j : jobs) sums.push_back(ReferenceJobSums(m.view, j));
          const double pr = PrFromJobSums(sums);
          EXPECT_NEAR(pr, *oracle, 1e-9 * *oracle)
              << s.rows << "x" << s.cols << " " << SpectrumName(spec) << " "
              << DTypeName(dtype) << " tile " << tile;
        }
      }
    }
  }
}

// The per-job contract summed sequentially from the stored values, one
// Gram entry at a time: the check of the BLAS reference.
JobSums ScalarJobSums(const StoredMatrix& m, const TuneJob& job) {
  const std::vector<double> w = StoredValues(m);
  const int64_t rows = m.view.rows, cols = m.view.cols;
  const bool tall = rows > cols;
  const int64_t k = tall ? rows : cols;
  const auto op = [&](int64_t r, int64_t p) { return tall ? w[p * cols + r] : w[r * cols + p]; };
  JobSums s;
  bool nan = false;
  for (const auto& [first, count] : {std::pair<int, int>{job.row0, job.rows},
                                    std::pair<int, int>{job.col0, job.cols}}) {
    for (int r = first; r < first + count; ++r) {
      for (int64_t p = 0; p < k; ++p) {
        nan |= std::isnan(op(r, p));
        s.maxabs = std::max(s.maxabs, std::fabs(op(r, p)));
      }
    }
  }
  if (nan) s.maxabs = std::numeric_limits<double>::quiet_NaN();
  for (int i = 0; i < job.rows; ++i) {
    for (int j = 0; j < job.cols; ++j) {
      const int r = job.row0 + i, c = job.col0 + j;
      if (c < r) continue;
      double g = 0;
      for (int64_t p = 0; p < k; ++p) g += op(r, p) * op(c, p);
      s.g2 += (c == r ? 1.0 : 2.0) * g * g;
      if (c == r) s.trace += g;
    }
  }
  return s;
}

// Equal for the same non-finite class, else within `rel` (the BLAS sums
// differ from sequential ones only in the rounding of their order).
bool Close(double got, double want, double rel) {
  if (std::isnan(want) || std::isnan(got)) return std::isnan(want) && std::isnan(got);
  if (std::isinf(want) || std::isinf(got)) return got == want;
  return std::fabs(got - want) <= rel * std::fabs(want);
}

// ReferenceMatrixSums (dgemm/dsyrk on the converted rows) against the
// sequential sums: random shapes (wide, tall, square; edge tiles; padded
// rows, whose NaN padding must never be read), the enumerated tilings and
// random jobs on and off the diagonal, all dtypes, and zeros, NaN, Inf,
// huge, tiny and subnormal entries.
TEST(ReferenceTest, BlasSumsMatchTheSequentialSums) {
  std::mt19937_64 rng = SeededRng("ReferenceTest.BlasSumsMatchTheSequentialSums");
  std::fprintf(stderr, "ReferenceTest.BlasSumsMatchTheSequentialSums: seed %llu\n",
               static_cast<unsigned long long>(TestSeed()));
  const auto below = [&](int n) { return static_cast<int>(rng() % static_cast<uint64_t>(n)); };
  enum Content { kPlain, kZeros, kNaN, kInf, kHuge, kTiny, kSubnormal, kContents };
  int compared = 0, nonfinite = 0;
  for (int trial = 0; trial < 60; ++trial) {
    const int shape = trial % 3;  // wide, tall, square
    const int n = 1 + below(150), k = n + below(shape == 2 ? 1 : 200);
    const int rows = shape == 1 ? k : n, cols = shape == 1 ? n : k;
    const Content content = static_cast<Content>(trial % kContents);
    const DType dtype = kDtypes[(trial / 3) % 3];
    std::vector<double> w = content == kZeros ? std::vector<double>(size_t(rows) * cols, 0.0)
                                              : MakeMatrix(rng, rows, cols, Spectrum::kGaussian, 1.0);
    const double scale = content == kHuge ? kHugeScale : content == kTiny ? kTinyScale
                         : content == kSubnormal ? 1e-39 : 1.0;
    for (double& x : w) x *= scale;
    const size_t bad = static_cast<size_t>(below(rows)) * cols + below(cols);
    if (content == kNaN) w[bad] = std::numeric_limits<double>::quiet_NaN();
    if (content == kInf) w[bad] = (rng() & 1) ? std::numeric_limits<double>::infinity()
                                              : -std::numeric_limits<double>::infinity();
    const StoredMatrix m = Store(w, rows, cols, dtype, below(4), "blas");
    std::vector<TuneJob> jobs;
    const int tr = 16 * below(4), tc = tr == 0 ? 0 : 16 * (1 + below(3));
    EnumerateTuneJobs(0, n, CandidateLaunch{128, 0, tr, tc}, &jobs);
    for (int extra = 0; extra < 4; ++extra) {  // arbitrary tiles, diagonal or not
      TuneJob j{0, below(n), below(n), 0, 0, 0};
      if (extra == 0) j.col0 = j.row0;
      j.rows = 1 + below(n - j.row0);
      j.cols = 1 + below(n - j.col0);
      j.diagonal = j.row0 < j.col0 + j.cols && j.col0 < j.row0 + j.rows;
      jobs.push_back(j);
    }
    const std::vector<JobSums> fast = ReferenceMatrixSums(m.view, jobs);
    ASSERT_EQ(fast.size(), jobs.size());
    for (size_t q = 0; q < jobs.size(); ++q) {
      const TuneJob& j = jobs[q];
      const JobSums want = ScalarJobSums(m, j);
      const std::string where = absl::StrCat(m.view.rows, "x", m.view.cols, " ", DTypeName(dtype),
                                             " content ", content, " job rows [", j.row0, "+",
                                             j.rows, ") cols [", j.col0, "+", j.cols, ")");
      EXPECT_TRUE(Close(fast[q].g2, want.g2, 1e-12)) << where << ": g2 " << fast[q].g2 << " vs " << want.g2;
      EXPECT_TRUE(Close(fast[q].trace, want.trace, 1e-12))
          << where << ": trace " << fast[q].trace << " vs " << want.trace;
      EXPECT_TRUE(std::memcmp(&fast[q].maxabs, &want.maxabs, sizeof want.maxabs) == 0 ||
                  (std::isnan(fast[q].maxabs) && std::isnan(want.maxabs)))
          << where << ": maxabs " << fast[q].maxabs << " vs " << want.maxabs;
      EXPECT_EQ(ReferenceJobSums(m.view, j).g2 == fast[q].g2 || std::isnan(fast[q].g2), true) << where;
      ++compared;
      nonfinite += !std::isfinite(want.g2);
    }
  }
  EXPECT_GT(nonfinite, 0);  // the NaN and Inf contents were met
  std::fprintf(stderr, "compared %d jobs, %d of them non-finite\n", compared, nonfinite);
}

TEST(ReferenceTest, NanAndZeros) {
  std::vector<float> w(16 * 32, 0.0f);
  MatrixView v{w.data(), 16, 32, 32, DType::kF32, 0, 0};
  const TuneJob whole{0, 0, 0, 16, 16, 1};
  const JobSums zero = ReferenceJobSums(v, whole);
  EXPECT_EQ(zero.g2, 0);
  EXPECT_EQ(PrFromJobSums({zero}), 0);
  w[5 * 32 + 7] = std::nanf("");
  const JobSums nan = ReferenceJobSums(v, whole);
  EXPECT_TRUE(std::isnan(nan.maxabs));
  EXPECT_TRUE(std::isnan(PrFromJobSums({nan})));
  // The NaN row is not in the job of rows 0..3: its sums stay finite.
  EXPECT_FALSE(std::isnan(ReferenceJobSums(v, TuneJob{0, 0, 0, 4, 4, 1}).g2));
}

}  // namespace
}  // namespace rvd::tune

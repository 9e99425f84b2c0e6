// Tests of the CPU engine against the float64 SVD oracle, on fresh random
// inputs with controlled spectra, in every dtype and view form.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu_engine_stats.h"
#include "kernels/dtype_convert.h"
#include "kernels/engine.h"
#include "kernels/pr_check.h"
#include "kernels/test_matrices.h"

namespace rvd {
namespace {

using ::testing::HasSubstr;

double Oracle(const MatrixView& v) {
  absl::StatusOr<double> pr = OraclePR(v);
  EXPECT_TRUE(pr.ok()) << pr.status();
  return pr.ok() ? *pr : std::numeric_limits<double>::quiet_NaN();
}

struct ShapeCase {
  int64_t rows, cols;
};

std::vector<StoredMatrix> MakeSuite(std::mt19937_64& rng) {
  const std::vector<ShapeCase> shapes = {{1, 512},  {512, 1},    {300, 40},
                                         {40, 300}, {37, 129},   {129, 37},
                                         {64, 64},  {128, 4096}, {1, 1}};
  const DType dtypes[] = {DType::kF32, DType::kF16, DType::kBF16};
  std::vector<StoredMatrix> suite;
  int n = 0;
  for (const ShapeCase& sh : shapes) {
    for (Spectrum sp : kAllSpectra) {
      const std::vector<double> w = MakeMatrix(rng, sh.rows, sh.cols, sp);
      for (DType dt : dtypes) {
        const int64_t pad = (n++ % 3 == 0) ? 3 : 0;  // a third are strided
        suite.push_back(Store(w, sh.rows, sh.cols, dt, pad, SpectrumName(sp)));
      }
    }
  }
  return suite;
}

// Runs `got` vs `ref` through the one checker; reports its first mismatches.
void ExpectMatches(const std::vector<double>& got,
                   const std::vector<double>& ref,
                   const std::vector<StoredMatrix>& suite, const std::string& what) {
  const CheckResult r = CheckPR(got, ref, kExactPrTolerance);
  EXPECT_EQ(r.mismatches, 0) << what << ":\n" << r.report;
  for (size_t i = 0; i < got.size() && r.mismatches > 0; ++i) {
    if (!WithinTolerance(got[i], ref[i], kExactPrTolerance)) {
      ADD_FAILURE() << "  " << suite[i].label;
      break;
    }
  }
  std::printf("%s: %zu matrices, max rel error %.3g\n", what.c_str(),
              got.size(), r.max_rel_error);
}

class CpuEngineTest : public ::testing::Test {
 protected:
  std::unique_ptr<Engine> engine_ = NewCpuEngine(2);
};

TEST_F(CpuEngineTest, Identity) {
  EXPECT_EQ(engine_->Backend(), "cpu");
  EXPECT_EQ(engine_->DefaultVariant(), "algebraic");
  EXPECT_THAT(engine_->Version(), HasSubstr("cpu"));
}

TEST_F(CpuEngineTest, ExactVariantsMatchOracleOneByOneAndBatched) {
  std::mt19937_64 rng(std::random_device{}());
  const std::vector<StoredMatrix> suite = MakeSuite(rng);
  std::vector<MatrixView> views;
  std::vector<double> ref;
  for (const StoredMatrix& s : suite) {
    views.push_back(s.view);
    ref.push_back(Oracle(s.view));
  }
  const CpuEngineCounters before = GetCpuEngineCounters();
  for (const char* name : {"algebraic", "", "naive"}) {
    VariantSpec spec;
    spec.name = name;
    // Whole batch: mixed shapes and dtypes, spread across the pool.
    std::vector<double> got(views.size());
    ASSERT_TRUE(engine_->ComputePR(views, spec, absl::MakeSpan(got)).ok());
    ExpectMatches(got, ref, suite, absl::StrCat("batched '", name, "'"));
    // One at a time: a batch of one splits large matrices across threads.
    std::vector<double> one(views.size());
    for (size_t i = 0; i < views.size(); ++i) {
      ASSERT_TRUE(engine_
                      ->ComputePR(absl::MakeConstSpan(&views[i], 1), spec,
                                  absl::MakeSpan(&one[i], 1))
                      .ok());
    }
    ExpectMatches(one, ref, suite, absl::StrCat("one by one '", name, "'"));
  }
  // The fast path served every matrix: no silent float64 fallback (which
  // would hide a Gram kernel that corrupts the diagonal).
  const CpuEngineCounters after = GetCpuEngineCounters();
  EXPECT_EQ(after.float64_fallbacks, before.float64_fallbacks);
  EXPECT_EQ(after.avx512_grams + after.openblas_grams - before.avx512_grams -
                before.openblas_grams,
            4 * static_cast<int64_t>(views.size()));
}

TEST_F(CpuEngineTest, SixtyFourBigPowerLawMatricesMatchOracle) {
  // The benchmark's shape, across threads, f32 and bf16.
  std::mt19937_64 rng(std::random_device{}());
  std::vector<StoredMatrix> suite;
  for (int i = 0; i < 6; ++i) {
    const std::vector<double> w =
        MakeMatrix(rng, 128, 4096, Spectrum::kPowerLaw);
    suite.push_back(
        Store(w, 128, 4096, i % 2 ? DType::kBF16 : DType::kF32, 0, "pl"));
    suite.push_back(Store(w, 4096, 128, DType::kF32, 0, "pl-transposed-data"));
  }
  std::vector<MatrixView> views;
  std::vector<double> ref;
  for (const StoredMatrix& s : suite) {
    views.push_back(s.view);
    ref.push_back(Oracle(s.view));
  }
  std::vector<double> got(views.size());
  ASSERT_TRUE(engine_->ComputePR(views, {}, absl::MakeSpan(got)).ok());
  ExpectMatches(got, ref, suite, "128x4096 / 4096x128");
}

TEST_F(CpuEngineTest, ExtremeScalesFallBackToFloat64) {
  std::mt19937_64 rng(std::random_device{}());
  const int64_t fallbacks = GetCpuEngineCounters().float64_fallbacks;
  for (double scale : {1e18, 1e-17, 1e-19, 1e-21, 1e-40}) {
    std::vector<double> w = MakeMatrix(rng, 48, 200, Spectrum::kPowerLaw);
    for (double& x : w) x *= scale;
    const StoredMatrix s = Store(w, 48, 200, DType::kF32, 0, "scaled");
    double got = 0;
    ASSERT_TRUE(engine_->ComputePR({s.view}, {}, absl::MakeSpan(&got, 1)).ok());
    EXPECT_TRUE(WithinTolerance(got, Oracle(s.view), kExactPrTolerance))
        << "scale " << scale << ": got " << got << " ref " << Oracle(s.view);
  }
  EXPECT_GE(GetCpuEngineCounters().float64_fallbacks - fallbacks, 4);
}

TEST_F(CpuEngineTest, ZeroMatrixHasPrZero) {
  std::vector<float> zeros(37 * 129, 0.0f);
  const MatrixView v{zeros.data(), 37, 129, 129, DType::kF32};
  for (const char* name : {"algebraic", "naive", "power_iter", "sketch"}) {
    VariantSpec spec;
    spec.name = name;
    double got = -1;
    ASSERT_TRUE(engine_->ComputePR({v}, spec, absl::MakeSpan(&got, 1)).ok())
        << name;
    EXPECT_EQ(got, 0.0) << name;
  }
  EXPECT_EQ(*OraclePR(v), 0.0);
}

TEST_F(CpuEngineTest, NanOrInfIsInvalidArgumentNamingTheIndex) {
  std::mt19937_64 rng(std::random_device{}());
  // Wide and tall (the two Gram kernels), one big enough to be split across
  // threads when alone in a batch.
  for (auto [rows, cols] :
       {std::pair<int64_t, int64_t>{16, 40}, {40, 16}, {2048, 64}}) {
    const std::vector<double> w =
        MakeMatrix(rng, rows, cols, Spectrum::kGaussian);
    for (DType dt : {DType::kF32, DType::kF16, DType::kBF16}) {
      for (float bad : {std::numeric_limits<float>::quiet_NaN(),
                        std::numeric_limits<float>::infinity(),
                        -std::numeric_limits<float>::infinity()}) {
        std::vector<double> wb = w;
        wb[(rows / 2) * cols + cols - 3] = bad;
        const StoredMatrix good = Store(w, rows, cols, dt, 0, "good");
        const StoredMatrix poisoned = Store(wb, rows, cols, dt, 0, "bad");
        const std::vector<MatrixView> batch = {good.view, good.view,
                                               poisoned.view};
        for (const char* name :
             {"algebraic", "naive", "power_iter", "sketch"}) {
          VariantSpec spec;
          spec.name = name;
          std::vector<double> out(3);
          absl::Status s = engine_->ComputePR(batch, spec, absl::MakeSpan(out));
          EXPECT_TRUE(absl::IsInvalidArgument(s)) << name << " " << s;
          EXPECT_THAT(std::string(s.message()), HasSubstr("batch[2]")) << name;
          // Alone: a batch of one takes the split path for algebraic.
          s = engine_->ComputePR({poisoned.view}, spec,
                                 absl::MakeSpan(out.data(), 1));
          EXPECT_TRUE(absl::IsInvalidArgument(s)) << name << " " << s;
        }
      }
    }
  }
}

TEST_F(CpuEngineTest, FusedAndUnknownAreUnimplementedNamingCpu) {
  std::vector<float> w(64, 1.0f);
  const MatrixView v{w.data(), 8, 8, 8, DType::kF32};
  double out;
  for (const char* name : {"fused", "no_such_variant"}) {
    VariantSpec spec;
    spec.name = name;
    const absl::Status s =
        engine_->ComputePR({v}, spec, absl::MakeSpan(&out, 1));
    EXPECT_TRUE(absl::IsUnimplemented(s)) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("cpu"));
    EXPECT_THAT(std::string(s.message()), HasSubstr(name));
  }
}

TEST_F(CpuEngineTest, BadViewsAndSpecsAreInvalidArgument) {
  std::vector<float> w(64, 1.0f);
  const MatrixView good{w.data(), 8, 8, 8, DType::kF32};
  const std::vector<MatrixView> bad = {{nullptr, 8, 8, 8, DType::kF32},
                                       {w.data(), 0, 8, 8, DType::kF32},
                                       {w.data(), 8, -1, 8, DType::kF32},
                                       {w.data(), 8, 8, 7, DType::kF32}};
  for (const MatrixView& b : bad) {
    std::vector<double> out(2);
    const absl::Status s =
        engine_->ComputePR({good, b}, {}, absl::MakeSpan(out));
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("batch[1]"));
    EXPECT_FALSE(OraclePR(b).ok());
  }
  std::vector<double> out(2);
  EXPECT_TRUE(absl::IsInvalidArgument(
      engine_->ComputePR({good}, {}, absl::MakeSpan(out))));  // size mismatch
  VariantSpec p;
  p.name = "power_iter";
  p.probes = 0;
  EXPECT_TRUE(absl::IsInvalidArgument(
      engine_->ComputePR({good}, p, absl::MakeSpan(out.data(), 1))));
  VariantSpec k;
  k.name = "sketch";
  k.sketch_rank = 0;
  EXPECT_TRUE(absl::IsInvalidArgument(
      engine_->ComputePR({good}, k, absl::MakeSpan(out.data(), 1))));
  EXPECT_TRUE(engine_->ComputePR({}, {}, {}).ok());
}

TEST_F(CpuEngineTest, DeterministicBitwise) {
  std::mt19937_64 rng(std::random_device{}());
  std::vector<StoredMatrix> suite;
  for (auto [r, c] : {std::pair{128, 4096}, {300, 40}, {37, 129}}) {
    suite.push_back(Store(MakeMatrix(rng, r, c, Spectrum::kPowerLaw), r, c,
                          DType::kBF16, 1, "det"));
  }
  std::vector<MatrixView> views;
  for (const StoredMatrix& s : suite) views.push_back(s.view);
  for (const char* name : {"algebraic", "naive", "power_iter", "sketch"}) {
    VariantSpec spec;
    spec.name = name;
    spec.seed = 42;
    std::vector<double> a(views.size()), b(views.size());
    ASSERT_TRUE(engine_->ComputePR(views, spec, absl::MakeSpan(a)).ok());
    ASSERT_TRUE(engine_->ComputePR(views, spec, absl::MakeSpan(b)).ok());
    EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(double)))
        << name;
    if (spec.name == "power_iter" || spec.name == "sketch") {
      spec.seed = 43;
      ASSERT_TRUE(engine_->ComputePR(views, spec, absl::MakeSpan(b)).ok());
      EXPECT_NE(a, b) << name << ": the seed must matter";
    }
  }
}

TEST_F(CpuEngineTest, ConcurrentCallersGetTheSameAnswers) {
  std::mt19937_64 rng(std::random_device{}());
  std::vector<StoredMatrix> suite;
  for (int i = 0; i < 12; ++i) {
    suite.push_back(Store(MakeMatrix(rng, 64, 300, Spectrum::kGaussian), 64,
                          300, DType::kF32, 0, "c"));
  }
  std::vector<MatrixView> views;
  for (const StoredMatrix& s : suite) views.push_back(s.view);
  std::vector<double> want(views.size());
  ASSERT_TRUE(engine_->ComputePR(views, {}, absl::MakeSpan(want)).ok());
  std::vector<std::vector<double>> got(4, std::vector<double>(views.size()));
  std::vector<std::thread> callers;
  for (int t = 0; t < 4; ++t) {
    callers.emplace_back([&, t] {
      for (int rep = 0; rep < 5; ++rep) {
        EXPECT_TRUE(engine_->ComputePR(views, {}, absl::MakeSpan(got[t])).ok());
      }
    });
  }
  for (std::thread& c : callers) c.join();
  for (const auto& g : got) EXPECT_EQ(g, want);
}

TEST_F(CpuEngineTest, PrIsBetweenOneAndRank) {
  std::mt19937_64 rng(std::random_device{}());
  for (Spectrum sp : {Spectrum::kFlat, Spectrum::kPowerLaw, Spectrum::kRankOne,
                      Spectrum::kGaussian}) {
    const StoredMatrix s =
        Store(MakeMatrix(rng, 40, 300, sp), 40, 300, DType::kF32, 0, "b");
    double pr = 0;
    ASSERT_TRUE(engine_->ComputePR({s.view}, {}, absl::MakeSpan(&pr, 1)).ok());
    const double rank = sp == Spectrum::kRankOne ? 1.0 : 40.0;
    EXPECT_GE(pr, 1.0 - 1e-6) << SpectrumName(sp);
    EXPECT_LE(pr, rank * (1 + 1e-6)) << SpectrumName(sp);
    if (sp == Spectrum::kFlat) {
      EXPECT_NEAR(pr, 40.0, 1e-3);
    }
    if (sp == Spectrum::kRankOne) {
      EXPECT_NEAR(pr, 1.0, 1e-5);
    }
  }
}

// Mean relative error of an estimator over fresh matrices.
double MeanRelError(Engine& engine, const VariantSpec& spec, int64_t rows,
                    int64_t cols, std::mt19937_64& rng) {
  std::vector<StoredMatrix> suite;
  std::vector<MatrixView> views;
  for (int i = 0; i < 24; ++i) {
    suite.push_back(Store(MakeMatrix(rng, rows, cols, Spectrum::kPowerLaw),
                          rows, cols, DType::kF32, 0, "e"));
    views.push_back(suite.back().view);
  }
  std::vector<double> exact(views.size()), est(views.size());
  EXPECT_TRUE(engine.ComputePR(views, {}, absl::MakeSpan(exact)).ok());
  double sum = 0;
  for (uint64_t seed = 1; seed <= 4; ++seed) {
    VariantSpec s = spec;
    s.seed = seed;
    EXPECT_TRUE(engine.ComputePR(views, s, absl::MakeSpan(est)).ok());
    for (size_t i = 0; i < est.size(); ++i) {
      EXPECT_GE(est[i], 1.0);
      sum += std::fabs(est[i] - exact[i]) / exact[i];
    }
  }
  return sum / (4.0 * views.size());
}

TEST_F(CpuEngineTest, EstimatorsAreWithinStatisticalBounds) {
  std::mt19937_64 rng(std::random_device{}());
  struct Case {
    const char* name;
    int probes, rank;
    bool hpp;
    double bound;
  };
  for (const Case& c : {Case{"power_iter", 64, 0, false, 0.5},
                        Case{"power_iter", 64, 0, true, 0.5},
                        // The sketch's error has a floor set by the spectrum:
                        // rel. std ~ sqrt(4/r^2 + 8 tr(G^4) / (r tr(G^2)^2)),
                        // about 0.58 (r=16) and 0.2 (r=128) for s_i = i^-0.7.
                        Case{"sketch", 0, 16, false, 0.75},
                        Case{"sketch", 0, 128, false, 0.25}}) {
    VariantSpec spec;
    spec.name = c.name;
    if (c.probes) spec.probes = c.probes;
    if (c.rank) spec.sketch_rank = c.rank;
    spec.hutch_plus_plus = c.hpp;
    for (auto [r, cc] : {std::pair{96, 512}, {512, 96}}) {
      const double err = MeanRelError(*engine_, spec, r, cc, rng);
      std::printf("%s K=%d r=%d hutch++=%d %dx%d: mean rel error %.3f\n",
                  c.name, c.probes, c.rank, c.hpp, r, cc, err);
      EXPECT_LT(err, c.bound) << c.name;
    }
  }
}

// A deliberately wrong reference: the Gram with one wrong index (G[i][j]
// reads column j+1 of the second row when j is the last-but-one). The one
// checker must flag it, as it must flag a slightly poisoned output.
double MutantPR(const std::vector<double>& w, int64_t rows, int64_t cols) {
  double trace = 0, g2 = 0;
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < rows; ++j) {
      double g = 0;
      for (int64_t k = 0; k < cols; ++k) {
        const int64_t kk = (k == cols - 2) ? k + 1 : k;  // the bug
        g += w[i * cols + k] * w[j * cols + kk];
      }
      if (i == j) trace += g;
      g2 += g * g;
    }
  }
  return trace * trace / g2;
}

TEST_F(CpuEngineTest, CheckerCatchesMutants) {
  std::mt19937_64 rng(std::random_device{}());
  std::vector<StoredMatrix> suite;
  std::vector<double> ref, mutant;
  for (int i = 0; i < 4; ++i) {
    const std::vector<double> w = MakeMatrix(rng, 20, 60, Spectrum::kGaussian);
    suite.push_back(Store(w, 20, 60, DType::kF32, 0, "m"));
    ref.push_back(Oracle(suite.back().view));
    std::vector<double> wf(w.size());  // the stored (f32-rounded) values
    for (size_t k = 0; k < w.size(); ++k) wf[k] = static_cast<float>(w[k]);
    mutant.push_back(MutantPR(wf, 20, 60));
  }
  CheckResult r = CheckPR(mutant, ref, kExactPrTolerance);
  EXPECT_EQ(r.mismatches, 4) << "the checker missed the wrong-index Gram";
  EXPECT_THAT(r.report, HasSubstr("[0]"));

  std::vector<MatrixView> views;
  for (const StoredMatrix& s : suite) views.push_back(s.view);
  std::vector<double> got(views.size());
  ASSERT_TRUE(engine_->ComputePR(views, {}, absl::MakeSpan(got)).ok());
  EXPECT_EQ(CheckPR(got, ref, kExactPrTolerance).mismatches, 0);
  got[2] *= 1 + 1e-5;  // poisoned output
  EXPECT_EQ(CheckPR(got, ref, kExactPrTolerance).mismatches, 1);
  got[2] = std::numeric_limits<double>::quiet_NaN();
  EXPECT_EQ(CheckPR(got, ref, kExactPrTolerance).mismatches, 1);
}

TEST(DTypeConvertTest, HalfRoundTripsAndMatchesHardware) {
  std::vector<uint16_t> all(65536);
  for (int i = 0; i < 65536; ++i) all[i] = static_cast<uint16_t>(i);
  std::vector<float> fast(65536);
  ConvertRowToFloat(all.data(), DType::kF16, 65536, fast.data());
  for (int i = 0; i < 65536; ++i) {
    const uint16_t h = static_cast<uint16_t>(i);
    const float f = HalfToFloat(h);
    ASSERT_EQ(std::bit_cast<uint32_t>(f), std::bit_cast<uint32_t>(fast[i]))
        << i;
    const bool nan = (h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0;
    if (nan) {
      EXPECT_TRUE(std::isnan(f));
      EXPECT_EQ(FloatToHalf(f) & 0x7c00, 0x7c00);
    } else {
      EXPECT_EQ(FloatToHalf(f), h) << i;
    }
  }
  EXPECT_EQ(HalfToFloat(0x0001), 0x1p-24f);  // smallest subnormal
  EXPECT_EQ(HalfToFloat(0x7bff), 65504.0f);  // largest finite
  EXPECT_EQ(FloatToHalf(65519.0f), 0x7bff);
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7c00);             // rounds to infinity
  EXPECT_EQ(FloatToHalf(1.0f + 0x1p-11f), 0x3c00);      // tie to even (down)
  EXPECT_EQ(FloatToHalf(1.0f + 3 * 0x1p-11f), 0x3c02);  // tie to even (up)
  EXPECT_EQ(FloatToHalf(0x1p-25f), 0x0000);    // tie between 0 and 2^-24
  EXPECT_EQ(FloatToHalf(0x1.8p-24f), 0x0002);  // tie rounds to even (up)
  EXPECT_EQ(FloatToHalf(1e-10f), 0x0000);
  EXPECT_EQ(FloatToHalf(-0.0f), 0x8000);
}

TEST(DTypeConvertTest, BFloat16RoundTripsAndRoundsToEven) {
  std::vector<uint16_t> all(65536);
  for (int i = 0; i < 65536; ++i) all[i] = static_cast<uint16_t>(i);
  std::vector<float> fast(65536);
  ConvertRowToFloat(all.data(), DType::kBF16, 65536, fast.data());
  for (int i = 0; i < 65536; ++i) {
    const uint16_t b = static_cast<uint16_t>(i);
    const float f = BFloat16ToFloat(b);
    ASSERT_EQ(std::bit_cast<uint32_t>(f), std::bit_cast<uint32_t>(fast[i]))
        << i;
    if (std::isnan(f)) continue;
    EXPECT_EQ(FloatToBFloat16(f), b);
  }
  EXPECT_EQ(FloatToBFloat16(1.0f + 0x1p-8f), 0x3f80);      // tie, even down
  EXPECT_EQ(FloatToBFloat16(1.0f + 3 * 0x1p-8f), 0x3f82);  // tie, even up
  EXPECT_TRUE(std::isnan(BFloat16ToFloat(
      FloatToBFloat16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_EQ(FloatToBFloat16(std::numeric_limits<float>::max()), 0x7f80);
  EXPECT_EQ(DTypeSize(DType::kBF16), 2u);
  EXPECT_STREQ(DTypeName(DType::kF16), "f16");
  EXPECT_TRUE(IsExactVariant("algebraic"));
  EXPECT_FALSE(IsExactVariant("sketch"));
  EXPECT_EQ(KnownVariants().size(), 5u);
}

}  // namespace
}  // namespace rvd

// The CPU engine's GramEigenvalues (engine.h, gram_eigen.h) against the
// float64 SVD oracle's singular values squared (gram_eigen_check.h), on
// fresh random matrices of every spectrum, wide, tall and square, in every
// dtype with padded rows, on one thread and split across four; against
// matrices built with known singular values; and its errors.
//
// Every test prints the seed of its inputs (and each failure carries it):
// RVD_TEST_SEED=<seed> gram_eigen_test --gtest_filter=<test> replays it.
#include <cmath>
#include <cstdio>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/dtype_convert.h"
#include "kernels/engine.h"
#include "kernels/gram_eigen_check.h"
#include "kernels/oracle_svd.h"
#include "kernels/test_matrices.h"

namespace rvd {
namespace {

using ::testing::HasSubstr;

class GramEigenTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    const std::string name = absl::StrCat(info->test_suite_name(), ".", info->name());
    rng_ = SeededRng(name);
    const std::string replay = absl::StrCat("replay: RVD_TEST_SEED=", TestSeed(),
                                            " gram_eigen_test --gtest_filter='", name, "'");
    std::printf("%s\n", replay.c_str());
    trace_.emplace(__FILE__, __LINE__, replay);
  }
  std::mt19937_64 rng_;
  std::optional<::testing::ScopedTrace> trace_;
};

std::vector<double> Eigenvalues(Engine& e, const MatrixView& v) {
  std::vector<double> out(static_cast<size_t>(std::min(v.rows, v.cols)));
  const absl::Status s = e.GramEigenvalues(v, absl::MakeSpan(out), CallOptions());
  EXPECT_TRUE(s.ok()) << s;
  return out;
}

std::vector<double> OracleSingularValues(const MatrixView& v) {
  absl::StatusOr<std::vector<double>> s = SvdSingularValues(v, 0);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *s : std::vector<double>();
}

TEST_F(GramEigenTest, MatchesTheSvdOracleOnEverySpectrumShapeAndDtype) {
  // Wide, tall, square and a vector each way in every spectrum and dtype;
  // then shapes of several chunks of the long side (n = 600: 1747 per
  // chunk; n = 300: 3495) that the 4-thread engine also splits into parts
  // (>= 4e6 multiply-adds), in fewer combinations (the oracle's SVD of
  // them is the slow part).
  struct Case {
    int64_t rows, cols;
    std::vector<Spectrum> spectra;
    std::vector<DType> dtypes;
  };
  const std::vector<Spectrum> all(std::begin(kAllSpectra), std::end(kAllSpectra));
  const std::vector<DType> dtypes = {DType::kF32, DType::kBF16, DType::kF16};
  const std::vector<Case> cases = {
      {64, 512, all, dtypes},   {512, 64, all, dtypes},
      {128, 128, all, dtypes},  {1, 300, all, dtypes},
      {300, 1, all, dtypes},    {37, 1000, all, dtypes},
      {600, 4000, {Spectrum::kPowerLaw, Spectrum::kRankDeficient}, {DType::kF32, DType::kBF16}},
      {9000, 300, {Spectrum::kFlat, Spectrum::kRankOne}, {DType::kF32, DType::kF16}}};
  std::unique_ptr<Engine> one = NewCpuEngine(1), four = NewCpuEngine(4);
  double worst = 0;
  int matrices = 0;
  for (const Case& c : cases) {
    for (Spectrum spec : c.spectra) {
      const std::vector<double> w = MakeMatrix(rng_, c.rows, c.cols, spec);
      for (DType dt : c.dtypes) {
        const int64_t pad = std::uniform_int_distribution<int64_t>(0, 5)(rng_);
        const StoredMatrix m = Store(w, c.rows, c.cols, dt, pad,
                                     absl::StrCat(SpectrumName(spec), " ", c.rows, "x", c.cols,
                                                  " pad ", pad, " ", DTypeName(dt)));
        const std::vector<double> sv = OracleSingularValues(m.view);
        for (Engine* e : {one.get(), four.get()}) {
          const EigenCheck check = CheckGramEigenvalues(Eigenvalues(*e, m.view), sv,
                                                        std::max(c.rows, c.cols));
          EXPECT_EQ(check.result.mismatches, 0)
              << m.label << (e == one.get() ? " 1 thread" : " 4 threads") << ":\n"
              << check.result.report;
          worst = std::max(worst, check.max_abs_error_rel_to_max);
        }
        ++matrices;
      }
    }
  }
  std::printf("%d matrices x {1, 4} threads: max |error| / lambda_max %.3g\n", matrices, worst);
}

TEST_F(GramEigenTest, MatchesKnownSingularValues) {
  // Independent of LAPACK's SVD: U diag(s) V^T in float64 stored as f32,
  // whose singular values are s to f32 rounding (~1e-7 relative of s_max).
  std::unique_ptr<Engine> e = NewCpuEngine(2);
  for (const auto& [rows, cols] : std::vector<std::pair<int64_t, int64_t>>{{40, 300}, {300, 40}}) {
    std::vector<double> s(40);
    for (size_t i = 0; i < s.size(); ++i) s[i] = 1.0 + 3.0 * static_cast<double>(i);
    const std::vector<double> w = MakeMatrixWithSingularValues(rng_, rows, cols, s);
    const StoredMatrix m = Store(w, rows, cols, DType::kF32, 0, "known");
    const std::vector<double> got = Eigenvalues(*e, m.view);
    ASSERT_EQ(got.size(), s.size());
    for (size_t i = 0; i < s.size(); ++i) {
      const double want = s[i] * s[i];  // s ascending, as got
      EXPECT_NEAR(got[i], want, 1e-5 * s.back() * s.back()) << i;
    }
  }
}

TEST_F(GramEigenTest, ZeroMatrixHasZeroEigenvalues) {
  std::unique_ptr<Engine> e = NewCpuEngine(1);
  const std::vector<double> w(20 * 70, 0.0);
  const StoredMatrix m = Store(w, 20, 70, DType::kBF16, 3, "zeros");
  for (double x : Eigenvalues(*e, m.view)) EXPECT_EQ(x, 0.0);
}

TEST_F(GramEigenTest, RefusesNonFiniteAndBadCallsWithPoisonedOutput) {
  std::unique_ptr<Engine> e = NewCpuEngine(2);
  std::vector<double> w = MakeMatrix(rng_, 30, 90, Spectrum::kGaussian, 1.0);
  for (double bad : {std::numeric_limits<double>::quiet_NaN(),
                     std::numeric_limits<double>::infinity()}) {
    w[30 * 90 - 1] = bad;  // the last element: the last chunk's last row
    for (DType dt : {DType::kF32, DType::kF16}) {
      const StoredMatrix m = Store(w, 30, 90, dt, 1, "bad");
      std::vector<double> out(30, 7.0);
      const absl::Status s = e->GramEigenvalues(m.view, absl::MakeSpan(out), CallOptions());
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
      EXPECT_THAT(std::string(s.message()), HasSubstr("NaN or Inf"));
      for (double x : out) EXPECT_TRUE(std::isnan(x));
    }
  }
  w[30 * 90 - 1] = 1.0;
  const StoredMatrix m = Store(w, 30, 90, DType::kF32, 0, "ok");
  std::vector<double> wrong(29, 7.0);
  absl::Status s = e->GramEigenvalues(m.view, absl::MakeSpan(wrong), CallOptions());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("30 eigenvalues"));
  for (double x : wrong) EXPECT_TRUE(std::isnan(x));

  MatrixView blocked = m.view;
  blocked.block_rows = 15;
  blocked.block_stride = 15 * 90;
  std::vector<double> out(30);
  EXPECT_EQ(e->GramEigenvalues(blocked, absl::MakeSpan(out), CallOptions()).code(),
            absl::StatusCode::kInvalidArgument);
  MatrixView null = m.view;
  null.data = nullptr;
  EXPECT_EQ(e->GramEigenvalues(null, absl::MakeSpan(out), CallOptions()).code(),
            absl::StatusCode::kInvalidArgument);

  std::atomic<bool> cancel{true};
  CallOptions call;
  call.cancel = &cancel;
  s = e->GramEigenvalues(m.view, absl::MakeSpan(out), call);
  EXPECT_EQ(s.code(), absl::StatusCode::kCancelled) << s;
  for (double x : out) EXPECT_TRUE(std::isnan(x));
}

}  // namespace
}  // namespace rvd

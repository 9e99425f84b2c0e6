// MeasureActivations' parts in-process (activations.h): the statistics from
// hand-built spectra, request validation (each limit and its message), and
// whole requests through the CPU engine against the float64 SVD oracle,
// matrices built from random inputs with a printed seed.
#include "server/activations.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/dtype_convert.h"
#include "kernels/engine.h"

namespace rvd {
namespace {

using ::testing::HasSubstr;
using rvd::v1::ActivationTensor;
using rvd::v1::MeasureActivationsRequest;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

SpectrumStats Stats(const std::vector<double>& eigenvalues, int64_t long_side = 100) {
  absl::StatusOr<SpectrumStats> s = StatsFromGramEigenvalues(eigenvalues, long_side);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *s : SpectrumStats{kNaN, kNaN, kNaN, kNaN, kNaN};
}

TEST(ActivationStatsTest, FlatSpectrumHasFullEffectiveRank) {
  // k equal singular values s: p_i = 1/k, H = log k, effective rank k,
  // PR k, ||A||_F = s sqrt(k).
  for (int k : {1, 2, 7, 64}) {
    const double s = 3.0;
    const std::vector<double> l(k, s * s);
    const SpectrumStats st = Stats(l);
    EXPECT_NEAR(st.entropy, std::log(k), 1e-12) << k;
    EXPECT_NEAR(st.effective_rank, k, 1e-10 * k) << k;
    EXPECT_NEAR(st.participation_ratio, k, 1e-10 * k) << k;
    EXPECT_NEAR(st.frobenius_norm, s * std::sqrt(k), 1e-12) << k;
    EXPECT_DOUBLE_EQ(st.max_singular_value, s) << k;
  }
}

TEST(ActivationStatsTest, HandComputedSpectrum) {
  // s = (1, 2, 3, 4) given as ascending eigenvalues with zeros and a tiny
  // negative (rounding): p = s / 10.
  const std::vector<double> l = {-1e-30, 0.0, 1.0, 4.0, 9.0, 16.0};
  double h = 0;
  for (double s : {1.0, 2.0, 3.0, 4.0}) h -= s / 10 * std::log(s / 10);
  const SpectrumStats st = Stats(l);
  EXPECT_NEAR(st.entropy, h, 1e-14);
  EXPECT_NEAR(st.effective_rank, std::exp(h), 1e-13);
  EXPECT_NEAR(st.frobenius_norm, std::sqrt(30.0), 1e-14);
  EXPECT_DOUBLE_EQ(st.max_singular_value, 4.0);
  EXPECT_NEAR(st.participation_ratio, 30.0 * 30.0 / (1 + 16 + 81 + 256), 1e-13);
  // Scale-free statistics do not move with the matrix's scale; the norms
  // scale with it (lambda * c^2: s * c), far from 1 both ways.
  for (double c : {1e-150, 1e150}) {
    std::vector<double> scaled;
    for (double x : l) scaled.push_back(x * c * c);
    const SpectrumStats sc = Stats(scaled);
    EXPECT_NEAR(sc.effective_rank, st.effective_rank, 1e-12);
    EXPECT_NEAR(sc.participation_ratio, st.participation_ratio, 1e-12);
    EXPECT_NEAR(sc.frobenius_norm / (c * std::sqrt(30.0)), 1.0, 1e-14);
    EXPECT_NEAR(sc.max_singular_value / (4.0 * c), 1.0, 1e-14);
  }
}

TEST(ActivationStatsTest, RoundingFloorKeepsRankOneAtOne) {
  // A rank-one Gram's other eigenvalues are float64 noise of about
  // len * 2^-52 * lambda_max, either sign. Taken at face value, 1023 noise
  // singular values of sqrt(1e-13) each would add ~3e-4 of the mass and
  // raise the effective rank to ~1.005.
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> noise(-1.0, 1.0);
  std::vector<double> l;
  const int64_t len = 4096;
  for (int i = 0; i < 1023; ++i) l.push_back(noise(rng) * 0.9 * len * 0x1p-52 * 25.0);
  l.push_back(25.0);
  const SpectrumStats st = Stats(l, len);
  EXPECT_DOUBLE_EQ(st.effective_rank, 1.0);
  EXPECT_DOUBLE_EQ(st.entropy, 0.0);
  EXPECT_DOUBLE_EQ(st.participation_ratio, 1.0);
  EXPECT_DOUBLE_EQ(st.max_singular_value, 5.0);
  // An eigenvalue above the floor counts, however small its share.
  l[0] = 1e-6 * 25.0;
  EXPECT_GT(Stats(l, len).effective_rank, 1.0 + 1e-4);
}

TEST(ActivationStatsTest, ZeroMatrixIsAllZero) {
  for (const std::vector<double>& l :
       {std::vector<double>{0.0, 0.0, 0.0}, std::vector<double>{-1e-300, 0.0},
        std::vector<double>{}}) {
    const SpectrumStats st = Stats(l);
    EXPECT_EQ(st.effective_rank, 0.0);
    EXPECT_EQ(st.entropy, 0.0);
    EXPECT_EQ(st.frobenius_norm, 0.0);
    EXPECT_EQ(st.max_singular_value, 0.0);
    EXPECT_EQ(st.participation_ratio, 0.0);
  }
}

TEST(ActivationStatsTest, NonFiniteEigenvaluesAreRefused) {
  for (double bad : {kNaN, std::numeric_limits<double>::infinity()}) {
    absl::StatusOr<SpectrumStats> s = StatsFromGramEigenvalues({1.0, bad}, 10);
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  }
  EXPECT_EQ(StatsFromGramEigenvalues({1.0}, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// ---- validation ---------------------------------------------------------

ActivationTensor F32Tensor(uint32_t layer, int64_t rows, int64_t cols,
                           const std::vector<float>& values) {
  ActivationTensor a;
  a.set_layer(layer);
  a.set_dtype(rvd::v1::DTYPE_F32);
  a.add_shape(rows);
  a.add_shape(cols);
  a.set_data(std::string(reinterpret_cast<const char*>(values.data()),
                         values.size() * sizeof(float)));
  return a;
}

MeasureActivationsRequest OneTensorRequest() {
  MeasureActivationsRequest r;
  r.set_model_id("m");
  *r.add_activations() = F32Tensor(3, 2, 3, {1, 2, 3, 4, 5, 6});
  return r;
}

void ExpectInvalid(const MeasureActivationsRequest& r, const std::string& what,
                   absl::StatusCode code = absl::StatusCode::kInvalidArgument,
                   uint64_t max_bytes = 1 << 20) {
  absl::StatusOr<uint64_t> s = ValidateActivations(r, max_bytes);
  EXPECT_EQ(s.status().code(), code) << s.status();
  EXPECT_THAT(std::string(s.status().message()), HasSubstr(what));
}

TEST(ValidateActivationsTest, AcceptsAWellFormedRequest) {
  absl::StatusOr<uint64_t> s = ValidateActivations(OneTensorRequest(), 1 << 20);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(*s, 24u);
}

TEST(ValidateActivationsTest, RefusesEachBrokenPart) {
  MeasureActivationsRequest r = OneTensorRequest();
  r.set_model_id("bad id");
  ExpectInvalid(r, "invalid model_id");

  r = OneTensorRequest();
  r.clear_activations();
  ExpectInvalid(r, "no activations");

  r = OneTensorRequest();
  r.mutable_activations(0)->add_shape(1);
  ExpectInvalid(r, "activations[0] (layer 3): shape must be 2-D");

  r = OneTensorRequest();
  r.mutable_activations(0)->set_shape(0, 0);
  ExpectInvalid(r, "2-D and positive");

  r = OneTensorRequest();
  r.mutable_activations(0)->set_dtype(rvd::v1::DType(99));
  ExpectInvalid(r, "unknown dtype 99");

  r = OneTensorRequest();
  r.mutable_activations(0)->mutable_data()->pop_back();
  ExpectInvalid(r, "23 bytes do not hold a [2, 3] f32 matrix (24 bytes)");

  r = OneTensorRequest();
  r.mutable_activations(0)->set_dtype(rvd::v1::DTYPE_BF16);  // 12 bytes wanted
  ExpectInvalid(r, "24 bytes do not hold a [2, 3] bf16 matrix (12 bytes)");

  r = OneTensorRequest();
  *r.add_activations() = F32Tensor(3, 1, 2, {1, 2});
  ExpectInvalid(r, "activations[1] (layer 3): layer sent twice");

  // Both sides over the limit; one side over it alone is fine (checked
  // without bytes: the shape is refused first).
  r = OneTensorRequest();
  r.mutable_activations(0)->set_shape(0, kMaxActivationSide + 1);
  r.mutable_activations(0)->set_shape(1, kMaxActivationSide + 1);
  ExpectInvalid(r, "the smaller side exceeds the limit of 4096");

  r = OneTensorRequest();
  r.mutable_activations(0)->set_shape(0, 1);
  r.mutable_activations(0)->set_shape(1, int64_t{1} << 45);
  ExpectInvalid(r, "shape too large");

  r = OneTensorRequest();
  for (uint32_t l = 0; l < static_cast<uint32_t>(kMaxActivationTensors); ++l) {
    *r.add_activations() = F32Tensor(100 + l, 1, 1, {1});
  }
  ExpectInvalid(r, "4097 activations; the limit is 4096");

  ExpectInvalid(OneTensorRequest(), "exceed max_request_bytes (23)",
                absl::StatusCode::kResourceExhausted, 23);
}

// ---- whole requests -----------------------------------------------------

std::vector<float> Gaussian(std::mt19937_64& rng, size_t n) {
  std::normal_distribution<float> d;
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

TEST(ComputeActivationStatsTest, MatchesTheOracleInRequestOrder) {
  // RVD_TEST_SEED=<printed seed> replays the inputs.
  const char* env = std::getenv("RVD_TEST_SEED");
  const uint64_t seed = env != nullptr ? std::strtoull(env, nullptr, 10) : std::random_device{}();
  std::printf("replay: RVD_TEST_SEED=%llu activations_test\n",
              static_cast<unsigned long long>(seed));
  SCOPED_TRACE(absl::StrCat("seed ", seed));
  std::mt19937_64 rng(seed);
  std::unique_ptr<Engine> engine = NewCpuEngine(2);
  MeasureActivationsRequest r;
  r.set_model_id("act-model");
  r.set_step(42);
  // Layers out of order (the answer keeps the request's), wide and tall,
  // a bf16 one and a rank-one one.
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{64, 24}, {10, 200}, {96, 96}};
  const std::vector<uint32_t> layers = {7, 2, 5};
  std::vector<std::vector<float>> values;
  for (size_t i = 0; i < shapes.size(); ++i) {
    values.push_back(Gaussian(rng, shapes[i].first * shapes[i].second));
    *r.add_activations() = F32Tensor(layers[i], shapes[i].first, shapes[i].second, values[i]);
  }
  {  // rank one, u v^T, sent as bf16 (u, v of small integers: exact in bf16)
    const int64_t rows = 33, cols = 17;
    std::vector<uint16_t> bits(rows * cols);
    std::vector<float> f(rows * cols);
    for (int64_t i = 0; i < rows; ++i) {
      for (int64_t j = 0; j < cols; ++j) {
        f[i * cols + j] = static_cast<float>((i % 5 + 1) * (j % 3 + 1));
        bits[i * cols + j] = FloatToBFloat16(f[i * cols + j]);
      }
    }
    ActivationTensor* a = r.add_activations();
    a->set_layer(0);
    a->set_dtype(rvd::v1::DTYPE_BF16);
    a->add_shape(rows);
    a->add_shape(cols);
    a->set_data(std::string(reinterpret_cast<const char*>(bits.data()), bits.size() * 2));
    values.push_back(f);
  }
  ASSERT_TRUE(ValidateActivations(r, 1 << 20).ok());
  absl::StatusOr<rvd::v1::MeasureActivationsResponse> resp = ComputeActivationStats(*engine, r);
  ASSERT_TRUE(resp.ok()) << resp.status();
  EXPECT_EQ(resp->model_id(), "act-model");
  EXPECT_EQ(resp->step(), 42);
  EXPECT_EQ(resp->backend(), "cpu");
  ASSERT_EQ(resp->stats_size(), 4);
  for (int i = 0; i < 4; ++i) {
    const ActivationTensor& a = r.activations(i);
    const rvd::v1::ActivationStats& st = resp->stats(i);
    EXPECT_EQ(st.layer(), a.layer());
    // The reference: the oracle's singular values of the same values.
    const MatrixView v{values[i].data(), a.shape(0), a.shape(1), a.shape(1), DType::kF32};
    absl::StatusOr<double> pr = OraclePR(v);
    ASSERT_TRUE(pr.ok());
    double f2 = 0;
    for (float x : values[i]) f2 += static_cast<double>(x) * x;
    EXPECT_NEAR(st.frobenius_norm(), std::sqrt(f2), 1e-12 * std::sqrt(f2)) << i;
    EXPECT_NEAR(st.participation_ratio(), *pr, 1e-9 * *pr) << i;
    EXPECT_GE(st.effective_rank(), 1.0);
    EXPECT_LE(st.effective_rank(), static_cast<double>(std::min(a.shape(0), a.shape(1))));
    EXPECT_NEAR(st.effective_rank(), std::exp(st.entropy()), 1e-12 * st.effective_rank());
  }
  EXPECT_DOUBLE_EQ(resp->stats(3).effective_rank(), 1.0);  // rank one
  EXPECT_GE(resp->elapsed_ms(), 0.0);

  // NaN in one activation: the error names it.
  values[1][5] = std::numeric_limits<float>::quiet_NaN();
  *r.mutable_activations(1) = F32Tensor(2, 10, 200, values[1]);
  resp = ComputeActivationStats(*engine, r);
  EXPECT_EQ(resp.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(resp.status().message()), HasSubstr("activations[1] (layer 2)"));
  EXPECT_THAT(std::string(resp.status().message()), HasSubstr("NaN or Inf"));

  std::atomic<bool> cancel{true};
  resp = ComputeActivationStats(*engine, r, &cancel);
  EXPECT_EQ(resp.status().code(), absl::StatusCode::kCancelled);
}

TEST(ComputeActivationStatsTest, DiagonalMatrixByHand) {
  std::unique_ptr<Engine> engine = NewCpuEngine(1);
  MeasureActivationsRequest r;
  r.set_model_id("m");
  *r.add_activations() = F32Tensor(0, 2, 2, {3, 0, 0, 4});  // s = (4, 3)
  absl::StatusOr<rvd::v1::MeasureActivationsResponse> resp = ComputeActivationStats(*engine, r);
  ASSERT_TRUE(resp.ok()) << resp.status();
  const double h = -(4.0 / 7) * std::log(4.0 / 7) - (3.0 / 7) * std::log(3.0 / 7);
  EXPECT_NEAR(resp->stats(0).frobenius_norm(), 5.0, 1e-14);
  EXPECT_NEAR(resp->stats(0).max_singular_value(), 4.0, 1e-14);
  EXPECT_NEAR(resp->stats(0).entropy(), h, 1e-14);
  EXPECT_NEAR(resp->stats(0).effective_rank(), std::exp(h), 1e-14);
  EXPECT_NEAR(resp->stats(0).participation_ratio(), 625.0 / (256 + 81), 1e-13);
}

}  // namespace
}  // namespace rvd

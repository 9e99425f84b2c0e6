#include "server/measure.h"

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/dtype_convert.h"
#include "server/cancel_watch.h"

namespace rvd {
namespace {

using rvd::v1::MeasureHeader;
using ::testing::HasSubstr;

// A layer's V as f32 bytes: Gaussian entries scaled per row, so that the
// spectrum differs from layer to layer.
std::string RandomV(int rows, int cols, std::mt19937_64& rng, double decay) {
  std::normal_distribution<float> normal;
  std::vector<float> v(rows * cols);
  for (int r = 0; r < rows; ++r) {
    const float scale = std::pow(r + 1.0, -decay);
    for (int c = 0; c < cols; ++c) v[r * cols + c] = scale * normal(rng);
  }
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4);
}

void AddSeparate(MeasureHeader& h, uint32_t layer, int kv, int d, int hidden) {
  rvd::v1::TensorSpec* t = h.add_tensors();
  t->set_name("model.layers." + std::to_string(layer) +
              ".self_attn.v_proj.weight");
  t->set_layer(layer);
  t->set_dtype(rvd::v1::DTYPE_F32);
  t->add_shape(kv * d);
  t->add_shape(hidden);
  t->set_layout(rvd::v1::V_LAYOUT_SEPARATE);
  t->mutable_geometry()->set_num_heads(kv * 2);
  t->mutable_geometry()->set_num_kv_heads(kv);
  t->mutable_geometry()->set_head_dim(d);
}

double Oracle(const std::string& bytes, int rows, int cols) {
  MatrixView view{bytes.data(), rows, cols, cols, DType::kF32};
  return *OraclePR(view);
}

class MeasureTest : public ::testing::Test {
 protected:
  // Eight layers of 2 kv heads x 8 dims over a hidden size of 48.
  void SetUp() override {
    header_.set_model_id("tiny-llama_v1.0:ft");
    header_.set_step(7);
    for (uint32_t l = 0; l < 8; ++l) {
      AddSeparate(header_, l, 2, 8, 48);
      data_.push_back(RandomV(16, 48, rng_, 0.1 * l));
    }
  }
  std::vector<std::string_view> Views() const {
    return std::vector<std::string_view>(data_.begin(), data_.end());
  }

  std::mt19937_64 rng_{1234};
  MeasureHeader header_;
  std::vector<std::string> data_;
  std::unique_ptr<Engine> engine_ = NewCpuEngine(2);
};

TEST_F(MeasureTest, RvIsLateOverEarlyGeometricMeanOfOraclePR) {
  ASSERT_TRUE(ValidateHeader(header_, 1 << 30).ok());
  absl::StatusOr<rvd::v1::Measurement> m =
      ComputeMeasurement(*engine_, header_, Views());
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_EQ(m->layers_size(), 8);
  std::vector<double> oracle;
  for (int l = 0; l < 8; ++l) {
    oracle.push_back(Oracle(data_[l], 16, 48));
    EXPECT_NEAR(m->layers(l).pr(), oracle[l], 2e-6 * oracle[l]);
    EXPECT_EQ(m->layers(l).head_pr_size(), 0);
  }
  // L = 8: early = {0, 1}, late = {6, 7}.
  EXPECT_THAT(m->early_layers(), ::testing::ElementsAre(0, 1));
  EXPECT_THAT(m->late_layers(), ::testing::ElementsAre(6, 7));
  const double expected =
      std::sqrt(oracle[6] * oracle[7]) / std::sqrt(oracle[0] * oracle[1]);
  ASSERT_TRUE(m->has_rv());
  EXPECT_NEAR(m->rv(), expected, 4e-6 * expected);
  EXPECT_EQ(m->model_id(), "tiny-llama_v1.0:ft");
  EXPECT_EQ(m->step(), 7);
  EXPECT_EQ(m->variant(), "algebraic");
  EXPECT_EQ(m->backend(), "cpu");
  EXPECT_FALSE(m->engine_version().empty());
  EXPECT_GT(m->timestamp().seconds(), 1700000000);
}

TEST_F(MeasureTest, PerHeadPRIsThePROfEachHeadsRows) {
  header_.set_per_head(true);
  absl::StatusOr<rvd::v1::Measurement> m =
      ComputeMeasurement(*engine_, header_, Views());
  ASSERT_TRUE(m.ok()) << m.status();
  for (int l = 0; l < 8; ++l) {
    ASSERT_EQ(m->layers(l).head_pr_size(), 2);
    for (int h = 0; h < 2; ++h) {
      std::string head = data_[l].substr(h * 8 * 48 * 4, 8 * 48 * 4);
      const double want = Oracle(head, 8, 48);
      EXPECT_NEAR(m->layers(l).head_pr(h), want, 2e-6 * want);
    }
  }
}

TEST_F(MeasureTest, ExplicitLayerSetsAreUsed) {
  header_.add_early_layers(2);
  header_.add_late_layers(5);
  absl::StatusOr<rvd::v1::Measurement> m =
      ComputeMeasurement(*engine_, header_, Views());
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_NEAR(m->rv(), m->layers(5).pr() / m->layers(2).pr(), 1e-12);
}

TEST_F(MeasureTest, ZeroLayerGivesPRZeroAndNoRv) {
  data_[7].assign(data_[7].size(), '\0');
  absl::StatusOr<rvd::v1::Measurement> m =
      ComputeMeasurement(*engine_, header_, Views());
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->layers(7).pr(), 0);
  EXPECT_FALSE(m->has_rv());
  EXPECT_THAT(m->warnings(), ::testing::Contains(HasSubstr("all zeros")));
}

TEST_F(MeasureTest, NaNIsRejectedNamingTheTensor) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(data_[3].data() + 100 * 4, &nan, 4);
  absl::StatusOr<rvd::v1::Measurement> m =
      ComputeMeasurement(*engine_, header_, Views());
  ASSERT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(m.status().message(), HasSubstr("layers.3.self_attn"));
}

TEST_F(MeasureTest, ConfiguredDefaultVariantServesRequestsThatNameNone) {
  header_.mutable_variant()->set_seed(3);
  absl::StatusOr<rvd::v1::Measurement> m =
      ComputeMeasurement(*engine_, header_, Views(), "sketch");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->variant(), "sketch");
  header_.mutable_variant()->set_name("naive");
  m = ComputeMeasurement(*engine_, header_, Views(), "sketch");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->variant(), "naive");
}

TEST_F(MeasureTest, FusedIsUnimplementedOnCpu) {
  header_.mutable_variant()->set_name("fused");
  ASSERT_TRUE(ValidateHeader(header_, 1 << 30).ok());
  absl::StatusOr<rvd::v1::Measurement> m =
      ComputeMeasurement(*engine_, header_, Views());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(m.status().message(), HasSubstr("cpu"));
}

TEST_F(MeasureTest, WrongByteCountIsRejected) {
  data_[2].pop_back();
  absl::StatusOr<rvd::v1::Measurement> m =
      ComputeMeasurement(*engine_, header_, Views());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(m.status().message(), HasSubstr("layers.2."));
}

TEST_F(MeasureTest, WrongLayoutIsCaught) {
  // A separate v_proj declared as phi3's fused qkv: the shape cannot match.
  header_.mutable_tensors(4)->set_layout(rvd::v1::V_LAYOUT_PHI3_QKV);
  absl::StatusOr<rvd::v1::Measurement> m =
      ComputeMeasurement(*engine_, header_, Views());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(m.status().message(), HasSubstr("layers.4."));
}

TEST(ValidateHeaderTest, RejectsBadRequestsWithReasons) {
  MeasureHeader h;
  h.set_model_id("m");
  EXPECT_THAT(ValidateHeader(h, 1 << 20).status().message(),
              HasSubstr("no tensors"));
  AddSeparate(h, 0, 1, 4, 8);
  EXPECT_TRUE(ValidateHeader(h, 1 << 20).ok());
  EXPECT_EQ(*ValidateHeader(h, 1 << 20), 4u * 8 * 4);
  EXPECT_EQ(ValidateHeader(h, 64).status().code(),
            absl::StatusCode::kResourceExhausted);

  MeasureHeader bad = h;
  bad.set_model_id("no spaces");
  EXPECT_THAT(ValidateHeader(bad, 1 << 20).status().message(),
              HasSubstr("invalid model_id"));
  bad.set_model_id(std::string(129, 'a'));
  EXPECT_FALSE(ValidateHeader(bad, 1 << 20).ok());
  bad = h;
  bad.mutable_variant()->set_name("magic");
  EXPECT_THAT(ValidateHeader(bad, 1 << 20).status().message(),
              HasSubstr("unknown variant"));
  bad = h;
  AddSeparate(bad, 0, 1, 4, 8);
  EXPECT_THAT(ValidateHeader(bad, 1 << 20).status().message(),
              HasSubstr("sent twice"));
  bad = h;
  bad.add_early_layers(0);
  bad.add_late_layers(3);
  EXPECT_THAT(ValidateHeader(bad, 1 << 20).status().message(),
              HasSubstr("late layer 3 is not among"));
  bad = h;
  bad.mutable_tensors(0)->set_dtype(rvd::v1::DTYPE_UNSPECIFIED);
  EXPECT_THAT(ValidateHeader(bad, 1 << 20).status().message(),
              HasSubstr("unknown dtype"));
  bad = h;
  bad.mutable_tensors(0)->add_shape(2);
  EXPECT_THAT(ValidateHeader(bad, 1 << 20).status().message(),
              HasSubstr("2-D"));
  bad = h;
  bad.mutable_tensors(0)->set_shape(0, int64_t{1} << 40);
  bad.mutable_tensors(0)->set_shape(1, int64_t{1} << 40);
  EXPECT_THAT(ValidateHeader(bad, 1 << 20).status().message(),
              HasSubstr("too large"));
}

TEST(DefaultLayerSetsTest, QuartersRoundUp) {
  std::vector<uint32_t> early, late;
  DefaultLayerSets({0}, &early, &late);
  EXPECT_THAT(early, ::testing::ElementsAre(0));
  EXPECT_THAT(late, ::testing::ElementsAre(0));
  DefaultLayerSets({0, 1, 2, 3, 4}, &early, &late);  // ceil(5/4) = 2
  EXPECT_THAT(early, ::testing::ElementsAre(0, 1));
  EXPECT_THAT(late, ::testing::ElementsAre(3, 4));
  DefaultLayerSets({3, 9, 10, 20}, &early, &late);
  EXPECT_THAT(early, ::testing::ElementsAre(3));
  EXPECT_THAT(late, ::testing::ElementsAre(20));
}

// Cancellation: a request cancelled while the engine computes (the client
// gone, its deadline passed, the shutdown grace run out: each sets the
// flag) stops inside the engine and leaves nothing in history.
History::Options SmallHistory() {
  History::Options o;
  o.capacity_per_model = 10;
  o.max_models = 4;
  return o;
}

// A one-layer request: `rows` x `cols` bf16 of seeded uniform values.
struct Bf16Request {
  MeasureHeader header;
  std::string bytes;
};
Bf16Request Bf16Layer(int rows, int cols, std::mt19937_64& rng) {
  Bf16Request r;
  r.header.set_model_id("big");
  AddSeparate(r.header, 0, rows / 128, 128, cols);
  r.header.mutable_tensors(0)->set_dtype(rvd::v1::DTYPE_BF16);
  r.bytes.resize(size_t{2} * rows * cols);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  auto* b = reinterpret_cast<uint16_t*>(r.bytes.data());
  for (size_t i = 0; i < r.bytes.size() / 2; ++i) b[i] = FloatToBFloat16(u(rng));
  return r;
}

double SecondsBetween(std::chrono::steady_clock::time_point a,
                      std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

TEST(MeasureCancelTest, CancelledDuringTheEngineCallStopsAndRecordsNothing) {
  const uint64_t seed = std::random_device()();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  SCOPED_TRACE(absl::StrCat("seed ", seed));
  std::mt19937_64 rng(seed);
  constexpr int kCols = 16384;
  // One 512 x 512 Gram tile's time on one thread: a 1024-row layer is two
  // diagonal tiles (half a tile each) and one full tile.
  double tile_s = 0;
  {
    const Bf16Request probe = Bf16Layer(1024, kCols, rng);
    std::unique_ptr<Engine> one = NewCpuEngine(1);
    const auto t0 = std::chrono::steady_clock::now();
    ASSERT_TRUE(ComputeMeasurement(*one, probe.header, {probe.bytes}).ok());
    tile_s = SecondsBetween(t0, std::chrono::steady_clock::now()) / 2;
  }
  // 4096 x 16384 bf16 (128 MiB): 36 tiles, ~18 tiles' time on two threads.
  const Bf16Request big = Bf16Layer(4096, kCols, rng);
  const std::vector<std::string_view> data = {big.bytes};
  std::unique_ptr<Engine> engine = NewCpuEngine(2);
  History history(NewMemLog(100), SmallHistory());

  std::atomic<bool> cancel{false};
  std::chrono::steady_clock::time_point flagged;
  std::thread setter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(150));
    flagged = std::chrono::steady_clock::now();
    cancel = true;
  });
  absl::StatusOr<rvd::v1::Measurement> m =
      ComputeMeasurement(*engine, big.header, data, "", &cancel);
  absl::Status recorded = m.status();
  if (m.ok()) recorded = RecordUnlessCancelled(history, *m, &cancel).status();
  const auto end = std::chrono::steady_clock::now();
  setter.join();
  EXPECT_TRUE(absl::IsCancelled(recorded)) << recorded;
  // The words the integration tests and an operator's log search look for.
  EXPECT_THAT(recorded.message(), HasSubstr("the result was not recorded"));
  EXPECT_EQ(history.log().LastSequence(), 0u);
  EXPECT_TRUE(history.index().Models().empty());
  // The engine stopped within the tiles in flight (one per thread, with
  // slack for a loaded machine), not after the layer's 18 tiles per thread.
  const double after = SecondsBetween(flagged, end);
  std::printf("a tile: %.3f s; stopped %.3f s after the flag\n", tile_s, after);
  EXPECT_LT(after, 4 * tile_s + 0.5);

  // The flag cleared, a request is computed and recorded.
  cancel = false;
  std::mt19937_64 small_rng(seed);
  const Bf16Request small = Bf16Layer(256, 512, small_rng);
  m = ComputeMeasurement(*engine, small.header, {small.bytes}, "", &cancel);
  ASSERT_TRUE(m.ok()) << m.status();
  absl::StatusOr<MeasurementLog::Entry> stored = RecordUnlessCancelled(history, *m, &cancel);
  ASSERT_TRUE(stored.ok()) << stored.status();
  EXPECT_EQ((*stored)->sequence(), 1u);
}

TEST(MeasureCancelTest, FlagSetAfterComputingStillRecordsNothing) {
  std::mt19937_64 rng(7);
  MeasureHeader header;
  header.set_model_id("m");
  AddSeparate(header, 0, 2, 8, 48);
  const std::string bytes = RandomV(16, 48, rng, 0.0);
  const std::vector<std::string_view> data = {bytes};
  std::unique_ptr<Engine> engine = NewCpuEngine(1);
  History history(NewMemLog(100), SmallHistory());
  std::atomic<bool> cancel{false};
  absl::StatusOr<rvd::v1::Measurement> m = ComputeMeasurement(*engine, header, data, "", &cancel);
  ASSERT_TRUE(m.ok()) << m.status();
  cancel = true;  // the client left between computing and recording
  EXPECT_TRUE(absl::IsCancelled(RecordUnlessCancelled(history, *m, &cancel).status()));
  EXPECT_EQ(history.log().LastSequence(), 0u);
  // Set before computing: nothing is computed.
  EXPECT_TRUE(absl::IsCancelled(ComputeMeasurement(*engine, header, data, "", &cancel).status()));
}

// The service's flags: a call whose caller has gone gets its flag set by
// the watch's thread; CancelAll (the shutdown grace) sets every flag, and
// every later call's at registration.
TEST(CancelWatchTest, SetsTheFlagOfAGoneCallAndEveryFlagAfterCancelAll) {
  CancelWatch watch(absl::Milliseconds(5));
  std::atomic<bool> gone{false}, flag{false}, other{false};
  {
    CancelWatch::Watch a(watch, [&] { return gone.load(); }, &flag);
    CancelWatch::Watch b(watch, [] { return false; }, &other);
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    EXPECT_FALSE(flag.load());
    gone = true;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (!flag.load() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    EXPECT_TRUE(flag.load());
    EXPECT_FALSE(other.load());
    watch.CancelAll();
    EXPECT_TRUE(other.load());
  }
  std::atomic<bool> later{false};
  CancelWatch::Watch c(watch, [] { return false; }, &later);
  EXPECT_TRUE(later.load());
}

}  // namespace
}  // namespace rvd

// The live RPCs through RvdService (RegisterLiveModel, NotifyStep,
// UnregisterLiveModel) on the CPU, with the host-memory fake LiveDevice: the
// handlers reach the registry, a live measurement is stored as every other
// (GetLatest, /metrics' rvd_measurements_total), errors keep their codes,
// and a service without a registry answers UNIMPLEMENTED. PR against
// OraclePR; the seed is printed (RVD_TEST_SEED replays).
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/pr_check.h"
#include "kernels/test_matrices.h"
#include "server/fake_live_device.h"
#include "server/history.h"
#include "server/live_registry.h"
#include "server/metrics.h"
#include "server/service.h"

namespace rvd {
namespace {

class LiveServiceTest : public ::testing::Test {
 protected:
  LiveServiceTest()
      : metrics_(MetricsOptions{},
                 MetricsSources{&history_.index(), &engine_, &pool_, &history_.bus(), nullptr}),
        service_(engine_, pool_, history_, metrics_, ServiceLimits{}) {}

  void SetUp() override {
    LiveOptions o;
    o.watch_period = absl::Milliseconds(20);
    live_ = std::make_unique<LiveRegistry>(engine_, pool_, o, [this](rvd::v1::Measurement m) {
      return service_.RecordLiveMeasurement(std::move(m));
    });
    service_.set_live(live_.get());
    // One separate V of 2 kv heads x 16 rows over 64 columns, in a segment.
    std::mt19937_64 rng = SeededRng("live_service");
    const std::vector<double> w = MakeMatrix(rng, 32, 64, Spectrum::kPowerLaw);
    values_.assign(w.begin(), w.end());
    uint8_t* seg = engine_.fake().AddSegment(std::string(64, 'S'), 32 * 64 * 4);
    std::memcpy(seg, values_.data(), values_.size() * 4);
  }
  void TearDown() override { live_->Stop(); }

  rvd::v1::RegisterLiveModelRequest Request() {
    rvd::v1::RegisterLiveModelRequest r;
    r.mutable_header()->set_model_id("svc");
    r.set_device_uuid(*engine_.fake().DeviceUuid());
    r.set_producer_pid(getpid());
    rvd::v1::LiveTensor* t = r.add_tensors();
    t->mutable_spec()->set_name("v");
    t->mutable_spec()->set_dtype(rvd::v1::DTYPE_F32);
    t->mutable_spec()->add_shape(32);
    t->mutable_spec()->add_shape(64);
    t->mutable_spec()->set_layout(rvd::v1::V_LAYOUT_SEPARATE);
    t->mutable_spec()->mutable_geometry()->set_num_heads(4);
    t->mutable_spec()->mutable_geometry()->set_num_kv_heads(2);
    t->mutable_spec()->mutable_geometry()->set_head_dim(16);
    t->set_handle_kind(rvd::v1::IPC_HANDLE_KIND_CUDA_IPC);
    t->set_handle(std::string(64, 'S'));
    t->set_segment_bytes(32 * 64 * 4);
    t->add_strides(64);
    t->add_strides(1);
    return r;
  }

  double Oracle() const {
    return *OraclePR(MatrixView{values_.data(), 32, 64, 64, DType::kF32});
  }

  HostLiveEngine engine_;
  ComputePool pool_{2, 64};
  History history_{NewMemLog(4096), History::Options{1000, 100, 4, 16, {}}};
  Metrics metrics_;
  RvdService service_;
  std::vector<float> values_;
  std::unique_ptr<LiveRegistry> live_;
};

TEST_F(LiveServiceTest, TheRpcsReachTheRegistryAndStoreAsEveryMeasurement) {
  grpc::ServerContext ctx;
  rvd::v1::RegisterLiveModelResponse reg;
  rvd::v1::RegisterLiveModelRequest req = Request();
  ASSERT_TRUE(service_.RegisterLiveModel(&ctx, &req, &reg).ok());
  EXPECT_EQ(reg.segments_mapped(), 1u);

  rvd::v1::NotifyStepRequest n;
  n.set_model_id("svc");
  n.set_step(3);
  rvd::v1::NotifyStepResponse nr;
  ASSERT_TRUE(service_.NotifyStep(&ctx, &n, &nr).ok());
  EXPECT_TRUE(nr.snapshot());
  EXPECT_EQ(nr.reason(), "first");
  live_->Drain();

  rvd::v1::GetLatestRequest g;
  g.set_model_id("svc");
  rvd::v1::Measurement latest;
  ASSERT_TRUE(service_.GetLatest(&ctx, &g, &latest).ok());
  EXPECT_EQ(latest.step(), 3);
  EXPECT_GT(latest.sequence(), 0u);
  ASSERT_EQ(latest.layers_size(), 1);
  EXPECT_TRUE(WithinTolerance(latest.layers(0).pr(), Oracle(), Tolerance{0, 1e-5}))
      << latest.layers(0).pr() << " vs " << Oracle() << " (seed " << TestSeed() << ")";
  bool counted = false;
  for (const prometheus::MetricFamily& f : metrics_.Collect()) {
    if (f.name != "rvd_measurements_total") continue;
    for (const auto& m : f.metric) {
      for (const auto& l : m.label) counted |= l.name == "model_id" && l.value == "svc";
    }
  }
  EXPECT_TRUE(counted) << "the live measurement is missing from rvd_measurements_total";

  // Errors keep their codes through the handlers.
  n.set_step(3);
  EXPECT_EQ(service_.NotifyStep(&ctx, &n, &nr).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  n.set_model_id("nobody");
  EXPECT_EQ(service_.NotifyStep(&ctx, &n, &nr).error_code(), grpc::StatusCode::NOT_FOUND);
  req.set_device_uuid("GPU-other");
  EXPECT_EQ(service_.RegisterLiveModel(&ctx, &req, &reg).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);

  rvd::v1::UnregisterLiveModelRequest u;
  u.set_model_id("svc");
  rvd::v1::UnregisterLiveModelResponse ur;
  ASSERT_TRUE(service_.UnregisterLiveModel(&ctx, &u, &ur).ok());
  EXPECT_EQ(service_.UnregisterLiveModel(&ctx, &u, &ur).error_code(),
            grpc::StatusCode::NOT_FOUND);
  // The history stays.
  ASSERT_TRUE(service_.GetLatest(&ctx, &g, &latest).ok());
}

TEST_F(LiveServiceTest, WithoutARegistryTheRpcsAreUnimplemented) {
  service_.set_live(nullptr);
  grpc::ServerContext ctx;
  rvd::v1::RegisterLiveModelRequest req = Request();
  rvd::v1::RegisterLiveModelResponse reg;
  EXPECT_EQ(service_.RegisterLiveModel(&ctx, &req, &reg).error_code(),
            grpc::StatusCode::UNIMPLEMENTED);
  rvd::v1::NotifyStepRequest n;
  rvd::v1::NotifyStepResponse nr;
  EXPECT_EQ(service_.NotifyStep(&ctx, &n, &nr).error_code(), grpc::StatusCode::UNIMPLEMENTED);
  rvd::v1::UnregisterLiveModelRequest u;
  rvd::v1::UnregisterLiveModelResponse ur;
  EXPECT_EQ(service_.UnregisterLiveModel(&ctx, &u, &ur).error_code(),
            grpc::StatusCode::UNIMPLEMENTED);
}

}  // namespace
}  // namespace rvd

// The live registry on the CPU: a host-memory LiveDevice (fake_live_device.h)
// and the CPU engine. Registration (every refusal, nothing kept after one),
// segment sharing, unregister, lease expiry, producer exit, the trigger
// policy step for step against recorded history, snapshot buffers under a
// measurement that is still reading, and the metrics. PRs are checked
// against OraclePR; inputs come from TestSeed() (printed; RVD_TEST_SEED
// replays).
#include "server/live_registry.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/time_util.h"
#include "gtest/gtest.h"
#include "kernels/pr_check.h"
#include "kernels/test_matrices.h"
#include "kernels/v_layout.h"
#include "server/fake_live_device.h"
#include "server/history.h"
#include "server/live_metrics.h"

namespace rvd {
namespace {

using rvd::v1::LiveTensor;
using rvd::v1::Measurement;
using rvd::v1::NotifyStepRequest;
using rvd::v1::NotifyStepResponse;
using rvd::v1::RegisterLiveModelRequest;
using rvd::v1::RegisterLiveModelResponse;
using ::google::protobuf::util::TimeUtil;
using ::testing::HasSubstr;

// The CPU engine's algebraic PR (f32 data, float64 reductions) against the
// float64 SVD.
constexpr Tolerance kTol{0.0, 1e-5};

std::string Handle(char tag) { return std::string(kIpcHandleBytes, tag); }

// One live V tensor: its values (row-major, contiguous, the weights now)
// and where they sit in a fake segment (row stride ld).
struct Layer {
  uint32_t layer = 0;
  rvd::v1::VLayout layout = rvd::v1::V_LAYOUT_SEPARATE;
  HeadGeometry g;
  int64_t rows = 0, cols = 0, ld = 0;
  std::string handle;
  uint64_t offset = 0;
  uint64_t segment_bytes = 0;
  uint8_t* segment = nullptr;
  std::vector<float> values;

  // Copies `values` into the segment.
  void Write() const {
    for (int64_t r = 0; r < rows; ++r) {
      std::memcpy(segment + offset + static_cast<size_t>(r * ld) * 4, &values[r * cols],
                  static_cast<size_t>(cols) * 4);
    }
  }
  // V's values, row after row (what rvd snapshots).
  std::vector<float> V() const {
    absl::StatusOr<VSlices> s = SliceV(TensorView{values.data(), rows, cols, DType::kF32},
                                       static_cast<VLayout>(layout), g);
    EXPECT_TRUE(s.ok()) << s.status();
    std::vector<float> out;
    const auto* base = static_cast<const float*>(s->layer.data);
    for (int64_t r = 0; r < s->layer.rows; ++r) {
      out.insert(out.end(), base + r * s->layer.ld, base + r * s->layer.ld + s->layer.cols);
    }
    return out;
  }
  // The oracle's PR of V, then of each kv head.
  std::vector<double> Reference() const {
    absl::StatusOr<VSlices> s = SliceV(TensorView{values.data(), rows, cols, DType::kF32},
                                       static_cast<VLayout>(layout), g);
    EXPECT_TRUE(s.ok()) << s.status();
    std::vector<double> out{*OraclePR(s->layer)};
    for (const MatrixView& h : s->heads) out.push_back(*OraclePR(h));
    return out;
  }
};

class LiveRegistryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    rng_ = SeededRng(::testing::UnitTest::GetInstance()->current_test_info()->name());
    registry_ = Make(Options());
  }

  LiveOptions Options() {
    LiveOptions o;
    o.watch_period = absl::Milliseconds(20);
    return o;
  }
  std::unique_ptr<LiveRegistry> Make(const LiveOptions& o) {
    return std::make_unique<LiveRegistry>(engine_, pool_, o, [this](Measurement m) {
      return history_.Add(std::move(m));
    });
  }

  // Four layers in two segments: a separate V (padded rows), phi3's fused
  // QKV, gpt_neox's interleaved heads (a blocked view) and gpt2's Conv1D
  // (heads are column blocks), each with its own spectrum.
  std::vector<Layer> Model(char seg_a = 'A', char seg_b = 'B') {
    std::vector<Layer> layers(4);
    auto shape = [](Layer& l, uint32_t layer, rvd::v1::VLayout layout, HeadGeometry g,
                    int64_t rows, int64_t cols, int64_t ld) {
      l.layer = layer;
      l.layout = layout;
      l.g = g;
      l.rows = rows;
      l.cols = cols;
      l.ld = ld;
    };
    shape(layers[0], 0, rvd::v1::V_LAYOUT_SEPARATE, {4, 2, 8}, 16, 32, 40);
    shape(layers[1], 1, rvd::v1::V_LAYOUT_PHI3_QKV, {4, 2, 8}, 64, 32, 32);
    shape(layers[2], 2, rvd::v1::V_LAYOUT_GPT_NEOX_QKV, {2, 2, 8}, 48, 32, 36);
    shape(layers[3], 3, rvd::v1::V_LAYOUT_GPT2_CONV1D, {2, 2, 8}, 16, 48, 48);
    // Segment A: layers 0 and 1; B: 2 and 3 (sizes with room to spare).
    layers[0].handle = layers[1].handle = Handle(seg_a);
    layers[2].handle = layers[3].handle = Handle(seg_b);
    layers[0].offset = 256;
    layers[1].offset = 256 + 16 * 40 * 4 + 64;
    layers[2].offset = 0;
    layers[3].offset = 48 * 36 * 4 + 128;
    const uint64_t a_bytes = layers[1].offset + 64 * 32 * 4 + 32;
    const uint64_t b_bytes = layers[3].offset + 16 * 48 * 4;
    uint8_t* a = engine_.fake().AddSegment(layers[0].handle, a_bytes);
    uint8_t* b = engine_.fake().AddSegment(layers[2].handle, b_bytes);
    for (Layer& l : layers) {
      const bool in_a = l.handle == layers[0].handle;
      l.segment = in_a ? a : b;
      l.segment_bytes = in_a ? a_bytes : b_bytes;
      Fill(l, kAllSpectra[(l.layer + spectrum_shift_) % std::size(kAllSpectra)]);
    }
    return layers;
  }

  void Fill(Layer& l, Spectrum s) {
    const std::vector<double> w = MakeMatrix(rng_, l.rows, l.cols, s);
    l.values.assign(w.begin(), w.end());
    l.Write();
  }
  // W += eps * ||W||_max * noise on every layer (a training step).
  void Perturb(std::vector<Layer>& layers, double eps) {
    std::normal_distribution<double> noise;
    for (Layer& l : layers) {
      double scale = 0;
      for (float v : l.values) scale = std::max(scale, double(std::fabs(v)));
      for (float& v : l.values) v = static_cast<float>(v + eps * scale * noise(rng_));
      l.Write();
    }
  }

  RegisterLiveModelRequest Request(const std::string& id, const std::vector<Layer>& layers,
                                   bool inference = false) {
    RegisterLiveModelRequest r;
    r.mutable_header()->set_model_id(id);
    r.mutable_header()->set_step(0);
    r.mutable_header()->set_per_head(true);
    r.set_device_uuid(*engine_.fake().DeviceUuid());
    r.set_producer_pid(getpid());
    r.mutable_policy()->set_mode(inference ? rvd::v1::TriggerPolicy::MODE_INFERENCE
                                           : rvd::v1::TriggerPolicy::MODE_TRAINING);
    for (const Layer& l : layers) {
      LiveTensor* t = r.add_tensors();
      t->mutable_spec()->set_name(absl::StrCat("model.layers.", l.layer, ".attn"));
      t->mutable_spec()->set_layer(l.layer);
      t->mutable_spec()->set_dtype(rvd::v1::DTYPE_F32);
      t->mutable_spec()->add_shape(l.rows);
      t->mutable_spec()->add_shape(l.cols);
      t->mutable_spec()->set_layout(l.layout);
      t->mutable_spec()->mutable_geometry()->set_num_heads(l.g.num_heads);
      t->mutable_spec()->mutable_geometry()->set_num_kv_heads(l.g.num_kv_heads);
      t->mutable_spec()->mutable_geometry()->set_head_dim(l.g.head_dim);
      t->set_handle_kind(rvd::v1::IPC_HANDLE_KIND_CUDA_IPC);
      t->set_handle(l.handle);
      t->set_segment_bytes(l.segment_bytes);
      t->set_offset_bytes(l.offset);
      t->add_strides(l.ld);
      t->add_strides(1);
    }
    return r;
  }

  absl::StatusOr<NotifyStepResponse> Notify(const std::string& id, int64_t step,
                                            bool force = false) {
    NotifyStepRequest n;
    n.set_model_id(id);
    n.set_step(step);
    n.set_force(force);
    n.set_producer_event_handle(Handle('\x01'));
    return registry_->Notify(n);
  }

  // Every layer's and head's PR of `m` against the oracle of `layers`.
  void ExpectMatches(const Measurement& m, const std::vector<Layer>& layers) {
    ASSERT_EQ(m.layers_size(), static_cast<int>(layers.size()));
    std::vector<double> got, ref;
    std::vector<double> layer_ref;
    for (size_t i = 0; i < layers.size(); ++i) {
      const std::vector<double> r = layers[i].Reference();
      ASSERT_EQ(m.layers(i).head_pr_size() + 1, static_cast<int>(r.size()));
      got.push_back(m.layers(i).pr());
      for (double h : m.layers(i).head_pr()) got.push_back(h);
      ref.insert(ref.end(), r.begin(), r.end());
      layer_ref.push_back(r[0]);
    }
    const CheckResult c = CheckPR(got, ref, kTol);
    EXPECT_EQ(c.mismatches, 0) << "step " << m.step() << " (seed " << TestSeed() << ")\n"
                               << c.report;
    // R_V: the last quarter over the first (one layer each of four).
    ASSERT_TRUE(m.has_rv());
    EXPECT_NEAR(m.rv(), layer_ref[3] / layer_ref[0], 1e-5 * m.rv());
    EXPECT_EQ(m.variant(), "algebraic");
    EXPECT_EQ(m.backend(), "cpu");
    EXPECT_EQ(m.engine_version(), "host-live-1");
  }

  std::vector<Measurement> Recorded(const std::string& id) {
    absl::StatusOr<std::vector<MeasurementLog::Entry>> kept = history_.index().Get(id, 0);
    std::vector<Measurement> out;
    if (!kept.ok()) return out;
    for (const auto& e : *kept) out.push_back(*e);
    return out;
  }

  // Nothing of the fake is open any more (after releases; a release by the
  // watcher lets go of the model just after it counts it).
  void ExpectNothingHeld() {
    Eventually([&] {
      const FakeLiveDevice::Counts c = engine_.fake().counts();
      return c.segments_open == 0 && c.events_open == 0 && c.bytes_allocated == 0 &&
             c.snapshots_open == 0;
    });
    const FakeLiveDevice::Counts c = engine_.fake().counts();
    EXPECT_EQ(c.segments_open, 0);
    EXPECT_EQ(c.events_open, 0);
    EXPECT_EQ(c.bytes_allocated, 0u);
    EXPECT_EQ(c.snapshots_open, 0);
  }

  // Waits (up to 5 s) for `done`.
  static bool Eventually(const std::function<bool()>& done) {
    for (int i = 0; i < 500; ++i) {
      if (done()) return true;
      absl::SleepFor(absl::Milliseconds(10));
    }
    return done();
  }

  int spectrum_shift_ = 0;
  std::mt19937_64 rng_;
  HostLiveEngine engine_;
  ComputePool pool_{2, 64};
  History history_{NewMemLog(4096), History::Options{1000, 100, 4, 16, {}}};
  std::unique_ptr<LiveRegistry> registry_;  // last: goes first
};

TEST_F(LiveRegistryTest, InferenceMeasuresAtRegistrationAndAnswersFromIt) {
  std::vector<Layer> layers = Model();
  absl::StatusOr<RegisterLiveModelResponse> r = registry_->Register(Request("inf", layers, true));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->segments_mapped(), 2u);
  EXPECT_EQ(r->segments_reused(), 0u);
  EXPECT_EQ(r->lease_seconds(), 600u);
  EXPECT_EQ(r->rvd_event_handle(), std::string(kIpcHandleBytes, '\xee'));
  EXPECT_EQ(r->snapshot_bytes(), 0u);  // inference keeps no snapshot
  ASSERT_TRUE(r->has_measurement());
  EXPECT_EQ(r->measurement().step(), 0);
  EXPECT_GT(r->measurement().sequence(), 0u);
  EXPECT_TRUE(r->measurement().has_notified());  // the registration's receipt
  EXPECT_LE(TimeUtil::TimestampToNanoseconds(r->measurement().notified()),
            TimeUtil::TimestampToNanoseconds(r->measurement().timestamp()));
  ExpectMatches(r->measurement(), layers);

  Perturb(layers, 0.5);  // an inference model is not looked at again
  for (int64_t step = 1; step <= 3; ++step) {
    absl::StatusOr<NotifyStepResponse> n = Notify("inf", step);
    ASSERT_TRUE(n.ok()) << n.status();
    EXPECT_FALSE(n->snapshot());
    EXPECT_EQ(n->reason(), "inference");
    EXPECT_EQ(n->last_sequence(), r->measurement().sequence());
  }
  registry_->Drain();
  EXPECT_EQ(Recorded("inf").size(), 1u);
  // Forced, it measures the weights now.
  absl::StatusOr<NotifyStepResponse> f = Notify("inf", 4, true);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_TRUE(f->snapshot());
  EXPECT_EQ(f->reason(), "forced");
  registry_->Drain();
  ASSERT_EQ(Recorded("inf").size(), 2u);
  EXPECT_EQ(Recorded("inf")[1].step(), 4);
  ExpectMatches(Recorded("inf")[1], layers);
  EXPECT_EQ(engine_.fake().counts().bytes_allocated, 0u);
  ASSERT_TRUE(registry_->Unregister("inf").ok());
  ExpectNothingHeld();
}

// A pid that is not running: a child that exited and was reaped.
int32_t DeadPid() {
  const pid_t child = fork();
  if (child == 0) _exit(0);
  waitpid(child, nullptr, 0);
  return child;
}

TEST_F(LiveRegistryTest, EveryRefusalNamesItsCauseAndKeepsNothing) {
  const std::vector<Layer> layers = Model();
  // A model already registered must not be touched by the refusals.
  ASSERT_TRUE(registry_->Register(Request("keep", layers)).ok());
  const FakeLiveDevice::Counts before = engine_.fake().counts();
  struct Case {
    const char* what;
    std::function<void(RegisterLiveModelRequest&)> mutate;
    absl::StatusCode code;
    const char* message;
  };
  const int32_t dead = DeadPid();
  const std::vector<Case> cases = {
      {"tensors in the header", [](auto& r) { r.mutable_header()->add_tensors(); },
       absl::StatusCode::kInvalidArgument, "header.tensors must be empty"},
      {"bad model id", [](auto& r) { r.mutable_header()->set_model_id("a b"); },
       absl::StatusCode::kInvalidArgument, "invalid model_id"},
      {"no tensors", [](auto& r) { r.clear_tensors(); }, absl::StatusCode::kInvalidArgument,
       "no tensors"},
      {"a layer twice",
       [](auto& r) { r.mutable_tensors(1)->mutable_spec()->set_layer(0); },
       absl::StatusCode::kInvalidArgument, "sent twice"},
      {"late layer not sent",
       [](auto& r) {
         r.mutable_header()->add_early_layers(0);
         r.mutable_header()->add_late_layers(9);
       },
       absl::StatusCode::kInvalidArgument, "late layer 9"},
      {"unknown variant", [](auto& r) { r.mutable_header()->mutable_variant()->set_name("x"); },
       absl::StatusCode::kInvalidArgument, "unknown variant"},
      {"no producer pid", [](auto& r) { r.set_producer_pid(0); },
       absl::StatusCode::kInvalidArgument, "producer_pid 0"},
      {"producer not running", [dead](auto& r) { r.set_producer_pid(dead); },
       absl::StatusCode::kFailedPrecondition, "is not a running process"},
      {"another device", [](auto& r) { r.set_device_uuid("GPU-11111111-2222"); },
       absl::StatusCode::kFailedPrecondition, "is not rvd's device"},
      {"no handle kind",
       [](auto& r) { r.mutable_tensors(2)->set_handle_kind(rvd::v1::IPC_HANDLE_KIND_UNSPECIFIED); },
       absl::StatusCode::kInvalidArgument, "give TORCH or CUDA_IPC"},
      {"short CUDA_IPC handle",
       [](auto& r) { r.mutable_tensors(0)->set_handle(std::string(63, 'A')); },
       absl::StatusCode::kInvalidArgument, "of 64 bytes; got 63"},
      {"TORCH version 1",
       [](auto& r) {
         r.mutable_tensors(0)->set_handle_kind(rvd::v1::IPC_HANDLE_KIND_TORCH);
         r.mutable_tensors(0)->set_handle(std::string("\x01" "c") + Handle('A'));
       },
       absl::StatusCode::kInvalidArgument, "rvd reads version 2"},
      {"TORCH type x",
       [](auto& r) {
         r.mutable_tensors(0)->set_handle_kind(rvd::v1::IPC_HANDLE_KIND_TORCH);
         r.mutable_tensors(0)->set_handle(std::string("\x02x") + Handle('A'));
       },
       absl::StatusCode::kInvalidArgument, "rvd reads 'c'"},
      {"TORCH 'c' of 60 bytes",
       [](auto& r) {
         r.mutable_tensors(0)->set_handle_kind(rvd::v1::IPC_HANDLE_KIND_TORCH);
         r.mutable_tensors(0)->set_handle(std::string("\x02" "c") + std::string(60, 'A'));
       },
       absl::StatusCode::kInvalidArgument, "carries 60 bytes"},
      {"a handle that does not open",
       [](auto& r) {
         r.mutable_tensors(3)->set_handle(Handle('Z'));
       },
       absl::StatusCode::kInvalidArgument, "does not map"},
      {"column-major strides",
       [](auto& r) {
         r.mutable_tensors(1)->clear_strides();
         r.mutable_tensors(1)->add_strides(1);
         r.mutable_tensors(1)->add_strides(64);
       },
       absl::StatusCode::kInvalidArgument, "rvd takes row-major tensors"},
      {"ld below the columns",
       [](auto& r) { r.mutable_tensors(0)->set_strides(0, 31); },
       absl::StatusCode::kInvalidArgument, "ld >= 32"},
      {"outside the declared segment",
       [](auto& r) { r.mutable_tensors(1)->set_offset_bytes(r.tensors(1).segment_bytes()); },
       absl::StatusCode::kInvalidArgument, "lies outside its segment"},
      {"outside the mapped segment",
       [](auto& r) {
         for (int i : {0, 1}) r.mutable_tensors(i)->set_segment_bytes(1 << 20);
         r.mutable_tensors(1)->set_offset_bytes((1 << 20) - 64 * 32 * 4);
       },
       absl::StatusCode::kInvalidArgument, "mapped with"},
      {"misaligned offset", [](auto& r) { r.mutable_tensors(0)->set_offset_bytes(258); },
       absl::StatusCode::kInvalidArgument, "not a multiple of the element size"},
      {"shape against geometry",
       [](auto& r) { r.mutable_tensors(1)->mutable_spec()->mutable_geometry()->set_num_kv_heads(4); },
       absl::StatusCode::kInvalidArgument, "expected a tensor of shape"},
      {"negative threshold", [](auto& r) { r.mutable_policy()->set_delta_threshold(-1); },
       absl::StatusCode::kInvalidArgument, "delta_threshold"},
  };
  for (const Case& c : cases) {
    RegisterLiveModelRequest r = Request("refused", layers);
    c.mutate(r);
    absl::StatusOr<RegisterLiveModelResponse> got = registry_->Register(r);
    EXPECT_EQ(got.status().code(), c.code) << c.what << ": " << got.status();
    EXPECT_THAT(std::string(got.status().message()), HasSubstr(c.message)) << c.what;
    const FakeLiveDevice::Counts now = engine_.fake().counts();
    EXPECT_EQ(now.segments_open, before.segments_open) << c.what;
    EXPECT_EQ(now.events_open, before.events_open) << c.what;
    EXPECT_EQ(now.bytes_allocated, before.bytes_allocated) << c.what;
  }
  EXPECT_EQ(registry_->Stats().models, 1);
  // The model registered first still works.
  absl::StatusOr<NotifyStepResponse> n = Notify("keep", 1);
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_TRUE(n->snapshot());
  registry_->Drain();
  ASSERT_EQ(Recorded("keep").size(), 1u);
  ExpectMatches(Recorded("keep")[0], layers);
}

TEST_F(LiveRegistryTest, RefusalsThatDependOnTheDaemon) {
  const std::vector<Layer> layers = Model();
  // A backend without a device.
  {
    std::unique_ptr<Engine> cpu = NewCpuEngine(1);
    LiveRegistry plain(*cpu, pool_, Options(), [this](Measurement m) {
      return history_.Add(std::move(m));
    });
    absl::StatusOr<RegisterLiveModelResponse> r = plain.Register(Request("m", layers));
    EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(std::string(r.status().message()), HasSubstr("MeasureStream"));
  }
  // The device memory cap: the snapshot buffers do not fit.
  engine_.fake().set_max_bytes(1000);
  absl::StatusOr<RegisterLiveModelResponse> r = registry_->Register(Request("m", layers));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted) << r.status();
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("snapshot buffers"));
  ExpectNothingHeld();
  engine_.fake().set_max_bytes(uint64_t{1} << 30);
  // max_live_models.
  LiveOptions o = Options();
  o.max_live_models = 1;
  registry_ = Make(o);
  ASSERT_TRUE(registry_->Register(Request("one", layers)).ok());
  r = registry_->Register(Request("two", layers));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("max_live_models"));
  // The same model again by the same producer replaces it.
  ASSERT_TRUE(registry_->Register(Request("one", layers)).ok());
  EXPECT_EQ(registry_->Stats().releases.at("replaced"), 1);
  // By another (running) producer: ALREADY_EXISTS.
  const pid_t other = fork();
  if (other == 0) {
    pause();
    _exit(0);
  }
  RegisterLiveModelRequest theirs = Request("one", layers);
  theirs.set_producer_pid(other);
  r = registry_->Register(theirs);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kAlreadyExists) << r.status();
  kill(other, SIGKILL);
  waitpid(other, nullptr, 0);
  registry_.reset();
  ExpectNothingHeld();
}

TEST_F(LiveRegistryTest, SegmentsAreMappedOncePerProducerAndSharedByItsModels) {
  const std::vector<Layer> layers = Model();
  absl::StatusOr<RegisterLiveModelResponse> a = registry_->Register(Request("a", layers));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->segments_mapped(), 2u);
  EXPECT_EQ(a->segments_reused(), 0u);
  // A second model over the same tensors: both segments reused.
  absl::StatusOr<RegisterLiveModelResponse> b = registry_->Register(Request("b", layers));
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->segments_mapped(), 2u);
  EXPECT_EQ(b->segments_reused(), 2u);
  FakeLiveDevice::Counts c = engine_.fake().counts();
  EXPECT_EQ(c.opens.at(Handle('A')), 1);
  EXPECT_EQ(c.opens.at(Handle('B')), 1);
  EXPECT_EQ(c.segments_open, 2);
  EXPECT_EQ(registry_->Stats().segments_mapped, 2);
  // Torch's 'c' handle of the same block is the same segment.
  std::vector<Layer> torch = layers;
  RegisterLiveModelRequest t = Request("c", torch);
  for (LiveTensor& lt : *t.mutable_tensors()) {
    lt.set_handle_kind(rvd::v1::IPC_HANDLE_KIND_TORCH);
    lt.set_handle(std::string("\x02" "c") + lt.handle());
  }
  absl::StatusOr<RegisterLiveModelResponse> tc = registry_->Register(t);
  ASSERT_TRUE(tc.ok()) << tc.status();
  EXPECT_EQ(tc->segments_reused(), 2u);
  // Each model measures its own snapshot.
  for (const char* id : {"a", "b", "c"}) ASSERT_TRUE(Notify(id, 1).ok());
  registry_->Drain();
  for (const char* id : {"a", "b", "c"}) {
    ASSERT_EQ(Recorded(id).size(), 1u) << id;
    ExpectMatches(Recorded(id)[0], layers);
  }
  ASSERT_TRUE(registry_->Unregister("a").ok());
  ASSERT_TRUE(registry_->Unregister("b").ok());
  EXPECT_EQ(engine_.fake().counts().segments_open, 2);  // "c" holds them
  ASSERT_TRUE(registry_->Unregister("c").ok());
  registry_->Drain();
  ExpectNothingHeld();
  EXPECT_EQ(registry_->Stats().segments_mapped, 0);
  // Mapped again when needed.
  ASSERT_TRUE(registry_->Register(Request("a", layers)).ok());
  EXPECT_EQ(engine_.fake().counts().opens.at(Handle('A')), 2);
}

TEST_F(LiveRegistryTest, UnregisterReleasesAndKeepsTheHistory) {
  const std::vector<Layer> layers = Model();
  EXPECT_EQ(registry_->Unregister("nobody").code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(registry_->Register(Request("m", layers)).ok());
  ASSERT_TRUE(Notify("m", 1).ok());
  registry_->Drain();
  ASSERT_TRUE(registry_->Unregister("m").ok());
  EXPECT_EQ(registry_->Unregister("m").code(), absl::StatusCode::kNotFound);
  absl::StatusOr<NotifyStepResponse> n = Notify("m", 2);
  EXPECT_EQ(n.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(n.status().message()), HasSubstr("released: unregister"));
  EXPECT_EQ(Recorded("m").size(), 1u);
  ExpectNothingHeld();
  EXPECT_EQ(registry_->Stats().releases.at("unregister"), 1);
}

TEST_F(LiveRegistryTest, NotificationErrors) {
  const std::vector<Layer> layers = Model();
  ASSERT_TRUE(registry_->Register(Request("m", layers)).ok());
  EXPECT_EQ(Notify("absent", 1).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(Notify("bad id!", 1).status().code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(Notify("m", 5).ok());
  for (int64_t step : {5, 4}) {
    absl::StatusOr<NotifyStepResponse> n = Notify("m", step);
    EXPECT_EQ(n.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(n.status().message()), HasSubstr("not above the last notified step 5"));
  }
  NotifyStepRequest bad;
  bad.set_model_id("m");
  bad.set_step(6);
  bad.set_force(true);
  bad.set_producer_event_handle("short");
  EXPECT_EQ(registry_->Notify(bad).status().code(), absl::StatusCode::kInvalidArgument);
  bad.set_producer_event_handle(std::string(kIpcHandleBytes, '\xff'));  // the fake refuses it
  absl::StatusOr<NotifyStepResponse> n = registry_->Notify(bad);
  EXPECT_EQ(n.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(n.status().message()), HasSubstr("does not open"));
  // A refused notification consumes no step; an empty handle waits on nothing.
  bad.clear_producer_event_handle();
  n = registry_->Notify(bad);
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(engine_.fake().last_events().first, nullptr);
  EXPECT_NE(engine_.fake().last_events().second, nullptr);  // rvd's own event
  // The producer's event is opened once, whatever the number of steps.
  for (int64_t step = 7; step <= 10; ++step) ASSERT_TRUE(Notify("m", step, true).ok());
  registry_->Drain();
  EXPECT_EQ(engine_.fake().counts().event_opens, 2);  // 0x01..., and the refused 0xff...
  // Every refusal above: unknown model, bad id, steps 5 and 4, two handles.
  EXPECT_EQ(registry_->Stats().notifications.at("error"), 6);
}

TEST_F(LiveRegistryTest, LeaseRunsOutUnlessRenewed) {
  const std::vector<Layer> layers = Model();
  RegisterLiveModelRequest r = Request("leased", layers);
  r.set_lease_seconds(1);
  absl::StatusOr<RegisterLiveModelResponse> reg = registry_->Register(r);
  ASSERT_TRUE(reg.ok());
  EXPECT_EQ(reg->lease_seconds(), 1u);
  // Notifications every 0.25 s keep it for 1.5 s.
  for (int64_t step = 1; step <= 6; ++step) {
    absl::SleepFor(absl::Milliseconds(250));
    ASSERT_TRUE(Notify("leased", step).ok()) << step;
  }
  // Then silence.
  ASSERT_TRUE(Eventually([&] { return registry_->Stats().models == 0; }));
  EXPECT_EQ(registry_->Stats().releases.at("lease"), 1);
  absl::StatusOr<NotifyStepResponse> n = Notify("leased", 7);
  EXPECT_EQ(n.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(n.status().message()), HasSubstr("released: lease"));
  registry_->Drain();
  ExpectNothingHeld();
}

TEST_F(LiveRegistryTest, ProducerExitReleasesItsModels) {
  // The child's tensors live in segments of its own.
  const std::vector<Layer> theirs = Model('C', 'D');
  const std::vector<Layer> layers = Model();
  const pid_t child = fork();
  if (child == 0) {
    pause();
    _exit(0);
  }
  RegisterLiveModelRequest r = Request("child", theirs);
  r.set_producer_pid(child);
  ASSERT_TRUE(registry_->Register(r).ok());
  RegisterLiveModelRequest r2 = Request("child2", theirs);
  r2.set_producer_pid(child);
  ASSERT_TRUE(registry_->Register(r2).ok());
  ASSERT_TRUE(registry_->Register(Request("mine", layers)).ok());
  EXPECT_EQ(registry_->Stats().models, 3);
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  ASSERT_TRUE(Eventually([&] { return registry_->Stats().models == 1; }));
  EXPECT_EQ(registry_->Stats().releases.at("producer_exit"), 2);
  EXPECT_EQ(Notify("child", 1).status().code(), absl::StatusCode::kNotFound);
  // The child's mappings (keyed by its pid) are closed (by the watcher, just
  // after the release), this process's stay.
  EXPECT_TRUE(Eventually([&] { return engine_.fake().counts().segments_open == 2; }));
  EXPECT_EQ(engine_.fake().counts().segments_open, 2);
  ASSERT_TRUE(Notify("mine", 1).ok());
  registry_->Drain();
  ASSERT_EQ(Recorded("mine").size(), 1u);
  ExpectMatches(Recorded("mine")[0], layers);
}

// The policy, written once more independently of live_trigger.cc: which
// steps a training run measures, given each step's weights.
struct Expected {
  std::vector<int64_t> steps;
  std::vector<std::string> reasons;
};

TEST_F(LiveRegistryTest, HistoryFollowsThePolicyStepForStep) {
  std::vector<Layer> layers = Model();
  RegisterLiveModelRequest r = Request("train", layers);
  r.mutable_policy()->set_measurement_interval(5);
  r.mutable_policy()->set_adaptive(true);
  r.mutable_policy()->set_delta_threshold(0.05);
  ASSERT_TRUE(registry_->Register(r).ok());
  // Per step, the relative change made to the weights before it: mostly
  // below the threshold (so the interval rules), sometimes above, and
  // small changes that add up past it.
  std::mt19937_64 pattern = SeededRng("pattern");
  std::uniform_real_distribution<double> u;
  const int64_t kSteps = 60;
  auto flat = [&] {  // the V set
    std::vector<float> all;
    for (const Layer& l : layers) {
      const std::vector<float> v = l.V();
      all.insert(all.end(), v.begin(), v.end());
    }
    return all;
  };
  std::vector<int64_t> want_steps;
  std::vector<std::string> want_reasons;
  std::vector<std::vector<Layer>> at_step;
  std::optional<int64_t> last;
  std::vector<float> ref;
  for (int64_t step = 1; step <= kSteps; ++step) {
    const double p = u(pattern);
    Perturb(layers, p < 0.15 ? 0.2 : 0.004);
    const bool force = step % 23 == 0;
    // The reference decision, on the exact f32 weights.
    const std::vector<float> now = flat();
    std::string reason;
    if (force) {
      reason = "forced";
    } else if (!last.has_value()) {
      reason = "first";
    } else if (step - *last >= 5) {
      reason = "interval";
    } else {
      double d = 0, n = 0;
      for (size_t i = 0; i < now.size(); ++i) {
        d += (double(now[i]) - ref[i]) * (double(now[i]) - ref[i]);
        n += double(ref[i]) * ref[i];
      }
      if (std::sqrt(d) > 0.05 * std::sqrt(n)) reason = "adaptive_check";
    }
    if (!reason.empty()) {
      want_steps.push_back(step);
      want_reasons.push_back(reason);
      last = step;
      ref = now;
      at_step.push_back(layers);
    }
    absl::StatusOr<NotifyStepResponse> n = Notify("train", step, force);
    ASSERT_TRUE(n.ok()) << n.status();
    EXPECT_TRUE(n->snapshot()) << step;  // adaptive: every step is looked at
    // Every few steps, let measurements catch up, else run ahead of them.
    if (step % 7 == 0) registry_->Drain();
  }
  registry_->Drain();
  const std::vector<Measurement> got = Recorded("train");
  std::vector<int64_t> got_steps;
  for (const Measurement& m : got) got_steps.push_back(m.step());
  ASSERT_EQ(got_steps, want_steps) << "seed " << TestSeed();
  for (size_t i = 0; i < got.size(); ++i) ExpectMatches(got[i], at_step[i]);
  // The reasons counted match the policy's.
  const LiveStats s = registry_->Stats();
  int adaptive_measured = 0;
  for (const std::string& reason : want_reasons) adaptive_measured += reason == "adaptive_check";
  EXPECT_EQ(s.notifications.at("adaptive_check") + s.notifications.at("interval") +
                s.notifications.at("first") + s.notifications.at("forced"),
            kSteps);
  EXPECT_EQ(s.notifications.at("first"), 1);
  EXPECT_GT(adaptive_measured, 0) << "the pattern never crossed the threshold";
  EXPECT_LT(adaptive_measured, s.notifications.at("adaptive_check"))
      << "every check crossed the threshold";
  EXPECT_EQ(s.measured, static_cast<int64_t>(want_steps.size()));
}

TEST_F(LiveRegistryTest, IntervalWithoutAdaptiveReadsNothingBetween) {
  std::vector<Layer> layers = Model();
  RegisterLiveModelRequest r = Request("interval", layers);
  r.mutable_policy()->set_measurement_interval(4);
  ASSERT_TRUE(registry_->Register(r).ok());
  std::vector<int64_t> steps;
  for (int64_t step = 10; step <= 30; step += 1) {
    Perturb(layers, 0.01);
    absl::StatusOr<NotifyStepResponse> n = Notify("interval", step);
    ASSERT_TRUE(n.ok());
    if (n->snapshot()) steps.push_back(step);
    EXPECT_EQ(n->snapshot(), n->reason() != "skipped") << step;
  }
  registry_->Drain();
  EXPECT_EQ(steps, (std::vector<int64_t>{10, 14, 18, 22, 26, 30}));
  EXPECT_EQ(engine_.fake().counts().snapshots_started, 6);
  EXPECT_EQ(Recorded("interval").size(), 6u);
}

TEST_F(LiveRegistryTest, ASnapshotBeingMeasuredIsNeverOverwritten) {
  LiveOptions o = Options();
  o.busy_wait = absl::Milliseconds(200);
  registry_ = Make(o);
  std::vector<Layer> layers = Model();
  absl::StatusOr<RegisterLiveModelResponse> reg = registry_->Register(Request("busy", layers));
  ASSERT_TRUE(reg.ok());
  const uint64_t set_bytes = reg->snapshot_bytes() / 2;  // training holds two at first
  engine_.Block();
  std::vector<std::vector<Layer>> at_step;
  for (int64_t step = 1; step <= 3; ++step) {
    Perturb(layers, 0.3);
    at_step.push_back(layers);
    absl::StatusOr<NotifyStepResponse> n = Notify("busy", step, true);
    ASSERT_TRUE(n.ok()) << n.status();
    EXPECT_TRUE(n->snapshot()) << step;
    if (step == 1) engine_.WaitEntered(1);  // step 1's measurement is reading
  }
  // Step 1 being measured, 2 and 3 waiting: every buffer is in use.
  Perturb(layers, 0.3);
  absl::StatusOr<NotifyStepResponse> n = Notify("busy", 4, true);
  ASSERT_TRUE(n.ok());
  EXPECT_FALSE(n->snapshot());
  EXPECT_EQ(n->reason(), "busy");
  EXPECT_EQ(engine_.fake().counts().bytes_allocated, kMaxSnapshotBuffers * set_bytes);
  engine_.Unblock();
  registry_->Drain();
  const std::vector<Measurement> got = Recorded("busy");
  ASSERT_EQ(got.size(), 3u);
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].step(), static_cast<int64_t>(i + 1));
    ExpectMatches(got[i], at_step[i]);
  }
  EXPECT_EQ(registry_->Stats().notifications.at("busy"), 1);
  // Free again.
  n = Notify("busy", 5, true);
  ASSERT_TRUE(n.ok());
  EXPECT_TRUE(n->snapshot());
  registry_->Drain();
  ExpectMatches(Recorded("busy").back(), layers);
}

TEST_F(LiveRegistryTest, ShutdownReleasesEverything) {
  const std::vector<Layer> layers = Model();
  ASSERT_TRUE(registry_->Register(Request("a", layers)).ok());
  ASSERT_TRUE(registry_->Register(Request("b", layers, true)).ok());
  engine_.Block();
  ASSERT_TRUE(Notify("a", 1).ok());
  ASSERT_TRUE(Notify("a", 2, true).ok());
  engine_.WaitEntered(1);
  std::thread unblock([this] {
    absl::SleepFor(absl::Milliseconds(100));
    engine_.Unblock();
  });
  registry_->Stop();
  unblock.join();
  EXPECT_EQ(registry_->Stats().releases.at("shutdown"), 2);
  ExpectNothingHeld();
  absl::StatusOr<RegisterLiveModelResponse> r = registry_->Register(Request("c", layers));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable);
}

TEST_F(LiveRegistryTest, MetricsReadTheRegistry) {
  const std::vector<Layer> layers = Model();
  ASSERT_TRUE(registry_->Register(Request("m", layers)).ok());
  const int64_t before = absl::ToUnixNanos(absl::Now());
  ASSERT_TRUE(Notify("m", 1).ok());
  ASSERT_TRUE(Notify("m", 2).ok());  // skipped (interval 100)
  registry_->Drain();
  const int64_t after = absl::ToUnixNanos(absl::Now());
  // The measurement says when rvd received its notification.
  ASSERT_EQ(Recorded("m").size(), 1u);
  const int64_t notified = TimeUtil::TimestampToNanoseconds(Recorded("m")[0].notified());
  const int64_t computed = TimeUtil::TimestampToNanoseconds(Recorded("m")[0].timestamp());
  EXPECT_LE(before, notified);
  EXPECT_LE(notified, computed);
  EXPECT_LE(computed, after);
  ASSERT_TRUE(registry_->Unregister("m").ok());
  LiveMetrics metrics(registry_.get());
  std::map<std::string, double> values;
  for (const prometheus::MetricFamily& f : metrics.Collect()) {
    for (const prometheus::ClientMetric& m : f.metric) {
      std::string key = f.name;
      for (const auto& l : m.label) absl::StrAppend(&key, "{", l.name, "=", l.value, "}");
      if (f.type == prometheus::MetricType::Counter) values[key] = m.counter.value;
      if (f.type == prometheus::MetricType::Gauge) values[key] = m.gauge.value;
      if (f.type == prometheus::MetricType::Histogram) {
        values[key + "_count"] = static_cast<double>(m.histogram.sample_count);
        values[key + "_inf"] =
            static_cast<double>(m.histogram.bucket.back().cumulative_count);
      }
    }
  }
  EXPECT_EQ(values.at("rvd_live_models"), 0);
  EXPECT_EQ(values.at("rvd_live_segments_mapped"), 0);
  EXPECT_EQ(values.at("rvd_live_notifications_total{outcome=first}"), 1);
  EXPECT_EQ(values.at("rvd_live_notifications_total{outcome=skipped}"), 1);
  EXPECT_EQ(values.at("rvd_live_snapshots_total"), 1);
  EXPECT_EQ(values.at("rvd_live_snapshot_seconds_count"), 1);
  EXPECT_EQ(values.at("rvd_live_snapshot_seconds_inf"), 1);
  EXPECT_EQ(values.at("rvd_live_measurement_seconds_count"), 1);
  EXPECT_EQ(values.at("rvd_live_measurement_seconds_inf"), 1);
  EXPECT_EQ(values.at("rvd_live_measurements_total"), 1);
  EXPECT_EQ(values.at("rvd_live_releases_total{reason=unregister}"), 1);
}

}  // namespace
}  // namespace rvd

// The daemon's live-model path on a GPU (label gpu; on the H200 host:
// build/bin/cuda_live_daemon_test): rvd started in this process with the
// CUDA module (Server::Start, backend cuda) and called over gRPC, a trainer
// in a second process (this binary again, run with --producer: fork + exec,
// so that the producer's CUDA is its own) that cudaMallocs two segments of
// V weights with varied spectra (kernels/test_matrices.h, the printed
// seed), shares them by CUDA IPC (PyTorch's 'c' handle for one, a raw
// cudaIpcMemHandle_t for the other) with an interprocess event, and
// rewrites them on command after waiting on rvd's event.
//
// Checked: an inference registration measures the weights as registered;
// a training registration reuses the segments; each notified step is
// measured exactly as the adaptive/interval policy says (an unchanged step
// is not), per layer and per head against OraclePR of that step's weights,
// although the producer scribbles over its weights right after every
// notification (the snapshot is consistent: the scribble waits on rvd's
// event); the producer's exit releases its models. The CUDA runtime is
// linked here for the producer only; rvd itself reaches CUDA through the
// dlopen'ed module, as in the daemon.
#include <cuda_runtime_api.h>
#include <grpcpp/grpcpp.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/engine.h"
#include "kernels/pr_check.h"
#include "kernels/test_matrices.h"
#include "kernels/v_layout.h"
#include "rvd/v1/rvd.grpc.pb.h"
#include "server/config.h"
#include "server/server.h"

namespace rvd {
namespace {

// ---------------------------------------------------------------------------
// The model both processes know: five V tensors in two segments.
struct LayerDef {
  uint32_t layer;
  rvd::v1::VLayout layout;
  DType dtype;
  int64_t rows, cols, ld;
  HeadGeometry g;
  int segment;
};
// d = 64, hidden 1024: a separate bf16 V, a padded f32 one (the padding is
// NaN: read it and the PR is wrong), gpt_neox's interleaved heads (a
// blocked view), phi3's fused QKV in f32, a separate f16 V.
const LayerDef kLayers[] = {
    {0, rvd::v1::V_LAYOUT_SEPARATE, DType::kBF16, 256, 1024, 1024, {8, 4, 64}, 0},
    {1, rvd::v1::V_LAYOUT_SEPARATE, DType::kF32, 256, 1024, 1088, {8, 4, 64}, 0},
    {2, rvd::v1::V_LAYOUT_GPT_NEOX_QKV, DType::kBF16, 768, 1024, 1024, {4, 4, 64}, 0},
    {3, rvd::v1::V_LAYOUT_PHI3_QKV, DType::kF32, 1024, 1024, 1024, {8, 4, 64}, 1},
    {4, rvd::v1::V_LAYOUT_SEPARATE, DType::kF16, 256, 1024, 1024, {8, 4, 64}, 1},
};
constexpr int kSegments = 2;

uint64_t StoredBytes(const LayerDef& l) {
  return static_cast<uint64_t>(l.rows * l.ld) * DTypeSize(l.dtype);
}
// Byte offsets in their segments (256-aligned), and the segments' sizes.
struct Placement {
  std::vector<uint64_t> offset;
  uint64_t segment_bytes[kSegments] = {0, 0};
};
Placement Place() {
  Placement p;
  for (const LayerDef& l : kLayers) {
    uint64_t& end = p.segment_bytes[l.segment];
    p.offset.push_back(end);
    end = (end + StoredBytes(l) + 255) / 256 * 256;
  }
  return p;
}

// Layer `i`'s weights at `version`: the same in both processes (the seed is
// fixed before the producer starts and passed to it).
StoredMatrix Weights(uint64_t seed, size_t i, int version) {
  const LayerDef& l = kLayers[i];
  std::mt19937_64 rng(seed * 1315423911ull + i * 7919 + version);
  const std::vector<double> w =
      MakeMatrix(rng, l.rows, l.cols, kAllSpectra[(i + version) % std::size(kAllSpectra)]);
  return Store(w, l.rows, l.cols, l.dtype, l.ld - l.cols,
               absl::StrCat("layer ", l.layer, " v", version));
}

// The oracle's PR of layer `i`'s V and of each of its kv heads.
std::vector<double> Reference(const StoredMatrix& s, size_t i) {
  const LayerDef& l = kLayers[i];
  std::vector<double> out;
  if (l.ld != l.cols) {  // separate layout: V is the whole view, heads its row blocks
    out.push_back(*OraclePR(s.view));
    for (int64_t h = 0; h < l.g.num_kv_heads; ++h) {
      MatrixView v = s.view;
      v.data = static_cast<const uint8_t*>(s.view.data) +
               static_cast<size_t>(h * l.g.head_dim * l.ld) * DTypeSize(l.dtype);
      v.rows = l.g.head_dim;
      out.push_back(*OraclePR(v));
    }
    return out;
  }
  absl::StatusOr<VSlices> v = SliceV(TensorView{s.bytes.data(), l.rows, l.cols, l.dtype},
                                     static_cast<VLayout>(l.layout), l.g);
  EXPECT_TRUE(v.ok()) << v.status();
  out.push_back(*OraclePR(v->layer));
  for (const MatrixView& h : v->heads) out.push_back(*OraclePR(h));
  return out;
}

// ---------------------------------------------------------------------------
// Length-prefixed messages over a pipe.
bool WriteAll(int fd, const void* p, size_t n) {
  const auto* c = static_cast<const char*>(p);
  while (n > 0) {
    const ssize_t w = write(fd, c, n);
    if (w <= 0) return false;
    c += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}
bool ReadAll(int fd, void* p, size_t n) {
  auto* c = static_cast<char*>(p);
  while (n > 0) {
    const ssize_t r = read(fd, c, n);
    if (r <= 0) return false;
    c += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}
bool Send(int fd, const std::string& m) {
  const uint32_t n = m.size();
  return WriteAll(fd, &n, 4) && WriteAll(fd, m.data(), n);
}
bool Receive(int fd, std::string* m) {
  uint32_t n = 0;
  if (!ReadAll(fd, &n, 4)) return false;
  m->resize(n);
  return ReadAll(fd, m->data(), n);
}

// ---------------------------------------------------------------------------
// The producer (this binary with --producer SEED): stdin commands, stdout
// replies.
//   "open"          -> uuid (NUL-padded 64) + segment handles (64 each) +
//                      its event's handle (64), or "error ..." / "nodevice"
//   "rvd" + 64 B    -> opens rvd's event: "ok"
//   "write V"       -> waits on rvd's event, writes version V, records its
//                      event: "ok" (without waiting for the device)
int ProducerMain(uint64_t seed) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::string cmd;
    while (Receive(0, &cmd)) Send(1, "nodevice");
    return 0;
  }
  cudaSetDevice(0);
  const Placement place = Place();
  void* seg[kSegments] = {nullptr, nullptr};
  cudaStream_t stream;
  cudaEvent_t event;
  cudaEvent_t rvd_event = nullptr;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  cudaEventCreateWithFlags(&event, cudaEventDisableTiming | cudaEventInterprocess);
  std::vector<std::vector<uint8_t>> staged(std::size(kLayers));
  auto write = [&](int version) {
    // The stream waits for rvd's last snapshot before touching the weights.
    if (rvd_event != nullptr) cudaStreamWaitEvent(stream, rvd_event, 0);
    for (size_t i = 0; i < std::size(kLayers); ++i) {
      staged[i] = Weights(seed, i, version).bytes;
      cudaMemcpyAsync(static_cast<uint8_t*>(seg[kLayers[i].segment]) + place.offset[i],
                      staged[i].data(), staged[i].size(), cudaMemcpyHostToDevice, stream);
    }
    cudaEventRecord(event, stream);
  };
  std::string cmd;
  while (Receive(0, &cmd)) {
    std::string reply = "ok";
    if (cmd == "open") {
      cudaDeviceProp prop;
      cudaGetDeviceProperties(&prop, 0);
      const auto* u = reinterpret_cast<const uint8_t*>(prop.uuid.bytes);
      char uuid[64] = {};
      std::snprintf(uuid, sizeof(uuid),
                    "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
                    u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11],
                    u[12], u[13], u[14], u[15]);
      reply.assign(uuid, sizeof(uuid));
      bool ok = true;
      for (int s = 0; s < kSegments && ok; ++s) {
        cudaIpcMemHandle_t h{};
        ok = cudaMalloc(&seg[s], place.segment_bytes[s]) == cudaSuccess &&
             cudaMemset(seg[s], 0, place.segment_bytes[s]) == cudaSuccess &&
             cudaIpcGetMemHandle(&h, seg[s]) == cudaSuccess;
        reply.append(reinterpret_cast<const char*>(&h), sizeof(h));
      }
      if (!ok) {
        Send(1, "error cudaMalloc/cudaIpcGetMemHandle");
        continue;
      }
      write(0);
      cudaStreamSynchronize(stream);
      cudaIpcEventHandle_t eh;
      if (cudaIpcGetEventHandle(&eh, event) != cudaSuccess) reply = "error event handle";
      reply.append(reinterpret_cast<const char*>(&eh), sizeof(eh));
    } else if (cmd.rfind("rvd", 0) == 0 && cmd.size() == 3 + sizeof(cudaIpcEventHandle_t)) {
      cudaIpcEventHandle_t eh;
      std::memcpy(&eh, cmd.data() + 3, sizeof(eh));
      if (cudaIpcOpenEventHandle(&rvd_event, eh) != cudaSuccess) reply = "error open rvd event";
    } else if (cmd.rfind("write ", 0) == 0) {
      write(std::stoi(cmd.substr(6)));
      if (cudaGetLastError() != cudaSuccess) reply = "error write";
    } else {
      reply = "error unknown command";
    }
    if (!Send(1, reply)) break;
  }
  cudaStreamSynchronize(stream);
  return 0;
}

class ProducerProcess {
 public:
  explicit ProducerProcess(uint64_t seed) {
    int to[2], from[2];
    if (pipe(to) != 0 || pipe(from) != 0) return;
    pid_ = fork();
    if (pid_ == 0) {
      dup2(to[0], 0);
      dup2(from[1], 1);
      close(to[1]);
      close(from[0]);
      const std::string s = std::to_string(seed);
      char self[] = "/proc/self/exe";
      char arg[] = "--producer";
      std::vector<char> seed_arg(s.begin(), s.end());
      seed_arg.push_back('\0');
      char* argv[] = {self, arg, seed_arg.data(), nullptr};
      execv(self, argv);
      _exit(127);
    }
    close(to[0]);
    close(from[1]);
    to_ = to[1];
    from_ = from[0];
  }
  ~ProducerProcess() { Exit(); }
  // Closes its stdin (it exits) and reaps it.
  void Exit() {
    if (to_ >= 0) close(to_);
    if (from_ >= 0) close(from_);
    to_ = from_ = -1;
    if (pid_ > 0) waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  pid_t pid() const { return pid_; }
  std::string Call(const std::string& cmd) {
    std::string reply;
    if (!Send(to_, cmd) || !Receive(from_, &reply)) return "error: the producer is gone";
    return reply;
  }

 private:
  pid_t pid_ = -1;
  int to_ = -1, from_ = -1;
};

// ---------------------------------------------------------------------------
constexpr Tolerance kTol{0.0, 1e-5};  // issue 15 §7

class LiveDaemonGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    seed_ = TestSeed();
    producer_ = std::make_unique<ProducerProcess>(seed_);
    opened_ = producer_->Call("open");
    if (opened_ == "nodevice") GTEST_SKIP() << "no CUDA device";
    ASSERT_EQ(opened_.size(), 64 + 64 * kSegments + 64) << opened_;
    Config config;
    config.backend = "cuda";
    config.grpc_address = "127.0.0.1:0";
    config.metrics_address = "";
    absl::StatusOr<std::unique_ptr<Server>> server = Server::Start(config);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    stub_ = rvd::v1::Rvd::NewStub(grpc::CreateChannel(
        absl::StrCat("127.0.0.1:", server_->grpc_port()), grpc::InsecureChannelCredentials()));
  }
  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown();
  }

  std::string Uuid() const { return std::string(opened_.c_str()); }
  std::string SegmentHandle(int s) const { return opened_.substr(64 + 64 * s, 64); }
  std::string ProducerEvent() const { return opened_.substr(64 + 64 * kSegments, 64); }

  rvd::v1::RegisterLiveModelRequest Request(const std::string& id, bool inference) const {
    const Placement place = Place();
    rvd::v1::RegisterLiveModelRequest r;
    r.mutable_header()->set_model_id(id);
    r.mutable_header()->set_per_head(true);
    r.set_device_uuid(Uuid());
    r.set_producer_pid(producer_->pid());
    r.mutable_policy()->set_mode(inference ? rvd::v1::TriggerPolicy::MODE_INFERENCE
                                           : rvd::v1::TriggerPolicy::MODE_TRAINING);
    for (size_t i = 0; i < std::size(kLayers); ++i) {
      const LayerDef& l = kLayers[i];
      rvd::v1::LiveTensor* t = r.add_tensors();
      rvd::v1::TensorSpec* spec = t->mutable_spec();
      spec->set_name(absl::StrCat("model.layers.", l.layer, ".self_attn.v"));
      spec->set_layer(l.layer);
      spec->set_dtype(l.dtype == DType::kF32    ? rvd::v1::DTYPE_F32
                      : l.dtype == DType::kBF16 ? rvd::v1::DTYPE_BF16
                                                : rvd::v1::DTYPE_F16);
      spec->add_shape(l.rows);
      spec->add_shape(l.cols);
      spec->set_layout(l.layout);
      spec->mutable_geometry()->set_num_heads(l.g.num_heads);
      spec->mutable_geometry()->set_num_kv_heads(l.g.num_kv_heads);
      spec->mutable_geometry()->set_head_dim(l.g.head_dim);
      if (l.segment == 0) {  // PyTorch's form: version 2, type 'c', the handle
        t->set_handle_kind(rvd::v1::IPC_HANDLE_KIND_TORCH);
        t->set_handle(std::string("\x02" "c") + SegmentHandle(0));
      } else {
        t->set_handle_kind(rvd::v1::IPC_HANDLE_KIND_CUDA_IPC);
        t->set_handle(SegmentHandle(1));
      }
      t->set_segment_bytes(place.segment_bytes[l.segment]);
      t->set_offset_bytes(place.offset[i]);
      t->add_strides(l.ld);
      t->add_strides(1);
    }
    return r;
  }

  // Every layer's and head's PR, and R_V, against the oracle of `version`.
  void ExpectVersion(const rvd::v1::Measurement& m, int version) {
    ASSERT_EQ(m.layers_size(), static_cast<int>(std::size(kLayers)));
    std::vector<double> got, ref, layer_ref;
    for (size_t i = 0; i < std::size(kLayers); ++i) {
      const std::vector<double> r = Reference(Weights(seed_, i, version), i);
      ASSERT_EQ(m.layers(i).head_pr_size() + 1, static_cast<int>(r.size()));
      got.push_back(m.layers(i).pr());
      for (double h : m.layers(i).head_pr()) got.push_back(h);
      ref.insert(ref.end(), r.begin(), r.end());
      layer_ref.push_back(r[0]);
    }
    const CheckResult c = CheckPR(got, ref, kTol);
    EXPECT_EQ(c.mismatches, 0) << "step " << m.step() << ", version " << version
                               << " (RVD_TEST_SEED=" << seed_ << "), max rel "
                               << c.max_rel_error << "\n"
                               << c.report;
    const double rv = std::sqrt(layer_ref[3] * layer_ref[4]) / std::sqrt(layer_ref[0] * layer_ref[1]);
    ASSERT_TRUE(m.has_rv());
    EXPECT_NEAR(m.rv(), rv, 1e-5 * rv);
    EXPECT_EQ(m.backend(), "cuda");
    std::printf("step %lld (v%d): max rel error %.3g over %zu PRs, rv %.6f, elapsed %.3f ms, "
                "snapshot %.3f ms\n",
                static_cast<long long>(m.step()), version, c.max_rel_error, got.size(), m.rv(),
                m.elapsed_ms(), m.receive_ms());
  }

  // The model's measurements once `count` are recorded (10 s at most).
  std::vector<rvd::v1::Measurement> History(const std::string& id, size_t count) {
    std::vector<rvd::v1::Measurement> out;
    for (int i = 0; i < 1000; ++i) {
      grpc::ClientContext ctx;
      rvd::v1::GetHistoryRequest req;
      req.set_model_id(id);
      rvd::v1::GetHistoryResponse resp;
      if (stub_->GetHistory(&ctx, req, &resp).ok() &&
          static_cast<size_t>(resp.measurements_size()) >= count) {
        out.assign(resp.measurements().begin(), resp.measurements().end());
        return out;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return out;
  }

  grpc::Status Notify(const std::string& id, int64_t step, rvd::v1::NotifyStepResponse* resp) {
    grpc::ClientContext ctx;
    rvd::v1::NotifyStepRequest req;
    req.set_model_id(id);
    req.set_step(step);
    req.set_producer_event_handle(ProducerEvent());
    return stub_->NotifyStep(&ctx, req, resp);
  }

  uint64_t seed_ = 0;
  std::unique_ptr<ProducerProcess> producer_;
  std::string opened_;
  std::unique_ptr<Server> server_;
  std::unique_ptr<rvd::v1::Rvd::Stub> stub_;
};

TEST_F(LiveDaemonGpuTest, ConsistentSnapshotsOnPolicyAgainstTheOracle) {
  // Inference: measured at registration, the weights as written (version 0).
  rvd::v1::RegisterLiveModelResponse inf;
  {
    grpc::ClientContext ctx;
    const grpc::Status s = stub_->RegisterLiveModel(&ctx, Request("gpu-inf", true), &inf);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  EXPECT_EQ(inf.segments_mapped(), 2u);
  EXPECT_EQ(inf.segments_reused(), 0u);
  ASSERT_EQ(inf.rvd_event_handle().size(), 64u);
  ASSERT_TRUE(inf.has_measurement());
  ExpectVersion(inf.measurement(), 0);

  // Training, interval 2 and adaptive: the same segments, reused.
  rvd::v1::RegisterLiveModelRequest req = Request("gpu-train", false);
  req.mutable_policy()->set_measurement_interval(2);
  req.mutable_policy()->set_adaptive(true);
  rvd::v1::RegisterLiveModelResponse train;
  {
    grpc::ClientContext ctx;
    const grpc::Status s = stub_->RegisterLiveModel(&ctx, req, &train);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  EXPECT_EQ(train.segments_mapped(), 2u);
  EXPECT_EQ(train.segments_reused(), 2u);
  EXPECT_GT(train.snapshot_bytes(), 0u);
  ASSERT_EQ(producer_->Call("rvd" + train.rvd_event_handle()), "ok");

  // step: the version written before it; measured: what the policy says.
  // 1 first; 2 changed (adaptive); 3 unchanged (checked, not measured);
  // 4 interval; 5 changed (adaptive). After each notification the producer
  // at once writes version 99 over its weights: ordered after rvd's copy.
  struct Step {
    int64_t step;
    int version;
    bool measured;
    const char* reason;
  };
  const Step steps[] = {{1, 1, true, "first"},
                        {2, 2, true, "adaptive_check"},
                        {3, 2, false, "adaptive_check"},
                        {4, 4, true, "interval"},
                        {5, 5, true, "adaptive_check"}};
  std::vector<int> measured_versions;
  std::vector<int64_t> measured_steps;
  for (const Step& s : steps) {
    ASSERT_EQ(producer_->Call(absl::StrCat("write ", s.version)), "ok");
    rvd::v1::NotifyStepResponse resp;
    const auto t0 = std::chrono::steady_clock::now();
    const grpc::Status st = Notify("gpu-train", s.step, &resp);
    const double notify_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    ASSERT_TRUE(st.ok()) << st.error_message();
    EXPECT_TRUE(resp.snapshot()) << s.step;
    EXPECT_EQ(resp.reason(), s.reason) << s.step;
    std::printf("notify step %lld: %.3f ms round trip, reason %s\n",
                static_cast<long long>(s.step), notify_ms, resp.reason().c_str());
    ASSERT_EQ(producer_->Call("write 99"), "ok");  // the scribble
    if (s.measured) {
      measured_versions.push_back(s.version);
      measured_steps.push_back(s.step);
    }
  }
  // The last step's check is decided by its own job; wait for all.
  const std::vector<rvd::v1::Measurement> got = History("gpu-train", measured_steps.size());
  ASSERT_EQ(got.size(), measured_steps.size());
  // Nothing more arrives (step 3 stays unmeasured).
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  ASSERT_EQ(History("gpu-train", 0).size(), measured_steps.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].step(), measured_steps[i]);
    ExpectVersion(got[i], measured_versions[i]);
  }

  // Inference answers from its measurement.
  rvd::v1::NotifyStepResponse resp;
  ASSERT_TRUE(Notify("gpu-inf", 1, &resp).ok());
  EXPECT_FALSE(resp.snapshot());
  EXPECT_EQ(resp.reason(), "inference");
  EXPECT_EQ(resp.last_sequence(), inf.measurement().sequence());

  // Unregister one; the producer's exit releases the other.
  {
    grpc::ClientContext ctx;
    rvd::v1::UnregisterLiveModelRequest u;
    u.set_model_id("gpu-train");
    rvd::v1::UnregisterLiveModelResponse ur;
    ASSERT_TRUE(stub_->UnregisterLiveModel(&ctx, u, &ur).ok());
  }
  producer_->Exit();
  bool released = false;
  for (int i = 0; i < 500 && !released; ++i) {
    rvd::v1::NotifyStepResponse r;
    const grpc::Status s = Notify("gpu-inf", 2 + i, &r);
    released = s.error_code() == grpc::StatusCode::NOT_FOUND;
    if (!released) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(released) << "the producer exited; its model should be released";
}

// Refusals the real module takes part in, each leaving the daemon able to
// register the same model right after.
TEST_F(LiveDaemonGpuTest, RefusalsFromTheModuleKeepNothing) {
  auto code = [&](const rvd::v1::RegisterLiveModelRequest& r, std::string* message) {
    grpc::ClientContext ctx;
    rvd::v1::RegisterLiveModelResponse resp;
    const grpc::Status s = stub_->RegisterLiveModel(&ctx, r, &resp);
    *message = s.error_message();
    return s.error_code();
  };
  std::string message;
  // A handle that does not open (64 bytes of garbage).
  rvd::v1::RegisterLiveModelRequest r = Request("gpu-refused", false);
  for (rvd::v1::LiveTensor& t : *r.mutable_tensors()) {
    if (t.handle_kind() == rvd::v1::IPC_HANDLE_KIND_CUDA_IPC) t.set_handle(std::string(64, '\x5a'));
  }
  EXPECT_EQ(code(r, &message), grpc::StatusCode::INVALID_ARGUMENT) << message;
  EXPECT_NE(message.find("does not map"), std::string::npos) << message;
  // Another device.
  r = Request("gpu-refused", false);
  r.set_device_uuid("GPU-00000000-0000-0000-0000-000000000000");
  EXPECT_EQ(code(r, &message), grpc::StatusCode::FAILED_PRECONDITION) << message;
  // A tensor past the end of the real allocation, declared inside a
  // larger segment: the mapping's size (from the module) refuses it.
  r = Request("gpu-refused", false);
  const Placement place = Place();
  for (rvd::v1::LiveTensor& t : *r.mutable_tensors()) {
    if (t.handle_kind() == rvd::v1::IPC_HANDLE_KIND_CUDA_IPC) {
      t.set_segment_bytes(place.segment_bytes[1] * 4);
    }
  }
  r.mutable_tensors(4)->set_offset_bytes(place.segment_bytes[1] * 2);
  EXPECT_EQ(code(r, &message), grpc::StatusCode::INVALID_ARGUMENT) << message;
  // The module compares the producer's segment size with the mapping's
  // before any tensor is placed in it.
  EXPECT_NE(message.find("the producer says the segment holds"), std::string::npos) << message;
  // Then the same model registers and measures.
  rvd::v1::RegisterLiveModelResponse ok;
  {
    grpc::ClientContext ctx;
    const grpc::Status s = stub_->RegisterLiveModel(&ctx, Request("gpu-refused", true), &ok);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  EXPECT_EQ(ok.segments_mapped(), 2u);
  EXPECT_EQ(ok.segments_reused(), 0u);  // nothing of the refusals stayed mapped
  ExpectVersion(ok.measurement(), 0);
}

}  // namespace
}  // namespace rvd

int main(int argc, char** argv) {
  if (argc > 2 && std::string(argv[1]) == "--producer") {
    return rvd::ProducerMain(std::stoull(argv[2]));
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}

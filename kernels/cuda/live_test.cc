// GPU tests of live weights through the module's table (label gpu; on the
// H200 host: build/bin/cuda_live_test). The parent drives the module as the
// daemon does (rvd_cuda_module_table(), module.cc linked in); the weights
// live in a producer process, this binary again run with --producer
// (fork + exec: a forked CUDA process cannot use the GPU), which shares
// them by cudaMalloc IPC handles or by PyTorch's expandable-segment handle
// (cuMemCreate pages exported as POSIX file descriptors, the body written
// exactly as torch's share()), fills them with matrices of varied spectra
// (kernels/test_matrices.h, the printed seed) and rewrites them on command
// with a slow kernel, recording its interprocess event.
//
// Checked: snapshots copy bytewise, and their deltas match a host float64
// computation; a snapshot waits for the producer's event, and a producer
// that waits for rvd's event never overwrites a snapshot in progress (each
// with its mutant: the wait skipped, which the same check must catch);
// errors (a garbage handle, a pid that does not exist, the wrong device, a
// bad item) are clear statuses that leave the device healthy; a cancelled
// finish returns promptly; and a timing line for 32 x 1024x4096 bf16.
// Without a GPU every test skips.
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cuda/driver_api.h"
#include "kernels/cuda/ipc_handle.h"
#include "kernels/cuda/live.h"
#include "kernels/cuda/live_test_kernels.h"
#include "kernels/cuda_module.h"
#include "kernels/dtype_convert.h"
#include "kernels/engine.h"
#include "kernels/test_matrices.h"

extern "C" const rvd_cuda_module* rvd_cuda_module_table();

namespace rvd::cuda {
namespace {

using ::testing::HasSubstr;

// ---------------------------------------------------------------------------
// The weights: two segments holding six tensors of every kind the snapshot
// handles (contiguous bf16/f32, strided f16 at an unaligned base, a blocked
// gpt_neox-like V crossing a 2 MiB page, a 7B layer, a small odd f32 with a
// tail), their bytes at each step. Both processes compute the same bytes.

struct TensorSpec {
  int segment;
  uint64_t offset;  // bytes from the segment's start
  int64_t rows, cols, ld, block_rows, block_stride;
  DType dtype;
  Spectrum spectrum;
};

constexpr uint64_t kMiB = 1u << 20;
const std::vector<uint64_t> kSegmentBytes = {4 * kMiB, 10 * kMiB};  // multiples of 2 MiB pages

std::vector<TensorSpec> Tensors() {
  return {
      {0, 0, 256, 1024, 1024, 0, 0, DType::kBF16, Spectrum::kPowerLaw},
      {0, kMiB / 2 + 256, 128, 512, 512, 0, 0, DType::kF32, Spectrum::kFlat},
      {0, kMiB + 2, 200, 300, 320, 0, 0, DType::kF16, Spectrum::kGaussian},
      {0, 3 * kMiB / 2, 256, 512, 512, 64, 192 * 512, DType::kBF16, Spectrum::kRankDeficient},
      {1, kMiB, 1024, 4096, 4096, 0, 0, DType::kBF16, Spectrum::kPowerLaw},
      {1, 9 * kMiB + kMiB / 2, 37, 45, 45, 0, 0, DType::kF32, Spectrum::kRankOne},
  };
}

// Byte offset of element (i, j) from the tensor's start.
uint64_t ElementOffset(const TensorSpec& t, int64_t i, int64_t j) {
  const int64_t es = static_cast<int64_t>(DTypeSize(t.dtype));
  const int64_t row = t.block_rows == 0
                          ? i * t.ld
                          : (i / t.block_rows) * t.block_stride + (i % t.block_rows) * t.ld;
  return static_cast<uint64_t>((row + j) * es);
}

void PutValue(uint8_t* p, DType dt, double v) {
  const float f = static_cast<float>(v);
  if (dt == DType::kF32) {
    std::memcpy(p, &f, 4);
  } else {
    const uint16_t b = dt == DType::kBF16 ? FloatToBFloat16(f) : FloatToHalf(f);
    std::memcpy(p, &b, 2);
  }
}

double GetValue(const uint8_t* p, DType dt) {
  if (dt == DType::kF32) {
    float f;
    std::memcpy(&f, p, 4);
    return f;
  }
  uint16_t b;
  std::memcpy(&b, p, 2);
  return dt == DType::kBF16 ? BFloat16ToFloat(b) : HalfToFloat(b);
}

// Every segment's bytes at `step`: 0xff (NaN in every dtype) where no
// tensor is, so a snapshot that reads padding or a neighbour differs.
std::vector<std::vector<uint8_t>> Image(uint64_t seed, int step) {
  std::vector<std::vector<uint8_t>> image;
  for (uint64_t b : kSegmentBytes) image.emplace_back(b, 0xff);
  const std::vector<TensorSpec> tensors = Tensors();
  for (size_t k = 0; k < tensors.size(); ++k) {
    const TensorSpec& t = tensors[k];
    std::mt19937_64 rng(seed * 1000003u + static_cast<uint64_t>(step) * 7919u + k);
    const std::vector<double> w = MakeMatrix(rng, t.rows, t.cols, t.spectrum);
    uint8_t* base = image[t.segment].data() + t.offset;
    for (int64_t i = 0; i < t.rows; ++i) {
      for (int64_t j = 0; j < t.cols; ++j) {
        PutValue(base + ElementOffset(t, i, j), t.dtype, w[i * t.cols + j]);
      }
    }
  }
  return image;
}

uint64_t DenseBytes(const TensorSpec& t) {
  return static_cast<uint64_t>(t.rows * t.cols) * DTypeSize(t.dtype);
}

// Tensor k of an image, dense (what a snapshot's dst must hold).
std::vector<uint8_t> Dense(const std::vector<std::vector<uint8_t>>& image, const TensorSpec& t) {
  const size_t es = DTypeSize(t.dtype);
  std::vector<uint8_t> out(DenseBytes(t));
  const uint8_t* base = image[t.segment].data() + t.offset;
  for (int64_t i = 0; i < t.rows; ++i) {
    std::memcpy(out.data() + i * t.cols * es, base + ElementOffset(t, i, 0), t.cols * es);
  }
  return out;
}

// ||now - last||^2 and ||last||^2 in float64 (the oracle of the sums).
std::pair<double, double> HostSums(const std::vector<uint8_t>& now,
                                   const std::vector<uint8_t>& last, DType dt) {
  const size_t es = DTypeSize(dt);
  double d2 = 0, l2 = 0;
  for (size_t i = 0; i < now.size(); i += es) {
    const double a = GetValue(now.data() + i, dt), b = GetValue(last.data() + i, dt);
    d2 += (a - b) * (a - b);
    l2 += b * b;
  }
  return {d2, l2};
}

// ---------------------------------------------------------------------------
// The producer process and its protocol: length-prefixed messages on its
// stdin and stdout (its stderr is the test's).

bool WriteAll(int fd, const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    const ssize_t w = write(fd, c, n);
    if (w <= 0) return false;
    c += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

bool ReadAll(int fd, void* p, size_t n) {
  char* c = static_cast<char*>(p);
  while (n > 0) {
    const ssize_t r = read(fd, c, n);
    if (r <= 0) return false;
    c += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

bool SendMsg(int fd, const std::string& m) {
  const uint32_t n = static_cast<uint32_t>(m.size());
  return WriteAll(fd, &n, 4) && WriteAll(fd, m.data(), m.size());
}

bool RecvMsg(int fd, std::string* m) {
  uint32_t n = 0;
  if (!ReadAll(fd, &n, 4)) return false;
  m->resize(n);
  return ReadAll(fd, m->data(), n);
}

std::string Bytes(const void* p, size_t n) { return std::string(static_cast<const char*>(p), n); }

// The producer's side. Commands (text, space-separated):
//   open c|e SEED DEVICE   segments of kSegmentBytes holding Image(SEED, 0);
//                          replies "ok", then per segment its handle body,
//                          then its event's 64-byte handle (or "error ...")
//   rvd_event              the next message is rvd's event handle: opened
//   stage STEP             Image(SEED, STEP) generated and staged
//   update STEP WAIT MS    STEP staged (if not yet), then on its stream:
//                          [wait on rvd's event if WAIT] spin MS ms, copy
//                          into the segments, record its event; "ok" at once
//   big SEED               16 cudaMalloc segments of two 1024x4096 bf16 each,
//                          hash-filled; per segment its handle
//   sync                   its stream synchronized; "ok"
struct ProducerState {
  uint64_t seed = 0;
  cudaStream_t stream = nullptr;
  cudaEvent_t event = nullptr;      // the producer's interprocess event
  cudaEvent_t rvd_event = nullptr;  // rvd's, opened here
  std::vector<void*> segments;      // device addresses
  std::vector<void*> staging;       // device copies of the next image
  int staged_step = -1;             // the step staging holds, or -1
};

std::string ProducerOpen(ProducerState& st, char kind, int device) {
  if (cudaSetDevice(device) != cudaSuccess) return "error cudaSetDevice";
  if (cudaStreamCreateWithFlags(&st.stream, cudaStreamNonBlocking) != cudaSuccess ||
      cudaEventCreateWithFlags(&st.event, cudaEventDisableTiming | cudaEventInterprocess) !=
          cudaSuccess) {
    return "error stream/event";
  }
  std::vector<std::string> handles;
  if (kind == 'c') {
    for (uint64_t bytes : kSegmentBytes) {
      void* p = nullptr;
      cudaIpcMemHandle_t h;
      if (cudaMalloc(&p, bytes) != cudaSuccess || cudaIpcGetMemHandle(&h, p) != cudaSuccess) {
        return "error cudaMalloc/cudaIpcGetMemHandle";
      }
      st.segments.push_back(p);
      handles.push_back(Bytes(&h, sizeof(h)));
    }
  } else {
    absl::StatusOr<const DriverApi*> loaded = GetDriverApi();
    if (!loaded.ok()) return absl::StrCat("error ", loaded.status().ToString());
    const DriverApi& api = **loaded;
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = device;
    size_t page = 0;
    if (api.cuMemGetAllocationGranularity(&page, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) !=
            CUDA_SUCCESS ||
        page == 0 || (2 * kMiB) % page != 0) {
      return "error granularity";
    }
    page = 2 * kMiB;  // torch's small-pool page; a multiple of the granularity
    for (uint64_t bytes : kSegmentBytes) {
      CUdeviceptr va = 0;
      if (api.cuMemAddressReserve(&va, bytes, 0, 0, 0) != CUDA_SUCCESS) return "error reserve";
      std::vector<int32_t> fds;
      for (uint64_t off = 0; off < bytes; off += page) {
        CUmemGenericAllocationHandle h = 0;
        int fd = -1;
        if (api.cuMemCreate(&h, page, &prop, 0) != CUDA_SUCCESS ||
            api.cuMemMap(va + off, page, 0, h, 0) != CUDA_SUCCESS ||
            api.cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                                             0) != CUDA_SUCCESS) {
          return "error cuMemCreate/Map/Export";
        }
        fds.push_back(fd);  // kept open: the consumer takes it with pidfd_getfd
      }
      CUmemAccessDesc access{};
      access.location = prop.location;
      access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
      if (api.cuMemSetAccess(va, bytes, &access, 1) != CUDA_SUCCESS) return "error access";
      st.segments.push_back(reinterpret_cast<void*>(va));
      const std::vector<uint8_t> body =
          SerializeExpandableShare(static_cast<int32_t>(getpid()), page, fds);
      handles.push_back(Bytes(body.data(), body.size()));
    }
  }
  const std::vector<std::vector<uint8_t>> image = Image(st.seed, 0);
  for (size_t s = 0; s < st.segments.size(); ++s) {
    void* p = nullptr;
    if (cudaMalloc(&p, kSegmentBytes[s]) != cudaSuccess ||
        cudaMemcpy(st.segments[s], image[s].data(), kSegmentBytes[s], cudaMemcpyHostToDevice) !=
            cudaSuccess) {
      return "error staging";
    }
    st.staging.push_back(p);
  }
  if (cudaEventRecord(st.event, st.stream) != cudaSuccess) return "error record";
  cudaIpcEventHandle_t eh;
  if (cudaIpcGetEventHandle(&eh, st.event) != cudaSuccess) return "error event handle";
  std::string reply = "ok";
  for (const std::string& h : handles) reply += absl::StrCat("|", h.size());
  reply += "|";
  for (const std::string& h : handles) reply += h;
  reply += Bytes(&eh, sizeof(eh));
  return reply;
}

// Image(seed, step) into the staging buffers (host generation takes a
// while for the 7B layer: done before an update that must land at once).
std::string ProducerStage(ProducerState& st, int step) {
  if (st.staged_step == step) return "ok";
  const std::vector<std::vector<uint8_t>> image = Image(st.seed, step);
  // The staging buffers are idle once the stream's earlier copies ended.
  if (cudaStreamSynchronize(st.stream) != cudaSuccess) return "error sync";
  for (size_t s = 0; s < st.segments.size(); ++s) {
    if (cudaMemcpy(st.staging[s], image[s].data(), kSegmentBytes[s], cudaMemcpyHostToDevice) !=
        cudaSuccess) {
      return "error stage";
    }
  }
  st.staged_step = step;
  return "ok";
}

std::string ProducerUpdate(ProducerState& st, int step, bool wait_rvd, double ms) {
  if (std::string s = ProducerStage(st, step); s != "ok") return s;
  if (wait_rvd && (st.rvd_event == nullptr ||
                   cudaStreamWaitEvent(st.stream, st.rvd_event, 0) != cudaSuccess)) {
    return "error wait on rvd's event";
  }
  if (ms > 0 && live_test::LaunchSpin(ms, st.stream) != cudaSuccess) return "error spin";
  for (size_t s = 0; s < st.segments.size(); ++s) {
    if (cudaMemcpyAsync(st.segments[s], st.staging[s], kSegmentBytes[s],
                        cudaMemcpyDeviceToDevice, st.stream) != cudaSuccess) {
      return "error copy";
    }
  }
  if (cudaEventRecord(st.event, st.stream) != cudaSuccess) return "error record";
  st.staged_step = -1;  // the staging buffers are in use until the copy ends
  return "ok";
}

constexpr int kBigTensors = 32;
constexpr int64_t kBigRows = 1024, kBigCols = 4096;
constexpr uint64_t kBigTensorBytes = kBigRows * kBigCols * 2;

std::string ProducerBig(ProducerState& st) {
  std::string reply = "ok";
  for (int s = 0; s < kBigTensors / 2; ++s) {
    void* p = nullptr;
    cudaIpcMemHandle_t h;
    if (cudaMalloc(&p, 2 * kBigTensorBytes) != cudaSuccess ||
        live_test::LaunchHashFill(static_cast<uint16_t*>(p), 2 * kBigTensorBytes / 2, st.seed,
                                  static_cast<uint64_t>(s) * (2 * kBigTensorBytes / 2),
                                  st.stream) != cudaSuccess ||
        cudaIpcGetMemHandle(&h, p) != cudaSuccess) {
      return "error big";
    }
    reply += Bytes(&h, sizeof(h));
  }
  if (cudaStreamSynchronize(st.stream) != cudaSuccess) return "error big sync";
  return reply;
}

int ProducerMain() {
  ProducerState st;
  std::string cmd;
  while (RecvMsg(0, &cmd)) {
    const std::vector<std::string> a = absl::StrSplit(cmd, ' ');
    std::string reply;
    if (a[0] == "open" && a.size() == 4) {
      st.seed = std::stoull(a[2]);
      reply = ProducerOpen(st, a[1][0], std::stoi(a[3]));
    } else if (a[0] == "rvd_event") {
      std::string h;
      cudaIpcEventHandle_t eh;
      if (!RecvMsg(0, &h) || h.size() != sizeof(eh)) return 1;
      std::memcpy(&eh, h.data(), sizeof(eh));
      reply = cudaIpcOpenEventHandle(&st.rvd_event, eh) == cudaSuccess ? "ok" : "error open";
    } else if (a[0] == "stage" && a.size() == 2) {
      reply = ProducerStage(st, std::stoi(a[1]));
    } else if (a[0] == "update" && a.size() == 4) {
      reply = ProducerUpdate(st, std::stoi(a[1]), a[2] == "1", std::stod(a[3]));
    } else if (a[0] == "big" && a.size() == 2) {
      st.seed = std::stoull(a[1]);
      if (st.stream == nullptr) cudaStreamCreateWithFlags(&st.stream, cudaStreamNonBlocking);
      reply = ProducerBig(st);
    } else if (a[0] == "sync") {
      reply = cudaStreamSynchronize(st.stream) == cudaSuccess ? "ok" : "error sync";
    } else {
      reply = "error unknown command " + cmd;
    }
    if (!SendMsg(1, reply)) return 1;
  }
  return 0;  // the parent closed the pipe
}

class Producer {
 public:
  Producer() {
    int to[2], from[2];
    if (pipe(to) != 0 || pipe(from) != 0) return;
    pid_ = fork();
    if (pid_ == 0) {
      dup2(to[0], 0);
      dup2(from[1], 1);
      close(to[1]);
      close(from[0]);
      char self[] = "/proc/self/exe";
      char arg[] = "--producer";
      char* argv[] = {self, arg, nullptr};
      execv(self, argv);
      _exit(127);
    }
    close(to[0]);
    close(from[1]);
    to_ = to[1];
    from_ = from[0];
  }
  ~Producer() {
    if (to_ >= 0) close(to_);  // the producer exits at EOF
    if (from_ >= 0) close(from_);
    if (pid_ > 0) waitpid(pid_, nullptr, 0);
  }
  pid_t pid() const { return pid_; }
  std::string Call(const std::string& cmd) {
    std::string reply;
    if (!SendMsg(to_, cmd) || !RecvMsg(from_, &reply)) return "error: the producer is gone";
    return reply;
  }
  void Send(const std::string& msg) { SendMsg(to_, msg); }

 private:
  pid_t pid_ = -1;
  int to_ = -1, from_ = -1;
};

// What "open" handed over.
struct Shared {
  std::vector<std::string> handles;  // per segment
  std::string event;                 // 64 bytes
};

bool ParseOpen(const std::string& reply, size_t segments, Shared* out) {
  if (!absl::StartsWith(reply, "ok|")) return false;
  size_t pos = 3;
  std::vector<size_t> sizes;
  for (size_t s = 0; s < segments; ++s) {
    const size_t bar = reply.find('|', pos);
    if (bar == std::string::npos) return false;
    sizes.push_back(std::stoul(reply.substr(pos, bar - pos)));
    pos = bar + 1;
  }
  for (size_t n : sizes) {
    out->handles.push_back(reply.substr(pos, n));
    pos += n;
  }
  out->event = reply.substr(pos);
  return out->event.size() == 64;
}

// ---------------------------------------------------------------------------
// The parent: the module as the daemon drives it.

std::string StatusText(const rvd_status& s) { return absl::StrCat(s.code, ": ", s.message); }

class LiveTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
      GTEST_SKIP() << "no CUDA device";
    }
    module_ = rvd_cuda_module_table();
    ASSERT_NE(module_->live, nullptr);
    live_ = module_->live;
    rvd_cuda_options o{};
    o.device = 0;
    o.streams = 2;
    o.max_device_bytes = 2ull << 30;
    rvd_status st{};
    engine_ = module_->create(&o, &st);
    ASSERT_NE(engine_, nullptr) << StatusText(st);
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), cudaSuccess);
    seed_ = TestSeed();
  }
  void TearDown() override {
    if (stream_ != nullptr) cudaStreamSynchronize(stream_);
    if (engine_ != nullptr) {
      EXPECT_EQ(module_->lost(engine_), nullptr) << "the device was marked lost";
      module_->destroy(engine_);
    }
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  int64_t Served() {
    int64_t n = 0;
    module_->stats(
        engine_,
        +[](void* ctx, const char* kind, const char* key, double v) {
          if (std::string(kind) == "served" && std::string(key) == kSnapshotServedKey) {
            *static_cast<int64_t*>(ctx) = static_cast<int64_t>(v);
          }
        },
        &n);
    return n;
  }

  // Opens every segment the producer shared; false (with a skip reason in
  // *skip) when the permission for expandable segments is missing.
  bool OpenSegments(char kind, Producer& p, const Shared& sh, std::string* skip) {
    for (size_t s = 0; s < sh.handles.size(); ++s) {
      rvd_ipc_segment_desc d{};
      d.kind = kind == 'c' ? RVD_IPC_CUDA_MALLOC : RVD_IPC_EXPANDABLE;
      d.handle = reinterpret_cast<const uint8_t*>(sh.handles[s].data());
      d.handle_bytes = static_cast<uint32_t>(sh.handles[s].size());
      d.producer_pid = p.pid();
      d.segment_bytes = kSegmentBytes[s];
      void* base = nullptr;
      uint64_t bytes = 0;
      rvd_status st{};
      rvd_ipc_segment* seg = live_->ipc_open(engine_, &d, &base, &bytes, &st);
      if (seg == nullptr && st.code == static_cast<int32_t>(absl::StatusCode::kPermissionDenied)) {
        // The error must name what is missing.
        EXPECT_THAT(std::string(st.message), HasSubstr("CAP_SYS_PTRACE"));
        EXPECT_THAT(std::string(st.message), HasSubstr("ptrace_scope"));
        *skip = StatusText(st);
        return false;
      }
      EXPECT_NE(seg, nullptr) << StatusText(st);
      if (seg == nullptr) return false;
      EXPECT_GE(bytes, kSegmentBytes[s]);
      segments_.push_back(seg);
      bases_.push_back(static_cast<uint8_t*>(base));
    }
    return true;
  }

  void CloseAll() {
    for (rvd_ipc_segment* s : segments_) live_->ipc_close(engine_, s);
    segments_.clear();
    bases_.clear();
    for (void* e : events_) live_->event_destroy(engine_, e);
    events_.clear();
    for (void* b : buffers_) live_->free_device(engine_, b);
    buffers_.clear();
  }

  void* Alloc(uint64_t bytes) {
    rvd_status st{};
    void* p = live_->alloc_device(engine_, bytes, &st);
    EXPECT_NE(p, nullptr) << StatusText(st);
    if (p != nullptr) buffers_.push_back(p);
    return p;
  }

  // The items of Tensors() over the open segments, into dst[k], last[k].
  std::vector<rvd_snapshot_item> Items(const std::vector<void*>& dst,
                                       const std::vector<void*>* last) {
    std::vector<rvd_snapshot_item> items;
    const std::vector<TensorSpec> tensors = Tensors();
    for (size_t k = 0; k < tensors.size(); ++k) {
      const TensorSpec& t = tensors[k];
      rvd_snapshot_item it{};
      it.src = rvd_matrix{bases_[t.segment] + t.offset,
                          t.rows,
                          t.cols,
                          t.ld,
                          static_cast<int32_t>(t.dtype),
                          RVD_MEMORY_DEVICE,
                          t.block_rows,
                          t.block_stride};
      it.dst = dst[k];
      it.last = last != nullptr ? (*last)[k] : nullptr;
      items.push_back(it);
    }
    return items;
  }

  // Starts and finishes one snapshot; the sums into *d2, *l2.
  void Snapshot(const std::vector<rvd_snapshot_item>& items, void* wait, void* done,
                std::vector<double>* d2, std::vector<double>* l2) {
    rvd_status st{};
    rvd_snapshot* s = live_->snapshot_start(engine_, items.data(), items.size(), wait, done, &st);
    ASSERT_NE(s, nullptr) << StatusText(st);
    d2->assign(items.size(), std::nan(""));
    l2->assign(items.size(), std::nan(""));
    ASSERT_EQ(live_->snapshot_finish(engine_, s, d2->data(), l2->data(), nullptr, &st), 0)
        << StatusText(st);
  }

  // Mismatching bytes between tensor k's dst and Image(seed_, step).
  int64_t Mismatches(const std::vector<void*>& dst, int step) {
    const std::vector<std::vector<uint8_t>>& image = ImageAt(step);
    const std::vector<TensorSpec> tensors = Tensors();
    int64_t bad = 0;
    for (size_t k = 0; k < tensors.size(); ++k) {
      const std::vector<uint8_t> want = Dense(image, tensors[k]);
      std::vector<uint8_t> got(want.size());
      EXPECT_EQ(cudaMemcpy(got.data(), dst[k], got.size(), cudaMemcpyDeviceToHost), cudaSuccess);
      for (size_t i = 0; i < want.size(); ++i) bad += got[i] != want[i];
    }
    return bad;
  }

  void ExpectSums(const std::vector<double>& d2, const std::vector<double>& l2, int step,
                  int last_step) {
    const std::vector<std::vector<uint8_t>>& now = ImageAt(step);
    const std::vector<std::vector<uint8_t>>& last = ImageAt(last_step);
    const std::vector<TensorSpec> tensors = Tensors();
    for (size_t k = 0; k < tensors.size(); ++k) {
      const auto [want_d2, want_l2] =
          HostSums(Dense(now, tensors[k]), Dense(last, tensors[k]), tensors[k].dtype);
      EXPECT_NEAR(d2[k], want_d2, 1e-10 * want_d2 + 1e-300) << "tensor " << k;
      EXPECT_NEAR(l2[k], want_l2, 1e-10 * want_l2 + 1e-300) << "tensor " << k;
      EXPECT_GT(want_d2, 0) << "tensor " << k << ": the steps must differ";
    }
  }

  // A producer with kind's segments open here, its event and rvd's.
  struct Session {
    Producer producer;
    Shared shared;
    void* producer_event = nullptr;
    void* rvd_event = nullptr;
  };
  // False with *skip set when the environment lacks the permission.
  bool Start(char kind, Session* s, std::string* skip) {
    const std::string reply = s->producer.Call(absl::StrCat("open ", std::string(1, kind), " ",
                                                            seed_, " 0"));
    EXPECT_TRUE(ParseOpen(reply, kSegmentBytes.size(), &s->shared)) << reply.substr(0, 200);
    if (s->shared.handles.size() != kSegmentBytes.size()) return false;
    if (!OpenSegments(kind, s->producer, s->shared, skip)) return false;
    rvd_status st{};
    s->producer_event = live_->ipc_open_event(
        engine_, reinterpret_cast<const uint8_t*>(s->shared.event.data()), &st);
    EXPECT_NE(s->producer_event, nullptr) << StatusText(st);
    uint8_t handle[64];
    s->rvd_event = live_->ipc_create_event(engine_, handle, &st);
    EXPECT_NE(s->rvd_event, nullptr) << StatusText(st);
    if (s->producer_event == nullptr || s->rvd_event == nullptr) return false;
    events_.push_back(s->producer_event);
    events_.push_back(s->rvd_event);
    s->producer.Send("rvd_event");
    EXPECT_EQ(s->producer.Call(Bytes(handle, 64)), "ok");
    return true;
  }

  std::vector<void*> DenseBuffers() {
    std::vector<void*> out;
    for (const TensorSpec& t : Tensors()) out.push_back(Alloc(DenseBytes(t)));
    return out;
  }

  // Three snapshots of steps 0, 1, 2, each with deltas against the one
  // before, checked bytewise and against the host sums.
  void SnapshotsWithDeltas(char kind) {
    Session s;
    std::string skip;
    if (!Start(kind, &s, &skip)) {
      CloseAll();
      if (!skip.empty()) GTEST_SKIP() << "expandable segments not permitted here: " << skip;
      return;
    }
    const std::vector<void*> a = DenseBuffers(), b = DenseBuffers();
    const int64_t served0 = Served();
    std::vector<double> d2, l2;
    Snapshot(Items(a, nullptr), s.producer_event, s.rvd_event, &d2, &l2);
    EXPECT_EQ(Mismatches(a, 0), 0);
    for (size_t k = 0; k < d2.size(); ++k) {
      EXPECT_EQ(d2[k], 0.0);  // no last: 0
      EXPECT_EQ(l2[k], 0.0);
    }
    ASSERT_EQ(s.producer.Call("update 1 1 20"), "ok");
    Snapshot(Items(b, &a), s.producer_event, s.rvd_event, &d2, &l2);
    EXPECT_EQ(Mismatches(b, 1), 0);
    ExpectSums(d2, l2, 1, 0);
    ASSERT_EQ(s.producer.Call("update 2 1 20"), "ok");
    Snapshot(Items(a, &b), s.producer_event, s.rvd_event, &d2, &l2);
    EXPECT_EQ(Mismatches(a, 2), 0);
    ExpectSums(d2, l2, 2, 1);
    EXPECT_EQ(Served() - served0, static_cast<int64_t>(3 * Tensors().size()));
    ASSERT_EQ(s.producer.Call("sync"), "ok");
    CloseAll();
  }

  // Image(seed_, step), made once per test (the 7B layer takes a while).
  const std::vector<std::vector<uint8_t>>& ImageAt(int step) {
    auto it = images_.find(step);
    if (it == images_.end()) it = images_.emplace(step, Image(seed_, step)).first;
    return it->second;
  }

  std::map<int, std::vector<std::vector<uint8_t>>> images_;
  const rvd_cuda_module* module_ = nullptr;
  const rvd_cuda_live* live_ = nullptr;
  rvd_cuda_engine* engine_ = nullptr;
  cudaStream_t stream_ = nullptr;
  uint64_t seed_ = 0;
  std::vector<rvd_ipc_segment*> segments_;
  std::vector<uint8_t*> bases_;
  std::vector<void*> events_;
  std::vector<void*> buffers_;
};

TEST_F(LiveTest, DeviceUuidAsNvidiaSmiPrintsIt) {
  char uuid[64] = {};
  rvd_status st{};
  ASSERT_EQ(live_->device_uuid(engine_, uuid, &st), 0) << StatusText(st);
  cudaDeviceProp prop;
  ASSERT_EQ(cudaGetDeviceProperties(&prop, 0), cudaSuccess);
  EXPECT_EQ(std::string(uuid),
            FormatGpuUuid(reinterpret_cast<const unsigned char*>(prop.uuid.bytes)));
  EXPECT_EQ(std::strlen(uuid), 40u);
  EXPECT_TRUE(absl::StartsWith(uuid, "GPU-")) << uuid;
  std::fprintf(stderr, "device 0: %s (compare: nvidia-smi -L)\n", uuid);
}

TEST_F(LiveTest, CudaMallocSegmentsSnapshotWithDeltas) { SnapshotsWithDeltas('c'); }

TEST_F(LiveTest, ExpandableSegmentsSnapshotWithDeltas) { SnapshotsWithDeltas('e'); }

// Under the SM cap the copy's 2 blocks take every tile in turn (the grid-
// stride path): the same bytes and sums.
TEST_F(LiveTest, SmCapGivesTheSameSnapshots) {
  module_->destroy(engine_);
  rvd_cuda_options o{};
  o.device = 0;
  o.streams = 2;
  o.max_device_bytes = 2ull << 30;
  o.max_sms = 2;
  rvd_status st{};
  engine_ = module_->create(&o, &st);
  ASSERT_NE(engine_, nullptr) << StatusText(st);
  SnapshotsWithDeltas('c');
}

// The snapshot waits on the producer's event: a slow update (its copy 300
// ms behind a spin) is seen whole. Mutant: the wait skipped, the snapshot
// reads the old weights, and the same check catches it.
TEST_F(LiveTest, SnapshotWaitsForTheProducersUpdate) {
  Session s;
  std::string skip;
  ASSERT_TRUE(Start('c', &s, &skip)) << skip;
  const std::vector<void*> a = DenseBuffers();
  std::vector<double> d2, l2;
  ASSERT_EQ(s.producer.Call("update 1 0 300"), "ok");
  Snapshot(Items(a, nullptr), s.producer_event, s.rvd_event, &d2, &l2);
  EXPECT_EQ(Mismatches(a, 1), 0);
  // Mutant: no wait.
  ASSERT_EQ(s.producer.Call("update 2 0 300"), "ok");
  Snapshot(Items(a, nullptr), /*wait=*/nullptr, s.rvd_event, &d2, &l2);
  const int64_t mutant = Mismatches(a, 2);
  EXPECT_GT(mutant, 0) << "a snapshot that skips the producer's event must see the old weights";
  EXPECT_EQ(Mismatches(a, 1), 0);
  std::fprintf(stderr, "mutant (no wait on the producer's event): %lld bytes differ\n",
               static_cast<long long>(mutant));
  ASSERT_EQ(s.producer.Call("sync"), "ok");
  CloseAll();
}

// A producer whose next update waits on rvd's event never overwrites a
// snapshot in progress: the snapshot is held 300 ms (its `wait` is an
// event of the parent's, recorded after the producer's event and a spin)
// while the producer writes the next step at once. Mutant: the producer
// skips the wait on rvd's event, its write lands inside the snapshot, and
// the same check catches it.
TEST_F(LiveTest, ProducerWaitingOnRvdsEventNeverOverwritesASnapshot) {
  Session s;
  std::string skip;
  ASSERT_TRUE(Start('c', &s, &skip)) << skip;
  const std::vector<void*> a = DenseBuffers();
  cudaEvent_t held;
  ASSERT_EQ(cudaEventCreateWithFlags(&held, cudaEventDisableTiming), cudaSuccess);
  auto run = [&](int step, bool producer_waits) {
    // The weights are at `step`; the snapshot starts 300 ms after that.
    EXPECT_EQ(s.producer.Call("sync"), "ok");
    EXPECT_EQ(s.producer.Call(absl::StrCat("stage ", step + 1)), "ok");
    EXPECT_EQ(cudaStreamWaitEvent(stream_, static_cast<cudaEvent_t>(s.producer_event), 0),
              cudaSuccess);
    EXPECT_EQ(live_test::LaunchSpin(300, stream_), cudaSuccess);
    EXPECT_EQ(cudaEventRecord(held, stream_), cudaSuccess);
    rvd_status st{};
    const std::vector<rvd_snapshot_item> items = Items(a, nullptr);
    rvd_snapshot* snap =
        live_->snapshot_start(engine_, items.data(), items.size(), held, s.rvd_event, &st);
    EXPECT_NE(snap, nullptr) << StatusText(st);
    // The trainer writes step + 1 right after notifying (staged before).
    EXPECT_EQ(s.producer.Call(absl::StrCat("update ", step + 1, " ", producer_waits ? 1 : 0,
                                           " 0")),
              "ok");
    if (snap != nullptr) {
      EXPECT_EQ(live_->snapshot_finish(engine_, snap, nullptr, nullptr, nullptr, &st), 0)
          << StatusText(st);
    }
    return Mismatches(a, step);
  };
  ASSERT_EQ(s.producer.Call("update 1 0 0"), "ok");
  EXPECT_EQ(run(1, /*producer_waits=*/true), 0);
  const int64_t mutant = run(2, /*producer_waits=*/false);
  EXPECT_GT(mutant, 0) << "a producer that skips rvd's event must overwrite the snapshot";
  std::fprintf(stderr, "mutant (producer skips rvd's event): %lld bytes differ\n",
               static_cast<long long>(mutant));
  ASSERT_EQ(s.producer.Call("sync"), "ok");
  cudaStreamSynchronize(stream_);
  cudaEventDestroy(held);
  CloseAll();
}

TEST_F(LiveTest, FinishIsCancellableAndTheSlotIsNotReusedEarly) {
  Session s;
  std::string skip;
  ASSERT_TRUE(Start('c', &s, &skip)) << skip;
  const std::vector<void*> a = DenseBuffers(), b = DenseBuffers();
  cudaEvent_t held;
  ASSERT_EQ(cudaEventCreateWithFlags(&held, cudaEventDisableTiming), cudaSuccess);
  ASSERT_EQ(live_test::LaunchSpin(1500, stream_), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(held, stream_), cudaSuccess);
  const std::vector<rvd_snapshot_item> items = Items(a, nullptr);
  rvd_status st{};
  rvd_snapshot* snap =
      live_->snapshot_start(engine_, items.data(), items.size(), held, nullptr, &st);
  ASSERT_NE(snap, nullptr) << StatusText(st);
  std::atomic<bool> cancel{false};
  std::thread canceller([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    cancel = true;
  });
  const rvd_call call{nullptr, &cancel};
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(live_->snapshot_finish(engine_, snap, nullptr, nullptr, &call, &st),
            static_cast<int32_t>(absl::StatusCode::kCancelled))
      << StatusText(st);
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  canceller.join();
  EXPECT_LT(ms, 500) << "the cancel flag was not polled";
  // The next snapshot (a new slot: the cancelled one is still queued) is
  // right, and so is the cancelled one's copy once its wait ends.
  std::vector<double> d2, l2;
  Snapshot(Items(b, nullptr), s.producer_event, nullptr, &d2, &l2);
  EXPECT_EQ(Mismatches(b, 0), 0);
  ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
  Snapshot(Items(a, &b), nullptr, nullptr, &d2, &l2);  // reuses slots once idle
  EXPECT_EQ(Mismatches(a, 0), 0);
  for (double d : d2) EXPECT_EQ(d, 0.0);  // the same weights: exactly no change
  // The cancelled snapshot's copy into `a` must end before `a` is freed
  // (the caller's fence, live.h).
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  cudaEventDestroy(held);
  CloseAll();
}

TEST_F(LiveTest, ErrorsAreClearAndLeaveTheDeviceHealthy) {
  auto code = [](const rvd_status& st) { return static_cast<absl::StatusCode>(st.code); };
  rvd_status st{};
  void* base = nullptr;
  uint64_t bytes = 0;
  // A garbage cudaMalloc handle.
  std::mt19937_64 rng(seed_);
  std::vector<uint8_t> garbage(64);
  for (uint8_t& g : garbage) g = static_cast<uint8_t>(rng());
  rvd_ipc_segment_desc d{};
  d.kind = RVD_IPC_CUDA_MALLOC;
  d.handle = garbage.data();
  d.handle_bytes = 64;
  EXPECT_EQ(live_->ipc_open(engine_, &d, &base, &bytes, &st), nullptr);
  EXPECT_EQ(code(st), absl::StatusCode::kInvalidArgument) << StatusText(st);
  EXPECT_THAT(std::string(st.message), HasSubstr("does not open"));
  d.handle_bytes = 66;  // the prefix left on
  EXPECT_EQ(live_->ipc_open(engine_, &d, &base, &bytes, &st), nullptr);
  EXPECT_EQ(code(st), absl::StatusCode::kInvalidArgument) << StatusText(st);
  EXPECT_THAT(std::string(st.message), HasSubstr("2-byte prefix"));
  // A garbage event handle.
  EXPECT_EQ(live_->ipc_open_event(engine_, garbage.data(), &st), nullptr);
  EXPECT_EQ(code(st), absl::StatusCode::kInvalidArgument) << StatusText(st);

  // A pid that does not exist: a child that has exited and been reaped.
  const pid_t gone = fork();
  if (gone == 0) _exit(0);
  waitpid(gone, nullptr, 0);
  d.handle_bytes = 64;
  d.producer_pid = gone;
  EXPECT_EQ(live_->ipc_open(engine_, &d, &base, &bytes, &st), nullptr);
  EXPECT_EQ(code(st), absl::StatusCode::kNotFound) << StatusText(st);
  EXPECT_THAT(std::string(st.message), HasSubstr("pid namespace"));
  std::vector<uint8_t> e = SerializeExpandableShare(gone, 2 * kMiB, {5});
  d.kind = RVD_IPC_EXPANDABLE;
  d.handle = e.data();
  d.handle_bytes = static_cast<uint32_t>(e.size());
  EXPECT_EQ(live_->ipc_open(engine_, &d, &base, &bytes, &st), nullptr);
  EXPECT_EQ(code(st), absl::StatusCode::kNotFound) << StatusText(st);
  EXPECT_THAT(std::string(st.message), HasSubstr("pid namespace"));
  // A bad 'e' body.
  d.handle_bytes = 20;
  EXPECT_EQ(live_->ipc_open(engine_, &d, &base, &bytes, &st), nullptr);
  EXPECT_EQ(code(st), absl::StatusCode::kInvalidArgument) << StatusText(st);

  // A live producer whose named descriptors are not CUDA memory (its stdin)
  // or do not exist.
  Session s;
  std::string skip;
  ASSERT_TRUE(Start('c', &s, &skip)) << skip;
  for (int32_t fd : {0, 987}) {
    e = SerializeExpandableShare(s.producer.pid(), 2 * kMiB, {fd});
    d.handle = e.data();
    d.handle_bytes = static_cast<uint32_t>(e.size());
    d.producer_pid = s.producer.pid();
    EXPECT_EQ(live_->ipc_open(engine_, &d, &base, &bytes, &st), nullptr);
    if (code(st) == absl::StatusCode::kPermissionDenied) {
      EXPECT_THAT(std::string(st.message), HasSubstr("CAP_SYS_PTRACE"));
      std::fprintf(stderr, "pidfd_getfd not permitted here: %s\n", st.message);
      continue;
    }
    EXPECT_EQ(code(st), absl::StatusCode::kInvalidArgument) << "fd " << fd << ": "
                                                            << StatusText(st);
    EXPECT_THAT(std::string(st.message), HasSubstr(fd == 0 ? "not CUDA memory" : "no such file descriptor"));
  }
  // Memory over the cap, and bad items: nothing is enqueued.
  EXPECT_EQ(live_->alloc_device(engine_, 3ull << 30, &st), nullptr);
  EXPECT_EQ(code(st), absl::StatusCode::kResourceExhausted) << StatusText(st);
  const std::vector<void*> a = DenseBuffers();
  std::vector<rvd_snapshot_item> items = Items(a, nullptr);
  items[2].src.memory = RVD_MEMORY_HOST;
  EXPECT_EQ(live_->snapshot_start(engine_, items.data(), items.size(), nullptr, nullptr, &st),
            nullptr);
  EXPECT_EQ(code(st), absl::StatusCode::kInvalidArgument) << StatusText(st);
  EXPECT_THAT(std::string(st.message), HasSubstr("items[2]"));

  // The device is still healthy and serves.
  EXPECT_EQ(module_->lost(engine_), nullptr);
  std::vector<double> d2, l2;
  Snapshot(Items(a, nullptr), s.producer_event, s.rvd_event, &d2, &l2);
  EXPECT_EQ(Mismatches(a, 0), 0);
  CloseAll();
}

TEST_F(LiveTest, SegmentOfAnotherDeviceIsFailedPrecondition) {
  int count = 0;
  ASSERT_EQ(cudaGetDeviceCount(&count), cudaSuccess);
  if (count < 2) GTEST_SKIP() << "one CUDA device: run on a host with two for this check";
  for (char kind : {'c', 'e'}) {
    Producer p;
    Shared sh;
    const std::string reply = p.Call(absl::StrCat("open ", std::string(1, kind), " ", seed_, " 1"));
    ASSERT_TRUE(ParseOpen(reply, kSegmentBytes.size(), &sh)) << reply.substr(0, 200);
    rvd_ipc_segment_desc d{};
    d.kind = kind == 'c' ? RVD_IPC_CUDA_MALLOC : RVD_IPC_EXPANDABLE;
    d.handle = reinterpret_cast<const uint8_t*>(sh.handles[0].data());
    d.handle_bytes = static_cast<uint32_t>(sh.handles[0].size());
    d.producer_pid = p.pid();
    void* base = nullptr;
    uint64_t bytes = 0;
    rvd_status st{};
    EXPECT_EQ(live_->ipc_open(engine_, &d, &base, &bytes, &st), nullptr);
    if (st.code == static_cast<int32_t>(absl::StatusCode::kPermissionDenied)) continue;
    EXPECT_EQ(st.code, static_cast<int32_t>(absl::StatusCode::kFailedPrecondition))
        << kind << ": " << StatusText(st);
    EXPECT_THAT(std::string(st.message), HasSubstr("device 1"));
  }
}

// 32 x 1024x4096 bf16 (a 7B model's V set, 256 MiB in 16 segments, as torch
// lays it out): the copy alone and the copy with deltas, GPU time between
// the snapshot's wait and done events, beside a cudaMemcpyAsync of the same
// bytes; checked bytewise and (unchanged weights) with exactly zero deltas.
TEST_F(LiveTest, TimingOfA7BVSet) {
  Producer p;
  const std::string reply = p.Call(absl::StrCat("big ", seed_));
  ASSERT_TRUE(absl::StartsWith(reply, "ok")) << reply.substr(0, 200);
  ASSERT_EQ(reply.size(), 2 + 64u * (kBigTensors / 2));
  std::vector<uint8_t*> src;
  for (int s = 0; s < kBigTensors / 2; ++s) {
    rvd_ipc_segment_desc d{};
    d.kind = RVD_IPC_CUDA_MALLOC;
    d.handle = reinterpret_cast<const uint8_t*>(reply.data() + 2 + 64 * s);
    d.handle_bytes = 64;
    d.producer_pid = p.pid();
    d.segment_bytes = 2 * kBigTensorBytes;
    void* base = nullptr;
    uint64_t bytes = 0;
    rvd_status st{};
    rvd_ipc_segment* seg = live_->ipc_open(engine_, &d, &base, &bytes, &st);
    ASSERT_NE(seg, nullptr) << StatusText(st);
    segments_.push_back(seg);
    src.push_back(static_cast<uint8_t*>(base));
    src.push_back(static_cast<uint8_t*>(base) + kBigTensorBytes);
  }
  std::vector<void*> a, b;
  for (int k = 0; k < kBigTensors; ++k) {
    a.push_back(Alloc(kBigTensorBytes));
    b.push_back(Alloc(kBigTensorBytes));
  }
  auto items = [&](const std::vector<void*>& dst, const std::vector<void*>* last) {
    std::vector<rvd_snapshot_item> out;
    for (int k = 0; k < kBigTensors; ++k) {
      rvd_snapshot_item it{};
      it.src = rvd_matrix{src[k], kBigRows, kBigCols, kBigCols, RVD_DTYPE_BF16, RVD_MEMORY_DEVICE,
                          0, 0};
      it.dst = dst[k];
      it.last = last != nullptr ? (*last)[k] : nullptr;
      out.push_back(it);
    }
    return out;
  };
  cudaEvent_t t0, t1;
  ASSERT_EQ(cudaEventCreate(&t0), cudaSuccess);
  ASSERT_EQ(cudaEventCreate(&t1), cudaSuccess);
  constexpr int kReps = 20;
  auto timed = [&](const std::vector<rvd_snapshot_item>& its, std::vector<double>* d2) {
    std::vector<double> gpu_ms, wall_ms;
    std::vector<double> l2;
    for (int r = 0; r < kReps; ++r) {
      EXPECT_EQ(cudaEventRecord(t0, stream_), cudaSuccess);
      const auto w0 = std::chrono::steady_clock::now();
      Snapshot(its, t0, t1, d2, &l2);
      wall_ms.push_back(
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - w0)
              .count());
      float ms = 0;
      EXPECT_EQ(cudaEventElapsedTime(&ms, t0, t1), cudaSuccess);
      gpu_ms.push_back(ms);
    }
    std::sort(gpu_ms.begin(), gpu_ms.end());
    std::sort(wall_ms.begin(), wall_ms.end());
    return std::make_pair(gpu_ms[kReps / 2], wall_ms[kReps / 2]);
  };
  std::vector<double> d2;
  const auto [copy_gpu, copy_wall] = timed(items(a, nullptr), &d2);
  const auto [delta_gpu, delta_wall] = timed(items(b, &a), &d2);
  // cudaMemcpyAsync of the same bytes (torch's copy), for scale.
  std::vector<float> memcpy_ms;
  for (int r = 0; r < kReps; ++r) {
    EXPECT_EQ(cudaEventRecord(t0, stream_), cudaSuccess);
    for (int k = 0; k < kBigTensors; ++k) {
      EXPECT_EQ(cudaMemcpyAsync(a[k], src[k], kBigTensorBytes, cudaMemcpyDeviceToDevice, stream_),
                cudaSuccess);
    }
    EXPECT_EQ(cudaEventRecord(t1, stream_), cudaSuccess);
    EXPECT_EQ(cudaEventSynchronize(t1), cudaSuccess);
    float ms = 0;
    EXPECT_EQ(cudaEventElapsedTime(&ms, t0, t1), cudaSuccess);
    memcpy_ms.push_back(ms);
  }
  std::sort(memcpy_ms.begin(), memcpy_ms.end());
  const double gb = kBigTensors * kBigTensorBytes / 1e9;
  std::fprintf(stderr,
               "snapshot 32 x 1024x4096 bf16 (%.0f MiB), median of %d: copy %.3f ms GPU "
               "(%.0f GB/s read+write), %.3f ms start..finish; copy+delta %.3f ms GPU (%.0f GB/s "
               "read 2x + write), %.3f ms start..finish; cudaMemcpyAsync %.3f ms (%.0f GB/s)\n",
               gb * 1e9 / kMiB, kReps, copy_gpu, 2 * gb / (copy_gpu / 1e3), copy_wall, delta_gpu,
               3 * gb / (delta_gpu / 1e3), delta_wall, memcpy_ms[kReps / 2],
               2 * gb / (memcpy_ms[kReps / 2] / 1e3));
  // b holds the weights bytewise; unchanged weights: zero deltas exactly.
  std::vector<uint16_t> host(kBigRows * kBigCols);
  int64_t bad = 0;
  for (int k = 0; k < kBigTensors; ++k) {
    ASSERT_EQ(cudaMemcpy(host.data(), b[k], kBigTensorBytes, cudaMemcpyDeviceToHost), cudaSuccess);
    const uint64_t first = static_cast<uint64_t>(k) * (kBigTensorBytes / 2);
    for (size_t i = 0; i < host.size(); ++i) bad += host[i] != live_test::HashBf16(seed_, first + i);
    EXPECT_EQ(d2[k], 0.0) << "tensor " << k;
  }
  EXPECT_EQ(bad, 0);
  cudaEventDestroy(t0);
  cudaEventDestroy(t1);
  CloseAll();
}

}  // namespace
}  // namespace rvd::cuda

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "--producer") return rvd::cuda::ProducerMain();
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}

// rvd_cuda_tune over the runtime API, the driver API's module functions
// (driver_api.h) and NVRTC, which is dlopen'ed at the first compile so that
// a host without it still loads the module (compile answers UNAVAILABLE).
#include "kernels/cuda/tune.h"

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <nvrtc.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "kernels/cuda/abi_status.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/descriptors.h"
#include "kernels/cuda/driver_api.h"

struct rvd_tune_module {
  int device = 0;
  CUmodule module = nullptr;
  CUfunction fn = nullptr;
};

namespace rvd::cuda {
namespace {

using ::rvd::cuda_internal::SetAbiStatus;

// The candidate's entry and the job record it reads (self_improve/
// candidate_abi.h's TuneJob, six int32s; the module does not depend on
// self_improve, so the layout is restated and checked by size).
constexpr char kEntry[] = "rvd_tune_candidate";
constexpr size_t kTuneJobBytes = 6 * sizeof(int32_t);


struct Nvrtc {
  decltype(&nvrtcCreateProgram) create = nullptr;
  decltype(&nvrtcCompileProgram) compile = nullptr;
  decltype(&nvrtcGetProgramLogSize) log_size = nullptr;
  decltype(&nvrtcGetProgramLog) log = nullptr;
  decltype(&nvrtcGetCUBINSize) cubin_size = nullptr;
  decltype(&nvrtcGetCUBIN) cubin = nullptr;
  decltype(&nvrtcDestroyProgram) destroy = nullptr;
  decltype(&nvrtcGetErrorString) error = nullptr;
  absl::Status status;
};

const Nvrtc& GetNvrtc() {
  static const Nvrtc* const nvrtc = [] {
    auto* n = new Nvrtc;
    void* h = nullptr;
    for (const char* name : {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"}) {
      h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
      if (h != nullptr) break;
    }
    if (h == nullptr) {
      n->status = absl::UnavailableError("NVRTC (libnvrtc.so) is not installed on this host");
      return n;
    }
    auto sym = [&](const char* name, auto* fn) {
      *fn = reinterpret_cast<std::remove_pointer_t<decltype(fn)>>(dlsym(h, name));
      if (*fn == nullptr && n->status.ok()) {
        n->status = absl::UnavailableError(absl::StrCat("libnvrtc has no ", name));
      }
    };
    sym("nvrtcCreateProgram", &n->create);
    sym("nvrtcCompileProgram", &n->compile);
    sym("nvrtcGetProgramLogSize", &n->log_size);
    sym("nvrtcGetProgramLog", &n->log);
    sym("nvrtcGetCUBINSize", &n->cubin_size);
    sym("nvrtcGetCUBIN", &n->cubin);
    sym("nvrtcDestroyProgram", &n->destroy);
    sym("nvrtcGetErrorString", &n->error);
    return n;
  }();
  return *nvrtc;
}

// -I options: RVD_TUNE_NVRTC_INCLUDE (colon-separated) first, then the
// build's (the source tree for descriptors.h and candidate_abi.h, the CUDA
// toolkit's include directories and their cccl for cuda/std).
std::vector<std::string> IncludeOptions() {
  std::vector<std::string> dirs;
  if (const char* env = std::getenv("RVD_TUNE_NVRTC_INCLUDE"); env != nullptr) {
    for (absl::string_view d : absl::StrSplit(env, ':', absl::SkipEmpty())) dirs.emplace_back(d);
  }
#ifdef RVD_TUNE_INCLUDE_DIRS
  for (absl::string_view d : absl::StrSplit(RVD_TUNE_INCLUDE_DIRS, '|', absl::SkipEmpty())) {
    dirs.emplace_back(d);
  }
#endif
  std::vector<std::string> opts;
  for (const std::string& d : dirs) {
    opts.push_back(absl::StrCat("-I", d));
    if (std::ifstream(absl::StrCat(d, "/cccl/cuda/std/cstdint")).good()) {
      opts.push_back(absl::StrCat("-I", d, "/cccl"));
    }
  }
  return opts;
}

absl::Status Device(int device, rvd_tune_device* out) {
  cudaDeviceProp p{};
  RVD_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&p, device));
  *out = rvd_tune_device{};
  out->sm = p.major * 10 + p.minor;
  // sm_90a: Hopper's wgmma needs the architecture-specific target.
  const std::string arch = absl::StrCat("sm_", p.major, p.minor, out->sm == 90 ? "a" : "");
  std::snprintf(out->arch, sizeof(out->arch), "%s", arch.c_str());
  out->l2_bytes = static_cast<uint64_t>(std::max(0, p.l2CacheSize));
  return absl::OkStatus();  // the ceilings: MeasuredCeilings
}

// The FMA-chain kernel of the fp32 ceiling: 8 independent chains per
// thread, their result stored only under a condition the data never meets.
constexpr char kFmaPeakSource[] = R"(
extern "C" __global__ void rvd_fma_peak(float* out, int iters, float a, float b) {
  float x[8];
#pragma unroll
  for (int c = 0; c < 8; ++c) x[c] = threadIdx.x * 1e-3f + c;
  for (int i = 0; i < iters; ++i) {
#pragma unroll
    for (int c = 0; c < 8; ++c) x[c] = fmaf(x[c], a, b);
  }
  float s = 0;
#pragma unroll
  for (int c = 0; c < 8; ++c) s += x[c];
  if (s == -1.0f) out[threadIdx.x] = s;
}
)";
constexpr int kFmaChains = 8;

// Best of `tries` event-timed runs of enqueue(stream), in seconds.
absl::StatusOr<double> BestSeconds(cudaStream_t stream, int tries,
                                   const std::function<absl::Status()>& enqueue) {
  cudaEvent_t start = nullptr, end = nullptr;
  RVD_CUDA_RETURN_IF_ERROR(cudaEventCreate(&start));
  absl::Cleanup destroy_start = [&] { cudaEventDestroy(start); };
  RVD_CUDA_RETURN_IF_ERROR(cudaEventCreate(&end));
  absl::Cleanup destroy_end = [&] { cudaEventDestroy(end); };
  double best = 0;
  for (int t = 0; t <= tries; ++t) {  // the first run warms up, untimed
    RVD_CUDA_RETURN_IF_ERROR(cudaEventRecord(start, stream));
    if (absl::Status s = enqueue(); !s.ok()) return s;
    RVD_CUDA_RETURN_IF_ERROR(cudaEventRecord(end, stream));
    RVD_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(end));
    float ms = 0;
    RVD_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, start, end));
    if (t > 0 && (best == 0 || ms * 1e-3 < best)) best = ms * 1e-3;
  }
  return best;
}

// DRAM bytes per second: a device-to-device copy of 1 GiB (256 MiB when
// that much is not free), read plus written, best of 3.
absl::StatusOr<double> MeasureDram(cudaStream_t stream) {
  for (size_t bytes : {size_t{1} << 30, size_t{1} << 28}) {
    void *src = nullptr, *dst = nullptr;
    if (cudaMalloc(&src, bytes) != cudaSuccess || cudaMalloc(&dst, bytes) != cudaSuccess) {
      cudaGetLastError();  // the failed allocation is not an error of later calls
      if (src != nullptr) cudaFree(src);
      continue;
    }
    absl::Cleanup release = [&] {
      cudaStreamSynchronize(stream);
      cudaFree(src);
      cudaFree(dst);
    };
    RVD_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(src, 1, bytes, stream));
    absl::StatusOr<double> t = BestSeconds(stream, 3, [&]() -> absl::Status {
      RVD_CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream));
      return absl::OkStatus();
    });
    if (!t.ok()) return t.status();
    return *t > 0 ? 2.0 * static_cast<double>(bytes) / *t : 0.0;
  }
  return 0.0;  // not measured: no room for the buffers
}

// fp32 FLOP per second: the FMA chains (2 FLOP each) on every SM, best of 3.
// 0 when NVRTC is not installed.
absl::StatusOr<double> MeasureFp32(int device, cudaStream_t stream) {
  const Nvrtc& nv = GetNvrtc();
  if (!nv.status.ok()) return 0.0;
  absl::StatusOr<const DriverApi*> api = GetDriverApi();
  if (!api.ok()) return 0.0;
  rvd_tune_device dev;
  if (absl::Status s = Device(device, &dev); !s.ok()) return s;
  cudaDeviceProp p{};
  RVD_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&p, device));
  nvrtcProgram prog = nullptr;
  if (nv.create(&prog, kFmaPeakSource, "fma_peak.cu", 0, nullptr, nullptr) != NVRTC_SUCCESS) {
    return absl::InternalError("nvrtcCreateProgram failed for the fp32 ceiling");
  }
  absl::Cleanup destroy = [&] { nv.destroy(&prog); };
  const std::string arch = absl::StrCat("--gpu-architecture=", dev.arch);
  const char* opts[] = {arch.c_str()};
  if (nvrtcResult r = nv.compile(prog, 1, opts); r != NVRTC_SUCCESS) {
    return absl::InternalError(absl::StrCat("the fp32 ceiling's kernel: ", nv.error(r)));
  }
  size_t n = 0;
  nv.cubin_size(prog, &n);
  std::string cubin(n, '\0');
  nv.cubin(prog, cubin.data());
  CUmodule module = nullptr;
  CUfunction fn = nullptr;
  RVD_CU_RETURN_IF_ERROR(**api, (*api)->cuModuleLoadData(&module, cubin.data()),
                         absl::StatusCode::kInternal);
  absl::Cleanup unload = [&] { (*api)->cuModuleUnload(module); };
  RVD_CU_RETURN_IF_ERROR(**api, (*api)->cuModuleGetFunction(&fn, module, "rvd_fma_peak"),
                         absl::StatusCode::kInternal);
  void* out = nullptr;
  RVD_CUDA_RETURN_IF_ERROR(cudaMalloc(&out, 1024 * sizeof(float)));
  absl::Cleanup release = [&] {
    cudaStreamSynchronize(stream);
    cudaFree(out);
  };
  const unsigned threads = 512, blocks = static_cast<unsigned>(p.multiProcessorCount) * 4;
  int iters = 1 << 18;
  float a = 0.999999f, b = 1e-6f;
  void* args[] = {&out, &iters, &a, &b};
  absl::StatusOr<double> t = BestSeconds(stream, 3, [&]() -> absl::Status {
    RVD_CU_RETURN_IF_ERROR(**api,
                           (*api)->cuLaunchKernel(fn, blocks, 1, 1, threads, 1, 1, 0,
                                                  reinterpret_cast<CUstream>(stream), args,
                                                  nullptr),
                           absl::StatusCode::kInternal);
    return absl::OkStatus();
  });
  if (!t.ok()) return t.status();
  const double flop = 2.0 * kFmaChains * iters * static_cast<double>(threads) * blocks;
  return *t > 0 ? flop / *t : 0.0;
}

// The device's measured ceilings, once per device of this process (the
// first device() call of an engine on it), on the lowest-priority stream.
absl::Status MeasuredCeilings(int device, double* dram, double* fp32) {
  static std::mutex mu;
  static auto* cache = new std::map<int, std::pair<double, double>>;
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = cache->find(device); it != cache->end()) {
    *dram = it->second.first;
    *fp32 = it->second.second;
    return absl::OkStatus();
  }
  RVD_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  int least = 0, greatest = 0;
  RVD_CUDA_RETURN_IF_ERROR(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  cudaStream_t stream = nullptr;
  RVD_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithPriority(&stream, cudaStreamNonBlocking, least));
  absl::Cleanup destroy = [&] { cudaStreamDestroy(stream); };
  absl::StatusOr<double> d = MeasureDram(stream);
  if (!d.ok()) return d.status();
  absl::StatusOr<double> f = MeasureFp32(device, stream);
  if (!f.ok()) return f.status();
  (*cache)[device] = {*d, *f};
  *dram = *d;
  *fp32 = *f;
  return absl::OkStatus();
}

absl::StatusOr<rvd_tune_module*> Compile(int device, const char* source, std::string* log) {
  const Nvrtc& nv = GetNvrtc();
  if (!nv.status.ok()) return nv.status;
  absl::StatusOr<const DriverApi*> api = GetDriverApi();
  if (!api.ok()) return api.status();
  rvd_tune_device dev;
  if (absl::Status s = Device(device, &dev); !s.ok()) return s;
  nvrtcProgram prog = nullptr;
  if (nvrtcResult r = nv.create(&prog, source, "candidate.cu", 0, nullptr, nullptr);
      r != NVRTC_SUCCESS) {
    return absl::InternalError(absl::StrCat("nvrtcCreateProgram: ", nv.error(r)));
  }
  absl::Cleanup destroy = [&] { nv.destroy(&prog); };
  std::vector<std::string> opts = IncludeOptions();
  opts.push_back(absl::StrCat("--gpu-architecture=", dev.arch));
  opts.push_back("-std=c++17");
  std::vector<const char*> argv;
  for (const std::string& o : opts) argv.push_back(o.c_str());
  const nvrtcResult r = nv.compile(prog, static_cast<int>(argv.size()), argv.data());
  size_t n = 0;
  nv.log_size(prog, &n);
  log->assign(n, '\0');
  if (n > 0) nv.log(prog, log->data());
  while (!log->empty() && log->back() == '\0') log->pop_back();
  if (r != NVRTC_SUCCESS) {
    return absl::InvalidArgumentError(
        absl::StrCat("the candidate does not compile for ", dev.arch, ": ", nv.error(r)));
  }
  nv.cubin_size(prog, &n);
  std::string cubin(n, '\0');
  nv.cubin(prog, cubin.data());

  RVD_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  RVD_CUDA_RETURN_IF_ERROR(cudaFree(nullptr));  // the primary context, current
  auto* m = new rvd_tune_module;
  m->device = device;
  absl::Cleanup drop = [&] {
    if (m->module != nullptr) (*api)->cuModuleUnload(m->module);
    delete m;
  };
  RVD_CU_RETURN_IF_ERROR(**api, (*api)->cuModuleLoadData(&m->module, cubin.data()),
                         absl::StatusCode::kInternal);
  if ((*api)->cuModuleGetFunction(&m->fn, m->module, kEntry) != CUDA_SUCCESS) {
    return absl::InvalidArgumentError(
        absl::StrCat("the candidate defines no extern \"C\" __global__ ", kEntry));
  }
  std::move(drop).Cancel();
  return m;
}

size_t ElementSize(int32_t dtype) { return dtype == RVD_DTYPE_F32 ? 4 : 2; }

absl::Status Run(rvd_tune_module* m, int max_sms, const rvd_matrix* batch, size_t n,
                 const void* jobs, size_t num_jobs, rvd_tune_run* io) {
  absl::StatusOr<const DriverApi*> api = GetDriverApi();
  if (!api.ok()) return api.status();
  if (m == nullptr || io == nullptr || (n > 0 && batch == nullptr) || num_jobs == 0 ||
      jobs == nullptr || io->g2 == nullptr || io->trace == nullptr || io->maxabs == nullptr ||
      (io->timed_launches > 0 && io->seconds == nullptr)) {
    return absl::InvalidArgumentError("tune run: missing module, matrices, jobs or outputs");
  }
  if (io->threads == 0 || io->threads > 1024) {
    return absl::InvalidArgumentError(absl::StrCat("tune run: ", io->threads, " threads"));
  }
  for (size_t i = 0; i < n; ++i) {
    const rvd_matrix& b = batch[i];
    if (b.memory != RVD_MEMORY_HOST || b.block_rows != 0 || b.rows <= 0 || b.cols <= 0 ||
        b.ld < b.cols || b.dtype < RVD_DTYPE_F32 || b.dtype > RVD_DTYPE_BF16) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tune run: matrix ", i, " must be a non-empty strided host matrix"));
    }
  }
  const int device = m->device;
  RVD_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  rvd_tune_device dev;
  if (absl::Status s = Device(device, &dev); !s.ok()) return s;

  // The lowest priority stream: live measurements come first.
  int least = 0, greatest = 0;
  RVD_CUDA_RETURN_IF_ERROR(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  cudaStream_t stream = nullptr;
  RVD_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithPriority(&stream, cudaStreamNonBlocking, least));
  std::vector<void*> allocations;
  cudaEvent_t start = nullptr, end = nullptr;
  absl::Cleanup release = [&] {
    cudaDeviceSynchronize();
    for (void* p : allocations) cudaFree(p);
    if (start != nullptr) cudaEventDestroy(start);
    if (end != nullptr) cudaEventDestroy(end);
    cudaStreamDestroy(stream);
  };
  auto alloc = [&](size_t bytes, void** p) -> absl::Status {
    RVD_CUDA_RETURN_IF_ERROR(cudaMalloc(p, std::max<size_t>(bytes, 16)));
    allocations.push_back(*p);
    return absl::OkStatus();
  };

  // Inputs: the module's private copy on the host, and the device's.
  std::vector<std::vector<unsigned char>> private_copy(n);
  std::vector<void*> data(n);
  std::vector<MatrixDesc> descs(n);
  for (size_t i = 0; i < n; ++i) {
    const rvd_matrix& b = batch[i];
    const size_t es = ElementSize(b.dtype);
    const size_t bytes = static_cast<size_t>((b.rows - 1) * b.ld + b.cols) * es;
    const auto* src = static_cast<const unsigned char*>(b.data);
    private_copy[i].assign(src, src + bytes);
    if (absl::Status s = alloc(bytes, &data[i]); !s.ok()) return s;
    RVD_CUDA_RETURN_IF_ERROR(
        cudaMemcpy(data[i], private_copy[i].data(), bytes, cudaMemcpyHostToDevice));
    MatrixDesc& d = descs[i];
    d.data = data[i];
    d.ld = b.ld;
    d.rows = static_cast<int32_t>(b.rows);
    d.cols = static_cast<int32_t>(b.cols);
    d.n = static_cast<int32_t>(std::min(b.rows, b.cols));
    d.k = static_cast<int32_t>(std::max(b.rows, b.cols));
    d.tall = b.rows > b.cols ? 1 : 0;
    d.aligned = (reinterpret_cast<uintptr_t>(data[i]) % 16 == 0 &&
                 (b.ld * static_cast<int64_t>(es)) % 16 == 0)
                    ? 1
                    : 0;
  }
  void *d_descs = nullptr, *d_jobs = nullptr, *d_g2 = nullptr, *d_trace = nullptr,
       *d_max = nullptr;
  if (absl::Status s = alloc(n * sizeof(MatrixDesc), &d_descs); !s.ok()) return s;
  if (absl::Status s = alloc(num_jobs * kTuneJobBytes, &d_jobs); !s.ok()) return s;
  // Fresh output buffers, this call's only.
  if (absl::Status s = alloc(num_jobs * 8, &d_g2); !s.ok()) return s;
  if (absl::Status s = alloc(num_jobs * 8, &d_trace); !s.ok()) return s;
  if (absl::Status s = alloc(num_jobs * 4, &d_max); !s.ok()) return s;
  RVD_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(d_descs, descs.data(), n * sizeof(MatrixDesc), cudaMemcpyHostToDevice));
  RVD_CUDA_RETURN_IF_ERROR(cudaMemcpy(d_jobs, jobs, num_jobs * kTuneJobBytes,
                                      cudaMemcpyHostToDevice));
  {
    const std::vector<uint64_t> p64(num_jobs, io->poison64);
    const std::vector<uint32_t> p32(num_jobs, io->poison32);
    RVD_CUDA_RETURN_IF_ERROR(cudaMemcpy(d_g2, p64.data(), num_jobs * 8, cudaMemcpyHostToDevice));
    RVD_CUDA_RETURN_IF_ERROR(
        cudaMemcpy(d_trace, p64.data(), num_jobs * 8, cudaMemcpyHostToDevice));
    RVD_CUDA_RETURN_IF_ERROR(cudaMemcpy(d_max, p32.data(), num_jobs * 4, cudaMemcpyHostToDevice));
  }

  if (io->smem_bytes > 48 * 1024) {
    RVD_CU_RETURN_IF_ERROR(
        **api,
        (*api)->cuFuncSetAttribute(m->fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                   static_cast<int>(io->smem_bytes)),
        absl::StatusCode::kInvalidArgument);
  }
  int jobs_arg = static_cast<int>(num_jobs);
  void* args[] = {&d_descs, &d_jobs, &jobs_arg, &d_g2, &d_trace, &d_max};
  // Within the engine's SM cap: at most max_sms blocks, so at most that many
  // SMs hold the candidate (its blocks loop over the jobs: generator.h).
  unsigned grid = io->grid > 0 ? io->grid : static_cast<unsigned>(num_jobs);
  if (max_sms > 0) grid = std::min(grid, static_cast<unsigned>(max_sms));
  auto launch = [&]() -> absl::Status {
    RVD_CU_RETURN_IF_ERROR(**api,
                           (*api)->cuLaunchKernel(m->fn, grid, 1, 1, io->threads, 1, 1,
                                                  io->smem_bytes,
                                                  reinterpret_cast<CUstream>(stream), args,
                                                  nullptr),
                           absl::StatusCode::kInvalidArgument);
    return absl::OkStatus();
  };

  // The checked run: the whole device synchronized, then the outputs read.
  if (absl::Status s = launch(); !s.ok()) return s;
  RVD_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  RVD_CUDA_RETURN_IF_ERROR(cudaMemcpy(io->g2, d_g2, num_jobs * 8, cudaMemcpyDeviceToHost));
  RVD_CUDA_RETURN_IF_ERROR(cudaMemcpy(io->trace, d_trace, num_jobs * 8, cudaMemcpyDeviceToHost));
  RVD_CUDA_RETURN_IF_ERROR(cudaMemcpy(io->maxabs, d_max, num_jobs * 4, cudaMemcpyDeviceToHost));

  // Timed launches: L2 flushed (a write over twice its size) before each;
  // the end event recorded only after the whole device is idle, so work
  // the timer's stream does not wait for is still counted.
  if (io->timed_launches > 0) {
    void* flush = nullptr;
    const size_t flush_bytes = std::max<size_t>(2 * dev.l2_bytes, 1 << 20);
    if (absl::Status s = alloc(flush_bytes, &flush); !s.ok()) return s;
    RVD_CUDA_RETURN_IF_ERROR(cudaEventCreate(&start));
    RVD_CUDA_RETURN_IF_ERROR(cudaEventCreate(&end));
    for (uint32_t t = 0; t < io->timed_launches; ++t) {
      RVD_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(flush, static_cast<int>(t & 0xff), flush_bytes,
                                               stream));
      RVD_CUDA_RETURN_IF_ERROR(cudaEventRecord(start, stream));
      if (absl::Status s = launch(); !s.ok()) return s;
      RVD_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
      RVD_CUDA_RETURN_IF_ERROR(cudaEventRecord(end, stream));
      RVD_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(end));
      float ms = 0;
      RVD_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, start, end));
      io->seconds[t] = static_cast<double>(ms) * 1e-3;
    }
  }

  // The inputs against the private copy, after every launch.
  io->input_written = 0;
  std::vector<unsigned char> back;
  for (size_t i = 0; i < n && io->input_written == 0; ++i) {
    back.resize(private_copy[i].size());
    RVD_CUDA_RETURN_IF_ERROR(
        cudaMemcpy(back.data(), data[i], back.size(), cudaMemcpyDeviceToHost));
    if (std::memcmp(back.data(), private_copy[i].data(), back.size()) != 0) io->input_written = 1;
  }
  return absl::OkStatus();
}

int32_t DeviceFn(rvd_cuda_engine* engine, rvd_tune_device* out, rvd_status* status) {
  absl::Status s = out == nullptr ? absl::InvalidArgumentError("no output")
                                  : Device(TuneDeviceOf(engine), out);
  if (s.ok()) s = MeasuredCeilings(TuneDeviceOf(engine), &out->dram_bytes_per_s, &out->fp32_flop_per_s);
  SetAbiStatus(s, status);
  return status != nullptr ? status->code : static_cast<int32_t>(s.code());
}

rvd_tune_module* CompileFn(rvd_cuda_engine* engine, const char* source, char** log,
                           rvd_status* status) {
  std::string text;
  absl::StatusOr<rvd_tune_module*> m =
      source == nullptr ? absl::InvalidArgumentError("no source")
                        : Compile(TuneDeviceOf(engine), source, &text);
  if (log != nullptr) {
    *log = static_cast<char*>(std::malloc(text.size() + 1));
    if (*log != nullptr) std::memcpy(*log, text.c_str(), text.size() + 1);
  }
  SetAbiStatus(m.status(), status);
  return m.ok() ? *m : nullptr;
}

void FreeLogFn(char* log) { std::free(log); }

int32_t RunFn(rvd_cuda_engine* engine, rvd_tune_module* module, const rvd_matrix* batch,
              size_t n, const void* jobs, size_t num_jobs, rvd_tune_run* io,
              rvd_status* status) {
  const absl::Status s = Run(module, engine != nullptr ? TuneMaxSmsOf(engine) : 0, batch, n,
                             jobs, num_jobs, io);
  SetAbiStatus(s, status);
  return static_cast<int32_t>(s.code());
}

void ReleaseFn(rvd_cuda_engine*, rvd_tune_module* module) {
  if (module == nullptr) return;
  absl::StatusOr<const DriverApi*> api = GetDriverApi();
  // The fence: every launch of it on the device has finished.
  if (cudaSetDevice(module->device) == cudaSuccess) cudaDeviceSynchronize();
  if (api.ok() && module->module != nullptr) (*api)->cuModuleUnload(module->module);
  delete module;
}

}  // namespace

const rvd_cuda_tune kTuneTable = {&DeviceFn, &CompileFn, &FreeLogFn, &RunFn, &ReleaseFn};

}  // namespace rvd::cuda

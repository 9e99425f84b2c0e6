// The device headers compile with NVRTC (label unit: nvrtcCompileProgram
// needs no GPU), as the self-tuning worker will compile kernels from them:
// each header alone, with its kernels instantiated, for sm_90a and for the
// portable fallback (compute_80), and none includes a host-only header
// (absl, the C++ standard library, the CUDA runtime or driver API). The
// include path is the source tree and the toolkit's headers, as the worker
// will have it.
#include <nvrtc.h>

#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"

namespace {

struct DeviceHeader {
  const char* path;  // relative to the source tree
  // Code after the #include: wrappers for the header's device functions.
  const char* extra;
  // Kernels to instantiate (nvrtcAddNameExpression).
  std::vector<std::string> kernels;
  bool sm90a_only;
};

const std::vector<DeviceHeader>& Headers() {
  static const std::vector<DeviceHeader> kHeaders = {
      {"kernels/cuda/descriptors.h",
       "__global__ void Probe(rvd::cuda::MatrixDesc* d, rvd::cuda::FusedV4Launch* l) {\n"
       "  d->n = rvd::cuda::FusedV4Slices(d->k) + rvd::cuda::PieceBegin(1, 2, 9);\n"
       "  l->plan.grid = rvd::cuda::kFusedPolicyV4Sm90.block_tile;\n}\n",
       {"Probe"},
       false},
      {"kernels/cuda/block_sums.cuh",
       "__global__ void Probe(double* g, double* t, float* m) {\n"
       "  rvd::cuda::WriteBlockSums<8>(1.0, 2.0, 3.0f, [](float a, float b) { return a > b ? a : b; },"
       " g, t, m);\n}\n",
       {"Probe"},
       false},
      {"kernels/cuda/finalize.cuh",
       "__global__ void Probe(rvd::cuda::MatrixDesc d, double* pr, int32_t* st) {\n"
       "  rvd::cuda::FinalizeMatrix(d, 1.0, 1.0, 1.0f, pr, st);\n}\n",
       {"Probe"},
       false},
      {"kernels/cuda/fused_kernel.cuh",
       "",
       {"&rvd::cuda::fused::FusedKernel<float, rvd::cuda::fused::Product>",
        "&rvd::cuda::fused::FusedKernel<__half, rvd::cuda::fused::Product>",
        "&rvd::cuda::fused::FusedKernel<__nv_bfloat16, rvd::cuda::fused::Product>",
        "&rvd::cuda::fused::FusedKernel<float, rvd::cuda::fused::Product, true>"},
       false},
      {"kernels/cuda/fused_v2_kernel.cuh",
       "",
       {"&rvd::cuda::fused_v2::FusedV2Kernel<float, rvd::cuda::fused_v2::Product, "
        "rvd::cuda::fused_v2::kStagesDiag, 0>",
        "&rvd::cuda::fused_v2::FusedV2Kernel<float, rvd::cuda::fused_v2::Product, "
        "rvd::cuda::fused_v2::kStagesMixed, 0>",
        "&rvd::cuda::fused_v2::FusedV2Kernel<__nv_bfloat16, rvd::cuda::fused_v2::Product, "
        "rvd::cuda::fused_v2::kStagesDiag, rvd::cuda::fused_v2::kLiveChain>",
        "&rvd::cuda::fused_v2::FusedV2Kernel<__half, rvd::cuda::fused_v2::Product, "
        "rvd::cuda::fused_v2::kStagesMixed, rvd::cuda::fused_v2::kLiveChain>",
        "&rvd::cuda::fused_v2::FusedV2Kernel<__nv_bfloat16, rvd::cuda::fused_v2::Product, "
        "rvd::cuda::fused_v2::kStagesDiag, rvd::cuda::fused_v2::kLiveChain, true>"},
       false},
      {"kernels/cuda/fused_v4_kernel.cuh",
       "",
       {"&rvd::cuda::fused_v4::FusedV4Kernel<float, rvd::cuda::fused_v4::kLive, false>",
        "&rvd::cuda::fused_v4::FusedV4Kernel<float, rvd::cuda::fused_v4::kLive, false, true>",
        "&rvd::cuda::fused_v4::FusedV4Kernel<__nv_bfloat16, rvd::cuda::fused_v4::kLive, false>",
        "&rvd::cuda::fused_v4::FusedV4Kernel<__half, rvd::cuda::fused_v4::kLive, true>",
        "&rvd::cuda::fused_v4::FusedV4Kernel<__nv_bfloat16, rvd::cuda::fused_v4::kLive, true, "
        "false, true>"},
       true},
  };
  return kHeaders;
}

std::string ReadSource(const std::string& path) {
  std::ifstream in(absl::StrCat(RVD_SOURCE_DIR, "/", path));
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The include directories: the source tree, then the toolkit's (and their
// cccl/ subfolder, where CUDA 13 keeps cuda/std).
std::vector<std::string> IncludeOptions() {
  std::vector<std::string> opts = {absl::StrCat("-I", RVD_SOURCE_DIR)};
  for (absl::string_view dir : absl::StrSplit(RVD_CUDA_INCLUDE_DIRS, '|', absl::SkipEmpty())) {
    opts.push_back(absl::StrCat("-I", dir));
    if (std::ifstream(absl::StrCat(dir, "/cccl/cuda/std/cstdint")).good()) {
      opts.push_back(absl::StrCat("-I", dir, "/cccl"));
    }
  }
  return opts;
}

// Compiles `source` for `arch`, instantiating `kernels`; "" on success,
// else NVRTC's log.
std::string Compile(const std::string& name, const std::string& source,
                    const std::vector<std::string>& kernels, const std::string& arch) {
  nvrtcProgram prog;
  if (nvrtcCreateProgram(&prog, source.c_str(), name.c_str(), 0, nullptr, nullptr) !=
      NVRTC_SUCCESS) {
    return "nvrtcCreateProgram failed";
  }
  for (const std::string& k : kernels) nvrtcAddNameExpression(prog, k.c_str());
  std::vector<std::string> opts = IncludeOptions();
  opts.push_back(absl::StrCat("--gpu-architecture=", arch));
  opts.push_back("-std=c++17");
  std::vector<const char*> argv;
  for (const std::string& o : opts) argv.push_back(o.c_str());
  const nvrtcResult r = nvrtcCompileProgram(prog, static_cast<int>(argv.size()), argv.data());
  std::string out;
  if (r != NVRTC_SUCCESS) {
    size_t n = 0;
    nvrtcGetProgramLogSize(prog, &n);
    std::string log(n, '\0');
    nvrtcGetProgramLog(prog, log.data());
    if (!log.empty() && log.back() == '\0') log.pop_back();
    out = absl::StrCat(nvrtcGetErrorString(r), "\n", log);
  } else {
    for (const std::string& k : kernels) {
      const char* lowered = nullptr;
      if (nvrtcGetLoweredName(prog, k.c_str(), &lowered) != NVRTC_SUCCESS ||
          lowered == nullptr) {
        absl::StrAppend(&out, "no kernel for ", k, "\n");
      }
    }
  }
  nvrtcDestroyProgram(&prog);
  return out;
}

TEST(NvrtcHeadersTest, EachDeviceHeaderCompilesAlone) {
  for (const DeviceHeader& h : Headers()) {
    const std::string source = absl::StrCat("#include \"", h.path, "\"\n", h.extra);
    std::vector<std::string> archs = {"sm_90a"};
    if (!h.sm90a_only) archs.push_back("compute_80");
    for (const std::string& arch : archs) {
      const std::string log = Compile("probe.cu", source, h.kernels, arch);
      EXPECT_EQ(log, "") << h.path << " for " << arch;
    }
  }
}

// NVRTC finds the toolkit's own headers, host ones included (cuda_runtime.h
// compiles under it): the include lines themselves name device headers
// only. descriptors.h, which the host compiler reads too, takes <cstdint>
// outside NVRTC (its #else branch).
TEST(NvrtcHeadersTest, DeviceHeadersIncludeNoHostHeader) {
  const std::regex include(R"(^\s*#\s*include\s*([<"])([^>"]+)[>"])");
  const std::regex allowed_system(R"(cuda/std/[a-z_]+|cuda_bf16\.h|cuda_fp16\.h|mma\.h)");
  std::vector<std::string> device_paths;
  for (const DeviceHeader& h : Headers()) device_paths.push_back(h.path);
  for (const DeviceHeader& h : Headers()) {
    std::istringstream lines(ReadSource(h.path));
    ASSERT_FALSE(lines.str().empty()) << h.path;
    std::string line;
    bool host_branch = false;  // inside #else of #ifdef __CUDACC_RTC__
    while (std::getline(lines, line)) {
      if (line.rfind("#ifdef __CUDACC_RTC__", 0) == 0) host_branch = false;
      if (line.rfind("#else", 0) == 0) host_branch = true;
      if (line.rfind("#endif", 0) == 0) host_branch = false;
      std::smatch m;
      if (!std::regex_search(line, m, include)) continue;
      const std::string inc = m[2];
      bool ok = false;
      if (m[1] == "<") {
        ok = std::regex_match(inc, allowed_system) ||
             (host_branch && inc == "cstdint" &&
              std::string(h.path) == "kernels/cuda/descriptors.h");
      } else {
        for (const std::string& p : device_paths) ok |= inc == p;
      }
      EXPECT_TRUE(ok) << h.path << " includes " << inc << ", not a device header";
    }
  }
}

}  // namespace

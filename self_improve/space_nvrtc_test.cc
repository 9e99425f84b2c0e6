// Every family's template compiles with NVRTC (label unit: compiling needs
// no GPU), as the worker compiles candidates: for sm_90a, and the portable
// compute_80, on each dtype, with the source tree and the toolkit's headers
// on the include path only. The whole space takes minutes; a fixed sample
// runs by default (the naive point and seven tiled points spread over the
// space, per dtype); RVD_TUNE_NVRTC_ALL=1 compiles every point. (A wider
// sample, 349 compiles covering every knob value, took 11 minutes here and
// passed, 2026-12-02.)
#include <nvrtc.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "self_improve/generator.h"
#include "self_improve/space.h"

namespace rvd::tune {
namespace {

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

// "" on success, else NVRTC's log; the entry must exist under its C name.
std::string Compile(const std::string& source, const std::string& arch) {
  nvrtcProgram prog;
  if (nvrtcCreateProgram(&prog, source.c_str(), "candidate.cu", 0, nullptr, nullptr) !=
      NVRTC_SUCCESS) {
    return "nvrtcCreateProgram failed";
  }
  std::vector<std::string> opts = IncludeOptions();
  opts.push_back(absl::StrCat("--gpu-architecture=", arch));
  opts.push_back("-std=c++17");
  std::vector<const char*> argv;
  for (const std::string& o : opts) argv.push_back(o.c_str());
  const nvrtcResult r = nvrtcCompileProgram(prog, static_cast<int>(argv.size()), argv.data());
  size_t n = 0;
  nvrtcGetProgramLogSize(prog, &n);
  std::string log(n, '\0');
  nvrtcGetProgramLog(prog, log.data());
  if (!log.empty() && log.back() == '\0') log.pop_back();
  std::string out;
  if (r != NVRTC_SUCCESS) {
    out = absl::StrCat(nvrtcGetErrorString(r), "\n", log);
  } else {
    size_t ptx_size = 0;
    nvrtcGetPTXSize(prog, &ptx_size);
    std::string ptx(ptx_size, '\0');
    nvrtcGetPTX(prog, ptx.data());
    if (ptx.find(absl::StrCat(".entry ", kCandidateEntry, "(")) == std::string::npos) {
      out = absl::StrCat("no entry ", kCandidateEntry, " in the PTX");
    }
  }
  nvrtcDestroyProgram(&prog);
  return out;
}

TEST(SpaceNvrtcTest, TemplatesCompile) {
  const bool all = std::getenv("RVD_TUNE_NVRTC_ALL") != nullptr;
  int compiled = 0;
  for (DType dtype : {DType::kBF16, DType::kF16, DType::kF32}) {
    const std::vector<SpacePoint> points = Points(DefaultSpace(), dtype);
    std::vector<SpacePoint> tiled;
    for (const SpacePoint& p : points) {
      if (p.family == Family::kTiledFma) tiled.push_back(p);
    }
    // The sample: the naive point, the first and last tiled points and
    // four spread between them (about 2 s per compile here).
    std::vector<SpacePoint> sample = all ? points : std::vector<SpacePoint>{NaivePoint()};
    if (!all) {
      const size_t step = std::max<size_t>(1, tiled.size() / 5);
      for (size_t i = 0; i < tiled.size(); i += step) sample.push_back(tiled[i]);
      sample.push_back(tiled.back());
    }
    for (size_t i = 0; i < sample.size(); ++i) {
      const SpacePoint& p = sample[i];
      absl::StatusOr<Candidate> c = Emit(p, dtype);
      ASSERT_TRUE(c.ok()) << c.status();
      for (const char* arch : {"sm_90a", "compute_80"}) {
        if (!all && std::string(arch) == "compute_80" && i % 3 != 0) continue;
        const std::string log = Compile(c->source, arch);
        EXPECT_EQ(log, "") << PointKey(p) << " " << DTypeName(dtype) << " for " << arch;
        ++compiled;
        if (!log.empty()) return;  // one template error is enough to read
      }
    }
  }
  std::printf("compiled %d candidates\n", compiled);
}

// A deliberately broken source gives the compiler's error, as the loop
// feeds it back to a generator.
TEST(SpaceNvrtcTest, ABrokenCandidateReportsItsError) {
  absl::StatusOr<Candidate> c = Emit(NaivePoint(), DType::kBF16);
  ASSERT_TRUE(c.ok());
  std::string broken = c->source;
  broken.replace(broken.find("double s2 = 0.0"), 15, "double s2 = undeclared_name");
  const std::string log = Compile(broken, "sm_90a");
  EXPECT_NE(log.find("undeclared_name"), std::string::npos) << log;
}

}  // namespace
}  // namespace rvd::tune

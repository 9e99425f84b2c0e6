// libFuzzer target: a Measure request's header as rvd receives it, from
// wire bytes (MeasureHeader::ParseFromArray) through ValidateHeader, the
// V-layout cutting (SliceV) and, for small requests, ComputeMeasurement on
// the CPU engine with tensors of the declared sizes.
//
// What a header that passes ValidateHeader must guarantee (measure.h):
// its total is the sum of TensorByteSize over its tensors and within the
// limit; SliceV's views of a tensor of that size lie inside it or inside
// its gathered copy; and ComputeMeasurement either fails with a status or
// returns one LayerPR per tensor, in layer order, with finite PRs, exact
// variants' PRs at most min(rows, cols) of the layer's V.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "google/protobuf/stubs/logging.h"
#include "kernels/engine.h"
#include "kernels/v_layout.h"
#include "rvd/v1/rvd.pb.h"
#include "server/measure.h"
#include "tests/fuzz/fuzz_check.h"
#include "tests/fuzz/view_check.h"

namespace {

// The request limit ValidateHeader is given: large enough for every layout
// to be reachable, small enough that each input allocates little.
constexpr uint64_t kMaxRequestBytes = 1 << 20;
// Requests up to this many tensor bytes are also computed.
constexpr uint64_t kMaxComputeBytes = 16 << 10;

// Finite, nonzero values of every dtype: the odd bytes are 0x3c, so f16
// elements are near 1, bf16 near 0.008 and f32 near 0.008 (never NaN/Inf).
std::string TensorBytes(uint64_t bytes) {
  std::string out(bytes, '\x3c');
  for (uint64_t i = 0; i < bytes; i += 2) {
    out[i] = static_cast<char>((i * 37) & 0xff);
  }
  return out;
}

rvd::Engine& CpuEngine() {
  static rvd::Engine* const engine = rvd::NewCpuEngine(1).release();
  return *engine;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // Mutated strings are often not UTF-8; protobuf logs each such parse.
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  rvd::v1::MeasureHeader header;
  if (!header.ParseFromArray(data, static_cast<int>(size))) return 0;
  absl::StatusOr<uint64_t> total =
      rvd::ValidateHeader(header, kMaxRequestBytes);
  if (!total.ok()) {
    FUZZ_CHECK(!total.status().message().empty());
    return 0;
  }
  FUZZ_CHECK(*total <= kMaxRequestBytes);
  FUZZ_CHECK(header.tensors_size() > 0);

  std::vector<std::string> blocks;
  std::vector<std::string_view> views;
  uint64_t sum = 0;
  for (const rvd::v1::TensorSpec& spec : header.tensors()) {
    absl::StatusOr<uint64_t> bytes = rvd::TensorByteSize(spec);
    FUZZ_CHECK(bytes.ok());
    sum += *bytes;
    blocks.push_back(TensorBytes(*bytes));
    FUZZ_CHECK(spec.shape_size() == 2);
    const rvd::TensorView tensor{
        blocks.back().data(), spec.shape(0), spec.shape(1),
        spec.dtype() == rvd::v1::DTYPE_F32   ? rvd::DType::kF32
        : spec.dtype() == rvd::v1::DTYPE_F16 ? rvd::DType::kF16
                                             : rvd::DType::kBF16};
    const rvd::HeadGeometry geometry{spec.geometry().num_heads(),
                                     spec.geometry().num_kv_heads(),
                                     spec.geometry().head_dim()};
    absl::StatusOr<rvd::VSlices> slices = rvd::SliceV(
        tensor, static_cast<rvd::VLayout>(spec.layout()), geometry);
    if (slices.ok()) {
      const void* base = slices->gathered.empty()
                             ? static_cast<const void*>(blocks.back().data())
                             : slices->gathered.data();
      const size_t span = slices->gathered.empty() ? blocks.back().size()
                                                   : slices->gathered.size();
      FUZZ_CHECK(rvd_fuzz::ViewWithin(slices->layer, base, span));
      FUZZ_CHECK(static_cast<int64_t>(slices->heads.size()) ==
                 geometry.num_kv_heads);
      for (const rvd::MatrixView& head : slices->heads) {
        FUZZ_CHECK(rvd_fuzz::ViewWithin(head, base, span));
      }
    }
  }
  FUZZ_CHECK(sum == *total);
  if (*total > kMaxComputeBytes) return 0;

  for (const std::string& b : blocks) views.emplace_back(b);
  absl::StatusOr<rvd::v1::Measurement> m =
      rvd::ComputeMeasurement(CpuEngine(), header, views);
  if (!m.ok()) {
    FUZZ_CHECK(!m.status().message().empty());
    return 0;
  }
  FUZZ_CHECK(m->layers_size() == header.tensors_size());
  const bool exact = rvd::IsExactVariant(m->variant());
  for (int i = 0; i < m->layers_size(); ++i) {
    const rvd::v1::LayerPR& layer = m->layers(i);
    if (i > 0) FUZZ_CHECK(m->layers(i - 1).layer() < layer.layer());
    FUZZ_CHECK(std::isfinite(layer.pr()) && layer.pr() >= 0);
    if (header.per_head()) FUZZ_CHECK(layer.head_pr_size() > 0);
    if (exact) {
      // The layer's V is [K*d, D] (gpt2: [D, D]): PR <= its rank.
      const rvd::v1::TensorSpec* spec = nullptr;
      for (const rvd::v1::TensorSpec& s : header.tensors()) {
        if (s.layer() == layer.layer()) spec = &s;
      }
      FUZZ_CHECK(spec != nullptr);
      const double bound =
          static_cast<double>(std::min(spec->shape(0), spec->shape(1)));
      FUZZ_CHECK(layer.pr() <= bound * (1 + 1e-6));
    }
  }
  return 0;
}

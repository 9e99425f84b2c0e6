// From a MeasureHeader and tensor bytes to a Measurement: request
// validation, V slicing, one engine call, PR per layer and head, and R_V.
// No gRPC here, so that the whole path is testable in-process.
// Thread-safe: functions only; the Engine they call is thread-safe.
#ifndef RVD_SERVER_MEASURE_H_
#define RVD_SERVER_MEASURE_H_

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/engine.h"
#include "kernels/v_layout.h"
#include "rvd/v1/limits.h"
#include "server/history.h"
#include "rvd/v1/rvd.pb.h"

namespace rvd {

using rvd::v1::kMaxChunkBytes;  // largest data payload of one MeasureChunk

// What one request may ask for. Each bound is checked by ValidateHeader
// before anything is allocated, and each error names its limit.
inline constexpr int kMaxTensors = 4096;  // tensor specs (= layers) per request
inline constexpr size_t kMaxTensorNameBytes = 1024;
inline constexpr uint32_t kMaxHeads = 4096;  // num_heads, num_kv_heads per tensor
// kv heads summed over a request's tensors: the per-head views rvd builds and
// the per-head PRs it answers (per_head) are bounded by it.
inline constexpr int64_t kMaxHeadsPerRequest = int64_t{1} << 18;
inline constexpr uint32_t kMaxProbes = 4096;      // power_iter probes K
inline constexpr uint32_t kMaxSketchRank = 4096;  // sketch rank r
// Chunks without data a stream may send (they carry nothing, so a client
// sending many is broken or hostile).
inline constexpr int kMaxEmptyChunks = 16;

// The byte size of a tensor as its spec declares it, after checking the
// spec (2-D positive shape, known dtype and layout, no overflow).
absl::StatusOr<uint64_t> TensorByteSize(const rvd::v1::TensorSpec& spec);

// Everything about a header that can be checked before any bytes arrive:
// model id syntax, 1..kMaxTensors tensors, names of at most
// kMaxTensorNameBytes, specs, head counts (kMaxHeads, kMaxHeadsPerRequest),
// distinct layers, early/late layers among those sent, known variant,
// probes and sketch rank (kMaxProbes, kMaxSketchRank), total bytes <=
// max_request_bytes (RESOURCE_EXHAUSTED). Returns the total tensor bytes.
absl::StatusOr<uint64_t> ValidateHeader(const rvd::v1::MeasureHeader& header,
                                        uint64_t max_request_bytes);

// `[A-Za-z0-9_.:-]{1,128}`; INVALID_ARGUMENT otherwise.
absl::Status ValidateModelId(const std::string& model_id);

// The default R_V layer sets over the sorted layers sent: the first and last
// ceil(L/4) of them.
void DefaultLayerSets(const std::vector<uint32_t>& sorted_layers,
                      std::vector<uint32_t>* early,
                      std::vector<uint32_t>* late);

// The proto's dtype and layout as the engine's (INVALID_ARGUMENT for a
// value neither knows): the one conversion, checked at compile time.
absl::StatusOr<DType> ToDType(rvd::v1::DType dtype);
absl::StatusOr<VLayout> ToVLayout(rvd::v1::VLayout layout);

// The variant a request gets: its own, else `default_variant`, else the
// engine's default; probes, rank and seed from the request when set.
VariantSpec ResolveVariant(const rvd::v1::MeasureHeader& header,
                           const std::string& default_variant,
                           const Engine& engine);

// Where header.tensors(i)'s PRs sit in one engine call's results: the
// layer's at `layer`, its heads' (per_head) at layer + 1 .. layer + heads.
struct TensorResults {
  size_t layer = 0;
  size_t heads = 0;  // 0 without per_head
};

// The Measurement of `header` from PRs (`pr` indexed through `where`, one
// entry per tensor): layers sorted, warnings for all-zero layers, R_V over
// the request's layer sets (or the default quarters), variant, backend,
// engine version, elapsed_ms and the timestamp (now). Every path that
// measures (ComputeMeasurement, live models) assembles through it.
rvd::v1::Measurement AssembleMeasurement(const rvd::v1::MeasureHeader& header,
                                         absl::Span<const double> pr,
                                         absl::Span<const TensorResults> where,
                                         const std::string& variant,
                                         const Engine& engine, double elapsed_ms);

// Computes the measurement. `data[i]` holds the bytes of header.tensors[i];
// the header must have passed ValidateHeader. A request that names no
// variant gets `default_variant`, or the engine's default when that is
// empty. The caller stores the result (RecordUnlessCancelled).
//
// `cancel` (may be null): once set, by any thread (the client went away,
// its deadline passed, rvd's shutdown grace ran out), the engine call stops
// at its next checkpoint (CallOptions::cancel) and the answer is CANCELLED;
// a flag set after the engine returned also answers CANCELLED, so that no
// result of a cancelled request is handed on.
absl::StatusOr<rvd::v1::Measurement> ComputeMeasurement(
    Engine& engine, const rvd::v1::MeasureHeader& header,
    absl::Span<const std::string_view> data,
    const std::string& default_variant = "",
    const std::atomic<bool>* cancel = nullptr);

// Appends `m` to `history` unless `cancel` (may be null) is set: then
// CANCELLED and history is unchanged. A request told it failed must find
// nothing of it in history.
absl::StatusOr<MeasurementLog::Entry> RecordUnlessCancelled(
    History& history, rvd::v1::Measurement m, const std::atomic<bool>* cancel);

}  // namespace rvd

#endif  // RVD_SERVER_MEASURE_H_

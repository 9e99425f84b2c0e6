#include "server/checkpoint_reader.h"

#include <chrono>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "client/cpp/rvd_client.h"
#include "server/measure.h"

namespace rvd {

absl::StatusOr<std::unique_ptr<CheckpointReader>> CheckpointReader::Create(
    const std::vector<std::string>& roots) {
  absl::StatusOr<PathPolicy> policy = PathPolicy::Create(roots);
  if (!policy.ok()) return policy.status();
  absl::StatusOr<ArchitectureTable> table = DefaultArchitectureTable();
  if (!table.ok()) return table.status();
  return std::make_unique<CheckpointReader>(*std::move(policy),
                                            *std::move(table));
}

absl::StatusOr<ReadCheckpoint> CheckpointReader::Read(
    const std::string& path, const rvd::v1::MeasureHeader& header,
    const LoadOptions& options, uint64_t max_request_bytes,
    std::string* reason) const {
  const auto start = std::chrono::steady_clock::now();
  if (header.tensors_size() > 0) {
    if (reason != nullptr) *reason = "the header lists tensors";
    return absl::InvalidArgumentError(
        "MeasurePath: the header must not list tensors (rvd finds them in the "
        "checkpoint)");
  }
  // The model id first: a bad one is refused before anything is read.
  if (absl::Status s = ValidateModelId(header.model_id()); !s.ok()) return s;
  absl::StatusOr<std::string> real = policy_.Resolve(path, reason);
  if (!real.ok()) return real.status();

  LoadOptions checked = options;
  checked.resolve_file = [this, reason](const std::string& file) {
    absl::StatusOr<std::string> r = policy_.ResolveReadableFile(file, reason);
    if (!r.ok() && reason != nullptr) *reason = absl::StrCat(file, ": ", *reason);
    return r;
  };
  ReadCheckpoint out;
  out.real_path = *real;
  absl::StatusOr<LoadedModel> model = LoadModel(*real, table_, checked);
  if (!model.ok()) return model.status();
  out.model = *std::move(model);

  out.header = header;
  for (rvd::v1::TensorSpec& spec : TensorSpecs(out.model)) {
    *out.header.add_tensors() = std::move(spec);
  }
  absl::StatusOr<uint64_t> total = ValidateHeader(out.header, max_request_bytes);
  if (!total.ok()) return total.status();
  out.bytes = *total;
  for (const ModelTensor& t : out.model.tensors) {
    out.data.emplace_back(reinterpret_cast<const char*>(t.data), t.bytes);
  }
  out.load_ms = std::chrono::duration<double, std::milli>(
                    std::chrono::steady_clock::now() - start)
                    .count();
  return out;
}

}  // namespace rvd

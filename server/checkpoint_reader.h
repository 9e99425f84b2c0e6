// Checkpoints the daemon reads itself: a path under the checkpoint roots
// (path_policy.h), mapped through the same loader rvctl uses
// (client/cpp/model_loader.h), turned into a MeasureHeader and views of the
// mapped bytes, so that measuring it copies nothing and nothing crosses gRPC.
//
// Thread-safety: immutable after construction; Read may be called from any
// number of threads at once.
#ifndef RVD_SERVER_CHECKPOINT_READER_H_
#define RVD_SERVER_CHECKPOINT_READER_H_

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "client/cpp/model_loader.h"
#include "rvd/v1/rvd.pb.h"
#include "server/path_policy.h"

namespace rvd {

// One checkpoint, read: the header to measure and the bytes of each of its
// tensors, which point into `model`'s mappings (valid while this lives).
struct ReadCheckpoint {
  std::string real_path;  // the checkpoint's resolved path
  LoadedModel model;      // owns the mapped files
  rvd::v1::MeasureHeader header;        // the request's, with its tensors
  std::vector<std::string_view> data;   // data[i]: header.tensors(i)'s bytes
  uint64_t bytes = 0;                   // the tensors' bytes in all
  double load_ms = 0;                   // resolving, mapping and checking
};

class CheckpointReader {
 public:
  CheckpointReader(PathPolicy policy, ArchitectureTable table)
      : policy_(std::move(policy)), table_(std::move(table)) {}

  // A reader over `roots` and the compiled-in architecture table; errors
  // as PathPolicy::Create.
  static absl::StatusOr<std::unique_ptr<CheckpointReader>> Create(
      const std::vector<std::string>& roots);

  const PathPolicy& policy() const { return policy_; }

  // Reads the checkpoint at `path` (a directory or one .safetensors file)
  // for `header` (model id, step, layer sets, variant; no tensors:
  // INVALID_ARGUMENT) and checks the result with ValidateHeader against
  // `max_request_bytes`. The path and every file the loader opens pass the
  // policy (PathPolicy::Resolve, ResolveReadableFile); a refusal's status
  // is the policy's, and `*reason` (when not null) holds the details for
  // the log. Loader errors as LoadModel returns them.
  absl::StatusOr<ReadCheckpoint> Read(const std::string& path,
                                      const rvd::v1::MeasureHeader& header,
                                      const LoadOptions& options,
                                      uint64_t max_request_bytes,
                                      std::string* reason = nullptr) const;

 private:
  const PathPolicy policy_;
  const ArchitectureTable table_;
};

}  // namespace rvd

#endif  // RVD_SERVER_CHECKPOINT_READER_H_

// The copy exchange of a sharded model's group in messages under the gRPC
// limit: a sender splits its rows of a step into chunks (per layer, and a
// layer's rows in row ranges when one layer alone is too large), the
// receiver assembles them per (group, step, sender, incarnation) and hands
// on a sender's rows once all of its chunks came. Pure: no gRPC, no clock.
#ifndef RVD_SERVER_SHARD_CHUNKS_H_
#define RVD_SERVER_SHARD_CHUNKS_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "rvd/v1/rvd.pb.h"

namespace rvd {

// `whole` (every layer the sender holds, chunk fields unset) as messages of
// at most `max_bytes` each (chunk 0 .. chunk_count-1). A layer's rows are
// split into row ranges when needed; a single row over the limit is refused.
absl::StatusOr<std::vector<rvd::v1::ExchangeShardRequest>> SplitExchange(
    const rvd::v1::ExchangeShardRequest& whole, size_t max_bytes);

class ShardAssembler {
 public:
  // Adds one chunk (its shards' shapes already checked). Returns the
  // sender's whole request (one ShardData per layer, rows in order, chunk
  // fields cleared) when this chunk completes it; nullopt while chunks are
  // missing or for a duplicate. A chunk whose chunk_count disagrees with
  // its sender's earlier chunks, or pieces of a layer that do not tile,
  // is an error.
  absl::StatusOr<std::optional<rvd::v1::ExchangeShardRequest>> Add(
      const rvd::v1::ExchangeShardRequest& chunk, absl::Time now);

  // Drops partial senders whose first chunk came before `cutoff`.
  void Expire(absl::Time cutoff);
  size_t partial() const { return partial_.size(); }

 private:
  using Key = std::tuple<std::string, int64_t, uint32_t, uint64_t>;  // group, step, sender, inc
  struct Partial {
    uint32_t count = 0;
    absl::Time first;
    std::map<uint32_t, rvd::v1::ExchangeShardRequest> chunks;  // by index
  };
  std::map<Key, Partial> partial_;
  // Senders already assembled (so a late duplicate does not start a new
  // partial), with when.
  std::map<Key, absl::Time> done_;
};

}  // namespace rvd

#endif  // RVD_SERVER_SHARD_CHUNKS_H_

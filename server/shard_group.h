// A sharded model's group measurement (issue 18), the host path: every
// rank's rvd holds its rows of each layer's V (ShardGroup in the header),
// the ranks exchange by copy the rows their cross blocks need
// (ExchangeShard; which peer needs which: kernels/sharded_gram.h
// PairsOfRank), each computes its share of the sums per layer and per head
// (ShardPartial, float64) and reports it to the group's coordinator
// (ReportPartial). The coordinator, once GroupSteps says every rank
// reported the step, combines them (PRFromPartials), assembles the
// Measurement as a single rvd would (AssembleMeasurement: the same R_V
// rule) and stores it; every rank's caller gets that Measurement back, or
// the step's failure naming the ranks that did not report.
//
// The same pairing covers every split: a rank holding no rows of a layer
// contributes nothing to it (its pairs all include itself), so pipeline
// parallelism (a layer on one rank) needs no exchange to be exact, and a
// head whose rows sit on one rank comes out of that rank's diagonal alone.
//
// Waits are bounded: a rank waits for its peers' rows half the group
// timeout (so that it can still tell the coordinator which peer was
// missing before the coordinator's own timeout), the coordinator fails a
// step `timeout` after its first report (GroupSteps).
//
// Thread-safe.
#ifndef RVD_SERVER_SHARD_GROUP_H_
#define RVD_SERVER_SHARD_GROUP_H_

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "kernels/engine.h"
#include "rvd/v1/rvd.grpc.pb.h"
#include "server/group_steps.h"
#include "server/shard_chunks.h"
#include "server/history.h"

namespace rvd {

// The checks on a rank's header before anything is sent: group id syntax,
// world size and rank, coordinator and one peer address per rank, one
// ShardRows per tensor (by layer), every tensor V_LAYOUT_SEPARATE with its
// rows inside [0, total_rows), head_dim dividing total_rows when per_head,
// an exact variant (the sums are exact).
absl::Status ValidateShardHeader(const rvd::v1::MeasureHeader& header);

// This rank's partial sums per layer it holds, from its own shards
// (`own`, from its header) and the shards received from its peers
// (`peer_shards[r]`: rank r's, empty for ranks this one needs nothing
// from). Every layer's shards must agree on cols, dtype, total_rows and
// head_dim. Each partial names the rows of each peer its cross blocks used
// (peer_rows), for CombineReports to check.
absl::StatusOr<std::vector<rvd::v1::LayerPartial>> RankPartials(
    int rank, int world, absl::Span<const rvd::v1::ShardData> own,
    const std::map<int, std::vector<rvd::v1::ShardData>>& peer_shards);

// The group's Measurement from every rank's report (`reports`, one per
// rank of the world): each layer's shards must tile [0, total_rows), and
// every rank's cross blocks must have used the rows each peer reports
// holding (rows short, shifted or missing would give a wrong PR); the
// layer's PR and its heads' from the summed partials; R_V by
// AssembleMeasurement over the early/late layers the ranks' headers give
// (the same on every rank) or the default quarters of the group's layers;
// a warning that says it is the result of world ranks of the group.
// FAILED_PRECONDITION naming the layer or the rank otherwise.
absl::StatusOr<rvd::v1::Measurement> CombineReports(
    const std::map<int, rvd::v1::ReportPartialRequest>& reports, const Engine& engine);

struct ShardGroupOptions {
  absl::Duration timeout = absl::Seconds(30);  // shard_group_timeout_seconds
  uint64_t incarnation = 0;                    // this rvd process; 0: random
};

class ShardGroups {
 public:
  // Stores the coordinator's group Measurement (history, metrics, the log).
  using Recorder =
      std::function<absl::StatusOr<MeasurementLog::Entry>(rvd::v1::Measurement)>;

  ShardGroups(const Engine& engine, ShardGroupOptions options, Recorder record);

  // A rank's measurement of its shards (`data[i]` the bytes of
  // header.tensors(i); header passed ValidateHeader): exchanges rows with
  // its peers, reports to the coordinator and returns the group's answer.
  // Stores nothing here (the coordinator does).
  absl::StatusOr<rvd::v1::Measurement> MeasureShard(const rvd::v1::MeasureHeader& header,
                                                    absl::Span<const std::string_view> data,
                                                    absl::Time deadline);

  // A peer's rows for this rvd's rank (ExchangeShard).
  absl::Status ReceiveShards(const rvd::v1::ExchangeShardRequest& request);

  // The coordinator's side of ReportPartial: waits until the step ends (or
  // `deadline`), then the group's Measurement or the step's failure.
  absl::StatusOr<rvd::v1::Measurement> Report(const rvd::v1::ReportPartialRequest& request,
                                              absl::Time deadline);

  uint64_t incarnation() const { return incarnation_; }

 private:
  // One try at a step: the reports of the ranks that took part, and its
  // end, shared with every report handler waiting on it.
  struct Attempt {
    std::map<int, rvd::v1::ReportPartialRequest> reports;
    std::map<int, uint64_t> incarnation;  // rank -> reporting incarnation
    bool done = false;
    absl::StatusOr<rvd::v1::Measurement> result = absl::InternalError("pending");
  };
  struct Coordinated {
    Coordinated(int world, absl::Duration timeout) : world(world), steps(world, timeout) {}
    int world;
    GroupSteps steps;
    std::map<int64_t, std::shared_ptr<Attempt>> attempts;  // by step
  };
  struct Inbox {
    int world = 0;
    // step -> sender rank -> its request and when it came
    std::map<int64_t, std::map<int, std::pair<rvd::v1::ExchangeShardRequest, absl::Time>>>
        steps;
  };

  // Ends `attempt` with `outcome` (combining on completion); mu_ held.
  void Finish(const std::string& group_id, Attempt& attempt, const GroupSteps::Outcome& outcome);
  void ExpireLocked(absl::Time now);
  std::shared_ptr<rvd::v1::Rvd::Stub> StubFor(const std::string& address);

  const Engine& engine_;
  const ShardGroupOptions options_;
  const Recorder record_;
  const uint64_t incarnation_;

  std::mutex mu_;
  std::condition_variable changed_;  // a step ended or rows came
  std::map<std::string, Coordinated> coordinated_;  // by group id
  std::map<std::string, Inbox> inbox_;              // by group id
  ShardAssembler assembler_;  // senders' messages until each one's rows are whole
  std::map<std::string, std::shared_ptr<rvd::v1::Rvd::Stub>> stubs_;  // by address
};

}  // namespace rvd

#endif  // RVD_SERVER_SHARD_GROUP_H_

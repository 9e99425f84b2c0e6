#include "server/shard_group.h"

#include <algorithm>
#include <chrono>
#include <optional>
#include <random>
#include <set>
#include <utility>

#include <grpcpp/grpcpp.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "kernels/sharded_gram.h"
#include "rvd/v1/limits.h"
#include "server/log_text.h"
#include "server/measure.h"
#include "spdlog/spdlog.h"

namespace rvd {
namespace {

using rvd::v1::ExchangeShardRequest;
using rvd::v1::LayerPartial;
using rvd::v1::MeasureHeader;
using rvd::v1::Measurement;
using rvd::v1::ReportPartialRequest;
using rvd::v1::ShardData;
using rvd::v1::ShardRows;

constexpr uint32_t kMaxWorld = 4096;

absl::Status Bad(const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("shard_group: ", what));
}

absl::Status FromGrpc(const grpc::Status& s, const std::string& what) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                      absl::StrCat(what, ": ", s.error_message()));
}

// The view of rows [begin, end) of `shard` (a layer's rows from
// shard.rows().first_row()) that fall in [lo, hi) of the whole layer;
// an empty view of the same cols and dtype when none do.
MatrixView RowsIn(const ShardData& shard, DType dtype, int64_t lo, int64_t hi) {
  const int64_t first = shard.rows().first_row();
  const int64_t begin = std::max(lo, first);
  const int64_t end = std::min(hi, first + shard.num_rows());
  MatrixView v;
  v.cols = shard.cols();
  v.ld = shard.cols();
  v.dtype = dtype;
  if (end <= begin) return v;
  v.rows = end - begin;
  v.data = shard.data().data() +
           static_cast<size_t>((begin - first) * shard.cols()) * DTypeSize(dtype);
  return v;
}

std::vector<uint32_t> Layers(const google::protobuf::RepeatedField<uint32_t>& f) {
  return std::vector<uint32_t>(f.begin(), f.end());
}

}  // namespace

absl::Status ValidateShardHeader(const MeasureHeader& header) {
  const rvd::v1::ShardGroup& g = header.shard_group();
  if (absl::Status s = ValidateModelId(g.group_id()); !s.ok()) {
    return Bad(absl::StrCat("group_id: ", s.message()));
  }
  if (g.world_size() < 1 || g.world_size() > kMaxWorld) {
    return Bad(absl::StrCat("world_size ", g.world_size(), " (1 .. ", kMaxWorld, ")"));
  }
  if (g.rank() >= g.world_size()) {
    return Bad(absl::StrCat("rank ", g.rank(), " outside a world of ", g.world_size()));
  }
  if (g.coordinator().empty()) return Bad("no coordinator address");
  if (g.peers_size() != static_cast<int>(g.world_size()) ||
      std::any_of(g.peers().begin(), g.peers().end(),
                  [](const std::string& p) { return p.empty(); })) {
    return Bad(absl::StrCat(g.peers_size(), " peer addresses for a world of ", g.world_size(),
                            " (one non-empty host:port per rank)"));
  }
  if (!header.variant().name().empty() && !IsExactVariant(header.variant().name())) {
    return Bad(absl::StrCat("variant '", header.variant().name(),
                            "': a group measurement sums exact partials (use an exact "
                            "variant or none)"));
  }
  std::map<uint32_t, const ShardRows*> rows;
  for (const ShardRows& r : g.shards()) {
    if (!rows.emplace(r.layer(), &r).second) {
      return Bad(absl::StrCat("layer ", r.layer(), " has two ShardRows"));
    }
  }
  if (rows.size() != static_cast<size_t>(header.tensors_size())) {
    return Bad(absl::StrCat(rows.size(), " ShardRows for ", header.tensors_size(),
                            " tensors (one per tensor, by layer)"));
  }
  for (const rvd::v1::TensorSpec& t : header.tensors()) {
    auto it = rows.find(t.layer());
    if (it == rows.end()) return Bad(absl::StrCat("no ShardRows for layer ", t.layer()));
    const ShardRows& r = *it->second;
    if (t.layout() != rvd::v1::V_LAYOUT_SEPARATE) {
      return Bad(absl::StrCat("tensor '", t.name(),
                              "': a shard is V's rows alone (V_LAYOUT_SEPARATE)"));
    }
    if (r.first_row() < 0 || r.total_rows() < 1 ||
        r.first_row() > r.total_rows() - t.shape(0)) {
      return Bad(absl::StrCat("layer ", t.layer(), ": rows [", r.first_row(), ", ",
                              r.first_row() + t.shape(0), ") outside the layer's ",
                              r.total_rows()));
    }
    const uint32_t d = t.geometry().head_dim();
    if (header.per_head() && (d == 0 || r.total_rows() % d != 0)) {
      return Bad(absl::StrCat("layer ", t.layer(), ": per_head needs a head_dim dividing ",
                              r.total_rows(), " rows, got ", d));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<LayerPartial>> RankPartials(
    int rank, int world, absl::Span<const ShardData> own,
    const std::map<int, std::vector<ShardData>>& peer_shards) {
  std::vector<LayerPartial> out;
  for (const ShardData& mine : own) {
    absl::StatusOr<DType> dtype = ToDType(mine.dtype());
    if (!dtype.ok()) return dtype.status();
    const uint32_t layer = mine.rows().layer();
    // slot r: rank r's rows of this layer (null: none, or not needed).
    std::vector<const ShardData*> slot(static_cast<size_t>(world), nullptr);
    slot[static_cast<size_t>(rank)] = &mine;
    for (const auto& [peer, shards] : peer_shards) {
      for (const ShardData& s : shards) {
        if (s.rows().layer() != layer) continue;
        if (s.cols() != mine.cols() || s.dtype() != mine.dtype() ||
            s.rows().total_rows() != mine.rows().total_rows() ||
            s.head_dim() != mine.head_dim()) {
          return absl::FailedPreconditionError(absl::StrCat(
              "layer ", layer, ": rank ", peer, "'s shard (", s.rows().total_rows(),
              " rows of ", s.cols(), " columns, head_dim ", s.head_dim(),
              ") disagrees with rank ", rank, "'s (", mine.rows().total_rows(), " rows of ",
              mine.cols(), ", head_dim ", mine.head_dim(), ")"));
        }
        slot[static_cast<size_t>(peer)] = &s;
      }
    }
    auto views_in = [&](int64_t lo, int64_t hi) {
      std::vector<MatrixView> v(static_cast<size_t>(world));
      for (int r = 0; r < world; ++r) {
        const ShardData* s = slot[static_cast<size_t>(r)];
        if (s != nullptr) {
          v[static_cast<size_t>(r)] = RowsIn(*s, *dtype, lo, hi);
        } else {
          v[static_cast<size_t>(r)].cols = v[static_cast<size_t>(r)].ld = mine.cols();
          v[static_cast<size_t>(r)].dtype = *dtype;
        }
      }
      return v;
    };
    LayerPartial p;
    *p.mutable_rows() = mine.rows();
    p.set_num_rows(mine.num_rows());
    // What the cross blocks use of each peer, for the coordinator to check
    // against what that peer holds.
    for (int q : PeersOfRank(rank, world)) {
      rvd::v1::PeerRows* used = p.add_peer_rows();
      used->set_rank(static_cast<uint32_t>(q));
      if (const ShardData* s = slot[static_cast<size_t>(q)]; s != nullptr) {
        used->set_first_row(s->rows().first_row());
        used->set_num_rows(s->num_rows());
      }
    }
    const int64_t total = mine.rows().total_rows();
    absl::StatusOr<GramPartial> whole = ShardPartial(rank, world, views_in(0, total));
    if (!whole.ok()) return whole.status();
    p.set_trace(whole->trace);
    p.set_gram_sq(whole->gram_sq);
    const int64_t d = mine.head_dim();
    for (int64_t h = 0; d > 0 && h < total / d; ++h) {
      absl::StatusOr<GramPartial> head = ShardPartial(rank, world, views_in(h * d, (h + 1) * d));
      if (!head.ok()) return head.status();
      p.add_head_trace(head->trace);
      p.add_head_gram_sq(head->gram_sq);
    }
    out.push_back(std::move(p));
  }
  return out;
}

absl::StatusOr<Measurement> CombineReports(const std::map<int, ReportPartialRequest>& reports,
                                           const Engine& engine) {
  if (reports.empty()) return absl::InternalError("no reports to combine");
  const ReportPartialRequest& first = reports.begin()->second;
  const MeasureHeader& base = first.header();
  const int world = static_cast<int>(first.world_size());
  if (world < 1 || reports.size() != static_cast<size_t>(world) ||
      reports.rbegin()->first >= world || reports.begin()->first < 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        reports.size(), " reports (ranks ", reports.begin()->first, " .. ",
        reports.rbegin()->first, ") for a group of ", first.world_size(), " ranks"));
  }
  struct Piece {
    int rank;
    const LayerPartial* partial;
  };
  std::map<uint32_t, std::vector<Piece>> layers;
  for (const auto& [rank, r] : reports) {
    const MeasureHeader& h = r.header();
    if (r.world_size() != first.world_size() || h.model_id() != base.model_id() ||
        h.per_head() != base.per_head() ||
        Layers(h.early_layers()) != Layers(base.early_layers()) ||
        Layers(h.late_layers()) != Layers(base.late_layers())) {
      return absl::FailedPreconditionError(absl::StrCat(
          "rank ", rank, "'s header (model '", LogEscape(h.model_id(), 160),
          "', world size, per_head, early/late layers) differs from rank ", first.rank(), "'s"));
    }
    for (const LayerPartial& p : r.layers()) layers[p.rows().layer()].push_back({rank, &p});
  }
  MeasureHeader header;
  header.set_model_id(base.model_id());
  header.set_step(base.step());
  header.set_per_head(base.per_head());
  *header.mutable_early_layers() = base.early_layers();
  *header.mutable_late_layers() = base.late_layers();
  std::vector<double> pr;
  std::vector<TensorResults> where;
  for (auto& [layer, pieces] : layers) {
    std::sort(pieces.begin(), pieces.end(), [](const Piece& a, const Piece& b) {
      return a.partial->rows().first_row() < b.partial->rows().first_row();
    });
    const int64_t total = pieces.front().partial->rows().total_rows();
    const int heads = pieces.front().partial->head_trace_size();
    int64_t next = 0;  // the first row not yet covered
    std::vector<GramPartial> sums;
    std::vector<std::vector<GramPartial>> head_sums(static_cast<size_t>(heads));
    for (const Piece& piece : pieces) {
      const LayerPartial& p = *piece.partial;
      if (p.rows().total_rows() != total || p.head_trace_size() != heads ||
          p.head_gram_sq_size() != heads) {
        return absl::FailedPreconditionError(
            absl::StrCat("layer ", layer, ": rank ", piece.rank, " says ", p.rows().total_rows(),
                         " rows and ", p.head_trace_size(), " heads, rank ",
                         pieces.front().rank, " ", total, " and ", heads));
      }
      if (p.rows().first_row() != next) {
        return absl::FailedPreconditionError(absl::StrCat(
            "layer ", layer, ": the group's shards do not tile its ", total, " rows (rank ",
            piece.rank, " starts at row ", p.rows().first_row(), ", expected ", next, ")"));
      }
      next += p.num_rows();
      sums.push_back(GramPartial{p.trace(), p.gram_sq()});
      for (int h = 0; h < heads; ++h) {
        head_sums[static_cast<size_t>(h)].push_back(GramPartial{p.head_trace(h), p.head_gram_sq(h)});
      }
    }
    if (next != total) {
      return absl::FailedPreconditionError(absl::StrCat(
          "layer ", layer, ": the group's shards cover rows [0, ", next, ") of ", total));
    }
    // Every cross block must have used the rows its peer holds: a peer's
    // rows that came short, shifted or not at all would sum to a wrong PR.
    std::map<int, const LayerPartial*> holder;
    for (const Piece& piece : pieces) holder[piece.rank] = piece.partial;
    for (const Piece& piece : pieces) {
      std::map<int, const rvd::v1::PeerRows*> used;
      for (const rvd::v1::PeerRows& u : piece.partial->peer_rows()) {
        used[static_cast<int>(u.rank())] = &u;
      }
      for (int q : PeersOfRank(piece.rank, world)) {
        auto h = holder.find(q);
        const int64_t want_first = h != holder.end() ? h->second->rows().first_row() : 0;
        const int64_t want_rows = h != holder.end() ? h->second->num_rows() : 0;
        auto u = used.find(q);
        const int64_t got_first = u != used.end() ? u->second->first_row() : 0;
        const int64_t got_rows = u != used.end() ? u->second->num_rows() : 0;
        if (got_rows != want_rows || (want_rows > 0 && got_first != want_first)) {
          return absl::FailedPreconditionError(absl::StrCat(
              "layer ", layer, ": rank ", piece.rank, " computed its cross block with rank ", q,
              " from rows [", got_first, ", ", got_first + got_rows, "), but rank ", q,
              " holds [", want_first, ", ", want_first + want_rows, ")"));
        }
      }
    }
    rvd::v1::TensorSpec* spec = header.add_tensors();
    spec->set_layer(layer);
    spec->set_name(pieces.front().partial->tensor_name());
    where.push_back(TensorResults{pr.size(), static_cast<size_t>(heads)});
    absl::StatusOr<double> layer_pr = PRFromPartials(sums);
    if (!layer_pr.ok()) return layer_pr.status();
    pr.push_back(*layer_pr);
    for (const std::vector<GramPartial>& h : head_sums) {
      absl::StatusOr<double> head_pr = PRFromPartials(h);
      if (!head_pr.ok()) return head_pr.status();
      pr.push_back(*head_pr);
    }
  }
  for (const auto* set : {&header.early_layers(), &header.late_layers()}) {
    for (uint32_t l : *set) {
      if (!layers.contains(l)) {
        return absl::FailedPreconditionError(absl::StrCat(
            set == &header.early_layers() ? "early" : "late", " layer ", l,
            " is held by no rank of the group"));
      }
    }
  }
  const std::string variant = base.variant().name().empty() ? "algebraic" : base.variant().name();
  Measurement m = AssembleMeasurement(header, pr, where, variant, engine, 0);
  m.add_warnings(absl::StrCat("group '", first.header().shard_group().group_id(),
                              "': combined from the partial sums of ", reports.size(),
                              " ranks (sharded model)"));
  return m;
}

ShardGroups::ShardGroups(const Engine& engine, ShardGroupOptions options, Recorder record)
    : engine_(engine),
      options_(options),
      record_(std::move(record)),
      incarnation_(options.incarnation != 0 ? options.incarnation
                                            : (uint64_t{std::random_device{}()} << 32) |
                                                  std::random_device{}() | 1) {}

std::shared_ptr<rvd::v1::Rvd::Stub> ShardGroups::StubFor(const std::string& address) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& stub = stubs_[address];
  if (stub == nullptr) {
    grpc::ChannelArguments args;
    args.SetMaxSendMessageSize(rvd::v1::kMaxRequestMessageBytes);
    args.SetMaxReceiveMessageSize(rvd::v1::kMaxRequestMessageBytes);
    stub = rvd::v1::Rvd::NewStub(
        grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args));
  }
  return stub;
}

absl::StatusOr<Measurement> ShardGroups::MeasureShard(const MeasureHeader& header,
                                                      absl::Span<const std::string_view> data,
                                                      absl::Time deadline) {
  if (absl::Status s = ValidateShardHeader(header); !s.ok()) return s;
  const rvd::v1::ShardGroup& g = header.shard_group();
  const int world = static_cast<int>(g.world_size());
  const int rank = static_cast<int>(g.rank());
  const int64_t step = header.step();
  std::map<uint32_t, const ShardRows*> rows_of;
  for (const ShardRows& r : g.shards()) rows_of[r.layer()] = &r;

  std::vector<ShardData> own;
  for (int i = 0; i < header.tensors_size(); ++i) {
    const rvd::v1::TensorSpec& t = header.tensors(i);
    ShardData s;
    *s.mutable_rows() = *rows_of[t.layer()];
    s.set_dtype(t.dtype());
    s.set_num_rows(t.shape(0));
    s.set_cols(t.shape(1));
    s.set_head_dim(header.per_head() ? t.geometry().head_dim() : 0);
    s.set_data(std::string(data[static_cast<size_t>(i)]));
    own.push_back(std::move(s));
  }

  // Our rows to every rank whose cross blocks pair it with us.
  const absl::Time half = absl::Now() + options_.timeout / 2;
  for (int p = 0; p < world; ++p) {
    const std::vector<int> needs = PeersOfRank(p, world);
    if (std::find(needs.begin(), needs.end(), rank) == needs.end()) continue;
    ExchangeShardRequest x;
    x.set_group_id(g.group_id());
    x.set_world_size(g.world_size());
    x.set_from_rank(g.rank());
    x.set_incarnation(incarnation_);
    x.set_step(step);
    for (const ShardData& s : own) *x.add_shards() = s;
    // In messages under the gRPC limit; the peer assembles them.
    absl::StatusOr<std::vector<ExchangeShardRequest>> chunks =
        SplitExchange(x, static_cast<size_t>(rvd::v1::kMaxRequestMessageBytes));
    if (!chunks.ok()) return chunks.status();
    for (const ExchangeShardRequest& c : *chunks) {
      grpc::ClientContext ctx;
      ctx.set_deadline(absl::ToChronoTime(std::min(half, deadline)));
      rvd::v1::ExchangeShardResponse unused;
      grpc::Status sent = StubFor(g.peers(p))->ExchangeShard(&ctx, c, &unused);
      if (!sent.ok()) {
        // The peer cannot measure this step then; the coordinator names it.
        spdlog::warn("group {} step {}: rows for rank {} at {} not delivered (message {} of {}): {}",
                     LogEscape(g.group_id()), step, p, LogEscape(g.peers(p)), c.chunk() + 1,
                     c.chunk_count(), LogEscape(sent.error_message()));
        break;
      }
    }
  }

  // The peers' rows our cross blocks need, until half the timeout.
  ReportPartialRequest report;
  std::map<int, std::vector<ShardData>> peer_shards;
  {
    std::unique_lock<std::mutex> lock(mu_);
    const std::vector<int> needed = PeersOfRank(rank, world);
    std::vector<int> missing;
    while (true) {
      missing.clear();
      auto& steps = inbox_[g.group_id()].steps;
      auto it = steps.find(step);
      for (int p : needed) {
        if (it == steps.end() || !it->second.contains(p)) missing.push_back(p);
      }
      const absl::Time now = absl::Now();
      if (missing.empty() || now >= std::min(half, deadline)) break;
      changed_.wait_for(lock, absl::ToChronoNanoseconds(std::min(half, deadline) - now));
    }
    auto& steps = inbox_[g.group_id()].steps;
    if (auto it = steps.find(step); it != steps.end()) {
      for (int p : needed) {
        auto got = it->second.find(p);
        if (got == it->second.end()) continue;
        peer_shards[p].assign(got->second.first.shards().begin(), got->second.first.shards().end());
        it->second.erase(got);
      }
      if (it->second.empty()) steps.erase(it);
    }
    if (!missing.empty()) {
      report.set_error(absl::StrCat("rank ", rank, ": the rows of rank(s) ",
                                    absl::StrJoin(missing, ","), " never came within ",
                                    absl::FormatDuration(options_.timeout / 2)));
    }
  }
  if (report.error().empty()) {
    absl::StatusOr<std::vector<LayerPartial>> partials =
        RankPartials(rank, world, own, peer_shards);
    if (!partials.ok()) {
      report.set_error(absl::StrCat("rank ", rank, ": ", partials.status().message()));
    } else {
      for (size_t i = 0; i < partials->size(); ++i) {
        (*partials)[i].set_tensor_name(header.tensors(static_cast<int>(i)).name());
        *report.add_layers() = std::move((*partials)[i]);
      }
    }
  }
  report.set_group_id(g.group_id());
  report.set_world_size(g.world_size());
  report.set_rank(g.rank());
  report.set_incarnation(incarnation_);
  *report.mutable_header() = header;

  grpc::ClientContext ctx;
  // The coordinator answers within its timeout of the first report; a
  // caller without a deadline still gets an answer.
  ctx.set_deadline(absl::ToChronoTime(
      std::min(deadline, absl::Now() + 2 * options_.timeout + absl::Seconds(5))));
  Measurement m;
  grpc::Status s = StubFor(g.coordinator())->ReportPartial(&ctx, report, &m);
  if (!s.ok()) {
    return FromGrpc(s, absl::StrCat("group ", g.group_id(), " step ", step, " (coordinator ",
                                    g.coordinator(), ")"));
  }
  return m;
}

absl::Status ShardGroups::ReceiveShards(const ExchangeShardRequest& request) {
  if (absl::Status s = ValidateModelId(request.group_id()); !s.ok()) {
    return Bad(absl::StrCat("group_id: ", s.message()));
  }
  if (request.world_size() < 1 || request.world_size() > kMaxWorld ||
      request.from_rank() >= request.world_size()) {
    return Bad(absl::StrCat("rank ", request.from_rank(), " of a world of ",
                            request.world_size()));
  }
  for (const ShardData& s : request.shards()) {
    absl::StatusOr<DType> dtype = ToDType(s.dtype());
    if (!dtype.ok()) return dtype.status();
    if (s.num_rows() < 0 || s.cols() < 1 || s.rows().first_row() < 0 ||
        s.rows().first_row() > s.rows().total_rows() - s.num_rows() ||
        s.data().size() != static_cast<uint64_t>(s.num_rows() * s.cols()) * DTypeSize(*dtype)) {
      return Bad(absl::StrCat("rank ", request.from_rank(), "'s rows of layer ",
                              s.rows().layer(), " do not match their shape"));
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  Inbox& inbox = inbox_[request.group_id()];
  if (inbox.world != 0 && inbox.world != static_cast<int>(request.world_size())) {
    return Bad(absl::StrCat("group ", request.group_id(), " has ", inbox.world,
                            " ranks here, rank ", request.from_rank(), " says ",
                            request.world_size()));
  }
  inbox.world = static_cast<int>(request.world_size());
  const absl::Time now = absl::Now();
  // Rows nobody took within twice the timeout belong to a failed step.
  for (auto it = inbox.steps.begin(); it != inbox.steps.end();) {
    for (auto r = it->second.begin(); r != it->second.end();) {
      r = now - r->second.second > 2 * options_.timeout ? it->second.erase(r) : std::next(r);
    }
    it = it->second.empty() ? inbox.steps.erase(it) : std::next(it);
  }
  // A sender's rows count once all of its messages of the step came.
  assembler_.Expire(now - 2 * options_.timeout);
  absl::StatusOr<std::optional<ExchangeShardRequest>> whole = assembler_.Add(request, now);
  if (!whole.ok()) return Bad(std::string(whole.status().message()));
  if (!whole->has_value()) return absl::OkStatus();
  inbox.steps[request.step()][static_cast<int>(request.from_rank())] = {std::move(**whole), now};
  while (inbox.steps.size() > static_cast<size_t>(GroupSteps::kMaxPendingSteps)) {
    inbox.steps.erase(inbox.steps.begin());
  }
  changed_.notify_all();
  return absl::OkStatus();
}

void ShardGroups::Finish(const std::string& group_id, Attempt& attempt,
                         const GroupSteps::Outcome& outcome) {
  attempt.done = true;
  if (outcome.kind == GroupSteps::Outcome::Kind::kFailed) {
    // GroupSteps words a timeout "timed out"; the other reasons (a restart,
    // a rank that moved on, too many pending) abort the step.
    const std::string why = absl::StrCat("group ", group_id, " ", outcome.why);
    attempt.result = absl::StrContains(outcome.why, "timed out")
                         ? absl::DeadlineExceededError(why)
                         : absl::AbortedError(why);
    spdlog::warn("group measurement failed: {}", LogEscape(why));
    return;
  }
  std::vector<std::string> errors;
  for (const auto& [rank, r] : attempt.reports) {
    if (!r.error().empty()) errors.push_back(r.error());
  }
  absl::StatusOr<Measurement> m =
      errors.empty()
          ? CombineReports(attempt.reports, engine_)
          : absl::StatusOr<Measurement>(absl::FailedPreconditionError(
                absl::StrCat("step ", outcome.step, ": ", absl::StrJoin(errors, "; "))));
  if (!m.ok()) {
    attempt.result = absl::Status(m.status().code(),
                                  absl::StrCat("group ", group_id, " ", m.status().message()));
    spdlog::warn("group measurement failed: {}", LogEscape(attempt.result.status().ToString()));
    return;
  }
  absl::StatusOr<MeasurementLog::Entry> stored = record_(*m);
  if (!stored.ok()) {
    attempt.result = stored.status();
    return;
  }
  m->set_sequence((*stored)->sequence());
  spdlog::info("group measurement: group={} model={} step={} ranks={} rv={}", LogEscape(group_id),
               LogEscape(m->model_id()), m->step(), attempt.reports.size(),
               m->has_rv() ? absl::StrCat(m->rv()) : "absent");
  attempt.result = *std::move(m);
}

void ShardGroups::ExpireLocked(absl::Time now) {
  bool any = false;
  for (auto& [id, group] : coordinated_) {
    for (const GroupSteps::Outcome& o : group.steps.Expire(now)) {
      auto it = group.attempts.find(o.step);
      if (it == group.attempts.end()) continue;
      Finish(id, *it->second, o);
      group.attempts.erase(it);
      any = true;
    }
  }
  if (any) changed_.notify_all();
}

absl::StatusOr<Measurement> ShardGroups::Report(const ReportPartialRequest& request,
                                                absl::Time deadline) {
  if (absl::Status s = ValidateModelId(request.group_id()); !s.ok()) {
    return Bad(absl::StrCat("group_id: ", s.message()));
  }
  if (request.world_size() < 1 || request.world_size() > kMaxWorld ||
      request.rank() >= request.world_size()) {
    return Bad(absl::StrCat("rank ", request.rank(), " of a world of ", request.world_size()));
  }
  const int rank = static_cast<int>(request.rank());
  const int64_t step = request.header().step();
  std::unique_lock<std::mutex> lock(mu_);
  ExpireLocked(absl::Now());
  auto [git, created] = coordinated_.try_emplace(
      request.group_id(), static_cast<int>(request.world_size()), options_.timeout);
  Coordinated& group = git->second;
  if (!created && group.world != static_cast<int>(request.world_size())) {
    return Bad(absl::StrCat("group ", request.group_id(), " has ", group.world,
                            " ranks, rank ", rank, " says ", request.world_size()));
  }
  std::shared_ptr<Attempt> current;
  if (auto it = group.attempts.find(step); it != group.attempts.end()) current = it->second;
  // GroupSteps fails the attempt this rank's old incarnation took part in
  // before it opens the step again for the new one: that outcome is the
  // old attempt's.
  const bool stale = current != nullptr && current->incarnation.contains(rank) &&
                     current->incarnation[rank] != request.incarnation();
  absl::StatusOr<std::vector<GroupSteps::Outcome>> outcomes =
      group.steps.Notify(rank, request.incarnation(), step, absl::Now());
  if (!outcomes.ok()) {
    return absl::Status(outcomes.status().code(),
                        absl::StrCat("group ", request.group_id(), ": ",
                                     outcomes.status().message()));
  }
  std::shared_ptr<Attempt> old = stale ? current : nullptr;
  std::shared_ptr<Attempt>& slot = group.attempts[step];
  if (slot == nullptr || stale) slot = std::make_shared<Attempt>();
  std::shared_ptr<Attempt> mine = slot;
  mine->reports[rank] = request;
  mine->incarnation[rank] = request.incarnation();
  for (const GroupSteps::Outcome& o : *outcomes) {
    if (o.step == step && old != nullptr) {
      Finish(request.group_id(), *old, o);
      old = nullptr;
      continue;
    }
    auto it = group.attempts.find(o.step);
    if (it == group.attempts.end()) continue;
    Finish(request.group_id(), *it->second, o);
    group.attempts.erase(it);
  }
  changed_.notify_all();
  while (!mine->done) {
    const absl::Time now = absl::Now();
    if (now >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "group ", request.group_id(), " step ", step,
          ": the caller's deadline passed while the step waited for its ranks"));
    }
    // Wake at least every 100 ms to expire steps whose timeout passed.
    changed_.wait_for(lock, std::min(std::chrono::nanoseconds(100'000'000),
                                     absl::ToChronoNanoseconds(deadline - now)));
    ExpireLocked(absl::Now());
  }
  return mine->result;
}

}  // namespace rvd

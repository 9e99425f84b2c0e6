#include "server/shard_chunks.h"

#include <algorithm>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace rvd {

using rvd::v1::ExchangeShardRequest;
using rvd::v1::ShardData;

namespace {

ExchangeShardRequest Envelope(const ExchangeShardRequest& whole) {
  ExchangeShardRequest x;
  x.set_group_id(whole.group_id());
  x.set_world_size(whole.world_size());
  x.set_from_rank(whole.from_rank());
  x.set_incarnation(whole.incarnation());
  x.set_step(whole.step());
  return x;
}

// Room for the envelope, chunk fields and a ShardData's own fields.
constexpr size_t kOverhead = 1024;

}  // namespace

absl::StatusOr<std::vector<ExchangeShardRequest>> SplitExchange(const ExchangeShardRequest& whole,
                                                                size_t max_bytes) {
  if (max_bytes <= 2 * kOverhead) return absl::InvalidArgumentError("message limit too small");
  const size_t budget = max_bytes - 2 * kOverhead;
  std::vector<ExchangeShardRequest> out;
  ExchangeShardRequest cur = Envelope(whole);
  size_t used = 0;
  auto flush = [&] {
    out.push_back(std::move(cur));
    cur = Envelope(whole);
    used = 0;
  };
  for (const ShardData& s : whole.shards()) {
    const int64_t rows = s.num_rows();
    const size_t row_bytes = rows > 0 ? s.data().size() / static_cast<size_t>(rows) : 0;
    if (row_bytes + kOverhead > budget) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "shard_group: one row of layer ", s.rows().layer(), " is ", row_bytes,
          " bytes, more than one message (", max_bytes, ")"));
    }
    int64_t r = 0;
    do {
      if (used + kOverhead + row_bytes > budget && used > 0) flush();
      const size_t room = budget - used - kOverhead;
      const int64_t take =
          row_bytes == 0 ? rows - r : std::min<int64_t>(rows - r, static_cast<int64_t>(room / row_bytes));
      ShardData* piece = cur.add_shards();
      *piece->mutable_rows() = s.rows();
      piece->mutable_rows()->set_first_row(s.rows().first_row() + r);
      piece->set_dtype(s.dtype());
      piece->set_num_rows(take);
      piece->set_cols(s.cols());
      piece->set_head_dim(s.head_dim());
      piece->set_data(s.data().substr(static_cast<size_t>(r) * row_bytes,
                                      static_cast<size_t>(take) * row_bytes));
      used += kOverhead + static_cast<size_t>(take) * row_bytes;
      r += take;
    } while (r < rows);
  }
  if (cur.shards_size() > 0 || out.empty()) flush();
  for (size_t i = 0; i < out.size(); ++i) {
    out[i].set_chunk(static_cast<uint32_t>(i));
    out[i].set_chunk_count(static_cast<uint32_t>(out.size()));
  }
  return out;
}

absl::StatusOr<std::optional<ExchangeShardRequest>> ShardAssembler::Add(
    const ExchangeShardRequest& chunk, absl::Time now) {
  const uint32_t count = std::max<uint32_t>(chunk.chunk_count(), 1);  // 0: an older sender's one
  if (chunk.chunk() >= count) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk ", chunk.chunk(), " of ", count, " from rank ", chunk.from_rank()));
  }
  const Key key{chunk.group_id(), chunk.step(), chunk.from_rank(), chunk.incarnation()};
  if (done_.contains(key)) return std::optional<ExchangeShardRequest>();  // a late duplicate
  Partial& p = partial_[key];
  if (p.chunks.empty()) {
    p.count = count;
    p.first = now;
  } else if (p.count != count) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", chunk.from_rank(), " step ",
                                                   chunk.step(), ": chunk_count ", count,
                                                   " after ", p.count));
  }
  p.chunks.try_emplace(chunk.chunk(), chunk);  // a duplicate keeps the first
  if (p.chunks.size() < p.count) return std::optional<ExchangeShardRequest>();

  // Complete: one ShardData per layer, its pieces in row order.
  std::map<uint32_t, std::vector<const ShardData*>> by_layer;
  for (const auto& [i, c] : p.chunks) {
    for (const ShardData& s : c.shards()) by_layer[s.rows().layer()].push_back(&s);
  }
  ExchangeShardRequest whole = Envelope(chunk);
  for (auto& [layer, pieces] : by_layer) {
    std::sort(pieces.begin(), pieces.end(), [](const ShardData* a, const ShardData* b) {
      return a->rows().first_row() < b->rows().first_row();
    });
    ShardData* s = whole.add_shards();
    *s = *pieces[0];
    std::string data = s->data();
    int64_t next = pieces[0]->rows().first_row() + pieces[0]->num_rows();
    for (size_t i = 1; i < pieces.size(); ++i) {
      const ShardData& q = *pieces[i];
      if (q.rows().first_row() != next || q.cols() != s->cols() || q.dtype() != s->dtype() ||
          q.rows().total_rows() != s->rows().total_rows()) {
        partial_.erase(key);
        return absl::InvalidArgumentError(absl::StrCat(
            "rank ", chunk.from_rank(), "'s pieces of layer ", layer, " do not tile its rows"));
      }
      data += q.data();
      next += q.num_rows();
    }
    s->set_num_rows(next - s->rows().first_row());
    s->set_data(std::move(data));
  }
  partial_.erase(key);
  done_[key] = now;
  return std::optional<ExchangeShardRequest>(std::move(whole));
}

void ShardAssembler::Expire(absl::Time cutoff) {
  for (auto it = partial_.begin(); it != partial_.end();) {
    it = it->second.first < cutoff ? partial_.erase(it) : std::next(it);
  }
  for (auto it = done_.begin(); it != done_.end();) {
    it = it->second < cutoff ? done_.erase(it) : std::next(it);
  }
}

}  // namespace rvd

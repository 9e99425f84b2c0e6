// SplitExchange and ShardAssembler: a sender's rows of a step in messages
// under the limit, assembled byte for byte whatever order, duplicates or
// old incarnations; a missing chunk never completes.
#include "server/shard_chunks.h"

#include <algorithm>
#include <random>

#include "gtest/gtest.h"

namespace rvd {
namespace {

using rvd::v1::ExchangeShardRequest;
using rvd::v1::ShardData;
const absl::Time t0 = absl::FromUnixSeconds(1000);

// Rows of `layers` layers, `rows` x `cols` f32 each, random bytes (seed printed).
ExchangeShardRequest Whole(int layers, int64_t rows, int64_t cols, uint32_t seed,
                           uint64_t incarnation = 7) {
  std::mt19937 gen(seed);
  ExchangeShardRequest x;
  x.set_group_id("g");
  x.set_world_size(2);
  x.set_from_rank(1);
  x.set_incarnation(incarnation);
  x.set_step(4);
  for (int l = 0; l < layers; ++l) {
    ShardData* s = x.add_shards();
    s->mutable_rows()->set_layer(static_cast<uint32_t>(l));
    s->mutable_rows()->set_first_row(rows);  // rank 1 of 2
    s->mutable_rows()->set_total_rows(2 * rows);
    s->set_dtype(rvd::v1::DTYPE_F32);
    s->set_num_rows(rows);
    s->set_cols(cols);
    std::string d(static_cast<size_t>(rows * cols * 4), '\0');
    for (char& c : d) c = static_cast<char>(gen());
    s->set_data(d);
  }
  return x;
}

std::vector<ExchangeShardRequest> Split(const ExchangeShardRequest& w, size_t max) {
  auto r = SplitExchange(w, max);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : std::vector<ExchangeShardRequest>{};
}

void ExpectSame(const ExchangeShardRequest& a, const ExchangeShardRequest& b) {
  ASSERT_EQ(a.shards_size(), b.shards_size());
  EXPECT_EQ(a.step(), b.step());
  EXPECT_EQ(a.from_rank(), b.from_rank());
  EXPECT_EQ(a.incarnation(), b.incarnation());
  for (int i = 0; i < a.shards_size(); ++i) {
    EXPECT_EQ(a.shards(i).rows().layer(), b.shards(i).rows().layer());
    EXPECT_EQ(a.shards(i).rows().first_row(), b.shards(i).rows().first_row());
    EXPECT_EQ(a.shards(i).num_rows(), b.shards(i).num_rows());
    EXPECT_EQ(a.shards(i).cols(), b.shards(i).cols());
    EXPECT_TRUE(a.shards(i).data() == b.shards(i).data()) << "layer " << i;
  }
}

// Feeds chunks in `order`, expects completion exactly at the last one.
void Assemble(const std::vector<ExchangeShardRequest>& chunks, const std::vector<size_t>& order,
              const ExchangeShardRequest& whole) {
  ShardAssembler a;
  for (size_t k = 0; k < order.size(); ++k) {
    auto got = a.Add(chunks[order[k]], t0);
    ASSERT_TRUE(got.ok()) << got.status();
    if (k + 1 < order.size()) {
      EXPECT_FALSE(got->has_value()) << "complete after " << k + 1 << " of " << order.size();
    } else {
      ASSERT_TRUE(got->has_value());
      ExpectSame(**got, whole);
    }
  }
  EXPECT_EQ(a.partial(), 0u);
}

TEST(ShardChunksTest, EveryMessageUnderTheLimitAndRoundTrips) {
  const uint32_t seed = 20261202;
  std::printf("seed %u\n", seed);
  // 3 layers of 64 x 100 f32 (25600 bytes each) under limits from below a
  // layer to more than all of them: boundaries on and off a row.
  const ExchangeShardRequest w = Whole(3, 64, 100, seed);
  for (size_t max : {size_t{4096}, size_t{2048 + 400 * 7}, size_t{27648}, size_t{28048},
                     size_t{60000}, size_t{1} << 20}) {
    const auto chunks = Split(w, max);
    ASSERT_FALSE(chunks.empty());
    for (const auto& c : chunks) {
      EXPECT_LE(c.ByteSizeLong(), max) << "limit " << max;
      EXPECT_EQ(c.chunk_count(), chunks.size());
    }
    if (max < 25600) {
      EXPECT_GT(chunks.size(), 3u) << "a layer over the limit is split";
    }
    if (max == (size_t{1} << 20)) {
      EXPECT_EQ(chunks.size(), 1u);
    }
    std::vector<size_t> order(chunks.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    Assemble(chunks, order, w);
  }
}

TEST(ShardChunksTest, OutOfOrderAndDuplicates) {
  const uint32_t seed = 99;
  std::printf("seed %u\n", seed);
  const ExchangeShardRequest w = Whole(4, 32, 64, seed);
  const auto chunks = Split(w, 5000);
  ASSERT_GT(chunks.size(), 4u);
  std::mt19937 gen(seed);
  for (int trial = 0; trial < 5; ++trial) {
    std::vector<size_t> order(chunks.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::shuffle(order.begin(), order.end(), gen);
    Assemble(chunks, order, w);
  }
  // Duplicates before completion do not complete it; after it, nothing new.
  ShardAssembler a;
  for (size_t i = 0; i + 1 < chunks.size(); ++i) {
    ASSERT_FALSE(a.Add(chunks[i], t0)->has_value());
    ASSERT_FALSE(a.Add(chunks[i], t0)->has_value()) << "duplicate " << i;
  }
  auto done = a.Add(chunks.back(), t0);
  ASSERT_TRUE(done.ok() && done->has_value());
  ExpectSame(**done, w);
  auto late = a.Add(chunks[0], t0);
  ASSERT_TRUE(late.ok());
  EXPECT_FALSE(late->has_value());
  EXPECT_EQ(a.partial(), 0u);
}

TEST(ShardChunksTest, MissingChunkNeverCompletesAndExpires) {
  const ExchangeShardRequest w = Whole(2, 64, 100, 5);
  const auto chunks = Split(w, 8000);
  ASSERT_GT(chunks.size(), 2u);
  for (size_t missing = 0; missing < chunks.size(); ++missing) {
    ShardAssembler a;
    for (size_t i = 0; i < chunks.size(); ++i) {
      if (i == missing) continue;
      auto got = a.Add(chunks[i], t0);
      ASSERT_TRUE(got.ok());
      EXPECT_FALSE(got->has_value()) << "complete without chunk " << missing;
    }
    EXPECT_EQ(a.partial(), 1u);
    a.Expire(t0 + absl::Seconds(1));
    EXPECT_EQ(a.partial(), 0u);
  }
}

TEST(ShardChunksTest, OldIncarnationKeptApart) {
  const ExchangeShardRequest old_w = Whole(2, 64, 100, 1, /*incarnation=*/7);
  const ExchangeShardRequest new_w = Whole(2, 64, 100, 2, /*incarnation=*/8);
  const auto old_c = Split(old_w, 8000);
  const auto new_c = Split(new_w, 8000);
  ShardAssembler a;
  for (size_t i = 1; i < old_c.size(); ++i) ASSERT_FALSE(a.Add(old_c[i], t0)->has_value());
  for (size_t i = 0; i + 1 < new_c.size(); ++i) ASSERT_FALSE(a.Add(new_c[i], t0)->has_value());
  // The old incarnation's chunk 0 does not complete the new one's rows.
  auto mixed = a.Add(old_c[0], t0);
  ASSERT_TRUE(mixed.ok());
  ASSERT_TRUE(mixed->has_value());
  ExpectSame(**mixed, old_w);
  auto fresh = a.Add(new_c.back(), t0);
  ASSERT_TRUE(fresh.ok() && fresh->has_value());
  ExpectSame(**fresh, new_w);
}

TEST(ShardChunksTest, OlderSenderOneMessageAndBadChunks) {
  ExchangeShardRequest w = Whole(2, 4, 8, 3);  // chunk fields unset: one message
  ShardAssembler a;
  auto got = a.Add(w, t0);
  ASSERT_TRUE(got.ok() && got->has_value());
  ExpectSame(**got, w);
  ExchangeShardRequest bad = w;
  bad.set_step(5);
  bad.set_chunk(2);
  bad.set_chunk_count(2);
  EXPECT_FALSE(a.Add(bad, t0).ok());
  // One row over the limit is refused, not sent.
  EXPECT_EQ(SplitExchange(Whole(1, 2, 4096, 4), 8192).status().code(),
            absl::StatusCode::kResourceExhausted);
}

}  // namespace
}  // namespace rvd

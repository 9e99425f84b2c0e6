#include "self_improve/search_generator.h"

#include <algorithm>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "self_improve/seed_mix.h"

namespace rvd::tune {
namespace {

enum Knob { kTile, kWarps, kStages, kSplit, kVector, kSlice, kFamily, kKnobs };

// How much a bottleneck favours moving each knob (1: no preference).
int Weight(Bottleneck b, Knob k) {
  switch (b) {
    case Bottleneck::kMemoryBandwidth:
      return k == kVector || k == kStages ? 4 : 1;
    case Bottleneck::kMemoryLatency:
      return k == kStages || k == kSplit || k == kTile || k == kFamily ? 4 : 1;
    case Bottleneck::kOccupancy:
      return k == kWarps || k == kTile ? 4 : 1;
    case Bottleneck::kCompute:
      return k == kTile || k == kWarps || k == kFamily ? 4 : 1;
    case Bottleneck::kMixed:
    case Bottleneck::kUnknown:
      return 1;
  }
  return 1;
}

int* KnobOf(SpacePoint& p, Knob k) {
  switch (k) {
    case kTile: return &p.tile;
    case kWarps: return &p.warps;
    case kStages: return &p.stages;
    case kSplit: return &p.split_k;
    case kVector: return &p.vector_width;
    case kSlice: return &p.k_slice;
    default: return nullptr;
  }
}

const std::vector<int>& ValuesOf(const SearchSpace& s, Knob k) {
  switch (k) {
    case kTile: return s.tiles;
    case kWarps: return s.warps;
    case kStages: return s.stages;
    case kSplit: return s.split_k;
    case kVector: return s.vector_widths;
    default: return s.k_slices;
  }
}

struct Move {
  SpacePoint point;
  Knob knob;
};

// The point of `family` nearest `p`: its tile and warps, the others at
// their simplest valid values.
std::vector<SpacePoint> FamilySwitch(const SpacePoint& p, Family family, const SearchSpace& s,
                                     DType dtype) {
  std::vector<SpacePoint> out;
  if (family == Family::kNaive) {
    SpacePoint q;
    q.family = family;
    q.tile = p.tile;
    q.warps = p.warps;
    if (Valid(q, dtype)) out.push_back(q);
    return out;
  }
  for (int tile : {p.tile == 0 ? 64 : p.tile, 64, 32}) {
    for (int ks : {32, 16, 64}) {
      SpacePoint q{family, tile, p.warps, 1, 1, 1, ks, MmaPath::kFma};
      if (std::find(s.tiles.begin(), s.tiles.end(), tile) == s.tiles.end() ||
          std::find(s.k_slices.begin(), s.k_slices.end(), ks) == s.k_slices.end()) {
        continue;
      }
      if (Valid(q, dtype)) {
        out.push_back(q);
        return out;
      }
    }
  }
  return out;
}

std::vector<Move> Moves(const SpacePoint& p, DType dtype, const SearchSpace& s) {
  std::vector<Move> out;
  for (int k = kTile; k < kFamily; ++k) {
    const Knob knob = static_cast<Knob>(k);
    const std::vector<int>& values = ValuesOf(s, knob);
    SpacePoint q = p;
    int* v = KnobOf(q, knob);
    const auto at = std::find(values.begin(), values.end(), *v);
    if (at == values.end()) continue;
    if (at != values.begin()) {
      *v = *(at - 1);
      if (Valid(q, dtype)) out.push_back({q, knob});
    }
    if (at + 1 != values.end()) {
      *v = *(at + 1);
      if (Valid(q, dtype)) out.push_back({q, knob});
    }
  }
  for (Family f : s.families) {
    if (f == p.family) continue;
    for (const SpacePoint& q : FamilySwitch(p, f, s, dtype)) out.push_back({q, kFamily});
  }
  return out;
}

// The point key on a built-in source's first line ("" for another source).
std::string KeyOfSource(const std::string& source) {
  constexpr absl::string_view kPrefix = "// rvd tuning candidate ";
  if (!absl::StartsWith(source, kPrefix)) return "";
  std::vector<absl::string_view> words =
      absl::StrSplit(absl::string_view(source).substr(kPrefix.size()), ' ');
  return words.empty() || !ParsePointKey(words[0]).ok() ? "" : std::string(words[0]);
}

}  // namespace

std::vector<SpacePoint> SearchGenerator::Neighbours(const SpacePoint& p, DType dtype) const {
  std::vector<SpacePoint> out;
  for (const Move& m : Moves(p, dtype, space_)) out.push_back(m.point);
  return out;
}

absl::StatusOr<Candidate> SearchGenerator::Generate(const CandidateRequest& request) {
  if (request.cancelled != nullptr && request.cancelled->load()) {
    return absl::CancelledError("the job was cancelled");
  }
  const DType dtype = request.target.dtype;
  std::set<std::string> tried;
  for (const HistoryEntry& h : request.history) {
    const std::string key = KeyOfDescription(h.description);
    if (!key.empty()) tried.insert(key);
  }
  const std::string best_key = KeyOfDescription(request.best_description);
  if (!best_key.empty()) tried.insert(best_key);
  const std::string failed_key = KeyOfSource(request.failed_source);
  if (!failed_key.empty()) tried.insert(failed_key);

  uint64_t state = SplitMix64(seed_ ^ SplitMix64(static_cast<uint64_t>(request.iteration)) ^
                              SplitMix64(0x5bd1e995ull + static_cast<uint64_t>(request.attempt)));
  const auto draw = [&state](uint64_t bound) {
    state = SplitMix64(state);
    return state % bound;
  };

  std::vector<Move> moves;
  if (!best_key.empty()) {
    for (Move& m : Moves(*ParsePointKey(best_key), dtype, space_)) {
      if (tried.count(PointKey(m.point)) == 0) moves.push_back(std::move(m));
    }
  }
  SpacePoint chosen;
  std::string how;
  if (!moves.empty()) {
    uint64_t total = 0;
    for (const Move& m : moves) total += Weight(request.bottleneck.bottleneck, m.knob);
    uint64_t pick = draw(total);
    size_t i = 0;
    for (; i + 1 < moves.size(); ++i) {
      const uint64_t w = Weight(request.bottleneck.bottleneck, moves[i].knob);
      if (pick < w) break;
      pick -= w;
    }
    chosen = moves[i].point;
    how = absl::StrCat("a neighbour of ", best_key, " (bottleneck ",
                       BottleneckName(request.bottleneck.bottleneck), ")");
  } else {
    std::vector<SpacePoint> untried;
    for (const SpacePoint& p : Points(space_, dtype)) {
      if (tried.count(PointKey(p)) == 0) untried.push_back(p);
    }
    if (untried.empty()) {
      return absl::OutOfRangeError(absl::StrCat("search exhausted: all ", tried.size(),
                                                " points of the space tried"));
    }
    chosen = untried[draw(untried.size())];
    how = best_key.empty() ? "a random point (the best is not a point of the space)"
                           : absl::StrCat("a random point (every neighbour of ", best_key,
                                          " tried)");
  }
  absl::StatusOr<Candidate> c = Emit(chosen, dtype);
  if (!c.ok()) return c.status();
  absl::StrAppend(&c->description, "; ", how);
  return c;
}

}  // namespace rvd::tune

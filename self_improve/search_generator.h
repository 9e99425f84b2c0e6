// The built-in offline generator (self_improve/, public; the default): a
// seeded local search over the declared space (space.h). Each candidate is
// a neighbour of the current best point, one knob moved one step in its
// declared list, or a family switched; the bottleneck weighs which knobs
// are tried first (bandwidth: vector width and stages; latency: stages,
// split-K and tile; occupancy: warps and tile; compute: tile and warps).
// When every neighbour has been tried, a random untried point of the
// space; when none is left, OUT_OF_RANGE.
//
// Stateless between calls: what was tried is read from the request's
// history (each built-in description starts with its point's key) and the
// choice is drawn from (seed, iteration, attempt), so a job resumed after a
// restart, with its history from the job log, continues the same search.
//
// Thread-safe: const, no state beyond its options.
#ifndef RVD_SELF_IMPROVE_SEARCH_GENERATOR_H_
#define RVD_SELF_IMPROVE_SEARCH_GENERATOR_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "self_improve/generator.h"
#include "self_improve/space.h"

namespace rvd::tune {

class SearchGenerator final : public Generator {
 public:
  SearchGenerator(uint64_t seed, SearchSpace space = DefaultSpace())
      : seed_(seed), space_(std::move(space)) {}

  std::string Name() const override { return "builtin"; }
  absl::StatusOr<Candidate> Generate(const CandidateRequest& request) override;

  // The neighbours of `p` in the space for `dtype`, each valid, in a fixed
  // order (knob by knob, down then up; then the other families' nearest
  // point).
  std::vector<SpacePoint> Neighbours(const SpacePoint& p, DType dtype) const;

 private:
  const uint64_t seed_;
  const SearchSpace space_;
};

}  // namespace rvd::tune

#endif  // RVD_SELF_IMPROVE_SEARCH_GENERATOR_H_

// The tuning worker's one mixing function (self_improve/, private): the
// SplitMix64 step, which turns a seed into a well-spread 64-bit value. The
// loop derives its per-iteration seeds with it (tune_loop.cc), the search
// its choices (search_generator.cc), the verifier its input plans
// (verification.cc) and the device tools the matrices' values
// (device_tools.cc); a job's results depend on its exact bits, so it is
// written once. Thread-safe: a pure function.
#ifndef RVD_SELF_IMPROVE_SEED_MIX_H_
#define RVD_SELF_IMPROVE_SEED_MIX_H_

#include <cstdint>

namespace rvd::tune {

inline uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace rvd::tune

#endif  // RVD_SELF_IMPROVE_SEED_MIX_H_

// FUZZ_CHECK(cond): an invariant of the code under test that every input
// must keep. A violation prints the condition and aborts, which libFuzzer
// records as a crash (the input is saved under the artifact prefix).
#ifndef RVD_TESTS_FUZZ_FUZZ_CHECK_H_
#define RVD_TESTS_FUZZ_FUZZ_CHECK_H_

#include <cstdio>
#include <cstdlib>

#define FUZZ_CHECK(cond)                                                 \
  do {                                                                   \
    if (!(cond)) {                                                       \
      std::fprintf(stderr, "%s:%d: FUZZ_CHECK failed: %s\n", __FILE__,   \
                   __LINE__, #cond);                                     \
      std::abort();                                                      \
    }                                                                    \
  } while (0)

#endif  // RVD_TESTS_FUZZ_FUZZ_CHECK_H_

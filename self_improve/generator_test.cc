#include "self_improve/generator.h"

#include <string>

#include "gtest/gtest.h"

namespace rvd::tune {
namespace {

TEST(LaunchAnnotationTest, RoundTrips) {
  CandidateLaunch l{256, 49152, 128, 64};
  const std::string src = "#include <x>\n  " + FormatLaunchAnnotation(l) + "\n__global__ ...";
  absl::StatusOr<CandidateLaunch> got = ParseLaunchAnnotation(src);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, l);
  CandidateLaunch whole{128, 0, 0, 0};
  got = ParseLaunchAnnotation(FormatLaunchAnnotation(whole));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, whole);
}

TEST(LaunchAnnotationTest, RefusesBadLines) {
  struct Case {
    const char* src;
    const char* says;
  } cases[] = {
      {"__global__ void f() {}", "no launch annotation"},
      {"// rvd-launch: threads=64 smem=0 tile_rows=0 tile_cols=0\n"
       "// rvd-launch: threads=64 smem=0 tile_rows=0 tile_cols=0",
       "2 launch annotation lines"},
      {"// rvd-launch: threads=64 smem=0 tile_rows=0", "tile_cols is missing"},
      {"// rvd-launch: threads=64 threads=64 smem=0 tile_rows=0 tile_cols=0", "twice"},
      {"// rvd-launch: threads=6x smem=0 tile_rows=0 tile_cols=0", "not an integer"},
      {"// rvd-launch: threads=48 smem=0 tile_rows=0 tile_cols=0", "multiple of 32"},
      {"// rvd-launch: threads=2048 smem=0 tile_rows=0 tile_cols=0", "multiple of 32"},
      {"// rvd-launch: threads=64 smem=300000 tile_rows=0 tile_cols=0", "smem=300000"},
      {"// rvd-launch: threads=64 smem=0 tile_rows=24 tile_cols=32", "multiples of 16"},
      {"// rvd-launch: threads=64 smem=0 tile_rows=0 tile_cols=32", "multiples of 16"},
      {"// rvd-launch: threads=64 smem=0 tile_rows=32 tile_cols=32 grid=9",
       "unknown field"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<CandidateLaunch> got = ParseLaunchAnnotation(c.src);
    ASSERT_FALSE(got.ok()) << c.src;
    EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(got.status().message().find(c.says), std::string::npos)
        << got.status() << " should say " << c.says;
  }
}

TEST(VerdictTest, Names) {
  EXPECT_STREQ(VerdictName(Verdict::kAccepted), "accepted");
  EXPECT_STREQ(VerdictName(Verdict::kCompileError), "compile_error");
  EXPECT_STREQ(VerdictName(Verdict::kHeldOutFailed), "held_out_failed");
  EXPECT_STREQ(VerdictName(Verdict::kGeneratorError), "generator_error");
}

}  // namespace
}  // namespace rvd::tune

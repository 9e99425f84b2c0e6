// Tests of the call contract every engine shares (call_contract.h).
#include "kernels/call_contract.h"

#include <climits>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace rvd {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

VariantSpec Named(const std::string& name) {
  VariantSpec v;
  v.name = name;
  return v;
}

TEST(ParseVariantTest, EveryKnownNameAndTheDefault) {
  EXPECT_EQ(*ParseVariant(Named("fused"), "cuda", "fused"), VariantKind::kFused);
  EXPECT_EQ(*ParseVariant(Named("algebraic"), "cpu", "algebraic"),
            VariantKind::kAlgebraic);
  EXPECT_EQ(*ParseVariant(Named("naive"), "cpu", "algebraic"),
            VariantKind::kNaive);
  EXPECT_EQ(*ParseVariant(Named("power_iter"), "cpu", "algebraic"),
            VariantKind::kPowerIter);
  EXPECT_EQ(*ParseVariant(Named("sketch"), "cpu", "algebraic"),
            VariantKind::kSketch);
  EXPECT_EQ(*ParseVariant(Named(""), "cpu", "algebraic"),
            VariantKind::kAlgebraic);
  EXPECT_EQ(*ParseVariant(Named(""), "cuda", "fused"), VariantKind::kFused);
  // Every name in KnownVariants() parses.
  for (const std::string& name : KnownVariants()) {
    EXPECT_TRUE(ParseVariant(Named(name), "cpu", "algebraic").ok()) << name;
  }
}

TEST(ParseVariantTest, UnknownIsUnimplementedNamingBackendAndKnownNames) {
  const absl::StatusOr<VariantKind> k =
      ParseVariant(Named("svd_magic"), "cuda", "fused");
  ASSERT_TRUE(absl::IsUnimplemented(k.status())) << k.status();
  EXPECT_THAT(std::string(k.status().message()),
              AllOf(HasSubstr("svd_magic"), HasSubstr("cuda"),
                    HasSubstr("algebraic, naive, power_iter, sketch, fused")));
}

TEST(ParseVariantTest, WorkSizingParametersAreBounded) {
  for (int probes : {INT_MIN, -1, 0, kMaxProbes + 1, INT_MAX}) {
    VariantSpec v = Named("power_iter");
    v.probes = probes;
    const absl::Status s = ParseVariant(v, "cpu", "algebraic").status();
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << probes;
    EXPECT_THAT(std::string(s.message()),
                AllOf(HasSubstr("probes"), HasSubstr("[1, 4096]"),
                      HasSubstr(std::to_string(probes))));
  }
  for (int rank : {0, kMaxSketchRank + 1, INT_MAX}) {
    VariantSpec v = Named("sketch");
    v.sketch_rank = rank;
    const absl::Status s = ParseVariant(v, "cpu", "algebraic").status();
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << rank;
    EXPECT_THAT(std::string(s.message()),
                AllOf(HasSubstr("sketch_rank"), HasSubstr("[1, 4096]")));
  }
  VariantSpec edge = Named("power_iter");
  edge.probes = kMaxProbes;
  EXPECT_TRUE(ParseVariant(edge, "cpu", "algebraic").ok());
  edge.probes = 1;
  EXPECT_TRUE(ParseVariant(edge, "cpu", "algebraic").ok());
  VariantSpec sk = Named("sketch");
  sk.sketch_rank = kMaxSketchRank;
  EXPECT_TRUE(ParseVariant(sk, "cpu", "algebraic").ok());
  // A parameter the variant does not use is not checked (a client may send
  // zeros for fields it leaves unset).
  VariantSpec unused = Named("algebraic");
  unused.probes = 0;
  unused.sketch_rank = INT_MAX;
  EXPECT_TRUE(ParseVariant(unused, "cpu", "algebraic").ok());
}

TEST(ValidateViewTest, GoodViews) {
  std::vector<float> w(64);
  EXPECT_TRUE(ValidateView({w.data(), 8, 8, 8, DType::kF32}, 0).ok());
  EXPECT_TRUE(ValidateView({w.data(), 1, 1, 1, DType::kF32}, 0).ok());
  EXPECT_TRUE(ValidateView({w.data(), 4, 4, 16, DType::kF32}, 0).ok());
  // Element alignment only: a bf16 view may start at any even address.
  EXPECT_TRUE(ValidateView({reinterpret_cast<const char*>(w.data()) + 2, 4, 4,
                            4, DType::kBF16},
                           0)
                  .ok());
}

TEST(ValidateViewTest, BadViewsNameTheIndexAndTheReason) {
  std::vector<float> w(64);
  const char* odd = reinterpret_cast<const char*>(w.data()) + 1;
  const char* two = reinterpret_cast<const char*>(w.data()) + 2;
  struct Case {
    MatrixView v;
    const char* says;
  };
  const int64_t big = int64_t{1} << 31;
  for (const Case& c : {
           Case{{nullptr, 8, 8, 8, DType::kF32}, "bad matrix view"},
           Case{{w.data(), 0, 8, 8, DType::kF32}, "bad matrix view"},
           Case{{w.data(), 8, 0, 8, DType::kF32}, "bad matrix view"},
           Case{{w.data(), -3, 8, 8, DType::kF32}, "bad matrix view"},
           Case{{w.data(), 8, 8, 7, DType::kF32}, "bad matrix view"},
           Case{{w.data(), big, 8, 8, DType::kF32}, "exceed 2^31"},
           Case{{w.data(), 8, big, big, DType::kF32}, "exceed 2^31"},
           Case{{w.data(), 8, 8, big, DType::kF32}, "exceed 2^31"},
           Case{{two, 4, 4, 4, DType::kF32}, "not aligned"},
           Case{{odd, 4, 4, 4, DType::kF16}, "not aligned"},
       }) {
    const absl::Status s = ValidateView(c.v, 7);
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << c.says;
    EXPECT_THAT(std::string(s.message()),
                AllOf(HasSubstr("batch[7]"), HasSubstr(c.says)));
  }
  // Large dimensions pass (nothing is read) while the byte extent fits
  // int64; INT32_MAX^2 f32 elements are 2^64 bytes and do not.
  EXPECT_TRUE(
      ValidateView({w.data(), INT32_MAX, 1000, 1000, DType::kF32}, 0).ok());
  const absl::Status s =
      ValidateView({w.data(), INT32_MAX, INT32_MAX, INT32_MAX, DType::kF32}, 3);
  EXPECT_TRUE(absl::IsInvalidArgument(s));
  EXPECT_THAT(std::string(s.message()),
              AllOf(HasSubstr("batch[3]"), HasSubstr("2^63 bytes")));
}

TEST(NonFiniteErrorTest, NamesTheIndex) {
  const absl::Status s = NonFiniteError(12);
  EXPECT_TRUE(absl::IsInvalidArgument(s));
  EXPECT_EQ(s.message(), "batch[12]: matrix contains NaN or Inf");
}

TEST(CheckCallTest, ChecksInOrderAndPoisonsTheOutput) {
  std::vector<float> w(64, 1.0f);
  const MatrixView good{w.data(), 8, 8, 8, DType::kF32};
  const MatrixView bad{nullptr, 8, 8, 8, DType::kF32};
  std::vector<double> out = {1.0, 2.0};
  // A size mismatch is refused before anything is touched.
  absl::StatusOr<VariantKind> k =
      CheckCall({good}, {}, absl::MakeSpan(out), "cpu", "algebraic");
  EXPECT_TRUE(absl::IsInvalidArgument(k.status()));
  EXPECT_THAT(std::string(k.status().message()), HasSubstr("2 slots"));
  EXPECT_EQ(out[0], 1.0);
  // Poisoned, then the variant is refused before the views are looked at.
  k = CheckCall({good, bad}, Named("nope"), absl::MakeSpan(out), "cpu",
                "algebraic");
  EXPECT_TRUE(absl::IsUnimplemented(k.status())) << k.status();
  EXPECT_TRUE(std::isnan(out[0]) && std::isnan(out[1]));
  // A bad view names its index.
  out = {1.0, 2.0};
  k = CheckCall({good, bad}, {}, absl::MakeSpan(out), "cpu", "algebraic");
  EXPECT_TRUE(absl::IsInvalidArgument(k.status()));
  EXPECT_THAT(std::string(k.status().message()), HasSubstr("batch[1]"));
  EXPECT_TRUE(std::isnan(out[0]) && std::isnan(out[1]));
  // All good: the default variant's kind, outputs poisoned for the engine.
  out = {1.0, 2.0};
  k = CheckCall({good, good}, {}, absl::MakeSpan(out), "cuda", "fused");
  ASSERT_TRUE(k.ok()) << k.status();
  EXPECT_EQ(*k, VariantKind::kFused);
  EXPECT_TRUE(std::isnan(out[0]) && std::isnan(out[1]));
  EXPECT_TRUE(CheckCall({}, {}, {}, "cpu", "algebraic").ok());
}

TEST(PRFromSingularValuesTest, ClosedForms) {
  EXPECT_EQ(PRFromSingularValues({}), 0.0);
  EXPECT_EQ(PRFromSingularValues({0.0, 0.0}), 0.0);
  EXPECT_DOUBLE_EQ(PRFromSingularValues({5.0}), 1.0);
  EXPECT_DOUBLE_EQ(PRFromSingularValues({2.0, 0.0, 0.0}), 1.0);
  // k equal values: PR = k.
  EXPECT_DOUBLE_EQ(PRFromSingularValues(std::vector<double>(37, 0.3)), 37.0);
  // s = (1, 2): (1 + 4)^2 / (1 + 16) = 25 / 17, in any order.
  EXPECT_DOUBLE_EQ(PRFromSingularValues({1.0, 2.0}), 25.0 / 17.0);
  EXPECT_DOUBLE_EQ(PRFromSingularValues({2.0, 1.0}), 25.0 / 17.0);
}

TEST(PRFromSingularValuesTest, ScaleInvariantWithoutOverflowOrUnderflow) {
  const std::vector<double> s = {3.0, 1.0, 0.5, 0.25};
  const double pr = PRFromSingularValues(s);
  for (double scale : {1e-300, 1e-160, 1e160, 1e300}) {
    std::vector<double> t = s;
    for (double& x : t) x *= scale;  // s^4 would over/underflow unscaled
    EXPECT_NEAR(PRFromSingularValues(t), pr, 1e-14 * pr) << scale;
  }
  EXPECT_TRUE(std::isnan(
      PRFromSingularValues({1.0, std::numeric_limits<double>::quiet_NaN()})));
}

// A blocked view (MatrixView::block_rows) is a device call's input only:
// ValidateView refuses it, so a host call (CPU engine, CUDA host path) never
// reads rows of Q and K as V; ValidateBlockedView checks its blocking.
TEST(ValidateBlockedViewTest, HostCallsRefuseItDeviceCallsCheckIt) {
  std::vector<float> w(3 * 4 * 2 * 5);  // gpt_neox: 4 heads of [q k v] x 2 rows, 5 cols
  MatrixView v{w.data() + 2 * 2 * 5, 8, 5, 5, DType::kF32};
  v.block_rows = 2;
  v.block_stride = 3 * 2 * 5;
  const absl::Status host = ValidateView(v, 3);
  EXPECT_TRUE(absl::IsInvalidArgument(host));
  EXPECT_THAT(std::string(host.message()),
              AllOf(HasSubstr("batch[3]"), HasSubstr("blocked view")));
  std::vector<double> out(1);
  EXPECT_TRUE(absl::IsInvalidArgument(
      CheckCall({v}, {}, absl::MakeSpan(out), "cpu", "algebraic").status()));
  EXPECT_TRUE(ValidateBlockedView(v, 0).ok()) << ValidateBlockedView(v, 0);

  MatrixView bad = v;
  bad.block_rows = 3;  // does not divide 8 rows
  EXPECT_THAT(std::string(ValidateBlockedView(bad, 1).message()),
              AllOf(HasSubstr("batch[1]"), HasSubstr("divide")));
  bad = v;
  bad.block_stride = 2 * 5 - 1;  // blocks overlap
  EXPECT_THAT(std::string(ValidateBlockedView(bad, 2).message()), HasSubstr("overlaps"));
  bad = v;
  bad.ld = 4;  // ld < cols: a bad block
  EXPECT_TRUE(absl::IsInvalidArgument(ValidateBlockedView(bad, 0)));
  bad = v;
  bad.block_stride = std::numeric_limits<int64_t>::max() / 2;  // extent past 2^63 bytes
  EXPECT_THAT(std::string(ValidateBlockedView(bad, 0).message()), HasSubstr("2^63"));
  bad = v;
  bad.block_rows = 0;
  EXPECT_TRUE(absl::IsInvalidArgument(ValidateBlockedView(bad, 0)));
}

}  // namespace
}  // namespace rvd

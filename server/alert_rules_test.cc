#include "server/alert_rules.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace rvd {
namespace {

using ::testing::HasSubstr;

absl::Status ErrorOf(const std::string& text) {
  absl::StatusOr<std::vector<AlertRule>> r = ParseAlertRules(text);
  return r.ok() ? absl::OkStatus() : r.status();
}

// A document with one rule whose body is `body` (YAML lines at indent 4).
std::string OneRule(const std::string& body) {
  return "rules:\n  - name: r\n" + body;
}

TEST(AlertRulesTest, EmptyDocumentsAreEmptySets) {
  for (const char* text : {"", "# nothing\n", "~", "rules:\n", "rules: []\n"}) {
    absl::StatusOr<std::vector<AlertRule>> r = ParseAlertRules(text);
    ASSERT_TRUE(r.ok()) << text << ": " << r.status();
    EXPECT_TRUE(r->empty());
  }
}

TEST(AlertRulesTest, EveryKindAndField) {
  absl::StatusOr<std::vector<AlertRule>> r = ParseAlertRules(R"(
rules:
  - name: rv_floor
    model: "llama-*"
    value: rv
    below: 0.5
    for: 3
    resolve_for: 2
    hysteresis: 0.05
    severity: critical
    labels: {team: ml, page: "yes"}
    annotations: {summary: "R_V collapsed", runbook.url: "http://x/y"}
  - name: layer_high
    value: layer_pr
    layer: 7
    above: 40
  - name: drop_first
    drop: {baseline: first, measurements: 5, fraction: 0.2}
  - name: drop_ema
    drop: {baseline: ema, alpha: 0.25, fraction: 0.1}
  - name: drop_max
    drop: {baseline: max, fraction: 0.3}
  - name: fall
    change: {per: step, below: -0.001}
  - name: jump
    change: {below: -0.2, above: 0.2}
)");
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->size(), 7u);
  const AlertRule& a = (*r)[0];
  EXPECT_EQ(a.name, "rv_floor");
  EXPECT_EQ(a.model, "llama-*");
  EXPECT_EQ(a.value, AlertRule::Value::kRv);
  EXPECT_EQ(a.condition, AlertRule::Condition::kBelow);
  EXPECT_EQ(a.threshold, 0.5);
  EXPECT_EQ(a.for_count, 3u);
  EXPECT_EQ(a.resolve_for, 2u);
  EXPECT_EQ(a.hysteresis, 0.05);
  EXPECT_EQ(a.severity, "critical");
  EXPECT_EQ(a.labels.at("team"), "ml");
  EXPECT_EQ(a.labels.at("page"), "yes");
  EXPECT_EQ(a.annotations.at("runbook.url"), "http://x/y");
  EXPECT_TRUE(a.Matches("llama-7b"));
  EXPECT_FALSE(a.Matches("mistral"));
  const AlertRule& b = (*r)[1];
  EXPECT_EQ(b.value, AlertRule::Value::kLayerPr);
  EXPECT_EQ(b.layer, 7u);
  EXPECT_EQ(b.condition, AlertRule::Condition::kAbove);
  EXPECT_EQ(b.model, "*");
  EXPECT_EQ(b.severity, "warning");
  EXPECT_EQ(b.for_count, 1u);
  EXPECT_EQ((*r)[2].baseline, AlertRule::Baseline::kFirst);
  EXPECT_EQ((*r)[2].baseline_measurements, 5u);
  EXPECT_EQ((*r)[2].fraction, 0.2);
  EXPECT_EQ((*r)[3].baseline, AlertRule::Baseline::kEma);
  EXPECT_EQ((*r)[3].ema_alpha, 0.25);
  EXPECT_EQ((*r)[4].baseline, AlertRule::Baseline::kMax);
  EXPECT_TRUE((*r)[5].per_step);
  EXPECT_EQ(*(*r)[5].change_below, -0.001);
  EXPECT_FALSE((*r)[5].change_above.has_value());
  EXPECT_FALSE((*r)[6].per_step);
  EXPECT_EQ(*(*r)[6].change_above, 0.2);
  EXPECT_EQ(a.Describe(), "R_V below 0.5");
  EXPECT_EQ((*r)[2].Describe(), "R_V drop > 20% from the mean of the first 5");
}

// Each class of bad input, with the words its error must carry (the rule,
// the field, what is wrong).
TEST(AlertRulesTest, BadInputIsRefusedWithItsReason) {
  const struct {
    std::string text;
    std::vector<std::string> words;
  } kCases[] = {
      {"rules: [", {"YAML syntax error"}},
      {"- a\n- b\n", {"expected a map"}},
      {"rule:\n  - name: x\n    below: 1\n", {"unknown field 'rule'", "known fields: rules"}},
      {"rules: {name: x}\n", {"rules", "expected a sequence"}},
      {"rules:\n  - 42\n", {"rule 1", "expected a map"}},
      {OneRule("    below: 1\n    belw: 2\n"), {"rule 1 ('r')", "unknown field 'belw'", "line 4"}},
      {OneRule("    below: 1\n    below: 2\n"), {"'below' appears more than once"}},
      {"rules:\n  - below: 1\n", {"needs a 'name'"}},
      {"rules:\n  - name: \"bad name\"\n    below: 1\n", {"name", "[A-Za-z0-9_.:-]"}},
      {"rules:\n  - name: r\n    below: 1\n  - name: r\n    above: 2\n",
       {"rule 2 ('r')", "used by an earlier rule"}},
      {OneRule("    model: \"llama/*\"\n    below: 1\n"), {"model", "bad character '/'"}},
      {OneRule("    model: \"llama-[ab\"\n    below: 1\n"), {"unclosed '['"}},
      {OneRule("    value: loss\n    below: 1\n"), {"value", "\"loss\" is not one of rv, layer_pr"}},
      {OneRule("    value: layer_pr\n    below: 1\n"), {"needs a 'layer'"}},
      {OneRule("    layer: 3\n    below: 1\n"), {"layer", "only with value: layer_pr"}},
      {OneRule("    value: layer_pr\n    layer: -1\n    below: 1\n"), {"layer", "layer index >= 0"}},
      {OneRule("    for: 2\n"), {"needs one condition"}},
      {OneRule("    below: 1\n    above: 2\n"), {"below and above", "one condition per rule"}},
      {OneRule("    below: abc\n"), {"below", "expected a number"}},
      {OneRule("    below: .nan\n"), {"below", "finite"}},
      {OneRule("    above: .inf\n"), {"above", "finite"}},
      {OneRule("    below: 0\n"), {"below", "must be > 0"}},
      {OneRule("    above: -1\n"), {"above", "must be >= 0"}},
      {OneRule("    drop: {fraction: 0.2}\n"), {"drop", "needs 'baseline'"}},
      {OneRule("    drop: {baseline: median, fraction: 0.2}\n"), {"baseline", "\"median\""}},
      {OneRule("    drop: {baseline: max}\n"), {"needs 'fraction'"}},
      {OneRule("    drop: {baseline: max, fraction: 1.5}\n"), {"fraction", "(0, 1)"}},
      {OneRule("    drop: {baseline: max, fraction: 0}\n"), {"fraction", "(0, 1)"}},
      {OneRule("    drop: {baseline: max, fraction: 0.2, measurements: 3}\n"),
       {"measurements", "only with baseline: first"}},
      {OneRule("    drop: {baseline: first, fraction: 0.2, measurements: 0}\n"),
       {"measurements", "1..1000000"}},
      {OneRule("    drop: {baseline: ema, fraction: 0.2, alpha: 0}\n"), {"alpha", "(0, 1]"}},
      {OneRule("    drop: {baseline: first, fraction: 0.2, alpha: 0.5}\n"),
       {"alpha", "only with baseline: ema"}},
      {OneRule("    drop: {baseline: max, fraction: 0.2, window: 3}\n"),
       {"drop", "unknown field 'window'"}},
      {OneRule("    change: {per: epoch, below: -1}\n"), {"per", "\"epoch\""}},
      {OneRule("    change: {per: step}\n"), {"needs 'below' or 'above'"}},
      {OneRule("    change: {below: 0.5, above: 0.1}\n"), {"'below' must be less than 'above'"}},
      {OneRule("    below: 1\n    for: 0\n"), {"for", "1..1000000"}},
      {OneRule("    below: 1\n    for: 2.5\n"), {"for", "1..1000000"}},
      {OneRule("    below: 1\n    resolve_for: -3\n"), {"resolve_for", "1..1000000"}},
      {OneRule("    below: 1\n    hysteresis: -0.1\n"), {"hysteresis", "must be >= 0"}},
      {OneRule("    above: 1\n    hysteresis: 2\n"), {"hysteresis", "never resolve"}},
      {OneRule("    below: 1\n    severity: \"very bad\"\n"), {"severity"}},
      {OneRule("    below: 1\n    labels: {0bad: x}\n"), {"labels", "bad name '0bad'"}},
      {OneRule("    below: 1\n    labels: {__name__: x}\n"), {"labels", "bad name '__name__'"}},
      {OneRule("    below: 1\n    labels: [a, b]\n"), {"labels", "expected a map"}},
      {OneRule("    below: 1\n    labels: {team: [a]}\n"), {"team", "expected a string"}},
      {OneRule("    below: 1\n    annotations: {summary: " + std::string(5000, 'x') + "}\n"),
       {"annotations", "over 4096 bytes"}},
  };
  for (const auto& c : kCases) {
    const absl::Status s = ErrorOf(c.text);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.text << ": " << s;
    for (const std::string& w : c.words) {
      EXPECT_THAT(std::string(s.message()), HasSubstr(w)) << c.text;
    }
  }
}

TEST(AlertRulesTest, TooManyRulesOrBytes) {
  std::string text = "rules:\n";
  for (size_t i = 0; i <= kMaxAlertRules; ++i) {
    text += "  - {name: r" + std::to_string(i) + ", below: 1}\n";
  }
  EXPECT_THAT(std::string(ErrorOf(text).message()), HasSubstr("at most 256"));
  const std::string big(kMaxAlertRulesFileBytes + 1, '#');
  EXPECT_THAT(std::string(ErrorOf(big).message()), HasSubstr("bytes; at most"));
}

TEST(AlertRulesTest, GlobsMatchModelIds) {
  absl::StatusOr<std::vector<AlertRule>> r = ParseAlertRules(
      "rules:\n  - {name: a, model: \"run-?-[!x]*\", below: 1}\n");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE((*r)[0].Matches("run-1-abc"));
  EXPECT_FALSE((*r)[0].Matches("run-1-xbc"));
  EXPECT_FALSE((*r)[0].Matches("run-12-abc"));
}

TEST(AlertRulesTest, FingerprintFollowsWhatDecidesFiring) {
  auto parse = [](const std::string& body) {
    return (*ParseAlertRules(OneRule(body)))[0];
  };
  const AlertRule base = parse("    below: 1\n");
  EXPECT_EQ(base.Fingerprint(), parse("    below: 1\n    severity: page\n").Fingerprint());
  EXPECT_NE(base.Fingerprint(), parse("    below: 2\n").Fingerprint());
  EXPECT_NE(base.Fingerprint(), parse("    below: 1\n    for: 2\n").Fingerprint());
  EXPECT_NE(base.Fingerprint(), parse("    below: 1\n    model: a*\n").Fingerprint());
}

class AlertRulesFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("alert_rules_test." + std::to_string(getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string Write(const std::string& name, const std::string& text) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path) << text;
    return path;
  }
  std::filesystem::path dir_;
};

TEST_F(AlertRulesFileTest, LoadNamesThePath) {
  const std::string bad = Write("bad.yaml", OneRule("    below: 1\n    x: 1\n"));
  absl::StatusOr<std::vector<AlertRule>> r = LoadAlertRules(bad);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()), HasSubstr(bad + ": alert rules: rule 1"));
  EXPECT_EQ(LoadAlertRules((dir_ / "absent.yaml").string()).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(LoadAlertRules(dir_.string()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(AlertRulesFileTest, ThresholdIsOneRuleOfTheSet) {
  const std::string good = Write("good.yaml", OneRule("    below: 1\n"));
  absl::StatusOr<std::vector<AlertRule>> r = BuildAlertRules(good, 0.5);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->size(), 2u);
  EXPECT_EQ((*r)[1].name, kThresholdRuleName);
  EXPECT_EQ((*r)[1].condition, AlertRule::Condition::kBelow);
  EXPECT_EQ((*r)[1].threshold, 0.5);
  EXPECT_EQ((*r)[1].model, "*");
  // No threshold, no file: no rules.
  EXPECT_TRUE(BuildAlertRules("", 0)->empty());
  EXPECT_EQ(BuildAlertRules("", 0.3)->size(), 1u);
  // The threshold's name is taken while it is set.
  const std::string clash = Write(
      "clash.yaml", "rules:\n  - {name: rv_alert_threshold, below: 1}\n");
  EXPECT_THAT(std::string(BuildAlertRules(clash, 0.5).status().message()),
              HasSubstr("taken by the global rv_alert_threshold"));
  EXPECT_TRUE(BuildAlertRules(clash, 0).ok());
}

// The example shipped in config/ is a valid rules file (tests run from the
// source root).
TEST(AlertRulesTest, TheExampleFileLoads) {
  absl::StatusOr<std::vector<AlertRule>> r =
      LoadAlertRules("config/alert_rules.yaml");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->size(), 5u);
}

}  // namespace
}  // namespace rvd

// Parses alert rules. yaml-cpp reports errors by throwing; every call into it
// happens inside the try block of ParseAlertRules, so no exception leaves
// this file.
#include "server/alert_rules.h"

#include <fnmatch.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "yaml-cpp/yaml.h"

namespace rvd {
namespace {

// Where an error is: "alert rules: rule 2 ('rv_drop'): field 'for'".
class Context {
 public:
  explicit Context(std::string prefix) : prefix_(std::move(prefix)) {}
  Context Field(absl::string_view field) const {
    return Context(absl::StrCat(prefix_, ": ", field));
  }
  absl::Status Error(const YAML::Node& node, absl::string_view what) const {
    const int line = node.IsDefined() ? node.Mark().line + 1 : 0;
    return absl::InvalidArgumentError(absl::StrCat(
        prefix_, ": ", what, line > 0 ? absl::StrCat(" (line ", line, ")") : ""));
  }
  absl::Status Error(absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat(prefix_, ": ", what));
  }

 private:
  std::string prefix_;
};

std::string Got(const YAML::Node& node) {
  if (node.IsScalar()) return absl::StrCat("\"", node.Scalar(), "\"");
  if (node.IsSequence()) return "a sequence";
  if (node.IsMap()) return "a map";
  return "nothing";
}

// The fields of a map, each once, all known. `known` in the order the
// error message lists them.
absl::StatusOr<std::map<std::string, YAML::Node>> Fields(
    const Context& ctx, const YAML::Node& node,
    const std::vector<std::string>& known) {
  if (!node.IsMap()) return ctx.Error(node, "expected a map, got " + Got(node));
  std::map<std::string, YAML::Node> out;
  for (const auto& entry : node) {
    if (!entry.first.IsScalar()) {
      return ctx.Error(entry.first, "a field name must be a plain name");
    }
    const std::string key = entry.first.Scalar();
    if (std::find(known.begin(), known.end(), key) == known.end()) {
      return ctx.Error(entry.first,
                       absl::StrCat("unknown field '", key, "'; known fields: ",
                                    absl::StrJoin(known, ", ")));
    }
    if (!out.emplace(key, entry.second).second) {
      return ctx.Error(entry.first,
                       absl::StrCat("field '", key, "' appears more than once"));
    }
  }
  return out;
}

absl::Status ReadString(const Context& ctx, const YAML::Node& node,
                        std::string* out) {
  if (!node.IsScalar()) {
    return ctx.Error(node, "expected a string, got " + Got(node));
  }
  *out = node.Scalar();
  return absl::OkStatus();
}

// A finite number (YAML's .inf and .nan are refused: no rule can use them).
absl::Status ReadNumber(const Context& ctx, const YAML::Node& node,
                        double* out) {
  double v;
  const std::string lower =
      node.IsScalar() ? absl::AsciiStrToLower(node.Scalar()) : "";
  if (lower == ".nan" || absl::EndsWith(lower, ".inf")) {
    return ctx.Error(node, "expected a finite number, got " + Got(node));
  }
  if (!node.IsScalar() || !absl::SimpleAtod(node.Scalar(), &v)) {
    return ctx.Error(node, "expected a number, got " + Got(node));
  }
  if (!std::isfinite(v)) {
    return ctx.Error(node, "expected a finite number, got " + Got(node));
  }
  *out = v;
  return absl::OkStatus();
}

absl::Status ReadCount(const Context& ctx, const YAML::Node& node,
                       uint32_t* out) {
  uint32_t v;
  if (!node.IsScalar() || !absl::SimpleAtoi(node.Scalar(), &v) || v < 1 ||
      v > 1000000) {
    return ctx.Error(node, "expected an integer in 1..1000000, got " + Got(node));
  }
  *out = v;
  return absl::OkStatus();
}

bool ValidName(absl::string_view s, size_t max) {
  if (s.empty() || s.size() > max) return false;
  for (char c : s) {
    if (!absl::ascii_isalnum(c) && c != '_' && c != '.' && c != ':' && c != '-') {
      return false;
    }
  }
  return true;
}

// A Prometheus label name.
bool ValidLabelName(absl::string_view s) {
  if (s.empty() || s.size() > 128 || absl::ascii_isdigit(s[0])) return false;
  for (char c : s) {
    if (!absl::ascii_isalnum(c) && c != '_') return false;
  }
  return !absl::StartsWith(s, "__");
}

// Model ids are [A-Za-z0-9_.:-]; a glob adds * ? and [...] classes ([!...]
// negated), brackets closed.
absl::Status CheckGlob(const Context& ctx, const YAML::Node& node,
                       const std::string& glob) {
  if (glob.empty() || glob.size() > 256) {
    return ctx.Error(node, "a model glob must have 1 to 256 characters");
  }
  bool in_class = false;
  for (size_t i = 0; i < glob.size(); ++i) {
    const char c = glob[i];
    if (c == '[') {
      if (in_class) return ctx.Error(node, "'[' inside a [...] class");
      in_class = true;
      if (i + 1 < glob.size() && glob[i + 1] == '!') ++i;
      continue;
    }
    if (c == ']') {
      if (!in_class) return ctx.Error(node, "']' without '['");
      in_class = false;
      continue;
    }
    if (c == '*' || c == '?') continue;
    if (!absl::ascii_isalnum(c) && c != '_' && c != '.' && c != ':' && c != '-') {
      return ctx.Error(node, absl::StrCat("bad character '", std::string(1, c),
                                          "' in model glob \"", glob,
                                          "\" (model ids are [A-Za-z0-9_.:-])"));
    }
  }
  if (in_class) return ctx.Error(node, "unclosed '[' in model glob");
  return absl::OkStatus();
}

absl::Status ReadStringMap(const Context& ctx, const YAML::Node& node,
                           size_t max_value, bool label_names,
                           std::map<std::string, std::string>* out) {
  if (node.IsNull()) return absl::OkStatus();
  if (!node.IsMap()) return ctx.Error(node, "expected a map, got " + Got(node));
  for (const auto& entry : node) {
    if (!entry.first.IsScalar()) return ctx.Error(entry.first, "a key must be a name");
    const std::string key = entry.first.Scalar();
    if (label_names ? !ValidLabelName(key) : !ValidName(key, 128)) {
      return ctx.Error(entry.first,
                       absl::StrCat("bad name '", key, "' (",
                                    label_names ? "[a-zA-Z_][a-zA-Z0-9_]*, no __ prefix"
                                                : "[A-Za-z0-9_.:-]{1,128}",
                                    ")"));
    }
    std::string value;
    if (absl::Status s = ReadString(ctx.Field(key), entry.second, &value); !s.ok()) {
      return s;
    }
    if (value.size() > max_value) {
      return ctx.Error(entry.second, absl::StrCat("value of '", key, "' is over ",
                                                  max_value, " bytes"));
    }
    if (!out->emplace(key, std::move(value)).second) {
      return ctx.Error(entry.first, absl::StrCat("'", key, "' appears more than once"));
    }
  }
  if (out->size() > kMaxAlertLabels) {
    return ctx.Error(node, absl::StrCat("more than ", kMaxAlertLabels, " entries"));
  }
  return absl::OkStatus();
}

absl::Status ParseDrop(const Context& ctx, const YAML::Node& node,
                       AlertRule* rule) {
  absl::StatusOr<std::map<std::string, YAML::Node>> f =
      Fields(ctx, node, {"baseline", "fraction", "measurements", "alpha"});
  if (!f.ok()) return f.status();
  auto it = f->find("baseline");
  if (it == f->end()) {
    return ctx.Error(node, "needs 'baseline' (first, ema or max)");
  }
  std::string baseline;
  if (absl::Status s = ReadString(ctx.Field("baseline"), it->second, &baseline);
      !s.ok()) {
    return s;
  }
  if (baseline == "first") {
    rule->baseline = AlertRule::Baseline::kFirst;
  } else if (baseline == "ema") {
    rule->baseline = AlertRule::Baseline::kEma;
  } else if (baseline == "max") {
    rule->baseline = AlertRule::Baseline::kMax;
  } else {
    return ctx.Field("baseline").Error(
        it->second, absl::StrCat("\"", baseline, "\" is not one of first, ema, max"));
  }
  it = f->find("fraction");
  if (it == f->end()) return ctx.Error(node, "needs 'fraction' (a drop in (0, 1))");
  if (absl::Status s = ReadNumber(ctx.Field("fraction"), it->second, &rule->fraction);
      !s.ok()) {
    return s;
  }
  // A value is >= 0, so a drop is at most 1: a fraction of 1 or more can
  // never be exceeded, and 0 or less would fire on no drop at all.
  if (!(rule->fraction > 0 && rule->fraction < 1)) {
    return ctx.Field("fraction").Error(it->second,
                                       "must lie in (0, 1): the drop as a fraction "
                                       "of the baseline");
  }
  it = f->find("measurements");
  if (it != f->end()) {
    if (rule->baseline != AlertRule::Baseline::kFirst) {
      return ctx.Field("measurements").Error(it->second, "only with baseline: first");
    }
    if (absl::Status s = ReadCount(ctx.Field("measurements"), it->second,
                                   &rule->baseline_measurements);
        !s.ok()) {
      return s;
    }
  }
  it = f->find("alpha");
  if (it != f->end()) {
    if (rule->baseline != AlertRule::Baseline::kEma) {
      return ctx.Field("alpha").Error(it->second, "only with baseline: ema");
    }
    if (absl::Status s = ReadNumber(ctx.Field("alpha"), it->second, &rule->ema_alpha);
        !s.ok()) {
      return s;
    }
    if (!(rule->ema_alpha > 0 && rule->ema_alpha <= 1)) {
      return ctx.Field("alpha").Error(it->second, "must lie in (0, 1]");
    }
  }
  return absl::OkStatus();
}

absl::Status ParseChange(const Context& ctx, const YAML::Node& node,
                         AlertRule* rule) {
  absl::StatusOr<std::map<std::string, YAML::Node>> f =
      Fields(ctx, node, {"per", "below", "above"});
  if (!f.ok()) return f.status();
  if (auto it = f->find("per"); it != f->end()) {
    std::string per;
    if (absl::Status s = ReadString(ctx.Field("per"), it->second, &per); !s.ok()) {
      return s;
    }
    if (per != "measurement" && per != "step") {
      return ctx.Field("per").Error(
          it->second, absl::StrCat("\"", per, "\" is not one of measurement, step"));
    }
    rule->per_step = per == "step";
  }
  for (const char* side : {"below", "above"}) {
    auto it = f->find(side);
    if (it == f->end()) continue;
    double v;
    if (absl::Status s = ReadNumber(ctx.Field(side), it->second, &v); !s.ok()) {
      return s;
    }
    (std::string(side) == "below" ? rule->change_below : rule->change_above) = v;
  }
  if (!rule->change_below && !rule->change_above) {
    return ctx.Error(node, "needs 'below' or 'above' (or both)");
  }
  if (rule->change_below && rule->change_above &&
      *rule->change_below >= *rule->change_above) {
    return ctx.Error(node, "'below' must be less than 'above', or every change "
                           "would hold");
  }
  return absl::OkStatus();
}

const std::vector<std::string>& RuleFields() {
  static const auto* const kFields = new std::vector<std::string>{
      "name",   "model",      "value",       "layer",      "below",
      "above",  "drop",       "change",      "for",        "resolve_for",
      "hysteresis", "severity", "labels",   "annotations"};
  return *kFields;
}

absl::StatusOr<AlertRule> ParseRule(const Context& ctx, const YAML::Node& node) {
  absl::StatusOr<std::map<std::string, YAML::Node>> f =
      Fields(ctx, node, RuleFields());
  if (!f.ok()) return f.status();
  AlertRule rule;
  auto it = f->find("name");
  if (it == f->end()) return ctx.Error(node, "needs a 'name'");
  if (absl::Status s = ReadString(ctx.Field("name"), it->second, &rule.name); !s.ok()) {
    return s;
  }
  if (!ValidName(rule.name, 64)) {
    return ctx.Field("name").Error(it->second,
                                   "must match [A-Za-z0-9_.:-]{1,64}");
  }
  if (it = f->find("model"); it != f->end()) {
    if (absl::Status s = ReadString(ctx.Field("model"), it->second, &rule.model);
        !s.ok()) {
      return s;
    }
    if (absl::Status s = CheckGlob(ctx.Field("model"), it->second, rule.model);
        !s.ok()) {
      return s;
    }
  }
  if (it = f->find("value"); it != f->end()) {
    std::string value;
    if (absl::Status s = ReadString(ctx.Field("value"), it->second, &value); !s.ok()) {
      return s;
    }
    if (value == "rv") {
      rule.value = AlertRule::Value::kRv;
    } else if (value == "layer_pr") {
      rule.value = AlertRule::Value::kLayerPr;
    } else {
      return ctx.Field("value").Error(
          it->second, absl::StrCat("\"", value, "\" is not one of rv, layer_pr"));
    }
  }
  it = f->find("layer");
  if (rule.value == AlertRule::Value::kLayerPr) {
    if (it == f->end()) return ctx.Error(node, "value: layer_pr needs a 'layer'");
    uint32_t layer;
    if (!it->second.IsScalar() || !absl::SimpleAtoi(it->second.Scalar(), &layer)) {
      return ctx.Field("layer").Error(
          it->second, "expected a layer index >= 0, got " + Got(it->second));
    }
    rule.layer = layer;
  } else if (it != f->end()) {
    return ctx.Field("layer").Error(it->second, "only with value: layer_pr");
  }

  std::vector<std::string> conditions;
  for (const char* c : {"below", "above", "drop", "change"}) {
    if (f->count(c)) conditions.push_back(c);
  }
  if (conditions.size() != 1) {
    return ctx.Error(node, conditions.empty()
                               ? "needs one condition: below, above, drop or change"
                               : absl::StrCat("has ", absl::StrJoin(conditions, " and "),
                                              ": one condition per rule"));
  }
  const std::string& c = conditions[0];
  const YAML::Node& cn = f->at(c);
  if (c == "below" || c == "above") {
    rule.condition = c == "below" ? AlertRule::Condition::kBelow
                                  : AlertRule::Condition::kAbove;
    if (absl::Status s = ReadNumber(ctx.Field(c), cn, &rule.threshold); !s.ok()) {
      return s;
    }
    // R_V is > 0 and a PR >= 0: "below 0 or less" can never hold.
    if (c == "below" && rule.threshold <= 0) {
      return ctx.Field(c).Error(cn, "must be > 0: no R_V or PR is below it");
    }
    if (c == "above" && rule.threshold < 0) {
      return ctx.Field(c).Error(cn, "must be >= 0: every R_V and PR is above it");
    }
  } else if (c == "drop") {
    rule.condition = AlertRule::Condition::kDrop;
    if (absl::Status s = ParseDrop(ctx.Field("drop"), cn, &rule); !s.ok()) return s;
  } else {
    rule.condition = AlertRule::Condition::kChange;
    if (absl::Status s = ParseChange(ctx.Field("change"), cn, &rule); !s.ok()) {
      return s;
    }
  }
  if (it = f->find("for"); it != f->end()) {
    if (absl::Status s = ReadCount(ctx.Field("for"), it->second, &rule.for_count);
        !s.ok()) {
      return s;
    }
  }
  if (it = f->find("resolve_for"); it != f->end()) {
    if (absl::Status s =
            ReadCount(ctx.Field("resolve_for"), it->second, &rule.resolve_for);
        !s.ok()) {
      return s;
    }
  }
  if (it = f->find("hysteresis"); it != f->end()) {
    if (absl::Status s = ReadNumber(ctx.Field("hysteresis"), it->second, &rule.hysteresis);
        !s.ok()) {
      return s;
    }
    if (rule.hysteresis < 0) {
      return ctx.Field("hysteresis").Error(it->second, "must be >= 0");
    }
    // Below X resolves at X + H, which exists; above X resolves at X - H,
    // which must be a value R_V or PR can take.
    if (rule.condition == AlertRule::Condition::kAbove &&
        rule.hysteresis > rule.threshold) {
      return ctx.Field("hysteresis").Error(
          it->second, "must not exceed the 'above' threshold: the alert could "
                      "never resolve (values are >= 0)");
    }
  }
  if (it = f->find("severity"); it != f->end()) {
    if (absl::Status s = ReadString(ctx.Field("severity"), it->second, &rule.severity);
        !s.ok()) {
      return s;
    }
    if (!ValidName(rule.severity, 32)) {
      return ctx.Field("severity").Error(it->second,
                                         "must match [A-Za-z0-9_.:-]{1,32}");
    }
  }
  if (it = f->find("labels"); it != f->end()) {
    if (absl::Status s = ReadStringMap(ctx.Field("labels"), it->second,
                                       kMaxAlertLabelValue, true, &rule.labels);
        !s.ok()) {
      return s;
    }
  }
  if (it = f->find("annotations"); it != f->end()) {
    if (absl::Status s =
            ReadStringMap(ctx.Field("annotations"), it->second,
                          kMaxAlertAnnotationValue, false, &rule.annotations);
        !s.ok()) {
      return s;
    }
  }
  return rule;
}

absl::StatusOr<std::vector<AlertRule>> ParseRoot(const YAML::Node& root) {
  std::vector<AlertRule> rules;
  if (!root.IsDefined() || root.IsNull()) return rules;
  const Context top("alert rules");
  absl::StatusOr<std::map<std::string, YAML::Node>> f = Fields(top, root, {"rules"});
  if (!f.ok()) return f.status();
  auto it = f->find("rules");
  if (it == f->end() || it->second.IsNull()) return rules;
  if (!it->second.IsSequence()) {
    return top.Field("rules").Error(it->second,
                                    "expected a sequence of rules, got " + Got(it->second));
  }
  if (it->second.size() > kMaxAlertRules) {
    return top.Error(it->second,
                     absl::StrCat(it->second.size(), " rules; at most ", kMaxAlertRules));
  }
  std::set<std::string> names;
  size_t index = 0;
  for (const YAML::Node& node : it->second) {
    ++index;
    std::string label = absl::StrCat("rule ", index);
    // The name, when there is one, names the rule in every error.
    YAML::Node name_node;
    if (node.IsMap()) {
      for (const auto& entry : node) {
        if (entry.first.IsScalar() && entry.first.Scalar() == "name") {
          name_node = entry.second;
        }
      }
    }
    if (name_node.IsDefined() && name_node.IsScalar()) {
      absl::StrAppend(&label, " ('", name_node.Scalar().substr(0, 64), "')");
    }
    absl::StatusOr<AlertRule> rule = ParseRule(top.Field(label), node);
    if (!rule.ok()) return rule.status();
    if (!names.insert(rule->name).second) {
      return top.Field(label).Error(name_node, absl::StrCat("name '", rule->name,
                                                             "' is used by an earlier rule"));
    }
    rules.push_back(*std::move(rule));
  }
  return rules;
}

std::string Num(double v) { return absl::StrCat(v); }

}  // namespace

bool AlertRule::Matches(const std::string& model_id) const {
  return fnmatch(model.c_str(), model_id.c_str(), 0) == 0;
}

std::string AlertRule::Fingerprint() const {
  std::string out = absl::StrCat(
      "model=", model, ";value=", static_cast<int>(value), ";layer=", layer,
      ";condition=", static_cast<int>(condition), ";threshold=", Num(threshold),
      ";baseline=", static_cast<int>(baseline), ";n=", baseline_measurements,
      ";alpha=", Num(ema_alpha), ";fraction=", Num(fraction),
      ";per_step=", per_step, ";for=", for_count, ";resolve_for=", resolve_for,
      ";hysteresis=", Num(hysteresis));
  if (change_below) absl::StrAppend(&out, ";change_below=", Num(*change_below));
  if (change_above) absl::StrAppend(&out, ";change_above=", Num(*change_above));
  return out;
}

std::string AlertRule::Describe() const {
  const std::string v =
      value == Value::kRv ? "R_V" : absl::StrCat("layer ", layer, " PR");
  switch (condition) {
    case Condition::kBelow:
      return absl::StrCat(v, " below ", Num(threshold));
    case Condition::kAbove:
      return absl::StrCat(v, " above ", Num(threshold));
    case Condition::kDrop: {
      std::string from;
      switch (baseline) {
        case Baseline::kFirst:
          from = absl::StrCat("the mean of the first ", baseline_measurements);
          break;
        case Baseline::kEma:
          from = absl::StrCat("its EMA (alpha ", Num(ema_alpha), ")");
          break;
        case Baseline::kMax:
          from = "its running maximum";
          break;
      }
      return absl::StrCat(v, " drop > ", Num(fraction * 100), "% from ", from);
    }
    case Condition::kChange: {
      std::vector<std::string> parts;
      if (change_below) parts.push_back(absl::StrCat("< ", Num(*change_below)));
      if (change_above) parts.push_back(absl::StrCat("> ", Num(*change_above)));
      return absl::StrCat(v, " change per ", per_step ? "step " : "measurement ",
                          absl::StrJoin(parts, " or "));
    }
  }
  return v;
}

absl::StatusOr<std::vector<AlertRule>> ParseAlertRules(
    const std::string& yaml_text) {
  if (yaml_text.size() > kMaxAlertRulesFileBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "alert rules: ", yaml_text.size(), " bytes; at most ",
        kMaxAlertRulesFileBytes));
  }
  try {
    return ParseRoot(YAML::Load(yaml_text));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("alert rules: YAML syntax error: ", e.what()));
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("alert rules: ", e.what()));
  }
}

absl::StatusOr<std::vector<AlertRule>> LoadAlertRules(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    return absl::NotFoundError(
        absl::StrCat("alert rules file ", path, " does not exist"));
  }
  if (std::filesystem::is_directory(path, ec)) {
    return absl::InvalidArgumentError(
        absl::StrCat("alert rules file ", path, " is a directory"));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::PermissionDeniedError(absl::StrCat(
        "alert rules file ", path, ": cannot open: ", std::strerror(errno)));
  }
  // One byte past the limit is enough to refuse the file.
  std::string text(kMaxAlertRulesFileBytes + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  if (in.bad()) {
    return absl::DataLossError(absl::StrCat("alert rules file ", path, ": read error"));
  }
  text.resize(static_cast<size_t>(in.gcount()));
  absl::StatusOr<std::vector<AlertRule>> rules = ParseAlertRules(text);
  if (!rules.ok()) {
    return absl::Status(rules.status().code(),
                        absl::StrCat(path, ": ", rules.status().message()));
  }
  return rules;
}

AlertRule ThresholdRule(double threshold) {
  AlertRule rule;
  rule.name = kThresholdRuleName;
  rule.value = AlertRule::Value::kRv;
  rule.condition = AlertRule::Condition::kBelow;
  rule.threshold = threshold;
  rule.annotations["summary"] = "R_V below the global rv_alert_threshold";
  return rule;
}

absl::StatusOr<std::vector<AlertRule>> BuildAlertRules(const std::string& path,
                                                       double rv_alert_threshold) {
  std::vector<AlertRule> rules;
  if (!path.empty()) {
    absl::StatusOr<std::vector<AlertRule>> loaded = LoadAlertRules(path);
    if (!loaded.ok()) return loaded.status();
    rules = *std::move(loaded);
  }
  if (rv_alert_threshold > 0) {
    for (const AlertRule& r : rules) {
      if (r.name == kThresholdRuleName) {
        return absl::InvalidArgumentError(absl::StrCat(
            path, ": rule name '", kThresholdRuleName,
            "' is taken by the global rv_alert_threshold; rename the rule"));
      }
    }
    if (rules.size() >= kMaxAlertRules) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": ", rules.size(), " rules and rv_alert_threshold: at most ",
          kMaxAlertRules, " in all"));
    }
    rules.push_back(ThresholdRule(rv_alert_threshold));
  }
  return rules;
}

}  // namespace rvd

#include "self_improve/generator.h"

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace rvd::tune {
namespace {

constexpr absl::string_view kAnnotation = "// rvd-launch:";
constexpr int kMaxSmem = 227 * 1024;  // the most an H100/H200 block may opt into

}  // namespace

const char* VerdictName(Verdict v) {
  switch (v) {
    case Verdict::kAccepted: return "accepted";
    case Verdict::kSlower: return "slower";
    case Verdict::kIncorrect: return "incorrect";
    case Verdict::kNondeterministic: return "nondeterministic";
    case Verdict::kCompileError: return "compile_error";
    case Verdict::kLaunchError: return "launch_error";
    case Verdict::kImpossible: return "impossible";
    case Verdict::kHeldOutFailed: return "held_out_failed";
    case Verdict::kGeneratorError: return "generator_error";
  }
  return "unknown";
}

std::string FormatLaunchAnnotation(const CandidateLaunch& l) {
  return absl::StrCat(kAnnotation, " threads=", l.threads, " smem=", l.smem,
                      " tile_rows=", l.tile_rows, " tile_cols=", l.tile_cols);
}

absl::StatusOr<CandidateLaunch> ParseLaunchAnnotation(absl::string_view source) {
  absl::string_view line;
  int found = 0;
  for (absl::string_view l : absl::StrSplit(source, '\n')) {
    absl::string_view s = absl::StripLeadingAsciiWhitespace(l);
    if (absl::StartsWith(s, kAnnotation)) {
      line = s.substr(kAnnotation.size());
      ++found;
    }
  }
  if (found == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the candidate has no launch annotation line (\"", kAnnotation,
        " threads=N smem=BYTES tile_rows=R tile_cols=C\")"));
  }
  if (found > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("the candidate has ", found, " launch annotation lines; one is allowed"));
  }
  CandidateLaunch l;
  struct Key {
    absl::string_view name;
    int* value;
    bool seen = false;
  } keys[] = {{"threads", &l.threads}, {"smem", &l.smem},
              {"tile_rows", &l.tile_rows}, {"tile_cols", &l.tile_cols}};
  for (absl::string_view field :
       absl::StrSplit(absl::StripAsciiWhitespace(line), ' ', absl::SkipEmpty())) {
    std::pair<absl::string_view, absl::string_view> kv = absl::StrSplit(field, '=');
    Key* key = nullptr;
    for (Key& k : keys) {
      if (k.name == kv.first) key = &k;
    }
    if (key == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("launch annotation: unknown field \"", field, "\""));
    }
    if (key->seen) {
      return absl::InvalidArgumentError(
          absl::StrCat("launch annotation: ", key->name, " given twice"));
    }
    if (!absl::SimpleAtoi(kv.second, key->value)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "launch annotation: ", key->name, "=\"", kv.second, "\" is not an integer"));
    }
    key->seen = true;
  }
  for (const Key& k : keys) {
    if (!k.seen) {
      return absl::InvalidArgumentError(
          absl::StrCat("launch annotation: ", k.name, " is missing"));
    }
  }
  if (l.threads < 32 || l.threads > 1024 || l.threads % 32 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "launch annotation: threads=", l.threads, " is not a multiple of 32 in [32, 1024]"));
  }
  if (l.smem < 0 || l.smem > kMaxSmem) {
    return absl::InvalidArgumentError(absl::StrCat(
        "launch annotation: smem=", l.smem, " is outside [0, ", kMaxSmem, "]"));
  }
  const bool whole = l.tile_rows == 0 && l.tile_cols == 0;
  const bool tiled = l.tile_rows > 0 && l.tile_cols > 0 && l.tile_rows % 16 == 0 &&
                     l.tile_cols % 16 == 0 && l.tile_rows <= 4096 && l.tile_cols <= 4096;
  if (!whole && !tiled) {
    return absl::InvalidArgumentError(absl::StrCat(
        "launch annotation: tile_rows=", l.tile_rows, " tile_cols=", l.tile_cols,
        ": both 0 (one job per matrix) or both multiples of 16 in [16, 4096]"));
  }
  return l;
}

}  // namespace rvd::tune

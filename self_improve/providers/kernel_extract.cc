#include "self_improve/providers/kernel_extract.h"

#include <algorithm>
#include <cctype>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "self_improve/providers/llm_provider.h"

namespace rvd::tune {
namespace {

// A token of C++ source and where it sits in it.
struct Token {
  absl::string_view text;
  size_t begin = 0;
};

struct Lexed {
  std::vector<Token> tokens;          // preprocessor lines and comments removed
  std::vector<std::string> includes;  // each #include's header name
};

bool IsIdent(char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '_'; }

// Enough of C++'s lexer for comparing declarations and spotting names:
// identifiers and numbers, string and character literals, `::`, `<<<`,
// `>>>`, `->`, single punctuation.
Lexed Lex(absl::string_view s) {
  Lexed out;
  size_t i = 0;
  bool line_start = true;
  while (i < s.size()) {
    const char c = s[i];
    if (c == '\n') {
      line_start = true;
      ++i;
      continue;
    }
    if (std::isspace(static_cast<unsigned char>(c)) != 0) {
      ++i;
      continue;
    }
    if (c == '/' && i + 1 < s.size() && s[i + 1] == '/') {
      i = s.find('\n', i);
      if (i == absl::string_view::npos) i = s.size();
      continue;
    }
    if (c == '/' && i + 1 < s.size() && s[i + 1] == '*') {
      const size_t end = s.find("*/", i + 2);
      i = end == absl::string_view::npos ? s.size() : end + 2;
      continue;
    }
    if (c == '#' && line_start) {  // a directive, continuation lines included
      size_t end = i;
      for (;;) {
        end = s.find('\n', end);
        if (end == absl::string_view::npos) {
          end = s.size();
          break;
        }
        if (end > 0 && s[end - 1] == '\\') {
          ++end;
          continue;
        }
        break;
      }
      absl::string_view line = absl::StripAsciiWhitespace(s.substr(i + 1, end - i - 1));
      if (absl::ConsumePrefix(&line, "include")) {
        line = absl::StripLeadingAsciiWhitespace(line);
        if (!line.empty() && (line[0] == '<' || line[0] == '"')) {
          const size_t close = line.find(line[0] == '<' ? '>' : '"', 1);
          out.includes.emplace_back(line.substr(
              1, close == absl::string_view::npos ? absl::string_view::npos : close - 1));
        } else {
          out.includes.emplace_back(line);  // a macro include: allowed by nothing
        }
      }
      i = end;
      continue;
    }
    line_start = false;
    const size_t begin = i;
    if (IsIdent(c)) {
      while (i < s.size() && IsIdent(s[i])) ++i;
    } else if (c == '"' || c == '\'') {
      ++i;
      while (i < s.size() && s[i] != c && s[i] != '\n') i += s[i] == '\\' ? 2 : 1;
      i = std::min(i + 1, s.size());
    } else if (absl::StartsWith(s.substr(i), "<<<") || absl::StartsWith(s.substr(i), ">>>")) {
      i += 3;
    } else if (absl::StartsWith(s.substr(i), "::") || absl::StartsWith(s.substr(i), "->")) {
      i += 2;
    } else {
      ++i;
    }
    out.tokens.push_back({s.substr(begin, i - begin), begin});
  }
  return out;
}

// Tokens a candidate may add to the signature, and __launch_bounds__(...).
std::vector<absl::string_view> Normalized(const std::vector<Token>& tokens, size_t begin,
                                          size_t end) {
  std::vector<absl::string_view> out;
  for (size_t i = begin; i < end; ++i) {
    const absl::string_view t = tokens[i].text;
    if (t == "inline" || t == "__forceinline__" || t == "__noinline__" || t == "__restrict__" ||
        t == "__restrict") {
      continue;
    }
    if (t == "__launch_bounds__" && i + 1 < end && tokens[i + 1].text == "(") {
      int depth = 0;
      for (++i; i < end; ++i) {
        if (tokens[i].text == "(") ++depth;
        if (tokens[i].text == ")" && --depth == 0) break;
      }
      continue;
    }
    out.push_back(t);
  }
  return out;
}

// The index of the ")" closing the "(" at `open`, or tokens.size().
size_t MatchingParen(const std::vector<Token>& tokens, size_t open) {
  int depth = 0;
  for (size_t i = open; i < tokens.size(); ++i) {
    if (tokens[i].text == "(") ++depth;
    if (tokens[i].text == ")" && --depth == 0) return i;
  }
  return tokens.size();
}

// `text` with each run of whitespace one space.
std::string Collapse(absl::string_view text) {
  return absl::StrJoin(absl::StrSplit(text, absl::ByAnyChar(" \t\r\n"), absl::SkipEmpty()), " ");
}

struct EntryScan {
  int matching = 0;                // definitions with the signature
  std::vector<std::string> other;  // definitions or declarations that differ, as written
};

EntryScan ScanEntry(absl::string_view source, const Lexed& lexed, absl::string_view name,
                    const std::vector<absl::string_view>& want) {
  EntryScan scan;
  const std::vector<Token>& t = lexed.tokens;
  for (size_t i = 0; i + 1 < t.size(); ++i) {
    if (t[i].text != name || t[i + 1].text != "(") continue;
    const size_t close = MatchingParen(t, i + 1);
    if (close == t.size()) continue;
    const bool definition = close + 1 < t.size() && t[close + 1].text == "{";
    if (!definition && !(close + 1 < t.size() && t[close + 1].text == ";")) continue;  // a call
    size_t first = i;
    while (first > 0 && t[first - 1].text != ";" && t[first - 1].text != "{" &&
           t[first - 1].text != "}") {
      --first;
    }
    std::vector<absl::string_view> got;
    // extern "C" { ... } around the definition counts as its prefix.
    if (first >= 3 && t[first - 1].text == "{" && t[first - 2].text == "\"C\"" &&
        t[first - 3].text == "extern") {
      got = {"extern", "\"C\""};
    }
    const std::vector<absl::string_view> own = Normalized(t, first, close + 1);
    got.insert(got.end(), own.begin(), own.end());
    if (got == want) {
      if (definition) ++scan.matching;
    } else {
      const size_t end = t[close].begin + 1;
      scan.other.push_back(Collapse(source.substr(t[first].begin, end - t[first].begin)));
    }
  }
  return scan;
}

// The host-side names a device-code-only candidate must not use.
absl::string_view HostName(absl::string_view t) {
  static constexpr absl::string_view kPrefixes[] = {
      "cudaMalloc",      "cudaFree",      "cudaMemcpy",
      "cudaMemset",      "cudaStream",    "cudaEvent",
      "cudaGraph",       "cudaLaunch",    "cudaDeviceSynchronize",
      "cudaDeviceReset", "cudaSetDevice", "cudaHostAlloc",
      "cublas",          "cudnn",         "cutlass",
      "cuLaunch",        "cuMem",         "cuStream",
      "cuCtx",           "cuModule"};
  for (absl::string_view p : kPrefixes) {
    if (absl::StartsWith(t, p)) return p;
  }
  if (t == "cute") return t;
  return {};
}

bool IncludeAllowed(absl::string_view header, const std::vector<std::string>& allowed) {
  for (const std::string& a : allowed) {
    if (header == a) return true;
    if (absl::EndsWith(a, "/") && absl::StartsWith(header, a)) return true;
  }
  return false;
}

bool IsCodeInfo(absl::string_view info) {
  static constexpr absl::string_view kTags[] = {"",    "cuda", "cu", "cuh", "c++", "cpp",
                                                "cxx", "cc",   "c",  "h",   "hpp"};
  return std::find(std::begin(kTags), std::end(kTags), info) != std::end(kTags) ||
         absl::StartsWith(info, "cuda");
}

absl::Status Wrong(std::string message) {
  return WithLlmErrorKind(absl::InvalidArgumentError(std::move(message)),
                          LlmErrorKind::kWrongKernel);
}

// Device-code-only checks on the chosen block.
absl::Status CheckDeviceOnly(const Lexed& lexed, const KernelExtractOptions& options) {
  int globals = 0;
  for (const Token& t : lexed.tokens) {
    if (t.text == "__global__") ++globals;
    if (t.text == "<<<") {
      return Wrong(
          "the kernel launches a kernel (<<<...>>>): a candidate is device code "
          "only, rvd owns every launch");
    }
    if (absl::string_view host = HostName(t.text); !host.empty()) {
      return Wrong(absl::StrCat("the kernel uses ", t.text, " (", host,
                                "...): a candidate is device code only, with no library, "
                                "allocation, copy, stream or event of its own"));
    }
  }
  if (globals != 1) {
    return Wrong(absl::StrCat("the kernel has ", globals,
                              " __global__ functions: a candidate defines exactly one, the "
                              "entry (helpers are __device__)"));
  }
  for (const std::string& header : lexed.includes) {
    if (!IncludeAllowed(header, options.allowed_includes)) {
      return Wrong(absl::StrCat("the kernel includes \"", header,
                                "\", which a candidate may "
                                "not: allowed are ",
                                absl::StrJoin(options.allowed_includes, ", ")));
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::vector<FencedBlock> FindFencedBlocks(absl::string_view text) {
  std::vector<FencedBlock> blocks;
  std::vector<absl::string_view> lines = absl::StrSplit(text, '\n');
  size_t i = 0;
  while (i < lines.size()) {
    absl::string_view line = absl::StripLeadingAsciiWhitespace(lines[i]);
    ++i;
    if (!absl::StartsWith(line, "```") && !absl::StartsWith(line, "~~~")) continue;
    const char fence = line[0];
    size_t run = 0;
    while (run < line.size() && line[run] == fence) ++run;
    absl::string_view info = absl::StripAsciiWhitespace(line.substr(run));
    FencedBlock block;
    block.info = absl::AsciiStrToLower(info.substr(0, info.find_first_of(" \t{")));
    block.closed = false;
    std::vector<absl::string_view> body;
    while (i < lines.size()) {
      absl::string_view l = absl::StripAsciiWhitespace(lines[i]);
      ++i;
      size_t r = 0;
      while (r < l.size() && l[r] == fence) ++r;
      if (r >= run && r == l.size()) {
        block.closed = true;
        break;
      }
      body.push_back(lines[i - 1]);
    }
    block.body = absl::StrJoin(body, "\n");
    if (!block.body.empty()) block.body += "\n";
    blocks.push_back(std::move(block));
  }
  return blocks;
}

absl::StatusOr<std::string> ExtractKernelSource(absl::string_view reply,
                                                const KernelExtractOptions& options) {
  const Lexed sig = Lex(options.signature);
  size_t paren = 0;
  while (paren < sig.tokens.size() && sig.tokens[paren].text != "(") ++paren;
  if (paren == 0 || paren == sig.tokens.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("kernel_extract: not a function signature: ", options.signature));
  }
  const absl::string_view name = sig.tokens[paren - 1].text;
  const std::vector<absl::string_view> want = Normalized(sig.tokens, 0, sig.tokens.size());

  const std::vector<FencedBlock> blocks = FindFencedBlocks(reply);
  const FencedBlock* chosen = nullptr;
  Lexed chosen_lexed;
  std::vector<std::string> changed;
  int code_blocks = 0;
  bool open_at_end = false;
  for (const FencedBlock& b : blocks) {
    if (!IsCodeInfo(b.info)) continue;
    ++code_blocks;
    if (!b.closed) open_at_end = true;
    Lexed lexed = Lex(b.body);
    EntryScan scan = ScanEntry(b.body, lexed, name, want);
    if (scan.matching > 1) {
      return Wrong(absl::StrCat("a code block defines ", name, " ", scan.matching,
                                " times: a candidate defines it once"));
    }
    if (scan.matching == 1) {
      chosen = &b;
      chosen_lexed = std::move(lexed);
    } else {
      changed.insert(changed.end(), scan.other.begin(), scan.other.end());
    }
  }
  if (options.truncated && (chosen == nullptr || !chosen->closed) && open_at_end) {
    return WithLlmErrorKind(
        absl::ResourceExhaustedError("the reply stopped at max_tokens inside its code block: raise "
                                     "max_tokens or ask for a shorter kernel"),
        LlmErrorKind::kTruncated);
  }
  if (code_blocks == 0) {
    return WithLlmErrorKind(
        absl::InvalidArgumentError(
            absl::StrCat("the reply has no fenced code block (", reply.size(), " chars of prose",
                         options.truncated ? ", cut at max_tokens" : "", ")")),
        LlmErrorKind::kNoCode);
  }
  if (chosen == nullptr) {
    if (!changed.empty()) {
      return Wrong(absl::StrCat("the signature of ", name, " changed: want `",
                                Collapse(options.signature), "`, found `", changed.back(), "`"));
    }
    return Wrong(absl::StrCat("no code block defines ", name, " (want `",
                              Collapse(options.signature), "`)"));
  }
  if (absl::Status s = CheckDeviceOnly(chosen_lexed, options); !s.ok()) return s;
  return chosen->body;
}

}  // namespace rvd::tune

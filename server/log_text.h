// What a client sends (model ids, tensor names, and the error messages that
// quote them) made safe for one line of rvd's log: a newline in a tensor
// name must not start a forged log line. Every log line that prints client
// text passes it through LogEscape.
#ifndef RVD_SERVER_LOG_TEXT_H_
#define RVD_SERVER_LOG_TEXT_H_

#include <cstddef>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace rvd {

// Printable ASCII is kept; a backslash becomes "\\"; newline, carriage
// return and tab become "\n", "\r", "\t"; every other byte (control
// characters, DEL, bytes of multi-byte UTF-8) becomes "\xNN". Text longer
// than `max_bytes` is cut there and ends with "...(N bytes)".
inline std::string LogEscape(absl::string_view text, size_t max_bytes = 1024) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  const absl::string_view kept = text.substr(0, max_bytes);
  out.reserve(kept.size() + 16);
  for (const char c : kept) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (u < 0x20 || u >= 0x7f) {
      out += "\\x";
      out += kHex[u >> 4];
      out += kHex[u & 0xf];
    } else {
      out += c;
    }
  }
  if (kept.size() < text.size()) absl::StrAppend(&out, "...(", text.size(), " bytes)");
  return out;
}

}  // namespace rvd

#endif  // RVD_SERVER_LOG_TEXT_H_

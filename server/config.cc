// Parses rvd's YAML configuration. yaml-cpp reports errors by throwing; every
// call into it happens inside a try block here so that no exception leaves
// this file (the daemon's layers speak absl::Status only).
#include "server/config.h"

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
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "kernels/engine.h"
#include "yaml-cpp/yaml.h"

namespace rvd {
namespace {

const char* NodeTypeName(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Null:
      return "null";
    case YAML::NodeType::Scalar:
      return "a scalar";
    case YAML::NodeType::Sequence:
      return "a sequence";
    case YAML::NodeType::Map:
      return "a map";
    case YAML::NodeType::Undefined:
    default:
      return "undefined";
  }
}

absl::Status TypeError(const std::string& key, const YAML::Node& node,
                       absl::string_view want) {
  std::string got = NodeTypeName(node);
  if (node.IsScalar()) got = absl::StrCat("\"", node.Scalar(), "\"");
  return absl::InvalidArgumentError(
      absl::StrCat("config key '", key, "': expected ", want, ", got ", got,
                   " (line ", node.Mark().line + 1, ")"));
}

// A string key: any scalar; null (`key:` with nothing after it) means "".
absl::Status ReadValue(const std::string& key, const YAML::Node& node,
                       std::string* out) {
  if (node.IsNull()) {
    out->clear();
    return absl::OkStatus();
  }
  if (!node.IsScalar()) return TypeError(key, node, "a string");
  *out = node.Scalar();
  return absl::OkStatus();
}

// Integers are parsed from the scalar text with absl::SimpleAtoi rather than
// yaml-cpp's stream conversion, which is lax about signs on unsigned types.
// (bool, also integral, takes the non-template overload below.)
template <typename T, std::enable_if_t<std::is_integral_v<T>, int> = 0>
absl::Status ReadValue(const std::string& key, const YAML::Node& node, T* out) {
  if (!node.IsScalar()) return TypeError(key, node, "an integer");
  T value;
  if (!absl::SimpleAtoi(node.Scalar(), &value)) {
    return TypeError(key, node,
                     std::is_signed_v<T> ? "an integer in range"
                                         : "a non-negative integer in range");
  }
  *out = value;
  return absl::OkStatus();
}

absl::Status ReadValue(const std::string& key, const YAML::Node& node,
                       bool* out) {
  if (!node.IsScalar()) return TypeError(key, node, "true or false");
  // yaml-cpp's bool conversion accepts true/false, yes/no, on/off (any case)
  // and returns false from decode on anything else.
  bool value;
  if (!YAML::convert<bool>::decode(node, value)) {
    return TypeError(key, node, "true or false");
  }
  *out = value;
  return absl::OkStatus();
}

absl::Status ReadValue(const std::string& key, const YAML::Node& node,
                       double* out) {
  if (!node.IsScalar()) return TypeError(key, node, "a number");
  double value;
  // YAML spells the special values .inf, -.inf and .nan (any case);
  // ValidateConfig then rejects them where they make no sense.
  const std::string lower = absl::AsciiStrToLower(node.Scalar());
  if (lower == ".nan") {
    value = std::numeric_limits<double>::quiet_NaN();
  } else if (lower == ".inf" || lower == "+.inf") {
    value = std::numeric_limits<double>::infinity();
  } else if (lower == "-.inf") {
    value = -std::numeric_limits<double>::infinity();
  } else if (!absl::SimpleAtod(node.Scalar(), &value)) {
    return TypeError(key, node, "a number");
  }
  *out = value;
  return absl::OkStatus();
}

// One entry per config key: its name and the Config field it sets.
struct KeyReader {
  const char* name;
  std::variant<std::string Config::*, bool Config::*, int Config::*,
               uint32_t Config::*, uint64_t Config::*, double Config::*>
      field;

  absl::Status Read(const YAML::Node& node, Config* config) const {
    return std::visit(
        [&](auto member) { return ReadValue(name, node, &(config->*member)); },
        field);
  }
};

const KeyReader kKeys[] = {
    {"grpc_address", &Config::grpc_address},
    {"metrics_address", &Config::metrics_address},
    {"backend", &Config::backend},
    {"data_dir", &Config::data_dir},
    {"log_level", &Config::log_level},
    {"history_capacity", &Config::history_capacity},
    {"max_models", &Config::max_models},
    {"engine_threads", &Config::engine_threads},
    {"compute_workers", &Config::compute_workers},
    {"max_inflight_requests", &Config::max_inflight_requests},
    {"max_request_bytes", &Config::max_request_bytes},
    {"per_head_metrics", &Config::per_head_metrics},
    {"rv_alert_threshold", &Config::rv_alert_threshold},
    {"default_variant", &Config::default_variant},
    {"cuda_device", &Config::cuda_device},
    {"cuda_streams", &Config::cuda_streams},
    {"cuda_max_device_bytes", &Config::cuda_max_device_bytes},
};

const KeyReader* FindKey(const std::string& name) {
  for (const KeyReader& k : kKeys) {
    if (name == k.name) return &k;
  }
  return nullptr;
}

std::string KnownKeys() {
  std::vector<std::string> names;
  for (const KeyReader& k : kKeys) names.push_back(k.name);
  return absl::StrJoin(names, ", ");
}

absl::StatusOr<Config> ParseNode(const YAML::Node& root) {
  Config config;
  if (!root.IsDefined() || root.IsNull()) return config;  // empty document
  if (!root.IsMap()) {
    return absl::InvalidArgumentError(
        absl::StrCat("config: the top level must be a map of key: value, got ",
                     NodeTypeName(root)));
  }
  std::set<std::string> seen;
  for (const auto& entry : root) {
    if (!entry.first.IsScalar()) {
      return absl::InvalidArgumentError(
          absl::StrCat("config: a key must be a plain name (line ",
                       entry.first.Mark().line + 1, ")"));
    }
    const std::string key = entry.first.Scalar();
    const KeyReader* reader = FindKey(key);
    if (reader == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "config: unknown key '", key, "' (line ", entry.first.Mark().line + 1,
          "); known keys: ", KnownKeys()));
    }
    if (!seen.insert(key).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("config: key '", key, "' appears more than once (line ",
                       entry.first.Mark().line + 1, ")"));
    }
    absl::Status s = reader->Read(entry.second, &config);
    if (!s.ok()) return s;
  }
  return config;
}

// HOST:PORT with a non-empty host (a name, an IPv4 address or a bracketed
// IPv6 address such as [::1]) and a decimal port in 0..65535 (0: the OS picks).
absl::Status CheckHostPort(absl::string_view key, absl::string_view address) {
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("config key '", key, "': \"", address,
                     "\" is not HOST:PORT (", why, ")"));
  };
  const size_t colon = address.rfind(':');
  if (colon == absl::string_view::npos) return bad("no ':PORT'");
  absl::string_view host = address.substr(0, colon);
  absl::string_view port = address.substr(colon + 1);
  if (host.empty()) return bad("empty host");
  if (host.front() == '[') {
    if (host.size() < 3 || host.back() != ']') return bad("unclosed '['");
    for (char c : host.substr(1, host.size() - 2)) {
      if (!absl::ascii_isxdigit(c) && c != ':' && c != '.' && c != '%') {
        return bad("bad character in IPv6 address");
      }
    }
  } else {
    for (char c : host) {
      if (!absl::ascii_isalnum(c) && c != '.' && c != '-' && c != '_') {
        return bad(c == ':' ? "IPv6 addresses need [brackets]"
                            : "bad character in host");
      }
    }
  }
  if (port.empty() || port.size() > 5) return bad("bad port");
  for (char c : port) {
    if (!absl::ascii_isdigit(c)) return bad("port is not a number");
  }
  int port_number = 0;
  if (!absl::SimpleAtoi(port, &port_number) || port_number > 65535) {
    return bad("port out of range 0..65535");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Config> ParseConfig(const std::string& yaml_text) {
  try {
    YAML::Node root = YAML::Load(yaml_text);
    return ParseNode(root);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("config: YAML syntax error: ", e.what()));
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("config: ", e.what()));
  }
}

absl::StatusOr<Config> LoadConfig(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    if (ec) {
      return absl::UnavailableError(
          absl::StrCat("config file ", path, ": ", ec.message()));
    }
    return absl::NotFoundError(
        absl::StrCat("config file ", path, " does not exist"));
  }
  if (std::filesystem::is_directory(path, ec)) {
    return absl::InvalidArgumentError(
        absl::StrCat("config file ", path, " is a directory"));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::PermissionDeniedError(absl::StrCat(
        "config file ", path, ": cannot open: ", std::strerror(errno)));
  }
  std::stringstream text;
  text << in.rdbuf();
  if (in.bad()) {
    return absl::DataLossError(
        absl::StrCat("config file ", path, ": read error"));
  }
  absl::StatusOr<Config> config = ParseConfig(text.str());
  if (!config.ok()) {
    return absl::Status(config.status().code(),
                        absl::StrCat(path, ": ", config.status().message()));
  }
  return config;
}

absl::Status ValidateConfig(const Config& config) {
  std::vector<std::string> errors;
  auto add = [&errors](const absl::Status& s) {
    if (!s.ok()) errors.emplace_back(s.message());
  };
  add(CheckHostPort("grpc_address", config.grpc_address));
  if (!config.metrics_address.empty()) {
    add(CheckHostPort("metrics_address", config.metrics_address));
  }
  if (config.backend != "auto" && config.backend != "cpu" &&
      config.backend != "cuda") {
    errors.push_back(absl::StrCat("config key 'backend': \"", config.backend,
                                  "\" is not one of auto, cpu, cuda"));
  }
  // The names spdlog::level::from_str understands (spdlog 1.10), including
  // its short aliases "warn" and "err".
  static const char* const kLevels[] = {"trace", "debug",    "info",
                                        "warn",  "warning",  "err",
                                        "error", "critical", "off"};
  bool level_ok = false;
  for (const char* level : kLevels) level_ok |= config.log_level == level;
  if (!level_ok) {
    errors.push_back(absl::StrCat(
        "config key 'log_level': \"", config.log_level,
        "\" is not one of trace, debug, info, warn, error, critical, off"));
  }
  if (config.history_capacity < 1) {
    errors.push_back("config key 'history_capacity': must be >= 1");
  }
  if (config.max_models < 1) {
    errors.push_back("config key 'max_models': must be >= 1");
  }
  if (config.engine_threads < 0) {
    errors.push_back(
        "config key 'engine_threads': must be >= 0 (0: one per core)");
  }
  if (config.compute_workers < 1) {
    errors.push_back("config key 'compute_workers': must be >= 1");
  }
  if (config.cuda_device < 0) {
    errors.push_back("config key 'cuda_device': must be >= 0");
  }
  if (config.cuda_streams < 1) {
    errors.push_back("config key 'cuda_streams': must be >= 1");
  }
  if (config.cuda_max_device_bytes < (64ull << 20)) {
    errors.push_back("config key 'cuda_max_device_bytes': must be >= 64 MiB");
  }
  if (!config.default_variant.empty() &&
      std::find(KnownVariants().begin(), KnownVariants().end(),
                config.default_variant) == KnownVariants().end()) {
    errors.push_back(absl::StrCat("config key 'default_variant': \"",
                                  config.default_variant, "\" is not one of ",
                                  absl::StrJoin(KnownVariants(), ", ")));
  }
  if (config.max_inflight_requests < 1) {
    errors.push_back("config key 'max_inflight_requests': must be >= 1");
  }
  if (config.max_request_bytes < 1) {
    errors.push_back("config key 'max_request_bytes': must be >= 1");
  }
  if (!std::isfinite(config.rv_alert_threshold) ||
      config.rv_alert_threshold < 0) {
    errors.push_back(
        "config key 'rv_alert_threshold': must be a finite number >= 0 "
        "(0: no alert gauge)");
  }
  if (errors.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrJoin(errors, "; "));
}

}  // namespace rvd

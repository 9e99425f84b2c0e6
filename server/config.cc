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
#include "absl/strings/str_replace.h"
#include "absl/strings/string_view.h"
#include "CLI/CLI.hpp"
#include "kernels/engine.h"
#include "server/sqlite_store.h"
#include "server/security.h"
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

// Where a value was written, for error messages: "config key 'k' ... (line
// N)" for the YAML file, "flag --k" for the command line.
struct Where {
  std::string what;
  int line = 0;  // 1-based; 0: not from a file
};

absl::Status TypeError(const Where& where, const YAML::Node& node,
                       absl::string_view want) {
  std::string got = NodeTypeName(node);
  if (node.IsScalar()) got = absl::StrCat("\"", node.Scalar(), "\"");
  return absl::InvalidArgumentError(absl::StrCat(
      where.what, ": expected ", want, ", got ", got,
      where.line > 0 ? absl::StrCat(" (line ", where.line, ")") : ""));
}

// A string key: any scalar; null (`key:` with nothing after it) means "".
absl::Status ReadValue(const Where& where, const YAML::Node& node,
                       std::string* out) {
  if (node.IsNull()) {
    out->clear();
    return absl::OkStatus();
  }
  if (!node.IsScalar()) return TypeError(where, node, "a string");
  *out = node.Scalar();
  return absl::OkStatus();
}

// Integers are parsed from the scalar text with absl::SimpleAtoi rather than
// yaml-cpp's stream conversion, which is lax about signs on unsigned types.
// (bool, also integral, takes the non-template overload below.)
template <typename T, std::enable_if_t<std::is_integral_v<T>, int> = 0>
absl::Status ReadValue(const Where& where, const YAML::Node& node, T* out) {
  if (!node.IsScalar()) return TypeError(where, node, "an integer");
  T value;
  if (!absl::SimpleAtoi(node.Scalar(), &value)) {
    return TypeError(where, node,
                     std::is_signed_v<T> ? "an integer in range"
                                         : "a non-negative integer in range");
  }
  *out = value;
  return absl::OkStatus();
}

absl::Status ReadValue(const Where& where, const YAML::Node& node,
                       bool* out) {
  if (!node.IsScalar()) return TypeError(where, node, "true or false");
  // yaml-cpp's bool conversion accepts true/false, yes/no, on/off (any case)
  // and returns false from decode on anything else.
  bool value;
  if (!YAML::convert<bool>::decode(node, value)) {
    return TypeError(where, node, "true or false");
  }
  *out = value;
  return absl::OkStatus();
}

absl::Status ReadValue(const Where& where, const YAML::Node& node,
                       double* out) {
  if (!node.IsScalar()) return TypeError(where, node, "a number");
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
    return TypeError(where, node, "a number");
  }
  *out = value;
  return absl::OkStatus();
}

// A list of strings: a sequence of scalars, or one scalar (a list of one);
// null means the empty list.
absl::Status ReadValue(const Where& where, const YAML::Node& node,
                       std::vector<std::string>* out) {
  std::vector<std::string> list;
  if (node.IsScalar()) {
    list.push_back(node.Scalar());
  } else if (node.IsSequence()) {
    for (const YAML::Node& item : node) {
      if (!item.IsScalar()) return TypeError(where, node, "a list of strings");
      list.push_back(item.Scalar());
    }
  } else if (!node.IsNull()) {
    return TypeError(where, node, "a list of strings");
  }
  *out = std::move(list);
  return absl::OkStatus();
}

absl::Status ReadValue(const Where& where, const YAML::Node& node,
                       WatchConfig* out) {
  // Its own messages give the line of the field at fault.
  return ReadWatchConfig(where.what, node, out);
}

std::string ValueText(const std::vector<std::string>& v) {
  return absl::StrCat("[", absl::StrJoin(v, ", "), "]");
}
std::string ValueText(const WatchConfig& v) { return WatchConfigText(v); }
std::string ValueText(const std::string& v) { return absl::StrCat("\"", v, "\""); }
std::string ValueText(bool v) { return v ? "true" : "false"; }
template <typename T, std::enable_if_t<std::is_arithmetic_v<T>, int> = 0>
std::string ValueText(T v) {
  return absl::StrCat(v);
}

// One entry per config key: its name, the Config field it sets, and the
// help text of its flag (the YAML file documents the same keys at length).
struct KeyReader {
  const char* name;
  std::variant<std::string Config::*, bool Config::*, int Config::*,
               uint32_t Config::*, uint64_t Config::*, double Config::*,
               std::vector<std::string> Config::*, WatchConfig Config::*>
      field;
  const char* help;
  // The flag's name when it is not the key's with dashes (a list key's
  // flag is singular and repeatable: --checkpoint-root A --checkpoint-root B).
  const char* flag = nullptr;

  absl::Status Read(const Where& where, const YAML::Node& node,
                    Config* config) const {
    return std::visit(
        [&](auto member) { return ReadValue(where, node, &(config->*member)); },
        field);
  }
  std::string Text(const Config& config) const {
    return std::visit([&](auto member) { return ValueText(config.*member); },
                      field);
  }
  bool is_bool() const {
    return std::holds_alternative<bool Config::*>(field);
  }
  bool is_list() const {
    return std::holds_alternative<std::vector<std::string> Config::*>(field);
  }
  // A map: its flag takes YAML text ("{directories: [/ckpt/*]}").
  bool is_section() const {
    return std::holds_alternative<WatchConfig Config::*>(field);
  }
};

const KeyReader kKeys[] = {
    {"grpc_address", &Config::grpc_address,
     "HOST:PORT of the gRPC API (IPv6 in brackets: [::1]:50051)"},
    {"metrics_address", &Config::metrics_address,
     "HOST:PORT of http://HOST:PORT/metrics; \"\" turns metrics off"},
    {"backend", &Config::backend, "auto | cpu | cuda"},
    {"data_dir", &Config::data_dir,
     "directory of the durable history (rvd.db); must exist and be "
     "writable; \"\": history in memory only"},
    {"store_sync", &Config::store_sync,
     "when a stored measurement is fsynced: record (each, before the reply) "
     "| <N>ms (every N ms) | off (by the OS)"},
    {"retention_per_model", &Config::retention_per_model,
     "measurements kept on disk per model (0: no bound; else >= "
     "history_capacity)"},
    {"retention_max_age_seconds", &Config::retention_max_age_seconds,
     "measurements older than this are deleted from disk (0: kept)"},
    {"log_level", &Config::log_level,
     "trace | debug | info | warn | error | critical | off"},
    {"history_capacity", &Config::history_capacity,
     "measurements kept per model (>= 1)"},
    {"max_models", &Config::max_models, "distinct model ids kept (>= 1)"},
    {"max_watchers", &Config::max_watchers,
     "WatchMeasurements streams at once; more are refused "
     "(RESOURCE_EXHAUSTED); 0: none"},
    {"max_live_models", &Config::max_live_models,
     "live models (RegisterLiveModel) registered at once; more are refused "
     "(RESOURCE_EXHAUSTED)"},
    {"live_lease_seconds", &Config::live_lease_seconds,
     "a live model no RegisterLiveModel or NotifyStep names for this long is "
     "released (>= 1; a request's lease_seconds overrides it)"},
    {"shard_group_timeout_seconds", &Config::shard_group_timeout_seconds,
     "a sharded model's group step fails this long after its first rank "
     "reported, naming the ranks that did not (>= 1)"},
    {"max_metric_series", &Config::max_metric_series,
     "per-layer and per-head PR series /metrics exports, all models "
     "together; the overflow is counted in rvd_series_dropped_total"},
    {"engine_threads", &Config::engine_threads,
     "CPU engine threads; 0: one per core"},
    {"compute_workers", &Config::compute_workers,
     "measurements computed at once (>= 1)"},
    {"max_inflight_requests", &Config::max_inflight_requests,
     "measurements computing or queued for a worker; more are refused "
     "(RESOURCE_EXHAUSTED)"},
    {"max_request_bytes", &Config::max_request_bytes,
     "tensor bytes one request may carry"},
    {"max_buffered_bytes", &Config::max_buffered_bytes,
     "received tensor bytes held at once, all requests together; 0: "
     "max_request_bytes, else >= it"},
    {"stream_idle_timeout_seconds", &Config::stream_idle_timeout_seconds,
     "a MeasureStream that sends nothing for this long is cancelled (> 0)"},
    {"per_head_metrics", &Config::per_head_metrics,
     "export rvd_participation_ratio_head (one series per head)"},
    {"rv_alert_threshold", &Config::rv_alert_threshold,
     "> 0: export rvd_rv_below_threshold{model_id}; 0: off"},
    {"alert_rules_file", &Config::alert_rules_file,
     "YAML file of alert rules (config/alert_rules.yaml), validated at start "
     "and reread on SIGHUP; \"\": none"},
    {"default_variant", &Config::default_variant,
     "variant for requests that name none; \"\": the backend's default"},
    {"cuda_device", &Config::cuda_device, "CUDA device ordinal"},
    {"cuda_streams", &Config::cuda_streams, "CUDA stream pool size (>= 1)"},
    {"cuda_max_device_bytes", &Config::cuda_max_device_bytes,
     "device memory rvd may hold (>= 64 MiB)"},
    {"cuda_max_sms", &Config::cuda_max_sms,
     "most SMs fused v4's persistent grid occupies, leaving the rest to a trainer (0: all)"},
    {"tune_duty_cycle", &Config::tune_duty_cycle,
     "share of time a tuning job's device work may take, in (0, 1]: after t seconds of it "
     "the job idles t (1 - d) / d"},
    {"checkpoint_roots", &Config::checkpoint_roots,
     "a directory under which rvd reads checkpoints itself (MeasurePath, "
     "watch); repeatable; given on the command line, replaces the file's list",
     "--checkpoint-root"},
    {"watch", &Config::watch,
     "checkpoint directories measured as they appear, as YAML: {directories: "
     "[{path: GLOB, model_id: ID}], poll_interval_seconds: S, "
     "settle_seconds: S, inotify: BOOL}"},
    {"tls_cert_file", &Config::tls_cert_file,
     "PEM certificate chain of the gRPC port; with --tls-key-file: TLS; "
     "\"\": plaintext"},
    {"tls_key_file", &Config::tls_key_file,
     "PEM private key of --tls-cert-file (unencrypted)"},
    {"tls_client_ca_file", &Config::tls_client_ca_file,
     "PEM CA bundle: clients must present a certificate it signed (mutual "
     "TLS)"},
    {"auth_token_file", &Config::auth_token_file,
     "file holding a bearer token every call but health checks must carry "
     "(needs TLS); a wrong or missing one: UNAUTHENTICATED"},
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
    absl::Status s = reader->Read(
        {absl::StrCat("config key '", key, "'"), entry.second.Mark().line + 1},
        entry.second, &config);
    if (!s.ok()) return s;
  }
  return config;
}

}  // namespace

absl::StatusOr<HostPort> ParseHostPort(absl::string_view what,
                                       absl::string_view address) {
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": \"", address, "\" is not HOST:PORT (", why, ")"));
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
  return HostPort{std::string(host), port_number};
}

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
  add(ParseHostPort("config key 'grpc_address'", config.grpc_address)
          .status());
  if (!config.metrics_address.empty()) {
    add(ParseHostPort("config key 'metrics_address'", config.metrics_address)
            .status());
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
  if (config.live_lease_seconds < 1) {
    errors.push_back("config key 'live_lease_seconds': must be >= 1");
  }
  if (config.shard_group_timeout_seconds < 1) {
    errors.push_back("config key 'shard_group_timeout_seconds': must be >= 1");
  }
  if (absl::StatusOr<StoreOptions> sync = ParseStoreSync(config.store_sync);
      !sync.ok()) {
    errors.push_back(
        absl::StrCat("config key 'store_sync': ", sync.status().message()));
  }
  if (config.retention_per_model != 0 &&
      config.retention_per_model < config.history_capacity) {
    errors.push_back(absl::StrCat(
        "config key 'retention_per_model': must be 0 (no bound) or >= "
        "history_capacity (", config.history_capacity, ")"));
  }
  if (!std::isfinite(config.retention_max_age_seconds) ||
      config.retention_max_age_seconds < 0) {
    errors.push_back(
        "config key 'retention_max_age_seconds': must be a finite number >= 0 "
        "(0: no age bound)");
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
  if (!(config.tune_duty_cycle > 0 && config.tune_duty_cycle <= 1)) {
    errors.push_back(absl::StrCat(
        "config key 'tune_duty_cycle': must be in (0, 1], the share of time a tuning job's "
        "device work may take (1: no idle between its runs), not ",
        config.tune_duty_cycle));
  }
  if (config.cuda_max_sms < 0) {
    errors.push_back("config key 'cuda_max_sms': must be >= 0 (0: every SM)");
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
  if (config.max_buffered_bytes != 0 &&
      config.max_buffered_bytes < config.max_request_bytes) {
    errors.push_back(absl::StrCat(
        "config key 'max_buffered_bytes': must be >= max_request_bytes (",
        config.max_request_bytes, "), or no request of that size could ever "
        "be received"));
  }
  if (!(config.stream_idle_timeout_seconds > 0) ||
      !std::isfinite(config.stream_idle_timeout_seconds)) {
    errors.push_back(
        "config key 'stream_idle_timeout_seconds': must be a finite number > "
        "0");
  }
  if (!std::isfinite(config.rv_alert_threshold) ||
      config.rv_alert_threshold < 0) {
    errors.push_back(
        "config key 'rv_alert_threshold': must be a finite number >= 0 "
        "(0: no alert gauge)");
  }
  add(ValidateSecurityConfig(config));
  add(ValidateCheckpointConfig(config));
  if (errors.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrJoin(errors, "; "));
}

}  // namespace rvd

namespace rvd {

absl::StatusOr<CommandLine> ParseCommandLine(int argc,
                                             const char* const* argv) {
  const Config defaults;
  CLI::App app(
      "rvd: measures the participation ratio of transformer V weights.\n"
      "Reads the YAML config (--config), then applies the flags on top; "
      "every config key is a flag, with dashes.",
      "rvd");
  app.footer(
      "Signals: SIGTERM or SIGINT stop rvd (in-flight work gets 5 s, then "
      "rvd exits anyway);\n"
      "SIGHUP rereads alert_rules_file (a bad file is refused and the old "
      "rules stay); SIGUSR1 logs the "
      "compute queue's state.");
  app.set_version_flag("--version", RVD_VERSION);
  std::string config_path;
  app.add_option("--config", config_path,
                 "YAML config file (default: the built-in defaults)")
      ->type_name("FILE");
  // Each flag is read as text and parsed by the YAML reader of its key, so
  // that a value is spelled the same in the file and on the command line.
  constexpr int kKeyCount = sizeof(kKeys) / sizeof(kKeys[0]);
  std::vector<std::string> values(kKeyCount);
  std::vector<std::vector<std::string>> lists(kKeyCount);  // list keys' flags
  std::vector<CLI::Option*> options(kKeyCount);
  for (int i = 0; i < kKeyCount; ++i) {
    const KeyReader& key = kKeys[i];
    const std::string flag =
        key.flag != nullptr ? std::string(key.flag)
                            : "--" + absl::StrReplaceAll(key.name, {{"_", "-"}});
    const std::string help =
        absl::StrCat(key.help, " [", key.Text(defaults), "]");
    options[i] = key.is_list() ? app.add_option(flag, lists[i], help)
                               : app.add_option(flag, values[i], help);
    if (key.is_list()) {
      options[i]->type_name("DIR")->allow_extra_args(false);
    } else if (key.is_section()) {
      options[i]->type_name("YAML");
    } else if (key.is_bool()) {
      // --per-head-metrics alone means true; --per-head-metrics=false too.
      options[i]->expected(0, 1)->default_str("true")->type_name("[BOOL]");
    } else {
      options[i]->type_name(std::visit(
          [](auto member) -> std::string {
            using T = std::remove_reference_t<decltype(Config().*member)>;
            if constexpr (std::is_same_v<T, std::string>) return "TEXT";
            if constexpr (std::is_floating_point_v<T>) return "NUMBER";
            return "INT";
          },
          key.field));
    }
  }

  CommandLine out;
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    out.exit_now = true;
    out.text = app.help();
    return out;
  } catch (const CLI::CallForVersion&) {
    out.exit_now = true;
    out.text = absl::StrCat("rvd ", RVD_VERSION, "\n");
    return out;
  } catch (const CLI::ParseError& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(e.what(), " (rvd --help lists the flags)"));
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(e.what());
  }

  if (!config_path.empty()) {
    absl::StatusOr<Config> loaded = LoadConfig(config_path);
    if (!loaded.ok()) return loaded.status();
    out.config = *std::move(loaded);
  }
  for (int i = 0; i < kKeyCount; ++i) {
    if (options[i]->count() == 0) continue;
    std::string text = values[i];
    if (kKeys[i].is_bool() && options[i]->results().empty()) text = "true";
    YAML::Node node(text);
    if (kKeys[i].is_list()) {
      node = YAML::Node(YAML::NodeType::Sequence);
      for (const std::string& item : lists[i]) node.push_back(item);
    } else if (kKeys[i].is_section()) {
      try {
        node = YAML::Load(text);
      } catch (const std::exception& e) {
        return absl::InvalidArgumentError(absl::StrCat(
            "flag ", options[i]->get_name(), ": not YAML: ", e.what()));
      }
    }
    absl::Status s = kKeys[i].Read(
        {absl::StrCat("flag ", options[i]->get_name()), 0}, node, &out.config);
    if (!s.ok()) return s;
  }
  if (absl::Status s = ValidateConfig(out.config); !s.ok()) return s;
  return out;
}

}  // namespace rvd

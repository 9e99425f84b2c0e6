// rvctl: the command-line client of rvd.
//
//   rvctl [--address HOST:PORT] measure PATH --model-id ID [--step N]
//         [--early A-B] [--late A-B] [--per-head] [--variant NAME] [--json]
//   rvctl history ID [--limit N] [--json|--csv]
//         [--from-step N] [--to-step N] [--since T] [--until T]
//         [--format text|json|csv]
//   rvctl delete ID
//   rvctl latest ID [--json]
//   rvctl models [--json]
//   rvctl watch [ID] [--after SEQ] [--alerts-after SEQ] [--noalerts] [--json]
//         (measurements and alert events as they happen)
//   rvctl tune start|status|list|watch|cancel ... (kernel tuning jobs:
//         client/rvctl_tune.h)
//
// Connection (every command): --address, and for a daemon with TLS
// --tls-ca-file CA.pem (or --tls), for mutual TLS --tls-cert-file and
// --tls-key-file, for a bearer token --auth-token-file FILE or the
// environment variable RVD_AUTH_TOKEN (see client/cpp/channel.h).
//
// PATH is a Hugging Face model directory or one .safetensors file (then
// --arch and the head flags). Exit status: 0 on success, 1 when rvd or the
// checkpoint reports an error (the message is printed), 2 on usage errors.
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <cstdlib>
#include <iostream>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/cpp/channel.h"
#include "client/cpp/model_loader.h"
#include "client/cpp/rvd_client.h"
#include "client/rvctl_tune.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(std::string, address, "127.0.0.1:50051", "rvd's gRPC HOST:PORT");
ABSL_FLAG(bool, tls, false,
          "TLS, verifying rvd's certificate against the system's roots "
          "(implied by --tls-ca-file and --tls-cert-file)");
ABSL_FLAG(std::string, tls_ca_file, "",
          "TLS: PEM CA that signed rvd's certificate");
ABSL_FLAG(std::string, tls_cert_file, "",
          "mutual TLS: PEM client certificate (with --tls-key-file)");
ABSL_FLAG(std::string, tls_key_file, "",
          "mutual TLS: PEM private key of --tls-cert-file");
ABSL_FLAG(std::string, tls_server_name, "",
          "TLS: the name rvd's certificate must carry (default: the host of "
          "--address)");
ABSL_FLAG(std::string, auth_token_file, "",
          "file holding rvd's bearer token (default: the environment "
          "variable RVD_AUTH_TOKEN, if set); needs TLS");
ABSL_FLAG(std::string, model_id, "",
          "measure: the model id, [A-Za-z0-9_.:-]{1,128}");
ABSL_FLAG(int64_t, step, 0, "measure: the training step");
ABSL_FLAG(std::string, early, "",
          "measure: early layers, 'A-B' (inclusive) or 'A,B,C'; default first "
          "quarter");
ABSL_FLAG(
    std::string, late, "",
    "measure: late layers, 'A-B' (inclusive) or 'A,B,C'; default last quarter");
ABSL_FLAG(bool, per_head, false, "measure: also the PR of every head");
ABSL_FLAG(std::string, variant, "",
          "measure: algebraic|naive|power_iter|sketch|fused");
ABSL_FLAG(uint32_t, probes, 0, "measure: power_iter probes K (0: default)");
ABSL_FLAG(uint32_t, sketch_rank, 0, "measure: sketch rank r (0: default)");
ABSL_FLAG(uint64_t, seed, 0, "measure: seed of power_iter and sketch");
ABSL_FLAG(std::string, arch, "",
          "measure: model_type for a single .safetensors file");
ABSL_FLAG(int64_t, num_heads, 0,
          "measure: query heads (single file, or override)");
ABSL_FLAG(int64_t, num_kv_heads, 0,
          "measure: kv heads (single file, or override)");
ABSL_FLAG(int64_t, head_dim, 0, "measure: head dim (single file, or override)");
ABSL_FLAG(std::string, architectures, "",
          "YAML architecture table (default: the built-in "
          "config/architectures.yaml)");
ABSL_FLAG(uint32_t, limit, 0, "history: newest N measurements (0: all kept)");
ABSL_FLAG(int64_t, after, -1,
          "watch: first the kept measurements with sequence > SEQ (0: all "
          "kept), then new ones; -1: new ones only");
ABSL_FLAG(bool, alerts, true,
          "watch: also show alert events (WatchAlerts); --noalerts: "
          "measurements only");
ABSL_FLAG(int64_t, alerts_after, -1,
          "watch: first the kept alert events with sequence > SEQ (0: all "
          "kept), then new ones; -1: new ones only");
ABSL_FLAG(std::string, transfer, "auto",
          "measure: auto (rvd reads PATH itself when it can see it, else the "
          "tensors are streamed) | path (rvd must read it) | stream");
ABSL_FLAG(bool, json, false, "print JSON");
ABSL_FLAG(bool, csv, false, "history: print CSV");
ABSL_FLAG(std::string, from_step, "", "history: only steps >= N");
ABSL_FLAG(std::string, to_step, "", "history: only steps <= N");
ABSL_FLAG(std::string, since, "",
          "history: only measurements at or after T (RFC 3339, e.g. "
          "2026-01-02T03:04:05Z, or Unix seconds)");
ABSL_FLAG(std::string, until, "", "history: only measurements before T");
ABSL_FLAG(std::string, format, "",
          "history: text | json | csv. With it, or a range flag, and no "
          "--limit: every matching measurement rvd retains (on disk with "
          "data_dir), oldest first, fetched page by page");

namespace {

using nlohmann::json;
using rvd::v1::Measurement;

constexpr int kUsageError = 2;
constexpr int kFailure = 1;

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "rvctl: %s: %s\n",
               absl::StatusCodeToString(s.code()).c_str(),
               std::string(s.message()).c_str());
  return kFailure;
}

int Usage(const std::string& why) {
  std::fprintf(stderr, "rvctl: %s\n%s\n", why.c_str(),
               absl::ProgramUsageMessage().data());
  return kUsageError;
}

// Accepts "A-B" (inclusive) or "A,B,C".
absl::StatusOr<std::vector<uint32_t>> ParseLayers(const std::string& text) {
  std::vector<uint32_t> layers;
  if (text.empty()) return layers;
  std::vector<std::string> range = absl::StrSplit(text, '-');
  uint32_t a, b;
  if (range.size() == 2 && absl::SimpleAtoi(range[0], &a) &&
      absl::SimpleAtoi(range[1], &b) && a <= b) {
    for (uint32_t l = a; l <= b; ++l) layers.push_back(l);
    return layers;
  }
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    if (!absl::SimpleAtoi(part, &a)) {
      return absl::InvalidArgumentError("bad layer set '" + text +
                                        "': expected A-B or A,B,C");
    }
    layers.push_back(a);
  }
  return layers;
}

std::string Timestamp(const Measurement& m) {
  absl::Time t = absl::FromUnixSeconds(m.timestamp().seconds()) +
                 absl::Nanoseconds(m.timestamp().nanos());
  return absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", t, absl::UTCTimeZone());
}

json ToJson(const Measurement& m) {
  json per_layer = json::object(), per_head = json::object();
  for (const rvd::v1::LayerPR& l : m.layers()) {
    per_layer[std::to_string(l.layer())] = l.pr();
    if (l.head_pr_size() > 0) {
      per_head[std::to_string(l.layer())] =
          std::vector<double>(l.head_pr().begin(), l.head_pr().end());
    }
  }
  return json{
      {"model_id", m.model_id()},
      {"step", m.step()},
      {"sequence", m.sequence()},
      {"rv", m.has_rv() ? json(m.rv()) : json(nullptr)},
      {"per_layer_pr", per_layer},
      {"per_head_pr", per_head},
      {"early_layers",
       std::vector<uint32_t>(m.early_layers().begin(), m.early_layers().end())},
      {"late_layers",
       std::vector<uint32_t>(m.late_layers().begin(), m.late_layers().end())},
      {"variant", m.variant()},
      {"backend", m.backend()},
      {"engine_version", m.engine_version()},
      {"elapsed_ms", m.elapsed_ms()},
      {"receive_ms", m.receive_ms()},
      {"timestamp", Timestamp(m)},
      {"warnings",
       std::vector<std::string>(m.warnings().begin(), m.warnings().end())},
  };
}

std::string RvText(const Measurement& m) {
  return m.has_rv() ? std::to_string(m.rv()) : "absent";
}

void PrintText(const Measurement& m) {
  std::printf("model %s step %lld at %s (sequence %llu)\n",
              m.model_id().c_str(), static_cast<long long>(m.step()),
              Timestamp(m).c_str(),
              static_cast<unsigned long long>(m.sequence()));
  std::printf("R_V %s  (variant %s, backend %s, engine %s, %.3f ms)\n",
              RvText(m).c_str(), m.variant().c_str(), m.backend().c_str(),
              m.engine_version().c_str(), m.elapsed_ms());
  for (const rvd::v1::LayerPR& l : m.layers()) {
    std::printf("  layer %4u  PR %10.4f", l.layer(), l.pr());
    for (double h : l.head_pr()) std::printf(" %.3f", h);
    std::printf("\n");
  }
  for (const std::string& w : m.warnings()) {
    std::printf("warning: %s\n", w.c_str());
  }
}

void PrintMeasurement(const Measurement& m) {
  if (absl::GetFlag(FLAGS_json)) {
    std::cout << ToJson(m).dump() << std::endl;
  } else {
    PrintText(m);
  }
}

// Draws a bar on stderr once a push has taken more than half a second, and
// only when stderr is a terminal.
class ProgressBar {
 public:
  ProgressBar() : enabled_(isatty(STDERR_FILENO)) {}
  ~ProgressBar() {
    if (drawn_) std::fprintf(stderr, "\n");
  }
  void Update(uint64_t sent, uint64_t total) {
    if (!enabled_ || std::chrono::steady_clock::now() - start_ <
                         std::chrono::milliseconds(500)) {
      return;
    }
    const int width = 40;
    const int filled =
        total == 0 ? width : static_cast<int>(width * sent / total);
    std::fprintf(
        stderr, "\r[%s%s] %6.1f / %.1f MB", std::string(filled, '#').c_str(),
        std::string(width - filled, ' ').c_str(), sent / 1e6, total / 1e6);
    drawn_ = true;
  }

 private:
  const bool enabled_;
  bool drawn_ = false;
  const std::chrono::steady_clock::time_point start_ =
      std::chrono::steady_clock::now();
};

int Measure(rvd::RvdClient& client, const std::string& path) {
  const std::string model_id = absl::GetFlag(FLAGS_model_id);
  if (model_id.empty()) return Usage("measure needs --model-id");
  absl::StatusOr<std::vector<uint32_t>> early =
      ParseLayers(absl::GetFlag(FLAGS_early));
  absl::StatusOr<std::vector<uint32_t>> late =
      ParseLayers(absl::GetFlag(FLAGS_late));
  if (!early.ok()) return Usage(std::string(early.status().message()));
  if (!late.ok()) return Usage(std::string(late.status().message()));

  const std::string transfer = absl::GetFlag(FLAGS_transfer);
  if (transfer != "auto" && transfer != "path" && transfer != "stream") {
    return Usage("--transfer takes auto, path or stream");
  }
  rvd::v1::MeasureHeader header;
  header.set_model_id(model_id);
  header.set_step(absl::GetFlag(FLAGS_step));
  for (uint32_t l : *early) header.add_early_layers(l);
  for (uint32_t l : *late) header.add_late_layers(l);
  header.set_per_head(absl::GetFlag(FLAGS_per_head));
  header.mutable_variant()->set_name(absl::GetFlag(FLAGS_variant));
  header.mutable_variant()->set_probes(absl::GetFlag(FLAGS_probes));
  header.mutable_variant()->set_sketch_rank(absl::GetFlag(FLAGS_sketch_rank));
  header.mutable_variant()->set_seed(absl::GetFlag(FLAGS_seed));

  // First ask rvd to read the checkpoint itself (nothing crosses gRPC but
  // the request). A daemon that cannot see the path (another host or mount
  // namespace, outside its checkpoint_roots, none configured, or older)
  // says so, and the tensors are streamed instead.
  std::string fallback;  // why rvd did not read it, when it did not
  if (transfer != "stream") {
    rvd::v1::MeasurePathRequest request;
    request.set_path(
        std::filesystem::absolute(path).lexically_normal().string());
    *request.mutable_header() = header;
    request.set_arch(absl::GetFlag(FLAGS_arch));
    request.set_num_heads(absl::GetFlag(FLAGS_num_heads));
    request.set_num_kv_heads(absl::GetFlag(FLAGS_num_kv_heads));
    request.set_head_dim(absl::GetFlag(FLAGS_head_dim));
    const absl::Time start = absl::Now();
    absl::StatusOr<Measurement> m = client.MeasurePath(request);
    const absl::Duration round_trip = absl::Now() - start;
    const absl::StatusCode code = m.status().code();
    const bool cannot_see = code == absl::StatusCode::kFailedPrecondition ||
                            code == absl::StatusCode::kPermissionDenied ||
                            code == absl::StatusCode::kNotFound ||
                            code == absl::StatusCode::kUnimplemented;
    if (m.ok() || transfer == "path" || !cannot_see) {
      if (!m.ok()) return Fail(m.status());
      if (absl::GetFlag(FLAGS_json)) {
        json out = ToJson(*m);
        out["transfer"] = "path";
        out["client_load_ms"] = 0.0;
        out["client_round_trip_ms"] = absl::ToDoubleMilliseconds(round_trip);
        std::cout << out.dump() << std::endl;
      } else {
        PrintText(*m);
        std::printf("transfer: rvd read %s itself (MeasurePath), %.3f ms to "
                    "map it; nothing streamed\n",
                    request.path().c_str(), m->receive_ms());
      }
      return 0;
    }
    fallback = absl::StrCat(absl::StatusCodeToString(code), ": ",
                            m.status().message());
  }

  absl::StatusOr<rvd::ArchitectureTable> table =
      absl::GetFlag(FLAGS_architectures).empty()
          ? rvd::DefaultArchitectureTable()
          : rvd::LoadArchitectureTableFile(absl::GetFlag(FLAGS_architectures));
  if (!table.ok()) return Fail(table.status());
  rvd::LoadOptions options;
  options.arch = absl::GetFlag(FLAGS_arch);
  options.num_heads = absl::GetFlag(FLAGS_num_heads);
  options.num_kv_heads = absl::GetFlag(FLAGS_num_kv_heads);
  options.head_dim = absl::GetFlag(FLAGS_head_dim);
  const absl::Time load_start = absl::Now();
  absl::StatusOr<rvd::LoadedModel> model =
      rvd::LoadModel(path, *table, options);
  if (!model.ok()) return Fail(model.status());
  const absl::Duration load_time = absl::Now() - load_start;

  for (rvd::v1::TensorSpec& spec : rvd::TensorSpecs(*model)) {
    *header.add_tensors() = std::move(spec);
  }
  absl::StatusOr<Measurement> m;
  const absl::Time send_start = absl::Now();
  {
    ProgressBar bar;
    m = client.Measure(header, *model, [&bar](uint64_t sent, uint64_t total) {
      bar.Update(sent, total);
    });
  }
  if (!m.ok()) return Fail(m.status());
  if (absl::GetFlag(FLAGS_json)) {
    // Where the time went, seen from the client: mapping and checking the
    // checkpoint, then sending it and waiting for the answer.
    json out = ToJson(*m);
    out["transfer"] = "stream";
    if (!fallback.empty()) out["transfer_fallback"] = fallback;
    out["client_load_ms"] = absl::ToDoubleMilliseconds(load_time);
    out["client_round_trip_ms"] =
        absl::ToDoubleMilliseconds(absl::Now() - send_start);
    std::cout << out.dump() << std::endl;
  } else {
    PrintText(*m);
    uint64_t bytes = 0;
    for (const rvd::ModelTensor& t : model->tensors) bytes += t.bytes;
    std::printf("transfer: streamed %.1f MB%s%s\n", bytes / 1e6,
                fallback.empty() ? "" : "; rvd did not read the path itself: ",
                fallback.c_str());
  }
  return 0;
}

int History(rvd::RvdClient& client, const std::string& model_id) {
  absl::StatusOr<std::vector<Measurement>> ms =
      client.GetHistory(model_id, absl::GetFlag(FLAGS_limit));
  if (!ms.ok()) return Fail(ms.status());
  if (absl::GetFlag(FLAGS_json)) {
    json all = json::array();
    for (const Measurement& m : *ms) all.push_back(ToJson(m));
    std::cout << all.dump() << std::endl;
  } else if (absl::GetFlag(FLAGS_csv)) {
    std::printf(
        "model_id,step,timestamp,rv,variant,backend,elapsed_ms,sequence\n");
    for (const Measurement& m : *ms) {
      std::printf("%s,%lld,%s,%s,%s,%s,%.6f,%llu\n", m.model_id().c_str(),
                  static_cast<long long>(m.step()), Timestamp(m).c_str(),
                  m.has_rv() ? std::to_string(m.rv()).c_str() : "",
                  m.variant().c_str(), m.backend().c_str(), m.elapsed_ms(),
                  static_cast<unsigned long long>(m.sequence()));
    }
  } else {
    for (const Measurement& m : *ms) {
      std::printf("%s  seq %-8llu step %-10lld R_V %-12s %s/%s %.3f ms\n",
                  Timestamp(m).c_str(),
                  static_cast<unsigned long long>(m.sequence()),
                  static_cast<long long>(m.step()), RvText(m).c_str(),
                  m.variant().c_str(), m.backend().c_str(), m.elapsed_ms());
    }
  }
  return 0;
}

// --since/--until: RFC 3339 or Unix seconds.
absl::Status ParseTimeFlag(const char* flag, const std::string& text,
                           google::protobuf::Timestamp* out) {
  int64_t seconds = 0;
  if (absl::SimpleAtoi(text, &seconds)) {
    out->set_seconds(seconds);
    return absl::OkStatus();
  }
  absl::Time t;
  std::string err;
  if (!absl::ParseTime(absl::RFC3339_full, text, &t, &err)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--", flag, " \"", text, "\": not RFC 3339 time or Unix seconds (",
        err, ")"));
  }
  const absl::Time whole = absl::FromUnixSeconds(absl::ToUnixSeconds(t));
  out->set_seconds(absl::ToUnixSeconds(t));
  out->set_nanos(static_cast<int32_t>((t - whole) / absl::Nanoseconds(1)));
  return absl::OkStatus();
}

bool HasRangeFlags() {
  return !absl::GetFlag(FLAGS_from_step).empty() ||
         !absl::GetFlag(FLAGS_to_step).empty() ||
         !absl::GetFlag(FLAGS_since).empty() ||
         !absl::GetFlag(FLAGS_until).empty() ||
         !absl::GetFlag(FLAGS_format).empty();
}

// history with ranges or --format: GetHistory's range fields; without
// --limit, every match, page by page (after_sequence), printed as it comes.
int HistoryRange(rvd::RvdClient& client, const std::string& model_id) {
  rvd::v1::GetHistoryRequest request;
  request.set_model_id(model_id);
  const std::pair<const char*, const std::string> steps[] = {
      {"from-step", absl::GetFlag(FLAGS_from_step)},
      {"to-step", absl::GetFlag(FLAGS_to_step)}};
  for (const auto& [flag, text] : steps) {
    if (text.empty()) continue;
    int64_t v = 0;
    if (!absl::SimpleAtoi(text, &v)) {
      return Usage(absl::StrCat("--", flag, " takes an integer step"));
    }
    if (flag == steps[0].first) {
      request.set_from_step(v);
    } else {
      request.set_to_step(v);
    }
  }
  if (const std::string t = absl::GetFlag(FLAGS_since); !t.empty()) {
    if (absl::Status s = ParseTimeFlag("since", t, request.mutable_since());
        !s.ok()) {
      return Usage(std::string(s.message()));
    }
  }
  if (const std::string t = absl::GetFlag(FLAGS_until); !t.empty()) {
    if (absl::Status s = ParseTimeFlag("until", t, request.mutable_until());
        !s.ok()) {
      return Usage(std::string(s.message()));
    }
  }
  std::string format = absl::GetFlag(FLAGS_format);
  if (format.empty()) {
    format = absl::GetFlag(FLAGS_json) ? "json"
             : absl::GetFlag(FLAGS_csv) ? "csv"
                                        : "text";
  }
  if (format != "text" && format != "json" && format != "csv") {
    return Usage("--format is text, json or csv");
  }
  const uint32_t limit = absl::GetFlag(FLAGS_limit);
  const bool paging = limit == 0;
  if (paging) {
    request.set_after_sequence(0);
  } else {
    request.set_limit(limit);
  }
  if (format == "json") std::printf("[");
  if (format == "csv") {
    std::printf(
        "model_id,step,timestamp,rv,variant,backend,elapsed_ms,sequence,"
        "layer_pr\n");
  }
  bool first = true;
  while (true) {
    absl::StatusOr<rvd::v1::GetHistoryResponse> page =
        client.GetHistoryPage(request);
    if (!page.ok()) {
      if (format == "json") std::printf("]\n");
      return Fail(page.status());
    }
    for (const Measurement& m : page->measurements()) {
      if (format == "json") {
        std::printf("%s\n%s", first ? "" : ",", ToJson(m).dump().c_str());
      } else if (format == "csv") {
        std::string layers;
        for (const rvd::v1::LayerPR& l : m.layers()) {
          absl::StrAppend(&layers, layers.empty() ? "" : ";", l.layer(), ":",
                          absl::StrFormat("%.17g", l.pr()));
        }
        std::printf("%s,%lld,%s,%s,%s,%s,%.6f,%llu,%s\n",
                    m.model_id().c_str(), static_cast<long long>(m.step()),
                    Timestamp(m).c_str(),
                    m.has_rv() ? absl::StrFormat("%.17g", m.rv()).c_str() : "",
                    m.variant().c_str(), m.backend().c_str(), m.elapsed_ms(),
                    static_cast<unsigned long long>(m.sequence()),
                    layers.c_str());
      } else {
        std::printf("%s  seq %-8llu step %-10lld R_V %-12s %s/%s %.3f ms\n",
                    Timestamp(m).c_str(),
                    static_cast<unsigned long long>(m.sequence()),
                    static_cast<long long>(m.step()), RvText(m).c_str(),
                    m.variant().c_str(), m.backend().c_str(), m.elapsed_ms());
      }
      first = false;
    }
    if (!paging || !page->more() || page->measurements().empty()) break;
    request.set_after_sequence(
        page->measurements(page->measurements_size() - 1).sequence());
  }
  if (format == "json") std::printf("%s]\n", first ? "" : "\n");
  std::fflush(stdout);
  return 0;
}

int Models(rvd::RvdClient& client) {
  absl::StatusOr<std::vector<rvd::v1::ModelSummary>> models =
      client.ListModels();
  if (!models.ok()) return Fail(models.status());
  if (absl::GetFlag(FLAGS_json)) {
    json all = json::array();
    for (const auto& s : *models) {
      all.push_back({{"model_id", s.model_id()},
                     {"measurements", s.measurements()},
                     {"latest", ToJson(s.latest())}});
    }
    std::cout << all.dump() << std::endl;
    return 0;
  }
  for (const auto& s : *models) {
    std::printf(
        "%-40s %6llu measurements  latest step %lld  R_V %s\n",
        s.model_id().c_str(), static_cast<unsigned long long>(s.measurements()),
        static_cast<long long>(s.latest().step()), RvText(s.latest()).c_str());
  }
  return 0;
}

const char* AlertStateText(rvd::v1::AlertState s) {
  switch (s) {
    case rvd::v1::ALERT_STATE_INACTIVE:
      return "inactive";
    case rvd::v1::ALERT_STATE_PENDING:
      return "pending";
    case rvd::v1::ALERT_STATE_FIRING:
      return "firing";
    case rvd::v1::ALERT_STATE_RESOLVED:
      return "resolved";
    default:
      return "unspecified";
  }
}

// An alert event as one line: "alert FIRING rv_floor model m ..." or, with
// --json, {"alert": {...}}.
void PrintAlert(const rvd::v1::AlertEvent& a) {
  if (absl::GetFlag(FLAGS_json)) {
    json labels = json::object(), annotations = json::object();
    for (const auto& [k, v] : a.labels()) labels[k] = v;
    for (const auto& [k, v] : a.annotations()) annotations[k] = v;
    std::cout << json{{"alert",
                       {{"sequence", a.sequence()},
                        {"alert", a.alert()},
                        {"model_id", a.model_id()},
                        {"state", AlertStateText(a.state())},
                        {"previous_state", AlertStateText(a.previous_state())},
                        {"since_seconds", a.since().seconds()},
                        {"value", a.value()},
                        {"observed", a.observed()},
                        {"threshold", a.threshold()},
                        {"baseline", a.baseline()},
                        {"measurement_sequence", a.measurement_sequence()},
                        {"step", a.step()},
                        {"severity", a.severity()},
                        {"labels", labels},
                        {"annotations", annotations},
                        {"description", a.description()}}}}
                     .dump()
              << std::endl;
    return;
  }
  std::string state = AlertStateText(a.state());
  for (char& c : state) c = static_cast<char>(std::toupper(c));
  std::printf(
      "alert %s %s model %s (alert sequence %llu, measurement %llu, step "
      "%lld, severity %s): %s\n",
      state.c_str(), a.alert().c_str(), a.model_id().c_str(),
      static_cast<unsigned long long>(a.sequence()),
      static_cast<unsigned long long>(a.measurement_sequence()),
      static_cast<long long>(a.step()), a.severity().c_str(),
      a.description().c_str());
}

const char* GapReasonText(rvd::v1::GapReason r) {
  switch (r) {
    case rvd::v1::GAP_REASON_SLOW_CONSUMER:
      return "slow_consumer";
    case rvd::v1::GAP_REASON_NOT_RETAINED:
      return "not_retained";
    default:
      return "unspecified";
  }
}

// Prints each event as it comes: a measurement as `measure` prints one, a
// gap as a line of its own ({"gap": {...}} with --json), so that a reader
// of the output knows exactly what it did not see.
int Watch(rvd::RvdClient& client, const std::string& model_id) {
  const int64_t after = absl::GetFlag(FLAGS_after);
  if (after < -1) return Usage("--after takes a sequence number >= 0");
  std::optional<uint64_t> cursor;
  if (after >= 0) cursor = static_cast<uint64_t>(after);
  const int64_t alerts_after = absl::GetFlag(FLAGS_alerts_after);
  if (alerts_after < -1) {
    return Usage("--alerts-after takes a sequence number >= 0");
  }
  std::optional<uint64_t> alert_cursor;
  if (alerts_after >= 0) alert_cursor = static_cast<uint64_t>(alerts_after);
  std::mutex print_mu;  // one event's lines at a time, from either stream
  absl::Status alerts_status;
  std::thread alerts;
  if (absl::GetFlag(FLAGS_alerts)) {
    alerts = std::thread([&] {
      alerts_status = client.WatchAlerts(
          model_id, alert_cursor,
          [&print_mu](const rvd::v1::AlertWatchEvent& e) {
            std::lock_guard<std::mutex> lock(print_mu);
            if (e.has_alert()) {
              PrintAlert(e.alert());
            } else if (e.has_gap()) {
              const rvd::v1::Gap& g = e.gap();
              if (absl::GetFlag(FLAGS_json)) {
                std::cout << json{{"alert_gap",
                                   {{"first_sequence", g.first_sequence()},
                                    {"last_sequence", g.last_sequence()},
                                    {"missed", g.missed()},
                                    {"reason", GapReasonText(g.reason())}}}}
                                 .dump()
                          << std::endl;
              } else {
                std::printf(
                    "alert gap: alert sequence %llu..%llu not delivered (%s); "
                    "--alerts-after %llu fetches what rvd still keeps\n",
                    static_cast<unsigned long long>(g.first_sequence()),
                    static_cast<unsigned long long>(g.last_sequence()),
                    GapReasonText(g.reason()),
                    static_cast<unsigned long long>(g.first_sequence() - 1));
              }
            }
            std::fflush(stdout);
            return true;
          });
      if (alerts_status.code() == absl::StatusCode::kUnimplemented) {
        // An rvd without alerts: the measurements go on alone.
        std::fprintf(stderr, "rvctl: rvd does not serve WatchAlerts; "
                             "showing measurements only\n");
        alerts_status = absl::OkStatus();
        return;
      }
      client.CancelWatches();  // the alert stream ended: so does the other
    });
  }
  absl::Status s =
      client.Watch(model_id, cursor, [&print_mu](const rvd::v1::WatchEvent& e) {
        std::lock_guard<std::mutex> lock(print_mu);
        if (e.has_measurement()) {
          PrintMeasurement(e.measurement());
        } else if (e.has_gap()) {
          const rvd::v1::Gap& g = e.gap();
          if (absl::GetFlag(FLAGS_json)) {
            std::cout << json{{"gap",
                               {{"first_sequence", g.first_sequence()},
                                {"last_sequence", g.last_sequence()},
                                {"missed", g.missed()},
                                {"reason", GapReasonText(g.reason())}}}}
                             .dump()
                      << std::endl;
          } else {
            std::printf(
                "gap: sequence %llu..%llu not delivered (%s, %llu missed); "
                "--after %llu fetches what rvd still keeps\n",
                static_cast<unsigned long long>(g.first_sequence()),
                static_cast<unsigned long long>(g.last_sequence()),
                GapReasonText(g.reason()),
                static_cast<unsigned long long>(g.missed()),
                static_cast<unsigned long long>(g.first_sequence() - 1));
          }
        }
        std::fflush(stdout);
        return true;
      });
  // The measurement stream ended (rvd shut down, or a bad cursor): so does
  // the alert stream.
  client.CancelWatches();
  if (alerts.joinable()) alerts.join();
  if (!s.ok()) return Fail(s);
  return alerts_status.ok() ? 0 : Fail(alerts_status);
}

// The connection flags; the token from --auth-token-file, else from
// $RVD_AUTH_TOKEN (a file keeps it out of `ps` and shell history).
absl::StatusOr<rvd::ChannelOptions> ChannelOptionsFromFlags() {
  rvd::ChannelOptions options;
  options.address = absl::GetFlag(FLAGS_address);
  options.tls = absl::GetFlag(FLAGS_tls);
  options.tls_ca_file = absl::GetFlag(FLAGS_tls_ca_file);
  options.tls_cert_file = absl::GetFlag(FLAGS_tls_cert_file);
  options.tls_key_file = absl::GetFlag(FLAGS_tls_key_file);
  options.tls_server_name = absl::GetFlag(FLAGS_tls_server_name);
  const std::string token_file = absl::GetFlag(FLAGS_auth_token_file);
  if (!token_file.empty()) {
    absl::StatusOr<std::string> token = rvd::ReadAuthTokenFile(token_file);
    if (!token.ok()) return token.status();
    options.auth_token = *std::move(token);
  } else if (const char* env = std::getenv("RVD_AUTH_TOKEN");
             env != nullptr && env[0] != '\0') {
    options.auth_token = env;
  }
  return options;
}

// Lets users write --model-id as well as --model_id: absl flag names are
// identifiers, the CLI convention is dashes.
std::vector<char*> DashesToUnderscores(int argc, char** argv) {
  for (int i = 1; i < argc && std::string(argv[i]) != "--"; ++i) {
    if (argv[i][0] != '-' || argv[i][1] != '-') continue;
    for (char* c = argv[i] + 2; *c != '\0' && *c != '='; ++c)
      *c = *c == '-' ? '_' : *c;
  }
  return std::vector<char*>(argv, argv + argc);
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "usage:\n"
      "  rvctl [--address HOST:PORT] measure PATH --model-id ID [--step N]\n"
      "        [--early A-B] [--late A-B] [--per-head] [--variant NAME] "
      "[--json]\n"
      "        [--arch TYPE --num-heads H --num-kv-heads K --head-dim D]\n"
      "  rvctl history ID [--limit N] [--json|--csv]\n"
      "        [--from-step N] [--to-step N] [--since T] [--until T] "
      "[--format text|json|csv]\n"
      "  rvctl delete ID\n"
      "  rvctl latest ID [--json]\n"
      "  rvctl models [--json]\n"
      "  rvctl watch [ID] [--after SEQ] [--alerts-after SEQ] [--noalerts] "
      "[--json]\n"
      "  rvctl tune start --shape-class C [--dtype D] [--shapes NxRxC,...] "
      "[--generator G]\n"
      "        [--max-iter N] [--patience N] [--min-improvement F] [--seed N] "
      "[--start naive|product] [--device N]\n"
      "  rvctl tune status|watch|cancel ID, rvctl tune list   [--json]\n"
      "connection: [--tls-ca-file CA.pem | --tls] [--tls-cert-file C.pem "
      "--tls-key-file K.pem]\n"
      "        [--auth-token-file FILE] (or RVD_AUTH_TOKEN in the "
      "environment)");
  std::vector<char*> args = DashesToUnderscores(argc, argv);
  std::vector<char*> positional =
      absl::ParseCommandLine(args.size(), args.data());
  if (positional.size() < 2) return Usage("no command given");
  const std::string command = positional[1];
  const std::string arg = positional.size() > 2 ? positional[2] : "";
  if (positional.size() > 3 && command != "tune") return Usage("too many arguments");
  absl::StatusOr<rvd::ChannelOptions> options = ChannelOptionsFromFlags();
  if (!options.ok()) return Fail(options.status());
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
      rvd::CreateRvdChannel(*options);
  if (!channel.ok()) return Fail(channel.status());
  if (command == "tune") {
    return rvd::RunTuneCommand(
        *channel, std::vector<std::string>(positional.begin() + 2, positional.end()));
  }
  rvd::RvdClient client(*channel);

  if (command == "measure") {
    if (arg.empty()) return Usage("measure needs a PATH");
    return Measure(client, arg);
  }
  if (command == "history") {
    if (arg.empty()) return Usage("history needs a model id");
    if (HasRangeFlags()) return HistoryRange(client, arg);
    return History(client, arg);
  }
  if (command == "delete") {
    if (arg.empty()) return Usage("delete needs a model id");
    absl::StatusOr<uint64_t> n = client.DeleteModelHistory(arg);
    if (!n.ok()) return Fail(n.status());
    std::printf("deleted %llu measurements of model %s\n",
                static_cast<unsigned long long>(*n), arg.c_str());
    return 0;
  }
  if (command == "latest") {
    if (arg.empty()) return Usage("latest needs a model id");
    absl::StatusOr<Measurement> m = client.GetLatest(arg);
    if (!m.ok()) return Fail(m.status());
    PrintMeasurement(*m);
    return 0;
  }
  if (command == "models") return Models(client);
  if (command == "watch") return Watch(client, arg);
  return Usage("unknown command '" + command + "'");
}

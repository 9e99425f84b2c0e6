// rvd_models: lists the models an rvd daemon has measured, with each one's
// latest R_V. A small program built against the installed rvd::client
// package (client/examples/CMakeLists.txt).
//
//   rvd_models [--address HOST:PORT] [--tls-ca-file CA.pem]
//              [--tls-cert-file C.pem --tls-key-file K.pem]
//              [--auth-token-file FILE]
//
// Exit status: 0 on success, 1 when the call fails, 2 on a usage error.
#include <cstdio>
#include <cstring>
#include <string>

#include "client/cpp/channel.h"
#include "client/cpp/rvd_client.h"

namespace {

constexpr char kUsage[] =
    "usage: rvd_models [--address HOST:PORT] [--tls-ca-file CA.pem]\n"
    "                  [--tls-cert-file C.pem --tls-key-file K.pem]\n"
    "                  [--auth-token-file FILE]\n";

}  // namespace

int main(int argc, char** argv) {
  rvd::ChannelOptions options;
  std::string token_file;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "rvd_models: %s needs a value\n%s", flag.c_str(), kUsage);
      return 2;
    }
    const std::string value = argv[++i];
    if (flag == "--address") {
      options.address = value;
    } else if (flag == "--tls-ca-file") {
      options.tls_ca_file = value;
    } else if (flag == "--tls-cert-file") {
      options.tls_cert_file = value;
    } else if (flag == "--tls-key-file") {
      options.tls_key_file = value;
    } else if (flag == "--auth-token-file") {
      token_file = value;
    } else {
      std::fprintf(stderr, "rvd_models: unknown flag %s\n%s", flag.c_str(), kUsage);
      return 2;
    }
  }
  if (!token_file.empty()) {
    absl::StatusOr<std::string> token = rvd::ReadAuthTokenFile(token_file);
    if (!token.ok()) {
      std::fprintf(stderr, "rvd_models: %s\n", token.status().ToString().c_str());
      return 1;
    }
    options.auth_token = *token;
  }
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
      rvd::CreateRvdChannel(options);
  if (!channel.ok()) {
    std::fprintf(stderr, "rvd_models: %s\n", channel.status().ToString().c_str());
    return 1;
  }
  rvd::RvdClient client(*channel);
  absl::StatusOr<std::vector<rvd::v1::ModelSummary>> models = client.ListModels();
  if (!models.ok()) {
    std::fprintf(stderr, "rvd_models: %s\n", models.status().ToString().c_str());
    return 1;
  }
  std::printf("%zu models\n", models->size());
  for (const rvd::v1::ModelSummary& m : *models) {
    std::printf("%s step %lld R_V %.6f\n", m.model_id().c_str(),
                static_cast<long long>(m.latest().step()), m.latest().rv());
  }
  return 0;
}

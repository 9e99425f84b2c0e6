#include "client/cpp/channel.h"

#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/channel_arguments.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "rvd/v1/limits.h"

namespace rvd {
namespace {

// Anything larger is not a PEM file or a token (a wrong path).
constexpr std::streamsize kMaxFileBytes = 1 << 20;

absl::StatusOr<std::string> ReadFile(const std::string& what,
                                     const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, ": cannot open ", path, ": ", std::strerror(errno)));
  }
  std::string text(kMaxFileBytes + 1, '\0');
  in.read(text.data(), kMaxFileBytes + 1);
  if (in.bad()) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, ": read error on ", path));
  }
  if (in.gcount() > kMaxFileBytes) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, ": ", path, " is larger than 1 MiB: not a PEM file or a token"));
  }
  text.resize(static_cast<size_t>(in.gcount()));
  return text;
}

absl::StatusOr<std::string> ReadPem(const std::string& what,
                                    const std::string& path,
                                    const char* marker) {
  absl::StatusOr<std::string> text = ReadFile(what, path);
  if (!text.ok()) return text;
  // gRPC would take any bytes and fail each handshake later, vaguely.
  if (text->find(marker) == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", path, " holds no PEM ", marker, " block"));
  }
  return text;
}

}  // namespace

absl::StatusOr<std::string> ReadAuthTokenFile(const std::string& path) {
  absl::StatusOr<std::string> text = ReadFile("auth token file", path);
  if (!text.ok()) return text;
  absl::string_view token = absl::StripAsciiWhitespace(*text);
  if (token.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("auth token file ", path, " is empty"));
  }
  for (char c : token) {
    if (c <= ' ' || c > '~') {
      return absl::InvalidArgumentError(absl::StrCat(
          "auth token file ", path,
          ": the token must be visible ASCII characters on one line"));
    }
  }
  return std::string(token);
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> CreateRvdChannel(
    const ChannelOptions& options) {
  if (options.tls_cert_file.empty() != options.tls_key_file.empty()) {
    return absl::InvalidArgumentError(
        "tls_cert_file and tls_key_file (--tls-cert-file, --tls-key-file) "
        "go together: a client certificate needs its key");
  }
  for (char c : options.auth_token) {
    if (c <= ' ' || c > '~') {
      return absl::InvalidArgumentError(
          "the auth token must be visible ASCII characters (no spaces)");
    }
  }
  const bool tls = options.tls || !options.tls_ca_file.empty() ||
                   !options.tls_cert_file.empty();
  if (!options.auth_token.empty() && !tls) {
    return absl::InvalidArgumentError(
        "an auth token needs TLS (--tls-ca-file or --tls): gRPC sends call "
        "credentials over secure channels only");
  }
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(rvd::v1::kMaxReplyMessageBytes);
  args.SetMaxSendMessageSize(rvd::v1::kMaxRequestMessageBytes);
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  if (!tls) {
    credentials = grpc::InsecureChannelCredentials();
  } else {
    grpc::SslCredentialsOptions ssl;
    if (!options.tls_ca_file.empty()) {
      absl::StatusOr<std::string> ca =
          ReadPem("tls_ca_file", options.tls_ca_file, "CERTIFICATE");
      if (!ca.ok()) return ca.status();
      ssl.pem_root_certs = *std::move(ca);
    }
    if (!options.tls_cert_file.empty()) {
      absl::StatusOr<std::string> cert =
          ReadPem("tls_cert_file", options.tls_cert_file, "CERTIFICATE");
      if (!cert.ok()) return cert.status();
      absl::StatusOr<std::string> key =
          ReadPem("tls_key_file", options.tls_key_file, "PRIVATE KEY");
      if (!key.ok()) return key.status();
      ssl.pem_cert_chain = *std::move(cert);
      ssl.pem_private_key = *std::move(key);
    }
    credentials = grpc::SslCredentials(ssl);
    if (!options.auth_token.empty()) {
      credentials = grpc::CompositeChannelCredentials(
          credentials, grpc::AccessTokenCredentials(options.auth_token));
    }
    if (!options.tls_server_name.empty()) {
      args.SetSslTargetNameOverride(options.tls_server_name);
    }
  }
  return grpc::CreateCustomChannel(options.address, credentials, args);
}

}  // namespace rvd

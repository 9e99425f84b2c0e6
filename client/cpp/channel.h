// How a client reaches rvd: the address, transport security (TLS with a CA
// to verify rvd's certificate, a client certificate for mutual TLS) and the
// bearer token sent on every call. The settings mirror the daemon's
// (server/security.h):
//
//   daemon                       client (ChannelOptions; rvctl flag)
//   tls_cert_file, tls_key_file  tls_ca_file: the CA that signed the
//                                daemon's certificate (--tls-ca-file), or
//                                tls with the system's roots (--tls)
//   tls_client_ca_file           tls_cert_file + tls_key_file: a client
//                                certificate that CA signed
//                                (--tls-cert-file, --tls-key-file)
//   auth_token_file              auth_token (--auth-token-file FILE, or
//                                the environment variable RVD_AUTH_TOKEN)
//
// Usage:
//   rvd::ChannelOptions options;
//   options.address = "rvd.example:50051";
//   options.tls_ca_file = "/etc/rvd/ca.pem";
//   absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
//       rvd::CreateRvdChannel(options);
//   if (!channel.ok()) ...;
//   rvd::RvdClient client(*channel);
#ifndef RVD_CLIENT_CPP_CHANNEL_H_
#define RVD_CLIENT_CPP_CHANNEL_H_

#include <grpcpp/channel.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace rvd {

struct ChannelOptions {
  std::string address = "127.0.0.1:50051";  // HOST:PORT
  // TLS is on when tls is true or any of the three files is set.
  bool tls = false;
  std::string tls_ca_file;    // PEM roots for rvd's certificate; "": system's
  std::string tls_cert_file;  // PEM client certificate chain (mutual TLS)
  std::string tls_key_file;   // PEM private key of tls_cert_file
  // The name rvd's certificate must carry; "": the host of `address`.
  std::string tls_server_name;
  // Sent as "authorization: Bearer <auth_token>" on every call; needs TLS
  // (gRPC attaches call credentials to secure channels only).
  std::string auth_token;
};

// A channel with rvd's message size limits. Reads the PEM files now: a
// missing file or an inconsistent setting (a certificate without its key, a
// token without TLS) is an error naming the option.
absl::StatusOr<std::shared_ptr<grpc::Channel>> CreateRvdChannel(
    const ChannelOptions& options);

// The token in `path`: its content up to trailing whitespace. Empty, or
// with spaces or control characters inside: INVALID_ARGUMENT (the message
// never quotes the token).
absl::StatusOr<std::string> ReadAuthTokenFile(const std::string& path);

}  // namespace rvd

#endif  // RVD_CLIENT_CPP_CHANNEL_H_

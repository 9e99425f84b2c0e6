// Transport security and authentication of rvd's gRPC port: TLS (a server
// certificate and key), mutual TLS (client certificates verified against a
// CA), and a bearer token required on every call but health checks.
//
// Config keys (each also a flag of the same name, with dashes):
//   tls_cert_file + tls_key_file  PEM certificate chain and private key: TLS.
//   tls_client_ca_file            PEM CA bundle: clients must present a
//                                 certificate it signed (mutual TLS).
//   auth_token_file               a file holding the token; every call must
//                                 carry "authorization: Bearer <token>".
// The token requires TLS (ValidateSecurityConfig): over plaintext it would
// cross the network readable, and gRPC's clients attach call credentials
// only to secure channels. grpc.health.v1.Health stays open without a token
// so that probes (kubelet's grpc probe, grpc_health_probe) work.
//
// MakeServerSecurity reads and checks every file once, at start: a missing
// file, a PEM that does not parse, or a key that does not match its
// certificate is an error naming the config key, before rvd listens.
#ifndef RVD_SERVER_SECURITY_H_
#define RVD_SERVER_SECURITY_H_

#include <grpcpp/security/auth_metadata_processor.h>
#include <grpcpp/security/server_credentials.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/config.h"

namespace rvd {

// The credentials rvd listens with, and a line for the start log.
struct ServerSecurity {
  std::shared_ptr<grpc::ServerCredentials> credentials;
  bool tls = false;
  // "plaintext", "TLS", "mutual TLS", each + ", bearer token" when set.
  // Never contains the token.
  std::string description;
};

// Which keys go together (cert with key; client CA and token need TLS).
// Called by ValidateConfig; errors name the keys.
absl::Status ValidateSecurityConfig(const Config& config);

// Reads and checks the files `config` names; see the file comment.
absl::StatusOr<ServerSecurity> MakeServerSecurity(const Config& config);

// Reads a token file: its content up to trailing whitespace (a newline an
// editor added). Empty, or with a character not allowed in an HTTP header
// value (control characters, spaces): INVALID_ARGUMENT. The message never
// contains the token.
absl::StatusOr<std::string> ReadTokenFile(absl::string_view what,
                                          const std::string& path);

// Whether `a` equals `b`, in time that depends on the sizes only, never on
// where the first difference lies (so a caller cannot find the token byte
// by byte by timing refusals).
bool ConstantTimeEquals(absl::string_view a, absl::string_view b);

// True for localhost, 127.0.0.0/8 and [::1]: hosts no other machine reaches.
bool IsLoopbackHost(absl::string_view host);

// What the start log warns about when grpc_address is reachable from other
// hosts (not IsLoopbackHost): plaintext, or TLS that authenticates no
// client (neither a token nor a client CA). "": nothing to warn about.
std::string ExposureWarning(const Config& config);

// The gRPC method paths served without a token (health checking).
bool IsOpenMethod(absl::string_view path);

// Checks "authorization: Bearer <token>" on every call but IsOpenMethod's;
// a missing or wrong one is UNAUTHENTICATED. The header is consumed: the
// handlers (and anything that logs metadata) never see it. Runs on gRPC's
// transport threads; it only compares bytes, so it does not block.
class TokenAuthProcessor final : public grpc::AuthMetadataProcessor {
 public:
  explicit TokenAuthProcessor(std::string token) : token_(std::move(token)) {}

  bool IsBlocking() const override { return false; }
  grpc::Status Process(const InputMetadata& auth_metadata,
                       grpc::AuthContext* context,
                       OutputMetadata* consumed_auth_metadata,
                       OutputMetadata* response_metadata) override;

 private:
  const std::string token_;  // never logged
};

}  // namespace rvd

#endif  // RVD_SERVER_SECURITY_H_

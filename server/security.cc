#include "server/security.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace rvd {
namespace {

constexpr absl::string_view kBearer = "Bearer ";
// The largest file read as a certificate, key, CA bundle or token: anything
// bigger is a wrong path (a log, a checkpoint), not a PEM.
constexpr size_t kMaxSecurityFileBytes = 1 << 20;

absl::StatusOr<std::string> ReadSmallFile(absl::string_view what,
                                          const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, ": cannot open ", path, ": ", std::strerror(errno)));
  }
  std::string text;
  text.resize(kMaxSecurityFileBytes + 1);
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  if (in.bad()) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, ": read error on ", path));
  }
  text.resize(static_cast<size_t>(in.gcount()));
  if (text.size() > kMaxSecurityFileBytes) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, ": ", path, " is larger than ", kMaxSecurityFileBytes,
        " bytes: not a PEM file or a token"));
  }
  return text;
}

// OpenSSL's reason for the last failure, and its error queue cleared.
std::string OpenSslError() {
  const unsigned long code = ERR_peek_last_error();
  std::string reason = code != 0 ? ERR_reason_error_string(code) != nullptr
                                       ? ERR_reason_error_string(code)
                                       : "unknown"
                                 : "no PEM data";
  ERR_clear_error();
  return reason;
}

// The certificates of a PEM bundle; at least one, or an error saying why.
absl::StatusOr<std::vector<X509*>> ParseCertificates(absl::string_view what,
                                                     const std::string& path,
                                                     const std::string& pem) {
  BIO* bio = BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size()));
  std::vector<X509*> certs;
  while (X509* cert = PEM_read_bio_X509(bio, nullptr, nullptr, nullptr)) {
    certs.push_back(cert);
  }
  BIO_free(bio);
  // Reading stops with "no start line" at the end of the bundle; that is
  // not an error once a certificate has been read.
  const std::string reason = OpenSslError();
  if (certs.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": ", path, " holds no PEM certificate (", reason, ")"));
  }
  return certs;
}

void FreeCertificates(std::vector<X509*>& certs) {
  for (X509* c : certs) X509_free(c);
  certs.clear();
}

// Checks the server's chain and key: both parse and the key is the leaf
// certificate's. gRPC would otherwise accept them and fail each handshake.
absl::Status CheckKeyPair(const Config& config, const std::string& cert_pem,
                          const std::string& key_pem) {
  absl::StatusOr<std::vector<X509*>> certs = ParseCertificates(
      "config key 'tls_cert_file'", config.tls_cert_file, cert_pem);
  if (!certs.ok()) return certs.status();
  BIO* bio = BIO_new_mem_buf(key_pem.data(), static_cast<int>(key_pem.size()));
  EVP_PKEY* key = PEM_read_bio_PrivateKey(bio, nullptr, nullptr, nullptr);
  BIO_free(bio);
  absl::Status status;
  if (key == nullptr) {
    status = absl::InvalidArgumentError(absl::StrCat(
        "config key 'tls_key_file': ", config.tls_key_file,
        " holds no unencrypted PEM private key (", OpenSslError(), ")"));
  } else if (X509_check_private_key(certs->front(), key) != 1) {
    ERR_clear_error();
    status = absl::InvalidArgumentError(absl::StrCat(
        "config key 'tls_key_file': the key in ", config.tls_key_file,
        " does not belong to the first certificate of ", config.tls_cert_file));
  }
  EVP_PKEY_free(key);
  FreeCertificates(*certs);
  return status;
}

}  // namespace

bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  // Every byte of `a` is compared (against `b` cycled), so the time depends
  // on a.size() alone; unequal sizes still compare every byte.
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  if (b.empty()) return a.empty();
  for (size_t i = 0; i < a.size(); ++i) {
    diff |= static_cast<unsigned char>(a[i] ^ b[i % b.size()]);
  }
  return diff == 0;
}

bool IsLoopbackHost(absl::string_view host) {
  if (absl::EqualsIgnoreCase(host, "localhost")) return true;
  if (host == "[::1]") return true;
  std::vector<absl::string_view> parts = absl::StrSplit(host, '.');
  int first = 0;
  if (parts.size() != 4 || !absl::SimpleAtoi(parts[0], &first)) return false;
  for (absl::string_view p : parts) {
    int octet = 0;
    if (!absl::SimpleAtoi(p, &octet) || octet < 0 || octet > 255) return false;
  }
  return first == 127;
}

std::string ExposureWarning(const Config& config) {
  absl::StatusOr<HostPort> hp =
      ParseHostPort("config key 'grpc_address'", config.grpc_address);
  if (!hp.ok() || IsLoopbackHost(hp->host)) return "";
  if (config.tls_cert_file.empty()) {
    return absl::StrCat(
        "gRPC on ", config.grpc_address,
        " is plaintext and reachable from other hosts: anyone who reaches it "
        "can measure and read history (set tls_cert_file and tls_key_file, "
        "and auth_token_file or tls_client_ca_file)");
  }
  if (config.auth_token_file.empty() && config.tls_client_ca_file.empty()) {
    return absl::StrCat(
        "gRPC on ", config.grpc_address,
        " is reachable from other hosts over TLS that authenticates no "
        "client: anyone who reaches it can measure and read history (set "
        "auth_token_file or tls_client_ca_file)");
  }
  return "";
}

bool IsOpenMethod(absl::string_view path) {
  return absl::StartsWith(path, "/grpc.health.v1.Health/");
}

absl::StatusOr<std::string> ReadTokenFile(absl::string_view what,
                                          const std::string& path) {
  absl::StatusOr<std::string> text = ReadSmallFile(what, path);
  if (!text.ok()) return text.status();
  absl::string_view token = absl::StripTrailingAsciiWhitespace(*text);
  if (token.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", path, " is empty"));
  }
  for (char c : token) {
    // The token goes into a header value after "Bearer ": visible ASCII.
    if (c <= ' ' || c > '~') {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": ", path,
          " must hold one token of visible ASCII characters (no spaces or "
          "control characters) on one line"));
    }
  }
  return std::string(token);
}

grpc::Status TokenAuthProcessor::Process(const InputMetadata& auth_metadata,
                                         grpc::AuthContext* /*context*/,
                                         OutputMetadata* consumed_auth_metadata,
                                         OutputMetadata* /*response_metadata*/) {
  auto path = auth_metadata.find(":path");
  const bool open = path != auth_metadata.end() &&
                    IsOpenMethod(absl::string_view(path->second.data(),
                                                   path->second.size()));
  auto header = auth_metadata.find("authorization");
  if (header == auth_metadata.end()) {
    if (open) return grpc::Status::OK;
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "this rvd requires a bearer token "
                        "(authorization: Bearer <token>)");
  }
  const absl::string_view value(header->second.data(), header->second.size());
  // Consumed: removed from the metadata the handlers see.
  consumed_auth_metadata->insert(std::make_pair(
      std::string(header->first.data(), header->first.size()),
      std::string(value)));
  if (open) return grpc::Status::OK;
  if (!absl::StartsWith(value, kBearer) ||
      !ConstantTimeEquals(value.substr(kBearer.size()), token_)) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "wrong bearer token");
  }
  return grpc::Status::OK;
}

absl::Status ValidateSecurityConfig(const Config& config) {
  std::vector<std::string> errors;
  const bool tls = !config.tls_cert_file.empty();
  if (tls != !config.tls_key_file.empty()) {
    errors.push_back(
        "config keys 'tls_cert_file' and 'tls_key_file': give both (TLS) or "
        "neither (plaintext)");
  }
  if (!config.tls_client_ca_file.empty() && !tls) {
    errors.push_back(
        "config key 'tls_client_ca_file': mutual TLS needs 'tls_cert_file' "
        "and 'tls_key_file' too");
  }
  if (!config.auth_token_file.empty() && !tls) {
    errors.push_back(
        "config key 'auth_token_file': a bearer token needs TLS "
        "('tls_cert_file' and 'tls_key_file'): over plaintext the token "
        "crosses the network readable");
  }
  if (errors.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrJoin(errors, "; "));
}

absl::StatusOr<ServerSecurity> MakeServerSecurity(const Config& config) {
  if (absl::Status s = ValidateSecurityConfig(config); !s.ok()) return s;
  ServerSecurity out;
  if (config.tls_cert_file.empty()) {
    out.credentials = grpc::InsecureServerCredentials();
    out.description = "plaintext";
    return out;
  }
  absl::StatusOr<std::string> cert =
      ReadSmallFile("config key 'tls_cert_file'", config.tls_cert_file);
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key =
      ReadSmallFile("config key 'tls_key_file'", config.tls_key_file);
  if (!key.ok()) return key.status();
  if (absl::Status s = CheckKeyPair(config, *cert, *key); !s.ok()) return s;

  grpc::SslServerCredentialsOptions options(
      GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  options.pem_key_cert_pairs.push_back({*key, *cert});
  out.description = "TLS";
  if (!config.tls_client_ca_file.empty()) {
    absl::StatusOr<std::string> ca = ReadSmallFile(
        "config key 'tls_client_ca_file'", config.tls_client_ca_file);
    if (!ca.ok()) return ca.status();
    absl::StatusOr<std::vector<X509*>> ca_certs = ParseCertificates(
        "config key 'tls_client_ca_file'", config.tls_client_ca_file, *ca);
    if (!ca_certs.ok()) return ca_certs.status();
    FreeCertificates(*ca_certs);
    options.pem_root_certs = *ca;
    options.client_certificate_request =
        GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
    out.description = "mutual TLS";
  }
  out.credentials = grpc::SslServerCredentials(options);
  out.tls = true;
  if (!config.auth_token_file.empty()) {
    absl::StatusOr<std::string> token =
        ReadTokenFile("config key 'auth_token_file'", config.auth_token_file);
    if (!token.ok()) return token.status();
    out.credentials->SetAuthMetadataProcessor(
        std::make_shared<TokenAuthProcessor>(*std::move(token)));
    absl::StrAppend(&out.description, ", bearer token");
  }
  return out;
}

}  // namespace rvd

#include "server/security.h"

#include <grpcpp/support/string_ref.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/config.h"

namespace rvd {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kToken[] = "tok-3f9a1c";

// Runs the processor over one call's metadata; returns the status and what
// it consumed.
struct Outcome {
  grpc::Status status;
  std::multimap<std::string, std::string> consumed;
};
Outcome Authorize(const std::multimap<std::string, std::string>& metadata) {
  TokenAuthProcessor processor(kToken);
  grpc::AuthMetadataProcessor::InputMetadata in;
  for (const auto& [k, v] : metadata) {
    in.insert({grpc::string_ref(k), grpc::string_ref(v)});
  }
  grpc::AuthMetadataProcessor::OutputMetadata consumed, response;
  Outcome out;
  out.status = processor.Process(in, nullptr, &consumed, &response);
  out.consumed = consumed;
  return out;
}

TEST(TokenAuthProcessorTest, RightTokenPassesAndIsConsumed) {
  Outcome o = Authorize({{":path", "/rvd.v1.Rvd/ListModels"},
                   {"authorization", std::string("Bearer ") + kToken}});
  EXPECT_TRUE(o.status.ok()) << o.status.error_message();
  // Consumed: the handlers never see the token.
  EXPECT_EQ(o.consumed.count("authorization"), 1u);
}

TEST(TokenAuthProcessorTest, MissingOrWrongTokenIsUnauthenticated) {
  const std::string good = std::string("Bearer ") + kToken;
  for (const std::string& value :
       {std::string(""), std::string("Bearer "), std::string(kToken),
        std::string("bearer ") + kToken, good.substr(0, good.size() - 1),
        good + "x", std::string("Bearer tok-3f9a1d"), std::string("Basic abc")}) {
    Outcome o = Authorize({{":path", "/rvd.v1.Rvd/GetLatest"}, {"authorization", value}});
    EXPECT_EQ(o.status.error_code(), grpc::StatusCode::UNAUTHENTICATED) << value;
    // The refusal never quotes the token it expected.
    EXPECT_THAT(o.status.error_message(), Not(HasSubstr(kToken)));
  }
  Outcome none = Authorize({{":path", "/rvd.v1.Rvd/MeasureStream"}});
  EXPECT_EQ(none.status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(none.status.error_message(), HasSubstr("requires a bearer token"));
  // No :path at all (never sent by gRPC): not open, so refused.
  EXPECT_EQ(Authorize({}).status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
}

TEST(TokenAuthProcessorTest, HealthIsOpenEverythingElseIsNot) {
  EXPECT_TRUE(Authorize({{":path", "/grpc.health.v1.Health/Check"}}).status.ok());
  EXPECT_TRUE(Authorize({{":path", "/grpc.health.v1.Health/Watch"}}).status.ok());
  // A wrong token on a health check is consumed and ignored.
  Outcome o = Authorize({{":path", "/grpc.health.v1.Health/Check"},
                   {"authorization", "Bearer nope"}});
  EXPECT_TRUE(o.status.ok());
  EXPECT_EQ(o.consumed.count("authorization"), 1u);
  for (const char* path :
       {"/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
        "/grpc.health.v1.HealthX/Check", "/rvd.v1.Rvd/WatchMeasurements",
        "grpc.health.v1.Health/Check"}) {
    EXPECT_EQ(Authorize({{":path", path}}).status.error_code(),
              grpc::StatusCode::UNAUTHENTICATED)
        << path;
  }
}

TEST(ConstantTimeEqualsTest, EqualsOnlyTheSameBytes) {
  EXPECT_TRUE(ConstantTimeEquals("", ""));
  EXPECT_TRUE(ConstantTimeEquals("abc", "abc"));
  EXPECT_FALSE(ConstantTimeEquals("abc", "abd"));
  EXPECT_FALSE(ConstantTimeEquals("abd", "abc"));
  EXPECT_FALSE(ConstantTimeEquals("ab", "abc"));
  EXPECT_FALSE(ConstantTimeEquals("abc", "ab"));
  EXPECT_FALSE(ConstantTimeEquals("abcabc", "abc"));  // b cycled: still unequal
  EXPECT_FALSE(ConstantTimeEquals("", "a"));
  EXPECT_FALSE(ConstantTimeEquals("a", ""));
  EXPECT_FALSE(ConstantTimeEquals(std::string("a\0", 2), "a"));
}

TEST(IsLoopbackHostTest, LoopbackOnly) {
  for (const char* h : {"localhost", "LOCALHOST", "127.0.0.1", "127.1.2.3", "[::1]"}) {
    EXPECT_TRUE(IsLoopbackHost(h)) << h;
  }
  for (const char* h : {"0.0.0.0", "10.0.0.1", "128.0.0.1", "[::]", "127.0.0",
                        "127.0.0.256", "example.com", "127.0.0.1.nip.io", ""}) {
    EXPECT_FALSE(IsLoopbackHost(h)) << h;
  }
  // The default metrics and gRPC addresses are loopback.
  const Config defaults;
  for (const std::string& a : {defaults.metrics_address, defaults.grpc_address}) {
    absl::StatusOr<HostPort> hp = ParseHostPort("default", a);
    ASSERT_TRUE(hp.ok());
    EXPECT_TRUE(IsLoopbackHost(hp->host)) << a;
  }
}

TEST(ExposureWarningTest, NonLoopbackWithoutClientAuthentication) {
  Config c;  // 127.0.0.1, plaintext
  EXPECT_EQ(ExposureWarning(c), "");
  c.grpc_address = "[::1]:50051";
  EXPECT_EQ(ExposureWarning(c), "");
  c.grpc_address = "0.0.0.0:50051";
  EXPECT_THAT(ExposureWarning(c), HasSubstr("0.0.0.0:50051 is plaintext"));
  c.tls_cert_file = "c.pem";
  c.tls_key_file = "k.pem";
  EXPECT_THAT(ExposureWarning(c), HasSubstr("authenticates no client"));
  c.auth_token_file = "t";
  EXPECT_EQ(ExposureWarning(c), "");
  c.auth_token_file.clear();
  c.tls_client_ca_file = "ca.pem";
  EXPECT_EQ(ExposureWarning(c), "");
}

class TempFile {
 public:
  explicit TempFile(const std::string& content) {
    path_ = (std::filesystem::temp_directory_path() /
             ("rvd_security_test_" + std::to_string(counter_++) + "_" +
              std::to_string(::getpid())))
                .string();
    std::ofstream(path_, std::ios::binary) << content;
  }
  ~TempFile() { std::remove(path_.c_str()); }
  const std::string& path() const { return path_; }

 private:
  static inline int counter_ = 0;
  std::string path_;
};

TEST(ReadTokenFileTest, TrailingNewlineIsNotPartOfTheToken) {
  TempFile f(std::string(kToken) + "\n");
  absl::StatusOr<std::string> t = ReadTokenFile("auth_token_file", f.path());
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(*t, kToken);
}

TEST(ReadTokenFileTest, RefusesEmptySpacedMissing) {
  for (const std::string& content : {std::string(""), std::string(" \n\n"),
                                     std::string("two words\n"),
                                     std::string("a\tb"), std::string("tok\x01")}) {
    TempFile f(content);
    absl::StatusOr<std::string> t = ReadTokenFile("auth_token_file", f.path());
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument) << content;
    EXPECT_THAT(std::string(t.status().message()), HasSubstr("auth_token_file"));
  }
  absl::StatusOr<std::string> t =
      ReadTokenFile("auth_token_file", "/nonexistent/rvd/token");
  EXPECT_EQ(t.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(t.status().message()), HasSubstr("/nonexistent/rvd/token"));
}

TEST(ValidateSecurityConfigTest, KeysThatGoTogether) {
  Config c;
  EXPECT_TRUE(ValidateSecurityConfig(c).ok());
  c.tls_cert_file = "c.pem";
  EXPECT_THAT(std::string(ValidateSecurityConfig(c).message()), HasSubstr("give both"));
  c.tls_key_file = "k.pem";
  EXPECT_TRUE(ValidateSecurityConfig(c).ok());
  c.auth_token_file = "t";
  c.tls_client_ca_file = "ca.pem";
  EXPECT_TRUE(ValidateSecurityConfig(c).ok());
  c.tls_cert_file.clear();
  c.tls_key_file.clear();
  const std::string m(ValidateSecurityConfig(c).message());
  EXPECT_THAT(m, HasSubstr("'auth_token_file': a bearer token needs TLS"));
  EXPECT_THAT(m, HasSubstr("'tls_client_ca_file'"));
  // ValidateConfig (every config and flag) includes these checks.
  EXPECT_FALSE(ValidateConfig(c).ok());
}

TEST(ConfigTest, SecurityKeysAreConfigKeysAndFlags) {
  absl::StatusOr<Config> c = ParseConfig(
      "tls_cert_file: /c.pem\ntls_key_file: /k.pem\n"
      "tls_client_ca_file: /ca.pem\nauth_token_file: /t\n");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->tls_cert_file, "/c.pem");
  EXPECT_EQ(c->tls_key_file, "/k.pem");
  EXPECT_EQ(c->tls_client_ca_file, "/ca.pem");
  EXPECT_EQ(c->auth_token_file, "/t");
  const char* argv[] = {"rvd", "--tls-cert-file", "/c2.pem", "--tls-key-file",
                        "/k2.pem", "--tls-client-ca-file", "/ca2.pem",
                        "--auth-token-file", "/t2"};
  absl::StatusOr<CommandLine> cl = ParseCommandLine(9, argv);
  ASSERT_TRUE(cl.ok()) << cl.status();
  EXPECT_EQ(cl->config.tls_cert_file, "/c2.pem");
  EXPECT_EQ(cl->config.tls_key_file, "/k2.pem");
  EXPECT_EQ(cl->config.tls_client_ca_file, "/ca2.pem");
  EXPECT_EQ(cl->config.auth_token_file, "/t2");
  const char* bad[] = {"rvd", "--auth-token-file", "/t"};
  EXPECT_FALSE(ParseCommandLine(3, bad).ok());
}

TEST(MakeServerSecurityTest, PlaintextByDefault) {
  absl::StatusOr<ServerSecurity> s = MakeServerSecurity(Config());
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_FALSE(s->tls);
  EXPECT_EQ(s->description, "plaintext");
  EXPECT_NE(s->credentials, nullptr);
}

TEST(MakeServerSecurityTest, GarbageCertificateIsAClearError) {
  TempFile cert("not a certificate\n"), key("not a key\n");
  Config c;
  c.tls_cert_file = cert.path();
  c.tls_key_file = key.path();
  absl::StatusOr<ServerSecurity> s = MakeServerSecurity(c);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.status().message()),
              HasSubstr("'tls_cert_file': " + cert.path() + " holds no PEM certificate"));
}

}  // namespace
}  // namespace rvd

#include "client/cpp/channel.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace rvd {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

class TempFile {
 public:
  explicit TempFile(const std::string& content) {
    path_ = (std::filesystem::temp_directory_path() /
             ("rvd_channel_test_" + std::to_string(counter_++) + "_" +
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

std::string Message(const ChannelOptions& o) {
  absl::StatusOr<std::shared_ptr<grpc::Channel>> c = CreateRvdChannel(o);
  EXPECT_FALSE(c.ok());
  return std::string(c.status().message());
}

TEST(CreateRvdChannelTest, PlaintextAndTlsChannelsAreMade) {
  ChannelOptions plain;
  EXPECT_TRUE(CreateRvdChannel(plain).ok());
  ChannelOptions system_roots;
  system_roots.tls = true;
  system_roots.auth_token = "tok";
  EXPECT_TRUE(CreateRvdChannel(system_roots).ok());
  TempFile ca("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n");
  ChannelOptions with_ca;
  with_ca.tls_ca_file = ca.path();
  EXPECT_TRUE(CreateRvdChannel(with_ca).ok());
}

TEST(CreateRvdChannelTest, InconsistentSettingsAreRefusedBeforeAnyCall) {
  ChannelOptions token_plain;
  token_plain.auth_token = "tok";
  EXPECT_THAT(Message(token_plain), HasSubstr("needs TLS"));
  // The refusal does not quote the token.
  EXPECT_THAT(Message(token_plain), Not(HasSubstr("tok\"")));

  TempFile cert("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n");
  ChannelOptions cert_only;
  cert_only.tls_cert_file = cert.path();
  EXPECT_THAT(Message(cert_only), HasSubstr("go together"));

  ChannelOptions spaced;
  spaced.tls = true;
  spaced.auth_token = "two words";
  EXPECT_THAT(Message(spaced), HasSubstr("visible ASCII"));
}

TEST(CreateRvdChannelTest, FilesAreReadAndCheckedNow) {
  ChannelOptions missing;
  missing.tls_ca_file = "/nonexistent/rvd/ca.pem";
  EXPECT_THAT(Message(missing), HasSubstr("tls_ca_file: cannot open /nonexistent/rvd/ca.pem"));

  TempFile garbage("not a pem\n");
  ChannelOptions bad_ca;
  bad_ca.tls_ca_file = garbage.path();
  EXPECT_THAT(Message(bad_ca), HasSubstr("holds no PEM CERTIFICATE block"));

  TempFile cert("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n");
  ChannelOptions bad_key;
  bad_key.tls_cert_file = cert.path();
  bad_key.tls_key_file = garbage.path();
  EXPECT_THAT(Message(bad_key), HasSubstr("tls_key_file"));
  EXPECT_THAT(Message(bad_key), HasSubstr("PRIVATE KEY"));
}

TEST(ReadAuthTokenFileTest, OneTokenOnOneLine) {
  TempFile good("  abc-123_XYZ \n");
  absl::StatusOr<std::string> t = ReadAuthTokenFile(good.path());
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(*t, "abc-123_XYZ");
  for (const char* content : {"", "\n", "a b\n", "a\nb\n"}) {
    TempFile f(content);
    EXPECT_EQ(ReadAuthTokenFile(f.path()).status().code(),
              absl::StatusCode::kInvalidArgument)
        << content;
  }
  EXPECT_EQ(ReadAuthTokenFile("/nonexistent/rvd/token").status().code(),
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace rvd

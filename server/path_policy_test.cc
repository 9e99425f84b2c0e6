// The checkpoint-root policy (path_policy.h) and the daemon's checkpoint
// reader built on it (checkpoint_reader.h): what is read, what is refused,
// with which status.
#include "server/path_policy.h"

#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "client/cpp/safetensors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/checkpoint_reader.h"

namespace rvd {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

// A fresh directory tree per test: <tmp>/root (the checkpoint root) and
// <tmp>/outside, world-searchable so that a child running as nobody can
// walk it.
class PolicyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::random_device rd;
    base_ = fs::temp_directory_path() /
            ("rvd_path_policy_" + std::to_string(::getpid()) + "_" +
             std::to_string(rd()));
    fs::create_directories(base_ / "root" / "ckpt");
    fs::create_directories(base_ / "outside");
    fs::permissions(base_, fs::perms::owner_all | fs::perms::group_exec |
                               fs::perms::others_exec | fs::perms::others_read);
    root_ = (base_ / "root").string();
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(base_, ec);
  }
  static void Write(const fs::path& p, const std::string& text) {
    std::ofstream(p, std::ios::binary) << text;
  }
  PathPolicy Policy() {
    absl::StatusOr<PathPolicy> p = PathPolicy::Create({root_});
    EXPECT_TRUE(p.ok()) << p.status();
    return *std::move(p);
  }

  fs::path base_;
  std::string root_;
};

TEST(PathIsUnderTest, WholeComponentsOnly) {
  EXPECT_TRUE(PathIsUnder("/a/b", "/a/b"));
  EXPECT_TRUE(PathIsUnder("/a/b/c", "/a/b"));
  EXPECT_FALSE(PathIsUnder("/a/bc", "/a/b"));
  EXPECT_FALSE(PathIsUnder("/a", "/a/b"));
  EXPECT_TRUE(PathIsUnder("/x", "/"));
}

TEST_F(PolicyTest, RootsMustBeAbsoluteExistingDirectories) {
  EXPECT_EQ(PathPolicy::Create({"relative/dir"}).status().code(),
            absl::StatusCode::kInvalidArgument);
  absl::Status missing =
      PathPolicy::Create({(base_ / "nonexistent").string()}).status();
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound) << missing;
  EXPECT_THAT(missing.message(), HasSubstr("nonexistent"));
  Write(base_ / "file", "x");
  EXPECT_EQ(PathPolicy::Create({(base_ / "file").string()}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(PolicyTest, NoRootsRefusesEveryPath) {
  absl::StatusOr<PathPolicy> p = PathPolicy::Create({});
  ASSERT_TRUE(p.ok());
  EXPECT_TRUE(p->empty());
  std::string reason;
  absl::Status s = p->Resolve(root_ + "/ckpt", &reason).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(s.message(), HasSubstr("checkpoint_roots"));
  EXPECT_FALSE(reason.empty());
}

TEST_F(PolicyTest, InsideIsResolvedOutsideIsRefused) {
  const PathPolicy policy = Policy();
  absl::StatusOr<std::string> in = policy.Resolve(root_ + "/ckpt/");
  ASSERT_TRUE(in.ok()) << in.status();
  EXPECT_EQ(*in, fs::canonical(base_ / "root" / "ckpt").string());
  EXPECT_TRUE(policy.Resolve(root_).ok());  // the root itself

  struct Case {
    std::string path;
    absl::StatusCode code;
  };
  const Case cases[] = {
      {"", absl::StatusCode::kInvalidArgument},
      {"root/ckpt", absl::StatusCode::kInvalidArgument},
      {(base_ / "outside").string(), absl::StatusCode::kPermissionDenied},
      {root_ + "/../outside", absl::StatusCode::kPermissionDenied},
      {root_ + "x", absl::StatusCode::kPermissionDenied},  // a sibling
      {"/etc/passwd", absl::StatusCode::kPermissionDenied},
      {root_ + "/nonexistent", absl::StatusCode::kNotFound},
  };
  for (const Case& c : cases) {
    std::string reason;
    absl::Status s = policy.Resolve(c.path, &reason).status();
    EXPECT_EQ(s.code(), c.code) << c.path << ": " << s;
    EXPECT_FALSE(reason.empty()) << c.path;
  }
}

TEST_F(PolicyTest, SymlinkLeadingOutIsRefusedOneStayingInIsFollowed) {
  fs::create_directory_symlink(base_ / "outside", base_ / "root" / "escape");
  fs::create_directory_symlink(base_ / "root" / "ckpt", base_ / "root" / "alias");
  const PathPolicy policy = Policy();
  std::string reason;
  absl::Status s = policy.Resolve(root_ + "/escape", &reason).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  EXPECT_THAT(s.message(), HasSubstr("symlink"));
  // Where it leads goes to the log, not to the client.
  EXPECT_THAT(reason, HasSubstr((base_ / "outside").string()));
  EXPECT_THAT(std::string(s.message()),
              ::testing::Not(HasSubstr((base_ / "outside").string())));
  absl::StatusOr<std::string> alias = policy.Resolve(root_ + "/alias");
  ASSERT_TRUE(alias.ok()) << alias.status();
  EXPECT_EQ(*alias, fs::canonical(base_ / "root" / "ckpt").string());
}

TEST_F(PolicyTest, ARootThatIsASymlinkAcceptsBothSpellings) {
  fs::create_directory_symlink(base_ / "root", base_ / "link");
  absl::StatusOr<PathPolicy> policy =
      PathPolicy::Create({(base_ / "link").string()});
  ASSERT_TRUE(policy.ok()) << policy.status();
  EXPECT_TRUE(policy->Resolve((base_ / "link" / "ckpt").string()).ok());
  EXPECT_TRUE(policy->Resolve(root_ + "/ckpt").ok());
  EXPECT_FALSE(policy->Resolve((base_ / "outside").string()).ok());
}

TEST_F(PolicyTest, FilesMustBeRegular) {
  const PathPolicy policy = Policy();
  Write(base_ / "root" / "ckpt" / "model.safetensors", "12345678");
  ASSERT_EQ(::mkfifo((base_ / "root" / "ckpt" / "fifo").c_str(), 0644), 0);
  EXPECT_TRUE(policy.ResolveReadableFile(root_ + "/ckpt/model.safetensors").ok());
  // A FIFO would block the reader forever; a directory is no file.
  EXPECT_EQ(policy.ResolveReadableFile(root_ + "/ckpt/fifo").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(policy.ResolveReadableFile(root_ + "/ckpt").status().code(),
            absl::StatusCode::kInvalidArgument);
  // A file symlinked from outside is as outside as its target.
  Write(base_ / "outside" / "secret", "s");
  fs::create_symlink(base_ / "outside" / "secret",
                     base_ / "root" / "ckpt" / "secret");
  EXPECT_EQ(policy.ResolveReadableFile(root_ + "/ckpt/secret").status().code(),
            absl::StatusCode::kPermissionDenied);
}

// Runs `check` as nobody when the test runs as root (root reads anything),
// else directly; returns the status code it saw.
int CodeAsUnprivileged(const std::function<absl::StatusCode()>& check) {
  if (::geteuid() != 0) return static_cast<int>(check());
  const pid_t pid = ::fork();
  if (pid == 0) {
    if (::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(100);
    ::_exit(static_cast<int>(check()));
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST_F(PolicyTest, UnreadableFileIsPermissionDenied) {
  const fs::path file = base_ / "root" / "ckpt" / "model.safetensors";
  Write(file, "12345678");
  fs::permissions(base_ / "root", fs::perms::owner_all | fs::perms::others_exec |
                                      fs::perms::others_read);
  fs::permissions(base_ / "root" / "ckpt",
                  fs::perms::owner_all | fs::perms::others_exec |
                      fs::perms::others_read);
  const PathPolicy policy = Policy();
  fs::permissions(file, fs::perms::owner_write);  // no one may read it
  EXPECT_EQ(CodeAsUnprivileged([&] {
              return policy.ResolveReadableFile(file.string()).status().code();
            }),
            static_cast<int>(absl::StatusCode::kPermissionDenied));
  fs::permissions(file, fs::perms::owner_read | fs::perms::others_read);
  EXPECT_EQ(CodeAsUnprivileged([&] {
              return policy.ResolveReadableFile(file.string()).status().code();
            }),
            static_cast<int>(absl::StatusCode::kOk));
}

// ---- the reader -----------------------------------------------------------

// A llama checkpoint of `layers` layers of V [kv_heads*head_dim, hidden]
// f32 in one file or two shards.
void WriteLlama(const fs::path& dir, int layers, bool sharded) {
  fs::create_directories(dir);
  std::ofstream(dir / "config.json")
      << R"({"model_type": "llama", "num_hidden_layers": )" << layers
      << R"(, "num_attention_heads": 4, "num_key_value_heads": 2,
             "hidden_size": 32})";
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  std::vector<SafetensorsEntry> entries;
  for (int l = 0; l < layers; ++l) {
    std::vector<float> v(16 * 32);
    for (float& x : v) x = normal(rng);
    entries.push_back({"model.layers." + std::to_string(l) +
                           ".self_attn.v_proj.weight",
                       "F32",
                       {16, 32},
                       std::string(reinterpret_cast<const char*>(v.data()),
                                   v.size() * 4)});
  }
  if (!sharded) {
    ASSERT_TRUE(WriteSafetensors((dir / "model.safetensors").string(), entries).ok());
    return;
  }
  const size_t half = entries.size() / 2;
  std::vector<SafetensorsEntry> a(entries.begin(), entries.begin() + half);
  std::vector<SafetensorsEntry> b(entries.begin() + half, entries.end());
  ASSERT_TRUE(WriteSafetensors((dir / "a.safetensors").string(), a).ok());
  ASSERT_TRUE(WriteSafetensors((dir / "b.safetensors").string(), b).ok());
  std::ofstream index(dir / "model.safetensors.index.json");
  index << R"({"metadata": {}, "weight_map": {)";
  for (size_t i = 0; i < entries.size(); ++i) {
    index << (i ? ", " : "") << '"' << entries[i].name << "\": \""
          << (i < half ? "a" : "b") << ".safetensors\"";
  }
  index << "}}";
}

rvd::v1::MeasureHeader Header(const std::string& id) {
  rvd::v1::MeasureHeader h;
  h.set_model_id(id);
  h.set_step(12);
  return h;
}

TEST_F(PolicyTest, ReaderMapsACheckpointUnderTheRoot) {
  WriteLlama(base_ / "root" / "ckpt", 4, /*sharded=*/true);
  absl::StatusOr<std::unique_ptr<CheckpointReader>> reader =
      CheckpointReader::Create({root_});
  ASSERT_TRUE(reader.ok()) << reader.status();
  absl::StatusOr<ReadCheckpoint> r = (*reader)->Read(
      root_ + "/ckpt", Header("m"), LoadOptions{}, 1 << 30);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->header.model_id(), "m");
  EXPECT_EQ(r->header.step(), 12);
  ASSERT_EQ(r->header.tensors_size(), 4);
  ASSERT_EQ(r->data.size(), 4u);
  EXPECT_EQ(r->bytes, 4u * 16 * 32 * 4);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(r->header.tensors(i).layer(), static_cast<uint32_t>(i));
    EXPECT_EQ(r->data[i].size(), 16u * 32 * 4);
    // The bytes are the file's, mapped: they lie inside one of its shards.
    EXPECT_EQ(r->header.tensors(i).geometry().num_kv_heads(), 2u);
  }
  // The request's size limit applies to what the checkpoint holds.
  EXPECT_EQ((*reader)
                ->Read(root_ + "/ckpt", Header("m"), LoadOptions{}, 1000)
                .status()
                .code(),
            absl::StatusCode::kResourceExhausted);
}

TEST_F(PolicyTest, ReaderRefusesWhatThePolicyRefuses) {
  WriteLlama(base_ / "outside" / "ckpt", 2, /*sharded=*/true);
  // A checkpoint inside whose shard is a symlink to a file outside.
  WriteLlama(base_ / "root" / "ckpt", 2, /*sharded=*/true);
  fs::remove(base_ / "root" / "ckpt" / "b.safetensors");
  fs::create_symlink(base_ / "outside" / "ckpt" / "b.safetensors",
                     base_ / "root" / "ckpt" / "b.safetensors");
  // One whose config.json is a FIFO (a read would never end).
  WriteLlama(base_ / "root" / "fifo", 2, /*sharded=*/false);
  fs::remove(base_ / "root" / "fifo" / "config.json");
  ASSERT_EQ(::mkfifo((base_ / "root" / "fifo" / "config.json").c_str(), 0644), 0);
  absl::StatusOr<std::unique_ptr<CheckpointReader>> reader =
      CheckpointReader::Create({root_});
  ASSERT_TRUE(reader.ok()) << reader.status();

  struct Case {
    std::string path;
    rvd::v1::MeasureHeader header;
    absl::StatusCode code;
    const char* reason_part;
  };
  rvd::v1::MeasureHeader with_tensors = Header("m");
  with_tensors.add_tensors()->set_name("x");
  const Case cases[] = {
      {(base_ / "outside" / "ckpt").string(), Header("m"),
       absl::StatusCode::kPermissionDenied, "outside"},
      {root_ + "/ckpt", Header("m"), absl::StatusCode::kPermissionDenied,
       "b.safetensors"},
      {root_ + "/fifo", Header("m"), absl::StatusCode::kInvalidArgument,
       "not a regular file"},
      {"ckpt", Header("m"), absl::StatusCode::kInvalidArgument, "absolute"},
      {root_ + "/ckpt", with_tensors, absl::StatusCode::kInvalidArgument,
       "tensors"},
      {root_ + "/missing", Header("m"), absl::StatusCode::kNotFound, "exist"},
  };
  for (const Case& c : cases) {
    std::string reason;
    absl::Status s =
        (*reader)->Read(c.path, c.header, LoadOptions{}, 1 << 30, &reason).status();
    EXPECT_EQ(s.code(), c.code) << c.path << ": " << s;
    EXPECT_THAT(reason, HasSubstr(c.reason_part)) << c.path;
  }
  // A bad model id is refused before anything is read.
  EXPECT_EQ((*reader)
                ->Read(root_ + "/ckpt", Header("bad id"), LoadOptions{}, 1 << 30)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace rvd

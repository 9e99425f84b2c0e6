// The checkpoint watcher (checkpoint_watcher.h) and its configuration
// (watch_config.h): step names, settle detection, completeness, the seen
// set, once-only across restarts, and the config's checks. The watcher runs
// on the test's thread (LookOnce with a chosen time) over real directories,
// with a fake in place of the daemon's measurement.
#include "server/checkpoint_watcher.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/config.h"

namespace rvd {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

TEST(StepTest, NamesThatGiveASteps) {
  const std::pair<const char*, int64_t> good[] = {
      {"checkpoint-1200", 1200}, {"checkpoint_7", 7},     {"checkpoint0", 0},
      {"global_step1200", 1200}, {"global_step_5", 5},    {"step-300", 300},
      {"step_300", 300},         {"step42", 42},          {"iter_0001200", 1200},
      {"iter-9", 9},             {"checkpoint-123456789012345678", 123456789012345678},
  };
  for (const auto& [name, step] : good) {
    std::optional<int64_t> got = ParseCheckpointStep(name);
    ASSERT_TRUE(got.has_value()) << name;
    EXPECT_EQ(*got, step) << name;
  }
  for (const char* name :
       {"", "checkpoint", "checkpoint-", "checkpoint-12a", "checkpoint-1200.tmp",
        "tmp-checkpoint-1300", "runs", "global_step", "step--3", "step-+3",
        "checkpoint-1234567890123456789", "Checkpoint-1", " checkpoint-1",
        "checkpoint- 1", "checkpoint-1/"}) {
    EXPECT_FALSE(ParseCheckpointStep(name).has_value()) << name;
  }
}

TEST(SettleTest, TwoLooksAtLeastSettleApartWithTheSameFiles) {
  SettleTracker t(absl::Seconds(5));
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  const std::vector<FileStamp> a = {{"config.json", 10, 1}, {"model.safetensors", 100, 2}};
  std::vector<FileStamp> b = a;
  b[1].size = 200;
  EXPECT_FALSE(t.Observe("k", a, t0));  // first look
  ASSERT_TRUE(t.NextDue().has_value());
  EXPECT_EQ(*t.NextDue(), t0 + absl::Seconds(5));
  EXPECT_FALSE(t.Observe("k", a, t0 + absl::Seconds(4)));  // too soon
  EXPECT_FALSE(t.Observe("k", b, t0 + absl::Seconds(6)));  // changed: again
  EXPECT_FALSE(t.Observe("k", b, t0 + absl::Seconds(10)));
  EXPECT_TRUE(t.Observe("k", b, t0 + absl::Seconds(11)));
  std::vector<FileStamp> c = b;
  c[0].mtime_ns = 99;  // an mtime alone counts as a change
  EXPECT_FALSE(t.Observe("k", c, t0 + absl::Seconds(12)));
  EXPECT_FALSE(t.Observe("other", a, t0));
  t.Retain({"k"});
  t.Forget("k");
  EXPECT_FALSE(t.NextDue().has_value());  // "other" went with Retain
}

// A directory tree per test: <tmp>/root (the checkpoint root) holding
// runs/<run>/<checkpoint>.
class WatchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::random_device rd;
    base_ = fs::temp_directory_path() /
            ("rvd_watch_" + std::to_string(::getpid()) + "_" + std::to_string(rd()));
    fs::create_directories(base_ / "root" / "runs");
    fs::create_directories(base_ / "outside");
    root_ = (base_ / "root").string();
    absl::StatusOr<PathPolicy> p = PathPolicy::Create({root_});
    ASSERT_TRUE(p.ok()) << p.status();
    policy_ = std::make_unique<PathPolicy>(*std::move(p));
    config_.directories.push_back({root_ + "/runs/*", "{dir}"});
    config_.settle_seconds = 5;
    config_.poll_interval_seconds = 1;
    config_.inotify = false;
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(base_, ec);
  }
  static void Write(const fs::path& p, const std::string& text) {
    fs::create_directories(p.parent_path());
    std::ofstream(p, std::ios::binary) << text;
  }
  // A watcher whose measurements are recorded in calls_; `answer` is what
  // the fake measurement returns.
  std::unique_ptr<CheckpointWatcher> Watcher(const std::string& seen_path) {
    WatchHooks hooks;
    hooks.measure = [this](const std::string& path,
                           const rvd::v1::MeasureHeader& header,
                           const std::function<bool()>&)
        -> absl::StatusOr<rvd::v1::Measurement> {
      calls_.push_back({path, header.model_id(), header.step()});
      if (!answer_.ok()) return answer_;
      rvd::v1::Measurement m;
      m.set_model_id(header.model_id());
      m.set_step(header.step());
      m.set_sequence(calls_.size());
      return m;
    };
    hooks.has_step = [this](const std::string& id, int64_t step) {
      return history_.contains({id, step});
    };
    absl::StatusOr<std::unique_ptr<CheckpointWatcher>> w =
        CheckpointWatcher::Create(config_, *policy_, seen_path, std::move(hooks));
    EXPECT_TRUE(w.ok()) << w.status();
    return w.ok() ? *std::move(w) : nullptr;
  }

  struct Call {
    std::string path, model_id;
    int64_t step;
  };
  fs::path base_;
  std::string root_;
  std::unique_ptr<PathPolicy> policy_;
  WatchConfig config_;
  std::vector<Call> calls_;
  absl::Status answer_;
  std::set<std::pair<std::string, int64_t>> history_;
  const absl::Time t0_ = absl::FromUnixSeconds(1000000);
};

TEST_F(WatchTest, CompleteMeansConfigAndEveryShardOfTheIndex) {
  const fs::path c = base_ / "root" / "runs" / "a" / "checkpoint-1";
  fs::create_directories(c);
  EXPECT_FALSE(LookAtCheckpoint(c.string()).complete);
  Write(c / "config.json", "{}");
  EXPECT_FALSE(LookAtCheckpoint(c.string()).complete);  // no weights
  Write(c / "model.safetensors.index.json", R"({"weight_map": {"x": "s1.safetensors",)");
  EXPECT_FALSE(LookAtCheckpoint(c.string()).complete);  // half an index
  Write(c / "model.safetensors.index.json",
        R"({"weight_map": {"x": "s1.safetensors", "y": "s2.safetensors"}})");
  Write(c / "s1.safetensors", "1234");
  CheckpointLook look = LookAtCheckpoint(c.string());
  EXPECT_FALSE(look.complete);
  EXPECT_THAT(look.incomplete, HasSubstr("s2.safetensors"));
  Write(c / "s2.safetensors", "5678");
  look = LookAtCheckpoint(c.string());
  ASSERT_TRUE(look.complete) << look.incomplete;
  ASSERT_EQ(look.files.size(), 4u);
  EXPECT_EQ(look.files[0].name, "config.json");
  EXPECT_EQ(look.files[3].name, "s2.safetensors");
  EXPECT_EQ(look.files[3].size, 4u);
  // One file without an index is complete too.
  const fs::path d = base_ / "root" / "runs" / "a" / "checkpoint-2";
  Write(d / "config.json", "{}");
  Write(d / "model.safetensors", "x");
  EXPECT_TRUE(LookAtCheckpoint(d.string()).complete);
}

TEST_F(WatchTest, MeasuresEachSettledCheckpointOnceWithItsStep) {
  std::unique_ptr<CheckpointWatcher> w = Watcher("");
  const fs::path run = base_ / "root" / "runs" / "llama-7b";
  const fs::path c = run / "checkpoint-1200";
  Write(c / "config.json", "{}");
  Write(c / "model.safetensors", "partial");
  Write(run / "tmp-checkpoint-1300" / "config.json", "{}");  // not a step name
  Write(run / "tmp-checkpoint-1300" / "model.safetensors", "x");
  Write(run / "logs" / "config.json", "{}");
  w->LookOnce(t0_);
  w->LookOnce(t0_ + absl::Seconds(4));  // not settled yet
  EXPECT_TRUE(calls_.empty());
  EXPECT_EQ(w->Stats().pending, 1);  // checkpoint-1200; the others are no steps
  EXPECT_EQ(w->Stats().directories, 1);
  Write(c / "model.safetensors", "partial and more");  // still being written
  w->LookOnce(t0_ + absl::Seconds(6));
  w->LookOnce(t0_ + absl::Seconds(10));
  EXPECT_TRUE(calls_.empty());
  w->LookOnce(t0_ + absl::Seconds(11));  // 5 s with the same files
  ASSERT_EQ(calls_.size(), 1u);
  EXPECT_EQ(calls_[0].path, fs::canonical(c).string());
  EXPECT_EQ(calls_[0].model_id, "llama-7b");
  EXPECT_EQ(calls_[0].step, 1200);
  for (int i = 12; i < 30; i += 3) w->LookOnce(t0_ + absl::Seconds(i));
  EXPECT_EQ(calls_.size(), 1u);  // once
  EXPECT_EQ(w->measured(), 1);
  EXPECT_EQ(w->Stats().measured, 1);
  EXPECT_EQ(w->Stats().pending, 0);
  EXPECT_GT(w->Stats().last_look_seconds, 0);
}

TEST_F(WatchTest, ARestartWithTheSeenFileMeasuresNothingAgain) {
  const std::string seen = (base_ / "data" / "seen.jsonl").string();
  const fs::path c = base_ / "root" / "runs" / "r" / "global_step7";
  Write(c / "config.json", "{}");
  Write(c / "model.safetensors", "x");
  {
    std::unique_ptr<CheckpointWatcher> w = Watcher(seen);
    w->LookOnce(t0_);
    w->LookOnce(t0_ + absl::Seconds(5));
    ASSERT_EQ(calls_.size(), 1u);
    EXPECT_EQ(calls_[0].step, 7);
  }
  {
    std::unique_ptr<CheckpointWatcher> w = Watcher(seen);
    w->LookOnce(t0_ + absl::Seconds(20));
    w->LookOnce(t0_ + absl::Seconds(30));
    EXPECT_EQ(calls_.size(), 1u) << "measured again after a restart";
    // A new checkpoint after the restart is measured.
    Write(c.parent_path() / "global_step8" / "config.json", "{}");
    Write(c.parent_path() / "global_step8" / "model.safetensors", "y");
    w->LookOnce(t0_ + absl::Seconds(40));
    w->LookOnce(t0_ + absl::Seconds(50));
    ASSERT_EQ(calls_.size(), 2u);
    EXPECT_EQ(calls_[1].step, 8);
  }
  // Without the file (memory only), a restart would measure both again:
  // the seen file is what prevents it.
  calls_.clear();
  std::unique_ptr<CheckpointWatcher> w = Watcher("");
  w->LookOnce(t0_ + absl::Seconds(60));
  w->LookOnce(t0_ + absl::Seconds(70));
  EXPECT_EQ(calls_.size(), 2u);
}

TEST_F(WatchTest, AStepTheHistoryHoldsIsNotMeasuredAgain) {
  history_.insert({"r", 7});
  const fs::path c = base_ / "root" / "runs" / "r" / "checkpoint-7";
  Write(c / "config.json", "{}");
  Write(c / "model.safetensors", "x");
  std::unique_ptr<CheckpointWatcher> w = Watcher("");
  w->LookOnce(t0_);
  w->LookOnce(t0_ + absl::Seconds(10));
  EXPECT_TRUE(calls_.empty());
}

TEST_F(WatchTest, AFailedCheckpointIsTriedAgainOnlyWhenItsFilesChange) {
  answer_ = absl::DataLossError("tensor runs past the end of its file");
  const fs::path c = base_ / "root" / "runs" / "r" / "checkpoint-3";
  Write(c / "config.json", "{}");
  Write(c / "model.safetensors", "half");
  std::unique_ptr<CheckpointWatcher> w = Watcher("");
  w->LookOnce(t0_);
  w->LookOnce(t0_ + absl::Seconds(5));
  ASSERT_EQ(calls_.size(), 1u);
  for (int i = 10; i < 40; i += 5) w->LookOnce(t0_ + absl::Seconds(i));
  EXPECT_EQ(calls_.size(), 1u) << "retried with the same files";
  answer_ = absl::OkStatus();
  Write(c / "model.safetensors", "the whole file");
  w->LookOnce(t0_ + absl::Seconds(40));
  w->LookOnce(t0_ + absl::Seconds(45));
  EXPECT_EQ(calls_.size(), 2u);
  EXPECT_EQ(w->measured(), 1);
  EXPECT_EQ(w->Stats().failed, 1);
}

TEST_F(WatchTest, ABusyDaemonIsTriedAgainAfterSettlingAgain) {
  answer_ = absl::ResourceExhaustedError("queue full");
  const fs::path c = base_ / "root" / "runs" / "r" / "checkpoint-3";
  Write(c / "config.json", "{}");
  Write(c / "model.safetensors", "x");
  std::unique_ptr<CheckpointWatcher> w = Watcher("");
  w->LookOnce(t0_);
  w->LookOnce(t0_ + absl::Seconds(5));
  ASSERT_EQ(calls_.size(), 1u);
  answer_ = absl::OkStatus();
  w->LookOnce(t0_ + absl::Seconds(6));
  EXPECT_EQ(calls_.size(), 1u);  // waits out settle_seconds first
  w->LookOnce(t0_ + absl::Seconds(11));
  EXPECT_EQ(calls_.size(), 2u);
  EXPECT_EQ(w->measured(), 1);
}

TEST_F(WatchTest, SymlinksOutOfTheRootAreNotFollowed) {
  const fs::path out = base_ / "outside" / "checkpoint-5";
  Write(out / "config.json", "{}");
  Write(out / "model.safetensors", "x");
  fs::create_directories(base_ / "root" / "runs" / "r");
  fs::create_directory_symlink(out, base_ / "root" / "runs" / "r" / "checkpoint-5");
  fs::create_directory_symlink(base_ / "outside", base_ / "root" / "runs" / "escaped");
  std::unique_ptr<CheckpointWatcher> w = Watcher("");
  w->LookOnce(t0_);
  w->LookOnce(t0_ + absl::Seconds(10));
  EXPECT_TRUE(calls_.empty());
}

TEST_F(WatchTest, FixedAndTemplatedModelIds) {
  config_.directories = {{root_ + "/runs/a", "fixed-id"},
                         {root_ + "/runs/b*", "exp.{dir}:v1"}};
  Write(base_ / "root" / "runs" / "a" / "step-1" / "config.json", "{}");
  Write(base_ / "root" / "runs" / "a" / "step-1" / "model.safetensors", "x");
  Write(base_ / "root" / "runs" / "b2" / "step-2" / "config.json", "{}");
  Write(base_ / "root" / "runs" / "b2" / "step-2" / "model.safetensors", "x");
  std::unique_ptr<CheckpointWatcher> w = Watcher("");
  w->LookOnce(t0_);
  w->LookOnce(t0_ + absl::Seconds(5));
  ASSERT_EQ(calls_.size(), 2u);
  EXPECT_EQ(calls_[0].model_id, "fixed-id");
  EXPECT_EQ(calls_[1].model_id, "exp.b2:v1");
}

TEST_F(WatchTest, AWatchRootThatDoesNotExistStopsTheStart) {
  config_.directories = {{root_ + "/nonexistent/*", "{dir}"}};
  absl::Status s =
      CheckpointWatcher::Create(config_, *policy_, "", WatchHooks{}).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_THAT(s.message(), HasSubstr("nonexistent"));
  config_.directories = {{(base_ / "outside").string(), "{dir}"}};
  s = CheckpointWatcher::Create(config_, *policy_, "", WatchHooks{}).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
}

TEST_F(WatchTest, TheThreadMeasuresWithInotifyAndStops) {
  config_.settle_seconds = 0.2;
  config_.poll_interval_seconds = 30;  // only inotify can wake it in time
  config_.inotify = true;
  std::unique_ptr<CheckpointWatcher> w = Watcher("");
  fs::create_directories(base_ / "root" / "runs" / "r");
  w->Start();
  absl::SleepFor(absl::Milliseconds(100));
  const fs::path c = base_ / "root" / "runs" / "r" / "checkpoint-9";
  Write(c / "config.json", "{}");
  Write(c / "model.safetensors", "x");
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (w->measured() == 0 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  w->Stop();
  ASSERT_EQ(calls_.size(), 1u) << "no measurement within 10 s";
  EXPECT_EQ(calls_[0].step, 9);
}

TEST(SeenSetTest, KeepsKeysAcrossOpensAndSkipsATornLine) {
  const fs::path dir = fs::temp_directory_path() /
                       ("rvd_seen_" + std::to_string(::getpid()));
  const std::string path = (dir / "sub" / "seen.jsonl").string();
  fs::remove_all(dir);
  {
    absl::StatusOr<SeenSet> s = SeenSet::Open(path);
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_EQ(s->size(), 0u);
    ASSERT_TRUE(s->Add("/a/checkpoint-1", "m", 1, 10).ok());
    ASSERT_TRUE(s->Add("/a/checkpoint-2", "m", 2, 11).ok());
  }
  std::ofstream(path, std::ios::app) << R"({"path": "/a/checkpoint-3", "mod)";
  {
    absl::StatusOr<SeenSet> s = SeenSet::Open(path);
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_TRUE(s->Contains("/a/checkpoint-1"));
    EXPECT_TRUE(s->Contains("/a/checkpoint-2"));
    EXPECT_FALSE(s->Contains("/a/checkpoint-3"));
    EXPECT_EQ(s->skipped_lines(), 1);
    ASSERT_TRUE(s->Add("/a/checkpoint-4", "m", 4, 12).ok());
  }
  absl::StatusOr<SeenSet> s = SeenSet::Open(path);
  ASSERT_TRUE(s.ok());
  EXPECT_TRUE(s->Contains("/a/checkpoint-4"))
      << "the record after a torn line must start a line of its own";
  EXPECT_EQ(s->skipped_lines(), 1);
  fs::remove_all(dir);
}

// ---- configuration ------------------------------------------------------

TEST(WatchConfigTest, ParsesTheSectionAndTheRoots) {
  absl::StatusOr<Config> c = ParseConfig(R"(
checkpoint_roots: [/mnt/ckpt, /data]
watch:
  directories:
    - path: /mnt/ckpt/llama-*
      model_id: "{dir}"
    - /data/runs/*
    - {path: /data/fixed, model_id: my-model}
  poll_interval_seconds: 2.5
  settle_seconds: 1
  inotify: false
)");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->checkpoint_roots, (std::vector<std::string>{"/mnt/ckpt", "/data"}));
  ASSERT_EQ(c->watch.directories.size(), 3u);
  EXPECT_EQ(c->watch.directories[0].path, "/mnt/ckpt/llama-*");
  EXPECT_EQ(c->watch.directories[1].path, "/data/runs/*");
  EXPECT_EQ(c->watch.directories[1].model_id, "{dir}");
  EXPECT_EQ(c->watch.directories[2].model_id, "my-model");
  EXPECT_EQ(c->watch.poll_interval_seconds, 2.5);
  EXPECT_EQ(c->watch.settle_seconds, 1);
  EXPECT_FALSE(c->watch.inotify);
  EXPECT_TRUE(ValidateConfig(*c).ok()) << ValidateConfig(*c);
  // Defaults: no roots, no watching.
  absl::StatusOr<Config> d = ParseConfig("");
  ASSERT_TRUE(d.ok());
  EXPECT_TRUE(d->checkpoint_roots.empty());
  EXPECT_TRUE(d->watch.directories.empty());
  // One root may be written as a scalar.
  absl::StatusOr<Config> one = ParseConfig("checkpoint_roots: /x\n");
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(one->checkpoint_roots, std::vector<std::string>{"/x"});
}

TEST(WatchConfigTest, BadSectionsAreNamed) {
  const std::pair<const char*, const char*> cases[] = {
      {"watch: [a]", "watch"},
      {"watch: {directories: [/a], bogus: 1}", "bogus"},
      {"watch: {directories: [{path: /a, name: x}]}", "name"},
      {"watch: {directories: [{model_id: x}]}", "path"},
      {"watch: {poll_interval_seconds: soon}", "poll_interval_seconds"},
      {"watch: {inotify: maybe}", "inotify"},
      {"checkpoint_roots: {a: b}", "checkpoint_roots"},
  };
  for (const auto& [text, word] : cases) {
    absl::StatusOr<Config> c = ParseConfig(text);
    ASSERT_FALSE(c.ok()) << text;
    EXPECT_THAT(c.status().message(), HasSubstr(word)) << text;
  }
}

TEST(WatchConfigTest, ValidationChecksRootsAndDirectories) {
  const std::pair<const char*, const char*> cases[] = {
      {"checkpoint_roots: [relative]", "absolute"},
      {"watch: {directories: [/mnt/ckpt/*]}", "not under any of checkpoint_roots"},
      {"checkpoint_roots: [/mnt/ckpt]\nwatch: {directories: [/mnt/ckptx/*]}",
       "not under"},
      {"checkpoint_roots: [/mnt/ckpt]\nwatch: {directories: [/mnt/ckpt/../etc]}",
       "not under"},
      {"checkpoint_roots: [/mnt/ckpt]\nwatch: {directories: [runs/*]}",
       "absolute"},
      {"checkpoint_roots: [/m]\nwatch: {directories: [{path: /m/a, model_id: "
       "\"bad id\"}]}",
       "model_id"},
      {"checkpoint_roots: [/m]\nwatch: {directories: [/m/a], settle_seconds: 0}",
       "settle_seconds"},
      {"checkpoint_roots: [/m]\nwatch: {directories: [/m/a], "
       "poll_interval_seconds: -1}",
       "poll_interval_seconds"},
  };
  for (const auto& [text, word] : cases) {
    absl::StatusOr<Config> c = ParseConfig(text);
    ASSERT_TRUE(c.ok()) << text << ": " << c.status();
    absl::Status s = ValidateConfig(*c);
    ASSERT_FALSE(s.ok()) << text;
    EXPECT_THAT(s.message(), HasSubstr(word)) << text;
  }
  absl::StatusOr<Config> ok = ParseConfig(
      "checkpoint_roots: [/mnt/ckpt/]\nwatch: {directories: [/mnt/ckpt]}");
  ASSERT_TRUE(ok.ok());
  EXPECT_TRUE(ValidateConfig(*ok).ok()) << ValidateConfig(*ok);
}

absl::StatusOr<CommandLine> Parse(std::vector<std::string> args) {
  args.insert(args.begin(), "rvd");
  std::vector<const char*> argv;
  for (const std::string& a : args) argv.push_back(a.c_str());
  return ParseCommandLine(argv.size(), argv.data());
}

TEST(WatchConfigTest, RepeatableRootFlagAndAYamlWatchFlag) {
  absl::StatusOr<CommandLine> cl = Parse(
      {"--checkpoint-root", "/a", "--checkpoint-root=/b", "--watch",
       "{directories: [/a/runs/*], settle_seconds: 2}"});
  ASSERT_TRUE(cl.ok()) << cl.status();
  EXPECT_EQ(cl->config.checkpoint_roots, (std::vector<std::string>{"/a", "/b"}));
  ASSERT_EQ(cl->config.watch.directories.size(), 1u);
  EXPECT_EQ(cl->config.watch.directories[0].path, "/a/runs/*");
  EXPECT_EQ(cl->config.watch.settle_seconds, 2);
  // A flag value that is no YAML, and a watch outside the roots, are errors
  // naming the flag or key.
  absl::StatusOr<CommandLine> bad = Parse({"--watch", "{directories: [/a"});
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("--watch"));
  bad = Parse({"--watch", "{directories: [/a/*]}"});
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("checkpoint_roots"));
  absl::StatusOr<CommandLine> help = Parse({"--help"});
  ASSERT_TRUE(help.ok());
  EXPECT_THAT(help->text, HasSubstr("--checkpoint-root"));
  EXPECT_THAT(help->text, HasSubstr("--watch"));
}

}  // namespace
}  // namespace rvd

// Fault injection in training (docs/reliability.md): the disk fills up (a file-size limit, as
// `ulimit -f` sets it) while `scalelab train --save-every` writes a resumable checkpoint. The
// earlier checkpoints stay byte for byte, no half-written checkpoint is left behind (not even by
// a run the kernel killed with SIGXFSZ: the next save removes what a dead run left), the message
// names the file and the cause, and a run with room resumes from the last good checkpoint.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>

#include "cli/cli_run.h"

namespace scalelab {
namespace {

namespace fs = std::filesystem;
using cli_test::CmdResult;

std::map<std::string, std::string> files_of(const fs::path& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    std::ifstream in(e.path(), std::ios::binary);
    out[e.path().filename().string()] = std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  return out;
}

std::vector<std::string> temporaries(const fs::path& root) {
  std::vector<std::string> t;
  for (const auto& e : fs::directory_iterator(root)) {
    const std::string n = e.path().filename().string();
    if (n.rfind(".checkpoint-", 0) == 0) t.push_back(n);
  }
  return t;
}

// Runs scalelab under bash with every file it writes limited to `limit_kib` KiB; SIGXFSZ ignored
// (the write fails with EFBIG) or at its default (the kernel kills the process).
struct Limited {
  int code;  // scalelab's exit status, 128 + the signal that killed it (as the shell reports it)
  std::string output;
};
Limited run_limited(const std::string& args, std::uintmax_t limit_kib, bool ignore_sigxfsz) {
  const std::string cmd = "bash -c 'ulimit -f " + std::to_string(limit_kib) + "; " +
                          (ignore_sigxfsz ? "trap \"\" XFSZ; " : "") + "exec " + SCALELAB_EXE + " " + args + "' 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  std::array<char, 4096> buf{};
  while (p && fgets(buf.data(), buf.size(), p)) out += buf.data();
  const int status = p ? pclose(p) : -1;
  if (WIFSIGNALED(status)) return {128 + WTERMSIG(status), out};
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

TEST(TrainFaults, DiskFullWhileCheckpointingKeepsTheEarlierCheckpoints) {
  const fs::path root = testing::TempDir() + "train_faults_" + std::to_string(::getpid());
  fs::remove_all(root);
  const std::string train = "train --model llama-tiny --seq-len 16 --micro-batch-size 2 --threads 1 --save-every 2 "
                            "--save " + root.string();
  // A run of 6 steps, then only its first checkpoint kept: the runs below resume from it (a
  // resumed run must have the flags of the run that wrote the checkpoint).
  CmdResult r = cli_test::run(train + " --max-steps 6");
  ASSERT_EQ(r.code, 0) << r.output;
  fs::remove_all(root / "checkpoint-4");
  fs::remove_all(root / "checkpoint-6");
  const fs::path ck2 = root / "checkpoint-2";
  const auto before = files_of(ck2);
  ASSERT_TRUE(before.count("model.safetensors") && before.count("optimizer.safetensors"));
  // A limit the weights fit under but the optimizer state (two moments per weight) does not.
  const std::uintmax_t model_bytes = before.at("model.safetensors").size();
  const std::uintmax_t optimizer_bytes = before.at("optimizer.safetensors").size();
  const std::uintmax_t limit_kib = model_bytes / 1024 + 4;
  ASSERT_LT(limit_kib * 1024, optimizer_bytes);
  const std::string resume = train + " --max-steps 6 --resume " + ck2.string();

  // The kernel kills the run at the limit (SIGXFSZ's default): its temporary directory stays.
  const Limited killed = run_limited(resume, limit_kib, false);
  EXPECT_EQ(killed.code, 128 + SIGXFSZ) << killed.output;
  EXPECT_FALSE(fs::exists(root / "checkpoint-4"));
  EXPECT_EQ(files_of(ck2), before);

  // The write fails instead (SIGXFSZ ignored): exit 1 naming the file and the cause, nothing half
  // written left (the killed run's leftovers removed too), the earlier checkpoint unchanged.
  const Limited failed = run_limited(resume, limit_kib, true);
  EXPECT_EQ(failed.code, 1) << failed.output;
  EXPECT_NE(failed.output.find("optimizer.safetensors"), std::string::npos) << failed.output;
  EXPECT_NE(failed.output.find("check free disk space and file-size limits"), std::string::npos) << failed.output;
  EXPECT_TRUE(temporaries(root).empty()) << temporaries(root).front();
  EXPECT_FALSE(fs::exists(root / "checkpoint-4"));
  EXPECT_EQ(files_of(ck2), before);

  // With room, the run resumes from the checkpoint and writes the next one.
  r = cli_test::run(resume);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(fs::exists(root / "checkpoint-4" / "optimizer.safetensors"));
  EXPECT_TRUE(fs::exists(root / "checkpoint-6" / "optimizer.safetensors"));
  EXPECT_TRUE(temporaries(root).empty());
  EXPECT_EQ(files_of(ck2), before);
  fs::remove_all(root);
}

}  // namespace
}  // namespace scalelab

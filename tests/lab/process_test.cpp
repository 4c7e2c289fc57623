// The trial runner's process handling (core/subprocess.h with a log file, as the executor runs
// trials): exit codes, signals, logs, timeouts that kill the whole process group (grandchildren
// and SIGTERM-ignoring children included), cancellation.
#include "core/subprocess.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <thread>

#include "lab/log_tail.h"
#include "lab_test_util.h"

namespace scalelab::lab {
namespace {

using ::testing::HasSubstr;
using testing::TempDir;

SubprocessSpec sh(const TempDir& dir, const std::string& script) {
  SubprocessSpec s;
  s.argv = {"/bin/sh", "-c", script};
  s.log_path = dir / "log.txt";
  s.kill_grace_s = 0.5;
  return s;
}

TEST(Process, ExitCodeAndLog) {
  TempDir dir;
  SubprocessSpec s = sh(dir, "echo out; echo err >&2; exit 7");
  s.log_header = "# header\n";
  s.env = {{"LAB_TEST_VAR", "v1"}};
  SubprocessResult r = run_subprocess(s);
  ASSERT_TRUE(r.started);
  EXPECT_TRUE(r.exited());
  EXPECT_EQ(r.exit_code(), 7);
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(testing::read_text(s.log_path), "# header\nout\nerr\n");
  EXPECT_EQ(r.describe(), "exit code 7");

  SubprocessSpec e = sh(dir, "printf '%s' \"$LAB_TEST_VAR\"; pwd");
  e.env = {{"LAB_TEST_VAR", "v1"}};
  e.cwd = dir.path();
  run_subprocess(e);
  std::string canonical = std::filesystem::canonical(dir.path()).string();
  EXPECT_EQ(testing::read_text(e.log_path), "v1" + canonical + "\n");
}

TEST(Process, StdinIsEmpty) {
  TempDir dir;
  SubprocessSpec s = sh(dir, "cat; echo end");
  SubprocessResult r = run_subprocess(s);
  EXPECT_EQ(r.exit_code(), 0);
  EXPECT_EQ(testing::read_text(s.log_path), "end\n");
}

TEST(Process, KilledBySignal) {
  TempDir dir;
  SubprocessResult r = run_subprocess(sh(dir, "kill -SEGV $$"));
  ASSERT_TRUE(r.started);
  EXPECT_FALSE(r.exited());
  EXPECT_EQ(r.term_signal(), 11);
  EXPECT_THAT(r.describe(), HasSubstr("killed by signal 11"));
}

TEST(Process, NotStartable) {
  TempDir dir;
  SubprocessSpec s = sh(dir, "");
  s.argv = {"no-such-program-scalelab-test"};
  SubprocessResult r = run_subprocess(s);
  EXPECT_FALSE(r.started);
  EXPECT_THAT(r.start_error, HasSubstr("not an executable file on PATH"));

  testing::write_text(dir / "noexec.sh", "#!/bin/sh\n");
  s.argv = {dir / "noexec.sh"};
  EXPECT_FALSE(run_subprocess(s).started);

  s.argv = {"/bin/true"};
  s.log_path = dir / "missing-dir/log.txt";
  r = run_subprocess(s);
  EXPECT_FALSE(r.started);
  EXPECT_THAT(r.start_error, HasSubstr("cannot write the log file"));

  s.log_path = dir / "log.txt";
  s.cwd = dir / "missing-dir";
  r = run_subprocess(s);
  EXPECT_FALSE(r.started);
  EXPECT_THAT(r.start_error, HasSubstr("cannot execute"));
}

TEST(Process, TimeoutKillsTheWholeGroup) {
  TempDir dir;
  // A grandchild that would outlive its parent, and a parent that ignores SIGTERM.
  std::string pidfile = dir / "grandchild.pid";
  SubprocessSpec s = sh(dir, "sleep 300 & echo $! > " + pidfile + "; trap '' TERM; echo started; while :; do sleep 1; done");
  s.timeout_s = 0.5;
  SubprocessResult r = run_subprocess(s);
  ASSERT_TRUE(r.started);
  EXPECT_TRUE(r.timed_out);
  EXPECT_FALSE(r.exited());
  EXPECT_EQ(r.term_signal(), 9);  // SIGTERM was ignored: SIGKILL after the grace period
  EXPECT_GE(r.wall_s, 0.5);
  pid_t grandchild = std::stoi(testing::read_text(pidfile));
  EXPECT_TRUE(testing::eventually([&] { return !testing::pid_alive(grandchild); }, 5.0));
  EXPECT_THAT(testing::read_text(s.log_path), HasSubstr("started"));
}

TEST(Process, LeftoverGroupMembersAreKilledAfterANormalExit) {
  TempDir dir;
  std::string pidfile = dir / "orphan.pid";
  SubprocessResult r = run_subprocess(sh(dir, "sleep 300 & echo $! > " + pidfile + "; exit 0"));
  EXPECT_EQ(r.exit_code(), 0);
  pid_t orphan = std::stoi(testing::read_text(pidfile));
  EXPECT_TRUE(testing::eventually([&] { return !testing::pid_alive(orphan); }, 5.0));
}

TEST(Process, CancelStopsTheTrial) {
  TempDir dir;
  std::atomic<bool> cancel{false};
  std::thread t([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    cancel = true;
  });
  int ticks = 0;
  SubprocessResult r = run_subprocess(sh(dir, "sleep 300"), &cancel, [&] { ++ticks; });
  t.join();
  EXPECT_TRUE(r.cancelled);
  EXPECT_FALSE(r.timed_out);
  EXPECT_LT(r.wall_s, 60);
}

TEST(Process, FindExecutableAndTail) {
  EXPECT_EQ(find_executable("sh").empty(), false);
  EXPECT_EQ(find_executable("/bin/sh"), "/bin/sh");
  EXPECT_EQ(find_executable("no-such-program-scalelab-test"), "");
  TempDir dir;
  testing::write_text(dir / "f", "line1\nline2\nline3\n");
  EXPECT_EQ(read_file_tail(dir / "f", 100), "line1\nline2\nline3\n");
  EXPECT_EQ(read_file_tail(dir / "f", 8), "line3\n");  // the cut first line is dropped
  EXPECT_EQ(read_file_tail(dir / "missing", 8), "");
}

}  // namespace
}  // namespace scalelab::lab

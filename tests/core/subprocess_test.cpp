// core/subprocess.h in pipe mode (what mpirun/sbatch launches and nvidia-smi use) and the
// Subprocess object itself; the log-file mode of the lab's trials is tested in
// tests/lab/process_test.cpp.
#include "core/subprocess.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "core/error.h"

namespace scalelab {
namespace {

SubprocessSpec sh(const std::string& script) {
  SubprocessSpec s;
  s.argv = {"sh", "-c", script};
  return s;
}

TEST(Subprocess, CapturesOutputAndExitCode) {
  SubprocessSpec o = sh("echo out $SCALELAB_PROCESS_TEST; echo err >&2; exit 3");
  o.env = {{"SCALELAB_PROCESS_TEST", "hello"}};
  const SubprocessResult r = run_subprocess(o);
  ASSERT_TRUE(r.started) << r.start_error;
  EXPECT_EQ(r.exit_code(), 3);
  EXPECT_FALSE(r.timed_out);
  EXPECT_FALSE(r.ok());
  EXPECT_NE(r.output.find("out hello"), std::string::npos);
  EXPECT_NE(r.output.find("err"), std::string::npos);
  EXPECT_EQ(r.describe(), "exit code 3");
}

TEST(Subprocess, TimeoutEndsTheWholeProcessGroup) {
  // A child that ignores SIGTERM and a grandchild: both must go (SIGKILL to the group).
  SubprocessSpec o = sh("trap '' TERM; sleep 60 & sleep 60; wait");
  o.timeout_s = 0.5;
  o.kill_grace_s = 0.5;
  const SubprocessResult r = run_subprocess(o);
  EXPECT_TRUE(r.timed_out);
  EXPECT_FALSE(r.ok());
  EXPECT_LT(r.wall_s, 30);
  EXPECT_NE(r.describe().find("timed out after 0.5 s"), std::string::npos) << r.describe();
}

TEST(Subprocess, SignalMissingCommandEnvironmentAndDirectory) {
  const SubprocessResult r = run_subprocess(sh("kill -9 $$"));
  EXPECT_EQ(r.term_signal(), 9);
  EXPECT_EQ(r.describe().rfind("killed by signal 9", 0), 0u) << r.describe();
  SubprocessSpec missing;
  missing.argv = {"/nonexistent/scalelab-no-such-binary"};
  const SubprocessResult m = run_subprocess(missing);
  EXPECT_FALSE(m.started);
  EXPECT_NE(m.start_error.find("is not an executable file"), std::string::npos) << m.start_error;
  EXPECT_THROW(Subprocess::start(missing), SubprocessStartError);

  setenv("SCALELAB_PROCESS_TEST_UNSET", "set", 1);
  SubprocessSpec o;
  o.argv = {"/bin/sh", "-c", "pwd; echo var=${SCALELAB_PROCESS_TEST_UNSET:-unset}"};
  o.unset_env.emplace_back("SCALELAB_PROCESS_TEST_UNSET");
  o.cwd = "/tmp";
  const SubprocessResult p = run_subprocess(o);
  EXPECT_NE(p.output.find("/tmp\nvar=unset"), std::string::npos) << p.output;
  o.cwd = "/nonexistent/scalelab-no-such-dir";
  const SubprocessResult d = run_subprocess(o);
  EXPECT_FALSE(d.started);
  EXPECT_NE(d.start_error.find("cannot execute /bin/sh in /nonexistent"), std::string::npos) << d.start_error;
}

TEST(Subprocess, KeepsTheLastBytesOfTheOutput) {
  SubprocessSpec o = sh("i=0; while [ $i -lt 2000 ]; do echo line$i; i=$((i+1)); done; echo last");
  o.max_output = 100;
  const SubprocessResult r = run_subprocess(o);
  EXPECT_EQ(r.exit_code(), 0);
  EXPECT_LE(r.output.size(), 100u);
  EXPECT_EQ(r.output.substr(r.output.size() - 5), "last\n");
}

TEST(Subprocess, CancelAndTick) {
  std::atomic<bool> cancel{false};
  int ticks = 0;
  const SubprocessResult r = run_subprocess(sh("sleep 60"), &cancel, [&] {
    if (++ticks == 2) cancel = true;
  });
  EXPECT_TRUE(r.cancelled);
  EXPECT_FALSE(r.timed_out);
  EXPECT_GE(ticks, 2);
  EXPECT_EQ(r.term_signal(), SIGTERM);
}

// The streaming use (nvidia-smi): started, read by the caller, waited for and ended.
TEST(Subprocess, StreamWaitAndTerminate) {
  SubprocessSpec s = sh("echo ready; exec sleep 60");
  s.own_process_group = false;
  s.die_with_parent = false;
  Subprocess p = Subprocess::start(s);
  ASSERT_TRUE(p.valid());
  EXPECT_EQ(::getpgid(p.pid()), ::getpgrp());  // stays in the host's process group
  char buf[16] = {};
  pollfd pfd{p.output_fd(), POLLIN, 0};
  ASSERT_EQ(::poll(&pfd, 1, 10000), 1);
  EXPECT_EQ(::read(p.output_fd(), buf, 6), 6);
  EXPECT_EQ(std::string(buf), "ready\n");
  EXPECT_FALSE(p.wait_for(std::chrono::milliseconds(50)).has_value());  // still running
  const ExitStatus st = p.terminate(std::chrono::milliseconds(2000));
  EXPECT_FALSE(st.exited);
  EXPECT_EQ(st.signal, SIGTERM);
  EXPECT_TRUE(p.reaped());
  EXPECT_EQ(p.reap().signal, SIGTERM);  // the same status again

  Subprocess g = Subprocess::start(sh("exit 4"));
  EXPECT_NE(::getpgid(g.pid()), ::getpgrp());  // a group of its own (the default)
  const auto done = g.wait_for(std::chrono::milliseconds(10000));
  ASSERT_TRUE(done.has_value());
  EXPECT_TRUE(done->exited);
  EXPECT_EQ(done->code, 4);
}

// A descriptor the host opened without O_CLOEXEC is not inherited: the host still sees EOF on
// a pipe whose write end it closed, while the child runs.
TEST(Subprocess, HostDescriptorsAreNotInherited) {
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);  // no O_CLOEXEC on purpose
  Subprocess p = Subprocess::start(sh("sleep 30"));
  ::close(fds[1]);
  pollfd pfd{fds[0], POLLIN, 0};
  ASSERT_EQ(::poll(&pfd, 1, 5000), 1);
  char c;
  EXPECT_EQ(::read(fds[0], &c, 1), 0);  // EOF: the child does not hold the write end
  ::close(fds[0]);
  p.terminate(std::chrono::milliseconds(1000));
}

TEST(Subprocess, FindExecutable) {
  EXPECT_FALSE(find_executable("sh").empty());
  EXPECT_EQ(find_executable("/bin/sh"), "/bin/sh");
  EXPECT_EQ(find_executable("no-such-program-scalelab-test"), "");
  EXPECT_EQ(find_executable("/etc/passwd"), "");  // not executable
  EXPECT_EQ(find_executable(""), "");
}

}  // namespace
}  // namespace scalelab

#include "dist/process.h"

#include <gtest/gtest.h>

#include <cstdlib>

#include "core/error.h"

namespace scalelab {
namespace {

TEST(RunProcess, CapturesOutputAndExitCode) {
  ProcessOptions o;
  o.env = {{"SCALELAB_PROCESS_TEST", "hello"}};
  const ProcessResult r = run_process({"sh", "-c", "echo out $SCALELAB_PROCESS_TEST; echo err >&2; exit 3"}, o);
  EXPECT_EQ(r.exit_code, 3);
  EXPECT_FALSE(r.timed_out);
  EXPECT_FALSE(r.ok());
  EXPECT_NE(r.output.find("out hello"), std::string::npos);
  EXPECT_NE(r.output.find("err"), std::string::npos);
  EXPECT_EQ(r.describe(), "exit code 3");
}

TEST(RunProcess, TimeoutEndsTheWholeProcessGroup) {
  ProcessOptions o;
  o.timeout_s = 0.5;
  // A child that ignores SIGTERM and a grandchild: both must go (SIGKILL to the group).
  const ProcessResult r = run_process({"sh", "-c", "trap '' TERM; sleep 60 & sleep 60; wait"}, o);
  EXPECT_TRUE(r.timed_out);
  EXPECT_FALSE(r.ok());
  EXPECT_NE(r.describe().find("timed out"), std::string::npos);
}

TEST(RunProcess, SignalAndMissingCommand) {
  const ProcessResult r = run_process({"sh", "-c", "kill -9 $$"});
  EXPECT_EQ(r.term_signal, 9);
  const ProcessResult m = run_process({"/nonexistent/scalelab-no-such-binary"});
  EXPECT_EQ(m.exit_code, 127);
  ProcessOptions o;
  setenv("SCALELAB_PROCESS_TEST_UNSET", "set", 1);
  o.unset_env.emplace_back("SCALELAB_PROCESS_TEST_UNSET");
  o.cwd = "/tmp";
  const ProcessResult p = run_process({"/bin/sh", "-c", "pwd; echo var=${SCALELAB_PROCESS_TEST_UNSET:-unset}"}, o);
  EXPECT_NE(p.output.find("/tmp\nvar=unset"), std::string::npos) << p.output;
}

}  // namespace
}  // namespace scalelab

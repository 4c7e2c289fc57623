// /proc and /sys readers: parsing of given text, this machine's files, and fake sysfs trees.
#include "telemetry/proc.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>

#include "telemetry/host_source.h"
#include "telemetry/process_source.h"
#include "telemetry_test_support.h"

extern char** environ;

namespace scalelab {
namespace {

using test::values_of;

// Starts `sh -c script` as a child of this process.
pid_t spawn_sh(const std::string& script) {
  pid_t pid = -1;
  const char* argv[] = {"/bin/sh", "-c", script.c_str(), nullptr};
  EXPECT_EQ(::posix_spawn(&pid, "/bin/sh", nullptr, nullptr, const_cast<char**>(argv), environ), 0);
  return pid;
}

void kill_and_reap(pid_t pid) {
  ::kill(pid, SIGKILL);
  int st = 0;
  ::waitpid(pid, &st, 0);
}

TEST(ProcParse, PidStatWithAwkwardComm) {
  // comm may hold spaces and parentheses: fields are counted after the last ')'.
  const std::string text =
      "4242 (my (odd) prog) S 17 4242 4242 0 -1 4194304 100 0 0 0 250 50 7 3 20 0 4 0 "
      "123456 987654321 2048 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0\n";
  const auto s = parse_pid_stat(text);
  ASSERT_TRUE(s);
  EXPECT_EQ(s->pid, 4242);
  EXPECT_EQ(s->comm, "my (odd) prog");
  EXPECT_EQ(s->state, 'S');
  EXPECT_EQ(s->ppid, 17);
  EXPECT_EQ(s->utime, 250u);
  EXPECT_EQ(s->stime, 50u);
  EXPECT_EQ(s->cutime, 7u);
  EXPECT_EQ(s->cstime, 3u);
  EXPECT_EQ(s->starttime, 123456u);
  EXPECT_EQ(s->rss_pages, 2048);
  EXPECT_FALSE(parse_pid_stat("garbage"));
  EXPECT_FALSE(parse_pid_stat("1 (x) S 0 1 2"));
}

TEST(ProcParse, StatCpuLineAndMeminfo) {
  const auto c = parse_proc_stat_cpu("cpu  100 5 50 800 20 1 2 3 0 0\ncpu0 1 2 3 4\nintr 5\n");
  ASSERT_TRUE(c);
  EXPECT_EQ(c->total(), 981u);
  EXPECT_EQ(c->idle_all(), 820u);
  CpuTimes later = *c;
  later.user += 30;
  later.idle += 10;
  EXPECT_DOUBLE_EQ(*cpu_busy_pct(*c, later), 75.0);
  EXPECT_FALSE(cpu_busy_pct(*c, *c));

  const auto m = parse_meminfo("MemTotal:       16000 kB\nMemFree:  100 kB\nMemAvailable:    4000 kB\n");
  ASSERT_TRUE(m);
  EXPECT_DOUBLE_EQ(m->total_bytes, 16000.0 * 1024);
  EXPECT_DOUBLE_EQ(m->available_bytes, 4000.0 * 1024);
  EXPECT_FALSE(parse_meminfo("MemTotal: 1 kB\n"));
}

TEST(ProcThisMachine, OwnStatMeminfoAndCpu) {
  const auto self = read_pid_stat(::getpid());
  ASSERT_TRUE(self);
  EXPECT_EQ(self->pid, ::getpid());
  EXPECT_EQ(self->ppid, ::getppid());
  EXPECT_EQ(self->state, 'R');
  EXPECT_GT(self->rss_pages, 0);
  const auto m = read_meminfo();
  ASSERT_TRUE(m);
  EXPECT_GT(m->total_bytes, m->available_bytes);
  EXPECT_GT(m->available_bytes, 0);
  const auto c = read_system_cpu();
  ASSERT_TRUE(c);
  EXPECT_GT(c->total(), 0u);
  EXPECT_FALSE(read_pid_stat(-5));
}

TEST(ProcThisMachine, ProcessTreeOfAChildWithGrandchildren) {
  const pid_t sh = spawn_sh("sleep 30 & sleep 30 & wait");
  ASSERT_GT(sh, 0);
  std::vector<int> tree;
  // Both children forked and exec'ed (a fork shows as "sh" until its exec).
  ASSERT_TRUE(test::wait_until([&] {
    tree = process_tree(sh);
    if (tree.size() != 3) return false;
    for (std::size_t i = 1; i < 3; ++i) {
      const auto st = read_pid_stat(tree[i]);
      if (!st || st->comm != "sleep") return false;
    }
    return true;
  })) << "tree size " << tree.size();
  EXPECT_EQ(tree[0], sh);
  for (std::size_t i = 1; i < tree.size(); ++i) {
    const auto st = read_pid_stat(tree[i]);
    ASSERT_TRUE(st);
    EXPECT_EQ(st->ppid, sh);
    EXPECT_EQ(st->comm, "sleep");
  }
  // This process's tree includes the shell and its children.
  const auto mine = process_tree(::getpid());
  for (int p : tree) EXPECT_NE(std::find(mine.begin(), mine.end(), p), mine.end());
  ::kill(tree[1], SIGKILL);
  ::kill(tree[2], SIGKILL);
  kill_and_reap(sh);
  EXPECT_TRUE(process_tree(sh).empty());
}

TEST(ProcFake, ProcessTreeByScanningWhereNoChildrenLists) {
  test::TempDir root;
  auto stat = [&](int pid, int ppid) {
    test::write_file(root / (std::to_string(pid) + "/stat"),
                     std::to_string(pid) + " (p) S " + std::to_string(ppid) +
                         " 0 0 0 -1 0 0 0 0 0 1 1 0 0 20 0 1 0 10 1000 5 0 0\n");
  };
  stat(1000, 1);
  stat(1001, 1000);
  stat(1002, 1001);
  stat(1003, 1);
  stat(1004, 1000);
  auto tree = process_tree(1000, root.path());
  std::sort(tree.begin(), tree.end());
  EXPECT_EQ(tree, (std::vector<int>{1000, 1001, 1002, 1004}));
  // Pruned: 1001 and its child 1002 are left out.
  tree = process_tree(1000, root.path(), {1001});
  std::sort(tree.begin(), tree.end());
  EXPECT_EQ(tree, (std::vector<int>{1000, 1004}));
  EXPECT_TRUE(process_tree(999, root.path()).empty());
}

TEST(ProcessSource, SeesTheCpuOfABusyTreeAndNoneOfAnIdleOne) {
  const pid_t busy = spawn_sh("while :; do :; done");
  const pid_t idle = spawn_sh("exec sleep 30");
  ASSERT_GT(busy, 0);
  ASSERT_GT(idle, 0);
  // Once started and asleep, the idle one uses no CPU at all.
  ASSERT_TRUE(test::wait_until([&] {
    const auto st = read_pid_stat(idle);
    return st && st->state == 'S' && st->comm == "sleep";
  }));
  TimeSeries ts;
  ProcessSource busy_src({busy, true, "/proc", nullptr});
  ProcessSource idle_src({idle, true, "/proc", nullptr});
  ASSERT_EQ(busy_src.open(), "");
  ASSERT_EQ(idle_src.open(), "");
  TimeSeries busy_ts, idle_ts;
  for (int i = 1; i <= 3; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    busy_src.sample(i * 0.1, busy_ts);
    idle_src.sample(i * 0.1, idle_ts);
  }
  kill_and_reap(busy);
  kill_and_reap(idle);
  const auto b = values_of(busy_ts.samples(), "process", "process", "cpu_util_pct");
  const auto d = values_of(idle_ts.samples(), "process", "process", "cpu_util_pct");
  ASSERT_EQ(b.size(), 3u);
  ASSERT_EQ(d.size(), 3u);
  const double busy_sum = b[0] + b[1] + b[2];
  EXPECT_GT(busy_sum, 0.0);  // it ran for some of the 300 ms, however loaded the machine
  for (double v : b) EXPECT_LE(v, 100.0 * std::thread::hardware_concurrency() + 50.0);
  for (double v : d) EXPECT_LT(v, 15.0);  // sleep uses no CPU (one 10 ms tick of rounding at most)
  EXPECT_GT(values_of(busy_ts.samples(), "process", "process", "rss_bytes")[0], 0);
  EXPECT_EQ(values_of(busy_ts.samples(), "process", "process", "num_processes")[0], 1);
}

TEST(ProcessSource, RootThatExitedIsUnavailable) {
  const pid_t p = spawn_sh("exit 0");
  int st = 0;
  ::waitpid(p, &st, 0);
  TimeSeries ts;
  ProcessSource src({p, true, "/proc", nullptr});
  EXPECT_NE(src.open().find("not found"), std::string::npos);
}

TEST(Rapl, CounterDeltaWithWrap) {
  EXPECT_EQ(rapl_delta_uj(100, 250, 1000), 150u);
  EXPECT_EQ(rapl_delta_uj(900, 100, 1000), 200u);  // wrapped at 1000
  EXPECT_FALSE(rapl_delta_uj(900, 100, 0));         // range unknown: not a wrap we can size
  EXPECT_EQ(rapl_delta_uj(5, 5, 0), 0u);
}

TEST(HostSource, FakeSysfsRaplWithWrapAndHwmon) {
  test::TempDir sys;
  const std::string zone = sys / "class/powercap/intel-rapl:0";
  test::write_file(zone + "/name", "package-0\n");
  test::write_file(zone + "/max_energy_range_uj", "1000000\n");
  test::write_file(zone + "/energy_uj", "999000\n");
  test::write_file(sys / "class/powercap/intel-rapl:0:0/name", "core\n");  // a sub-zone: ignored
  test::write_file(sys / "class/powercap/intel-rapl:0:0/energy_uj", "5\n");
  test::write_file(sys / "class/hwmon/hwmon0/name", "coretemp\n");
  test::write_file(sys / "class/hwmon/hwmon0/temp1_input", "45000\n");
  test::write_file(sys / "class/hwmon/hwmon0/temp1_label", "Package id 0\n");
  test::write_file(sys / "class/hwmon/hwmon0/temp2_input", "47500\n");  // no label
  test::write_file(sys / "class/hwmon/hwmon1/name", "nvme\n");
  test::write_file(sys / "class/hwmon/hwmon1/temp1_input", "38000\n");
  test::write_file(sys / "class/hwmon/hwmon2/name", "nvme\n");
  test::write_file(sys / "class/hwmon/hwmon2/temp1_input", "39000\n");

  HostSource::Options o;
  o.sys_root = sys.path();
  HostSource src(o);
  TimeSeries ts;
  ASSERT_EQ(src.open(), "");
  EXPECT_EQ(src.rapl_devices(), (std::vector<std::string>{"rapl:package-0"}));
  EXPECT_EQ(src.hwmon_devices(),
            (std::vector<std::string>{"hwmon:coretemp/Package id 0", "hwmon:coretemp/temp2",
                                      "hwmon:nvme@hwmon1/temp1", "hwmon:nvme@hwmon2/temp1"}));
  std::this_thread::sleep_for(std::chrono::milliseconds(40));
  test::write_file(zone + "/energy_uj", "200000\n");  // wrapped: +1000 to the top, +200000
  src.sample(1.0, ts);
  std::this_thread::sleep_for(std::chrono::milliseconds(40));
  test::write_file(zone + "/energy_uj", "700000\n");
  src.sample(2.0, ts);
  const auto s = ts.samples();
  const auto e = values_of(s, "host", "rapl:package-0", "energy_j");
  ASSERT_EQ(e.size(), 2u);
  EXPECT_NEAR(e[0], 0.201, 1e-12);
  EXPECT_NEAR(e[1], 0.701, 1e-12);
  const auto p = values_of(s, "host", "rapl:package-0", "power_w");
  ASSERT_EQ(p.size(), 2u);
  EXPECT_GT(p[0], 0);
  EXPECT_EQ(values_of(s, "host", "hwmon:coretemp/Package id 0", "temperature_c"),
            (std::vector<double>{45, 45}));
  EXPECT_EQ(values_of(s, "host", "hwmon:coretemp/temp2", "temperature_c"),
            (std::vector<double>{47.5, 47.5}));
  // /proc is this machine's: memory readings come with every sample.
  EXPECT_EQ(values_of(s, "host", "host", "mem_total_bytes").size(), 2u);
}

TEST(HostSource, ThisMachineWithoutRaplSaysSoAndReadsTheRest) {
  HostSource::Options o;
  o.sys_root = "/nonexistent-sys";
  HostSource src(o);
  TimeSeries ts;
  ASSERT_EQ(src.open(), "");
  const auto notes = src.take_notes();
  EXPECT_TRUE(test::any_note_contains(notes, "RAPL unavailable"));
  EXPECT_TRUE(test::any_note_contains(notes, "hwmon unavailable"));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  src.sample(0.05, ts);
  const auto s = ts.samples();
  const auto cpu = values_of(s, "host", "host", "cpu_util_pct");
  ASSERT_EQ(cpu.size(), 1u);
  EXPECT_GE(cpu[0], 0.0);
  EXPECT_LE(cpu[0], 100.0);
  EXPECT_GT(values_of(s, "host", "host", "mem_used_bytes").at(0), 0);
}

}  // namespace
}  // namespace scalelab

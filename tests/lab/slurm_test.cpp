// src/lab/slurm: the sbatch script and the submit/collect path, with fake sbatch/srun/scancel
// scripts (the real cluster is exercised by tests/distributed/slurm_localhost_test.sh).
#include "lab/slurm.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"

namespace scalelab::lab {
namespace {

namespace fs = std::filesystem;

SlurmJob example() {
  SlurmJob j;
  j.job_name = "scale-4x2";
  j.nodes = 2;
  j.tasks_per_node = 4;
  j.gpus_per_node = 4;
  j.cpus_per_task = 8;
  j.time = "00:30:00";
  j.partition = "gpu";
  j.command = {"/opt/scalelab/build/scalelab", "train", "--model", "llama-small", "--note", "it's a \"test\""};
  j.work_dir = "/scratch/runs/scale-8";
  j.env = {{"OMP_NUM_THREADS", "8"}};
  return j;
}

TEST(SlurmScript, HasTheResourcesAndOneSrunPerRank) {
  const std::string s = render_sbatch_script(example());
  EXPECT_EQ(s.rfind("#!/bin/bash\n", 0), 0u);
  for (const char* line : {"#SBATCH --job-name=scale-4x2\n", "#SBATCH --nodes=2\n", "#SBATCH --ntasks-per-node=4\n",
                           "#SBATCH --gpus-per-node=4\n", "#SBATCH --cpus-per-task=8\n", "#SBATCH --time=00:30:00\n",
                           "#SBATCH --partition=gpu\n", "#SBATCH --output=/scratch/runs/scale-8/slurm-%j.out\n",
                           "export OMP_NUM_THREADS='8'\n", "export SCALELAB_RESULT_DIR='/scratch/runs/scale-8'\n"})
    EXPECT_NE(s.find(line), std::string::npos) << line << "\n" << s;
  EXPECT_NE(s.find("srun --mpi=pmix --kill-on-bad-exit=1 sh -c 'exec \"$@\" --json "
                   "\"$SCALELAB_RESULT_DIR/rank-$SLURM_PROCID.json\"' scalelab-task '/opt/scalelab/build/scalelab' "
                   "'train' '--model' 'llama-small' '--note' 'it'\\''s a \"test\"'\n"),
            std::string::npos)
      << s;
  SlurmJob no_gpu = example();
  no_gpu.gpus_per_node = 0;
  no_gpu.partition.clear();
  no_gpu.result_flag.clear();
  const std::string t = render_sbatch_script(no_gpu);
  EXPECT_EQ(t.find("--gpus-per-node"), std::string::npos);
  EXPECT_EQ(t.find("--partition"), std::string::npos);
  EXPECT_NE(t.find("srun --mpi=pmix --kill-on-bad-exit=1 '/opt/scalelab/build/scalelab' 'train'"), std::string::npos) << t;
}

TEST(SlurmScript, RejectsWhatSbatchCannotCarry) {
  auto bad = [](auto mutate) {
    SlurmJob j = example();
    mutate(j);
    EXPECT_THROW(render_sbatch_script(j), InvalidInput);
  };
  bad([](SlurmJob& j) { j.nodes = 0; });
  bad([](SlurmJob& j) { j.tasks_per_node = 0; });
  bad([](SlurmJob& j) { j.partition = "gpu nodes"; });
  bad([](SlurmJob& j) { j.job_name = "a'b"; });
  bad([](SlurmJob& j) { j.command.clear(); });
  bad([](SlurmJob& j) { j.work_dir = "relative/dir"; });
  bad([](SlurmJob& j) { j.extra_sbatch = {"exclusive"}; });
  bad([](SlurmJob& j) { j.env = {{"1BAD", "x"}}; });
}

// A directory with fake sbatch / srun / scancel: sbatch runs the script at once (job id 4242),
// srun runs the command once per task with SLURM_PROCID set.
struct FakeSlurm {
  fs::path dir;
  explicit FakeSlurm(const std::string& sbatch_body) {
    dir = fs::temp_directory_path() / ("scalelab_fake_slurm_" + std::to_string(getpid()) + "_" +
                                       ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir);
    write("sbatch", sbatch_body);
    write("srun",
          "#!/bin/bash\n"
          "while [[ $# -gt 0 && $1 == --* ]]; do shift; done\n"
          "rc=0\n"
          "for r in $(seq 0 $((FAKE_TASKS - 1))); do SLURM_PROCID=$r \"$@\" || rc=$?; done\n"
          "exit $rc\n");
    write("scancel", "#!/bin/bash\necho \"$@\" >> \"$(dirname \"$0\")/cancelled\"\n");
  }
  ~FakeSlurm() { fs::remove_all(dir); }
  void write(const std::string& name, const std::string& body) {
    std::ofstream(dir / name) << body;
    fs::permissions(dir / name, fs::perms::owner_all);
  }
  SlurmSubmitOptions options(int tasks) const {
    SlurmSubmitOptions o;
    o.sbatch = (dir / "sbatch").string();
    o.scancel = (dir / "scancel").string();
    o.env = {{"PATH", dir.string() + ":" + std::getenv("PATH")}, {"FAKE_TASKS", std::to_string(tasks)}};
    return o;
  }
};

const char* kRunAtOnce =
    "#!/bin/bash\n"
    "script=${@: -1}\n"
    "echo 4242\n"
    "out=$(sed -n 's/^#SBATCH --output=//p' \"$script\" | sed 's/%j/4242/')\n"
    "bash \"$script\" > \"$out\" 2>&1\n";

TEST(SlurmSubmit, CollectsEveryRanksResultThroughTheScript) {
  FakeSlurm fake(kRunAtOnce);
  SlurmJob j;
  j.tasks_per_node = 3;
  j.work_dir = (fake.dir / "job").string();
  // Each "rank" writes a JSON naming its rank to the path appended after --json ($1 --json, $2 path).
  j.command = {"sh", "-c", "echo \"{\\\"status\\\": \\\"ok\\\", \\\"rank\\\": $SLURM_PROCID}\" > \"$2\"; echo hello from $SLURM_PROCID",
               "task"};
  const SlurmJobResult r = submit_slurm_job(j, fake.options(3));
  EXPECT_EQ(r.job_id, "4242");
  EXPECT_EQ(r.exit_code, 0) << r.sbatch_output << r.log_tail;
  ASSERT_EQ(r.ranks.size(), 3u);
  for (int k = 0; k < 3; ++k) {
    ASSERT_TRUE(r.ranks[static_cast<std::size_t>(k)].record.has_value()) << r.ranks[static_cast<std::size_t>(k)].error << r.log_tail;
    EXPECT_EQ((*r.ranks[static_cast<std::size_t>(k)].record)["rank"], k);
  }
  EXPECT_TRUE(r.ok()) << r.describe();
  EXPECT_NE(r.log_tail.find("hello from 2"), std::string::npos) << r.log_tail;
  EXPECT_TRUE(fs::exists(j.script_path()));
}

TEST(SlurmSubmit, MissingRankAndFailedJobAreNamed) {
  FakeSlurm fake(kRunAtOnce);
  SlurmJob j;
  j.tasks_per_node = 2;
  j.work_dir = (fake.dir / "job").string();
  j.command = {"sh", "-c", "[ $SLURM_PROCID = 1 ] && exit 3; echo '{\"status\": \"ok\"}' > \"$2\"", "task"};
  const SlurmJobResult r = submit_slurm_job(j, fake.options(2));
  EXPECT_EQ(r.exit_code, 3);
  EXPECT_FALSE(r.ok());
  EXPECT_TRUE(r.ranks[0].record.has_value());
  EXPECT_FALSE(r.ranks[1].record.has_value());
  EXPECT_NE(r.describe().find("job 4242 exited with code 3; rank 1: wrote no result"), std::string::npos) << r.describe();
}

TEST(SlurmSubmit, TimeoutCancelsTheJob) {
  FakeSlurm fake("#!/bin/bash\necho 777\nsleep 30\n");
  SlurmJob j;
  j.work_dir = (fake.dir / "job").string();
  j.command = {"true"};
  SlurmSubmitOptions o = fake.options(1);
  o.timeout_s = 0.5;
  const SlurmJobResult r = submit_slurm_job(j, o);
  EXPECT_TRUE(r.timed_out);
  EXPECT_FALSE(r.ok());
  std::ifstream in(fake.dir / "cancelled");
  std::string cancelled;
  std::getline(in, cancelled);
  EXPECT_EQ(cancelled, "777");
}

TEST(SlurmSubmit, RejectedSubmissionIsAnError) {
  FakeSlurm fake("#!/bin/bash\necho 'sbatch: error: invalid partition specified: nope' >&2\nexit 1\n");
  SlurmJob j;
  j.work_dir = (fake.dir / "job").string();
  j.command = {"true"};
  try {
    submit_slurm_job(j, fake.options(1));
    ADD_FAILURE() << "expected RuntimeError";
  } catch (const RuntimeError& e) {
    EXPECT_NE(std::string(e.what()).find("invalid partition specified"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace scalelab::lab

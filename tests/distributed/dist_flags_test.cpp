#include "distributed/dist_flags.h"

#include <gtest/gtest.h>

#include <CLI/CLI.hpp>

#include "core/error.h"

namespace scalelab {
namespace {

TEST(DistFlags, ParsedIntoOptions) {
  CLI::App app;
  DistFlags f;
  add_dist_flags(app, f);
  const char* argv[] = {"train", "--ddp-bucket-mb", "50", "--zero", "1", "--comm-timeout", "30", "--comm-backend", "mpi"};
  app.parse(9, argv);
  EXPECT_EQ(f.backend(), CommBackend::kMpi);
  EXPECT_DOUBLE_EQ(f.comm_options().timeout_s, 30);
  const DataParallelOptions o = f.data_parallel_options();
  EXPECT_DOUBLE_EQ(o.ddp.bucket_mb, 50);
  EXPECT_DOUBLE_EQ(o.ddp.first_bucket_mb, 1);
  EXPECT_EQ(o.zero_stage, 1);
  EXPECT_EQ(f.to_json()["ddp_bucket_mb"], 50.0);
  EXPECT_EQ(f.to_json()["comm_backend"], "mpi");
}

TEST(DistFlags, DefaultsAndBadValues) {
  DistFlags f;
  EXPECT_EQ(f.backend(), CommBackend::kAuto);
  EXPECT_DOUBLE_EQ(f.data_parallel_options().ddp.bucket_mb, 25);
  EXPECT_EQ(f.data_parallel_options().zero_stage, 0);
  f.zero = 3;
  EXPECT_THROW(f.data_parallel_options(), InvalidInput);
  f.zero = 0;
  f.ddp_bucket_mb = 0;
  EXPECT_THROW(f.data_parallel_options(), InvalidInput);
  f.comm_timeout_s = -1;
  EXPECT_THROW(f.comm_options(), InvalidInput);
  f.comm_backend = "gloo";
  EXPECT_THROW(f.backend(), InvalidInput);
}

}  // namespace
}  // namespace scalelab

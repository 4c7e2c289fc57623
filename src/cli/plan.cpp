// `scalelab plan`: the memory plan of a training configuration, without running it.
#include <cstdio>
#include <memory>

#include "cli/command.h"
#include "cli/train_flags.h"
#include "core/allocator.h"
#include "core/error.h"
#include "core/parallel.h"
#include "train/memory_plan.h"
#include "train/trainer.h"

namespace scalelab::cli {

Subcommand add_plan_command(CLI::App& root) {
  auto opts = std::make_shared<TrainOptions>();
  auto* app = root.add_subcommand("plan", "Print the device-memory plan of a train configuration without running it");
  add_train_flags(app, *opts);
  auto world = std::make_shared<int>(1);
  auto rank = std::make_shared<int>(0);
  app->add_option("--world-size", *world, "Data-parallel ranks (with --zero 1 the optimizer states are sharded)")
      ->capture_default_str();
  app->add_option("--rank", *rank, "The rank whose plan to show (ZeRO-1 shards differ by a few elements)")
      ->capture_default_str();
  return {app, [opts, world, rank] {
            const TrainOptions& o = *opts;
            validate_train_options(o);
            if (*world < 1 || *rank < 0 || *rank >= *world)
              throw InvalidInput("[plan] --rank " + std::to_string(*rank) + " is not in [0, --world-size " +
                                 std::to_string(*world) + ")");
            o.dist.data_parallel_options();  // checks --zero
            PlanInput in = make_plan_input(o);
            in.world_size = *world;
            in.rank = *rank;
            in.zero_stage = o.dist.zero;
            const MemoryPlan plan = plan_memory(in);
            std::printf("Memory plan: %s, micro-batch %lld, seq-len %lld\n", in.config.name.c_str(),
                        static_cast<long long>(o.micro_batch_size), static_cast<long long>(o.seq_len));
            if (plan.frozen_params > 0) {
              std::printf("Parameters: %lld (%lld trainable, %lld frozen by --freeze '%s')\n",
                          static_cast<long long>(plan.params), static_cast<long long>(plan.trainable_params),
                          static_cast<long long>(plan.frozen_params), o.freeze.c_str());
            }
            std::printf("%s", plan.to_table().c_str());
            if (!o.json.empty()) {
              write_json_file(o.json, plan.to_json());
              std::printf("Plan: %s\n", o.json.c_str());
            }
            return 0;
          }};
}

}  // namespace scalelab::cli

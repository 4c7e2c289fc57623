// `scalelab train`: train a model with the native engine and report throughput and memory.
#include <cstdio>
#include <memory>

#include "cli/command.h"
#include "cli/train_flags.h"
#include "core/allocator.h"
#include "core/error.h"
#include "distributed/communicator.h"
#include "distributed/dist_context.h"
#include "profile/summary.h"
#include "train/device_setup.h"
#include "train/trainer.h"

namespace scalelab::cli {

namespace {

// The telemetry summary in a few lines: per device the averages that matter, energy, and how far
// the sources agree (Pearson r and mean difference of each compared quantity).
void print_telemetry(const nlohmann::json& t) {
  std::printf("Telemetry: %lld readings over %.1f s\n", static_cast<long long>(t.value("readings", 0)),
              t.value("duration_s", 0.0));
  if (t.contains("devices")) {
    for (const auto& [dev, d] : t["devices"].items()) {
      std::string line;
      for (const auto& [src, metrics] : d["metrics"].items()) {
        for (const char* m : {"gpu_util_pct", "power_w", "mem_used_bytes", "temperature_c", "reserved_bytes"}) {
          if (!metrics.contains(m) || !metrics[m].contains("avg") || metrics[m]["avg"].is_null()) continue;
          char buf[128];
          std::snprintf(buf, sizeof buf, " %s.%s avg %.4g", src.c_str(), m, metrics[m]["avg"].get<double>());
          line += buf;
        }
      }
      std::printf("  %s:%s\n", dev.c_str(), line.c_str());
    }
  }
  if (!t.value("energy_j", nlohmann::json()).is_null()) {
    std::printf("  energy %.1f J, %.4g J/token, average power %.1f W\n", t["energy_j"].get<double>(),
                t.value("j_per_token", nlohmann::json(0.0)).is_null() ? 0.0 : t["j_per_token"].get<double>(),
                t.value("avg_power_w", nlohmann::json(0.0)).is_null() ? 0.0 : t["avg_power_w"].get<double>());
  }
  for (const auto& a : t.value("agreement", nlohmann::json::array())) {
    std::printf("  agreement %s %s: %s vs %s, r = %s, mean difference %.4g (%zu pairs)\n",
                a["device"].get<std::string>().c_str(), a["quantity"].get<std::string>().c_str(),
                a["a"]["source"].get<std::string>().c_str(), a["b"]["source"].get<std::string>().c_str(),
                a["pearson_r"].is_null() ? "n/a" : std::to_string(a["pearson_r"].get<double>()).c_str(),
                a["mean_diff"].get<double>(), a["n"].get<std::size_t>());
  }
  for (const auto& n : t.value("notes", nlohmann::json::array())) std::printf("  note: %s\n", n.get<std::string>().c_str());
}

void print_summary(const TrainResult& r) {
  std::printf("Training throughput: %.2f tokens/s/device\n", r.tokens_per_s_per_device);
  if (r.world_size > 1) {
    const auto& d = r.data_parallel;
    std::printf("Data parallel: %d ranks (%s, %s), %.2f tokens/s in total\n", r.world_size,
                d.value("mode", std::string("?")).c_str(), r.launcher.c_str(), r.tokens_per_s);
    std::printf("Communication per step: %.4f s, %.0f%% hidden behind backward\n", d.value("comm_time_s", 0.0),
                100.0 * d.value("comm_hidden_fraction", 0.0));
  }
  std::printf("Max reserved memory: %.2f GiB\n", static_cast<double>(r.max_reserved_bytes) / (1u << 30));
  std::printf("Max allocated memory: %.2f GiB\n", static_cast<double>(r.max_allocated_bytes) / (1u << 30));
  std::printf("Step time (median): %.3f s over %lld measured steps\n", r.step_time_s,
              static_cast<long long>(r.measured_steps));
  if (!r.steps.empty()) std::printf("Final loss: %.4f\n", r.steps.back().loss);
  if (!r.evals.empty()) {
    const EvalRecord& e = r.evals.back();
    std::printf("Validation loss: %.4f, perplexity %.3f (%lld tokens, after step %lld)\n", e.loss, e.perplexity,
                static_cast<long long>(e.tokens), static_cast<long long>(e.step));
  }
  std::printf("Parameters: %lld, FLOPs/token: %.3e\n", static_cast<long long>(r.params), r.flops_per_token);
  if (r.mfu) {
    std::printf("MFU: %.1f%%\n", 100.0 * *r.mfu);
  } else {
    std::printf("MFU: unknown (no peak for this device; pass --peak-tflops)\n");
  }
  if (!r.telemetry.is_null()) print_telemetry(r.telemetry);
  if (!r.profile.is_null()) {
    std::printf("\nProfile (measured steps, %.3f s in all):\n", r.profile["total_step_seconds"].get<double>());
    if (r.profile.contains("summary")) {
      profile::Report rep = profile::report_from_json(r.profile["summary"]);
      rep.file = "this run";
      const std::string text = profile::render_markdown(rep, 15);
      std::fwrite(text.data(), 1, text.size(), stdout);
    }
  }
  if (!r.trace_file.empty()) std::printf("Trace: %s (open in https://ui.perfetto.dev or chrome://tracing)\n", r.trace_file.c_str());
}

}  // namespace

Subcommand add_train_command(CLI::App& root) {
  auto opts = std::make_shared<TrainOptions>();
  auto* app = root.add_subcommand(
      "train",
      "Train a model with the native engine (under `mpirun -np N` or `srun --mpi=pmix`: data-parallel over N ranks)");
  add_train_flags(app, *opts);
  // DPO as a switch of train too (`train --dpo --pairs F` = `dpo --pairs F`), so that a sweep's
  // native trials (which run `scalelab train`) can compare it with the other methods.
  app->add_flag("--dpo", opts->dpo.enabled,
                "Train with DPO on --pairs instead of --data (as `scalelab dpo`; without --dpo, --pairs, --beta and "
                "--label-smoothing are unused, so that one sweep can hold both kinds of trial)");
  add_dpo_flags(app, *opts);
  return {app, [opts] {
            const TrainOptions& o = *opts;
            if (o.dpo.enabled && o.dpo.pairs.empty()) {
              throw InvalidInput("[--pairs] --dpo needs --pairs: a JSONL file of {prompt, chosen, rejected}");
            }
            validate_train_options(o);
            parse_train_device(o.device);  // meta is the plan's device: refused here (exit 2)
            // One process: a single communicator; mpirun/srun: MPI, one rank per process.
            DistContext dist = make_dist_context(o.dist.backend(), o.device == "cuda", o.dist.comm_options());
            // Rank 0 writes the run record (with every rank's figures), prints and saves.
            const bool leader = dist.rank() == 0;
            const TrainResult r = run_and_record(o, dist);
            if (r.status == RunStatus::kOom) {
              std::fprintf(stderr, "scalelab train: out of device memory%s: %s\n",
                           dist.world_size() > 1 ? (" on rank " + std::to_string(dist.rank())).c_str() : "",
                           r.error.c_str());
              std::fprintf(stderr, "Memory plan for this configuration:\n");
              for (const auto& it : r.plan["items"]) {
                std::fprintf(stderr, "  %-22s %12s  %s\n", it["name"].get<std::string>().c_str(),
                             format_bytes(it["bytes"].get<std::size_t>()).c_str(),
                             it["detail"].get<std::string>().c_str());
              }
              std::fprintf(stderr, "  %-22s %12s of %s; largest micro-batch that fits: %lld\n", "total",
                           format_bytes(r.plan["total_bytes"].get<std::size_t>()).c_str(),
                           format_bytes(r.plan["capacity_bytes"].get<std::size_t>()).c_str(),
                           static_cast<long long>(r.plan["max_micro_batch_size"].get<std::int64_t>()));
              std::fflush(stderr);
              linger_after_failure();  // the other ranks were told; let them report it
              return exit_code(ErrorKind::kOutOfMemory);
            }
            if (!leader) return 0;
            print_summary(r);
            if (!o.json.empty()) std::printf("Run record: %s\n", o.json.c_str());
            return 0;
          }};
}

}  // namespace scalelab::cli

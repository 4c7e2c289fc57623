#pragma once
// Subcommands of the scalelab binary: one file per subcommand in src/cli/, each providing an
// add_<name>_command() that declares its flags on a CLI11 sub-app and returns what to run.
// Only src/cli/ turns errors into exit codes (main.cpp does it, see run_command()).
#include <functional>

#include <CLI/CLI.hpp>

namespace scalelab::lab {
class ResultsStore;
}

namespace scalelab::cli {

struct Subcommand {
  CLI::App* app = nullptr;
  std::function<int()> run;  // returns the exit code; may throw scalelab::Error
};

Subcommand add_version_command(CLI::App& root);
Subcommand add_train_command(CLI::App& root);
Subcommand add_plan_command(CLI::App& root);
Subcommand add_monitor_command(CLI::App& root);
Subcommand add_sweep_command(CLI::App& root);
Subcommand add_oom_search_command(CLI::App& root);
Subcommand add_ladder_command(CLI::App& root);
Subcommand add_results_command(CLI::App& root);
Subcommand add_scale_command(CLI::App& root);
Subcommand add_selftest_command(CLI::App& root);
Subcommand add_profile_summary_command(CLI::App& root);
Subcommand add_trace_merge_command(CLI::App& root);
Subcommand add_generate_command(CLI::App& root);
Subcommand add_compare_command(CLI::App& root);
Subcommand add_tokenize_command(CLI::App& root);
Subcommand add_analyze_command(CLI::App& root);
Subcommand add_report_command(CLI::App& root);

// The most recently updated sweep of the database (analyze and report without --sweep); says so
// on stderr. InvalidInput when there is none.
std::string latest_sweep(const lab::ResultsStore& store, const char* command);
Subcommand add_merge_command(CLI::App& root);
Subcommand add_quantize_command(CLI::App& root);

}  // namespace scalelab::cli

// The scalelab binary: dispatches to one subcommand and maps errors to exit codes
// (0 success, 2 invalid input, 3 out of device memory, 1 anything else; see core/error.h).
#include <cstdio>
#include <exception>
#include <vector>

#include "cli/command.h"
#include "cli/dpo.h"
#include "core/error.h"
#include "distributed/communicator.h"

int main(int argc, char** argv) {
  using namespace scalelab;
  CLI::App app{"scalelab: measure, optimize and scale the training of large language models"};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "Show help for every subcommand");

  std::vector<cli::Subcommand> commands = {
      cli::add_train_command(app),
      cli::add_dpo_command(app),
      cli::add_plan_command(app),
      cli::add_version_command(app),
      cli::add_monitor_command(app),
      cli::add_sweep_command(app),
      cli::add_oom_search_command(app),
      cli::add_ladder_command(app),
      cli::add_results_command(app),
      cli::add_scale_command(app),
      cli::add_selftest_command(app),
      cli::add_profile_summary_command(app),
      cli::add_trace_merge_command(app),
      cli::add_generate_command(app),
      cli::add_compare_command(app),
      cli::add_tokenize_command(app),
      cli::add_analyze_command(app),
      cli::add_report_command(app),
      cli::add_merge_command(app),
      cli::add_quantize_command(app),
  };

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "scalelab: %s\n", e.what());
    std::fprintf(stderr, "Run 'scalelab --help' or 'scalelab <command> --help' for the flags.\n");
    return exit_code(ErrorKind::kInvalidInput);
  }

  for (auto& cmd : commands) {
    if (!cmd.app->parsed()) continue;
    try {
      return cmd.run();
    } catch (const Error& e) {
      std::fprintf(stderr, "scalelab %s: error: %s\n", cmd.app->get_name().c_str(), e.what());
      std::fflush(stderr);
      linger_after_failure();  // a data-parallel rank: the others learn which rank failed
      return exit_code(e.kind());
    } catch (const std::exception& e) {
      std::fprintf(stderr, "scalelab %s: internal error: %s\n", cmd.app->get_name().c_str(), e.what());
      std::fflush(stderr);
      linger_after_failure();
      return exit_code(ErrorKind::kRuntime);
    }
  }
  return exit_code(ErrorKind::kInvalidInput);
}

// `scalelab profile-summary FILE`: nsys-shaped tables of a scalelab trace, a PyTorch profiler
// trace or `nsys stats --format csv` output; `scalelab trace-merge`: one timeline from the files
// of every rank.
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "cli/command.h"
#include "core/error.h"
#include "core/trace.h"
#include "profile/readers.h"

namespace scalelab::cli {
namespace {

// Writes `text` to `<path>.tmp` and renames it over `path`: a reader never sees half a file, and a
// write that fails (the disk full) leaves the earlier file in place and says so.
void write_whole(const std::string& path, const std::string& text, const char* what) {
  const std::string tmp = path + ".tmp";
  std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
  if (!out) throw InvalidInput(std::string(what) + " cannot write '" + tmp + "' — check that the directory exists and is writable");
  out << text;
  out.close();
  if (!out) {
    std::remove(tmp.c_str());
    throw RuntimeError(std::string(what) + " writing '" + tmp +
                       "' failed — check free disk space and file-size limits (ulimit -f); '" + path + "' was not replaced");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    throw RuntimeError(std::string(what) + " cannot rename '" + tmp + "' to '" + path + "': " + std::strerror(err));
  }
}

}  // namespace

Subcommand add_profile_summary_command(CLI::App& root) {
  struct Opts {
    std::string file, format = "md", output;
    bool all_steps = false;
    std::size_t top = 0;
  };
  auto o = std::make_shared<Opts>();
  auto* app = root.add_subcommand(
      "profile-summary",
      "Summaries shaped like `nsys stats` (Time %, Total, Instances, Avg, Med, Min, Max, StdDev, Name) of a scalelab "
      "trace (train --trace), a PyTorch profiler Chrome trace, or `nsys stats --format csv` output");
  app->add_option("file", o->file, "The trace or CSV")->required();
  app->add_option("--format", o->format, "md, csv or json")->capture_default_str();
  app->add_flag("--all-steps", o->all_steps, "scalelab traces: include the warm-up steps (default: measured steps only)");
  app->add_option("-o,--output", o->output, "Write the summary to this file instead of stdout");
  app->add_option("--top", o->top, "Markdown: at most N rows per table (0: all; GPU kernel tables can run to hundreds)");
  return {app, [o] {
            const profile::Format f = profile::parse_format(o->format);
            const profile::Report r = profile::summarize_file(o->file, o->all_steps);
            const std::string text =
                f == profile::Format::kMarkdown ? profile::render_markdown(r, o->top) : profile::render(r, f);
            if (o->output.empty()) {
              std::fwrite(text.data(), 1, text.size(), stdout);
            } else {
              write_whole(o->output, text, "[--output]");
            }
            return 0;
          }};
}

Subcommand add_trace_merge_command(CLI::App& root) {
  struct Opts {
    std::vector<std::string> inputs;
    std::string output;
  };
  auto o = std::make_shared<Opts>();
  auto* app = root.add_subcommand("trace-merge",
                                  "Merge the per-rank traces of a data-parallel run (train --trace under mpirun) into "
                                  "one timeline, a process per rank, aligned on the wall clock");
  app->add_option("inputs", o->inputs, "The rank files (run.trace.rank0.json run.trace.rank1.json ...)")->required();
  app->add_option("-o,--output", o->output, "The merged trace")->required();
  return {app, [o] {
            std::vector<nlohmann::json> traces;
            for (const auto& path : o->inputs) {
              std::ifstream in(path);
              if (!in) throw InvalidInput("[trace-merge] cannot read '" + path + "' — check the path");
              try {
                traces.push_back(nlohmann::json::parse(in));
              } catch (const nlohmann::json::exception& e) {
                throw InvalidInput("[trace-merge] " + path + " is not valid JSON (" + e.what() + ")");
              }
            }
            const nlohmann::json merged = merge_traces(traces, o->inputs);
            write_whole(o->output, merged.dump() + "\n", "[trace-merge]");
            std::printf("Merged %zu traces (%zu events) into %s\n", traces.size(), merged["traceEvents"].size(),
                        o->output.c_str());
            return 0;
          }};
}

}  // namespace scalelab::cli

#include "lab/runner.h"

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "lab/interrupted.h"

namespace scalelab::lab {

Runner::Runner(LabOptions options, const std::string& command, std::string name, const std::string& notes)
    : options_(std::move(options)),
      name_(std::move(name)),
      progress_(stderr, Progress::is_terminal(stderr)),
      notes_shown_(show_notes(notes)),
      lock_(options_.db_path, command + " " + name_, options_.wait_for_lock, options_.cancel,
            [this](const std::string& m) { progress_.note(m); }),
      store_(options_.db_path, ResultsStore::Mode::kReadWrite) {}

bool Runner::show_notes(const std::string& notes) {
  std::string rest = notes;
  while (!rest.empty()) {
    const auto nl = rest.find('\n');
    progress_.note(rest.substr(0, nl));
    rest = nl == std::string::npos ? std::string() : rest.substr(nl + 1);
  }
  return true;
}

TrialExecutor& Runner::open_sweep(const std::string& kind, const Json& spec, const Workload& workload,
                                  bool clear_result) {
  sweep_id_ = store_.ensure_sweep(name_, kind, spec);
  if (clear_result) store_.set_sweep_result(sweep_id_, Json());
  executor_ = std::make_unique<TrialExecutor>(store_, sweep_id_, name_, workload, options_, progress_);
  return *executor_;
}

TrialExecutor& Runner::executor() {
  SCALELAB_CHECK(executor_ != nullptr, "[lab] Runner::executor() before open_sweep() — this is a bug");
  return *executor_;
}

void Runner::set_result(const Json& result) {
  SCALELAB_CHECK(sweep_id_ >= 0, "[lab] Runner::set_result() before open_sweep() — this is a bug");
  store_.set_sweep_result(sweep_id_, result);
}

RunnerOutcome Runner::run(const std::function<void()>& body, const std::string& resume_hint) {
  try {
    body();
  } catch (const Interrupted& e) {
    progress_.finish();
    std::fprintf(stderr, "\nscalelab: %s\n", e.what());
    std::fprintf(stderr, "Finished trials are in %s; %s\n", options_.db_path.c_str(), resume_hint.c_str());
    return RunnerOutcome::kInterrupted;
  }
  progress_.finish();
  return RunnerOutcome::kCompleted;
}

void Runner::print_table(const Table& table, TableFormat format, const std::string& json_path, const Json& json) const {
  std::fputs(render(table, format).c_str(), stdout);
  if (format != TableFormat::kMarkdown)
    for (const auto& n : table.notes) std::fprintf(stderr, "%s\n", n.c_str());
  if (!json_path.empty()) write_text_file(json_path, json.dump(2) + "\n", "--json");
}

Json Runner::table_json(const Table& table, const std::string& rows_key) const {
  return Json{{"sweep", name_}, {"db", store_.path()}, {rows_key, table.rows}, {"notes", table.notes}};
}

std::string Runner::log_dir() const {
  if (executor_) return executor_->log_dir();
  const std::string base = options_.log_dir.empty() ? default_log_dir_for(options_.db_path) : options_.log_dir;
  return (std::filesystem::path(base) / safe_file_name(name_)).string();
}

void Runner::print_footer(bool blank_line_before) const {
  std::fprintf(stderr, "%sResults: %s (scalelab results --db %s --sweep %s); logs in %s\n",
               blank_line_before ? "\n" : "", store_.path().c_str(), store_.path().c_str(), name_.c_str(),
               log_dir().c_str());
}

void write_text_file(const std::string& path, const std::string& text, const std::string& flag) {
  std::ofstream f(path);
  if (!f) throw InvalidInput("[" + flag + "] cannot write " + path + " — check the path");
  f << text;
  if (!f) throw InvalidInput("[" + flag + "] writing " + path + " failed — check the disk");
}

}  // namespace scalelab::lab

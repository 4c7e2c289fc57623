#pragma once
// Progress of a runner. On a terminal: one line per finished trial and, below them, a bar
// redrawn in place — done / total, ok / oom / failed counts, the ETA (mean duration of the trials
// run so far times the trials left) and the running trial with its elapsed time. Elsewhere (a
// pipe, CI, a log file): plain lines only, one when a trial starts and one when it ends.
#include <chrono>
#include <cstdio>
#include <string>

#include "lab/trial_status.h"

namespace scalelab::lab {

class Progress {
 public:
  // `tty` decides the style; use Progress::is_terminal(out) for the usual choice.
  Progress(std::FILE* out, bool tty);
  static bool is_terminal(std::FILE* out);
  // A progress that prints nothing (library callers and tests that do not care).
  static Progress& silent();

  // Trials this run will execute (0: unknown, e.g. an OOM search), and how many were already done.
  void set_total(int total);
  void note(const std::string& line);  // a message above the bar
  void trial_started(const std::string& label);
  // summary: e.g. "27542.2 tokens/s/device, 3.21 GiB" or the reason.
  void trial_finished(const std::string& label, TrialStatus status, const std::string& summary,
                      double duration_s);
  void tick();    // redraws the bar (terminal only)
  void finish();  // clears the bar

  int done() const { return done_; }
  int ok() const { return ok_; }
  int oom() const { return oom_; }
  int failed() const { return failed_; }

 private:
  void draw_bar();
  void clear_bar();
  std::string counter() const;

  std::FILE* out_;
  bool tty_;
  bool enabled_ = true;
  bool bar_shown_ = false;
  int total_ = 0;
  int done_ = 0, ok_ = 0, oom_ = 0, failed_ = 0;
  double run_seconds_ = 0;
  std::string running_;
  std::chrono::steady_clock::time_point running_since_;
};

// "3m20s", "45s", "1h02m".
std::string format_duration(double seconds);

}  // namespace scalelab::lab

#include "lab/progress.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>

namespace scalelab::lab {

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "--";
  long s = std::lround(seconds);
  char buf[32];
  if (seconds < 10) std::snprintf(buf, sizeof buf, "%.1fs", seconds);
  else if (s < 60) std::snprintf(buf, sizeof buf, "%lds", s);
  else if (s < 3600) std::snprintf(buf, sizeof buf, "%ldm%02lds", s / 60, s % 60);
  else std::snprintf(buf, sizeof buf, "%ldh%02ldm", s / 3600, (s % 3600) / 60);
  return buf;
}

Progress::Progress(std::FILE* out, bool tty) : out_(out), tty_(tty) {}

bool Progress::is_terminal(std::FILE* out) { return out && ::isatty(::fileno(out)) == 1; }

Progress& Progress::silent() {
  static Progress p(nullptr, false);
  p.enabled_ = false;
  return p;
}

void Progress::set_total(int total) { total_ = total; }

std::string Progress::counter() const {
  return total_ > 0 ? std::to_string(done_ + 1) + "/" + std::to_string(total_) : std::to_string(done_ + 1);
}

void Progress::note(const std::string& line) {
  if (!enabled_) return;
  clear_bar();
  std::fprintf(out_, "%s\n", line.c_str());
  draw_bar();
  std::fflush(out_);
}

void Progress::trial_started(const std::string& label) {
  running_ = label;
  running_since_ = std::chrono::steady_clock::now();
  if (!enabled_) return;
  if (tty_) {
    draw_bar();
  } else {
    std::fprintf(out_, "[%s] running %s\n", counter().c_str(), label.c_str());
  }
  std::fflush(out_);
}

void Progress::trial_finished(const std::string& label, TrialStatus status_value, const std::string& summary,
                              double duration_s) {
  const std::string status = status_name(status_value);
  std::string line = "[";
  line += counter();
  line += "] ";
  line += status;
  line.append(status.size() < 7 ? 7 - status.size() : 1, ' ');
  line += label;
  if (!summary.empty()) line += "  " + summary;
  line += "  (" + format_duration(duration_s) + ")";
  ++done_;
  if (status_value == TrialStatus::kOk) ++ok_;
  else if (status_value == TrialStatus::kOom) ++oom_;
  else ++failed_;
  run_seconds_ += duration_s;
  running_.clear();
  if (!enabled_) return;
  clear_bar();
  std::fprintf(out_, "%s\n", line.c_str());
  draw_bar();
  std::fflush(out_);
}

void Progress::tick() {
  if (!enabled_ || !tty_) return;
  draw_bar();
  std::fflush(out_);
}

void Progress::finish() {
  if (!enabled_) return;
  clear_bar();
  std::fflush(out_);
}

void Progress::clear_bar() {
  if (tty_ && bar_shown_) {
    std::fputs("\r\033[K", out_);
    bar_shown_ = false;
  }
}

void Progress::draw_bar() {
  if (!tty_ || !enabled_) return;
  int cols = 100;
  struct winsize ws {};
  if (::ioctl(::fileno(out_), TIOCGWINSZ, &ws) == 0 && ws.ws_col > 20) cols = ws.ws_col;
  std::string bar;
  if (total_ > 0) {
    const int width = 24;
    int filled = std::min(width, done_ * width / std::max(1, total_));
    bar = "[";
    bar.append(static_cast<std::size_t>(filled), '#');
    bar.append(static_cast<std::size_t>(width - filled), '-');
    bar += "] " + std::to_string(done_) + "/" + std::to_string(total_);
  } else {
    bar = std::to_string(done_) + " done";
  }
  bar += "  ok " + std::to_string(ok_) + "  oom " + std::to_string(oom_) + "  failed " + std::to_string(failed_);
  if (total_ > 0) {
    double eta = done_ > 0 ? run_seconds_ / done_ * (total_ - done_) : NAN;
    bar += "  ETA " + format_duration(eta);
  }
  if (!running_.empty()) {
    double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - running_since_).count();
    bar += "  | " + running_ + " (" + format_duration(el) + ")";
  }
  if (static_cast<int>(bar.size()) > cols - 1) bar = bar.substr(0, static_cast<std::size_t>(cols - 4)) + "...";
  std::fputs("\r\033[K", out_);
  std::fputs(bar.c_str(), out_);
  bar_shown_ = true;
}

}  // namespace scalelab::lab

#include "lab/runner_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <thread>

#include "lab/store.h"

namespace scalelab::lab {
namespace {

std::string read_all(int fd) {
  std::string out;
  char buf[512];
  if (::lseek(fd, 0, SEEK_SET) < 0) return out;
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof buf)) > 0) out.append(buf, static_cast<std::size_t>(n));
  while (!out.empty() && (out.back() == '\n' || out.back() == '\0')) out.pop_back();
  return out;
}

}  // namespace

RunnerLock::RunnerLock(const std::string& db_path, const std::string& what, bool wait,
                       const std::atomic<bool>* cancel,
                       const std::function<void(const std::string&)>& notify)
    : path_(lock_path_for(db_path)) {
  std::filesystem::path p(path_);
  if (p.has_parent_path()) {
    std::error_code ec;
    std::filesystem::create_directories(p.parent_path(), ec);
  }
  fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) {
    throw InvalidInput("[results] cannot create the lock file " + path_ + " (" + std::strerror(errno) +
                       ") — pass --db with a writable path");
  }
  bool notified = false;
  for (;;) {
    if (::flock(fd_, LOCK_EX | LOCK_NB) == 0) break;
    if (errno != EWOULDBLOCK && errno != EINTR) {
      int e = errno;
      ::close(fd_);
      throw RuntimeError("[results] cannot lock " + path_ + " (" + std::strerror(e) + ")");
    }
    std::string holder = read_all(fd_);
    if (holder.empty()) holder = "another scalelab runner";
    if (!wait) {
      ::close(fd_);
      throw RuntimeError("[results] " + db_path + " is in use by " + holder +
                         " — wait for it to finish, pass --wait to queue behind it, or pass --db with "
                         "another database");
    }
    if (!notified && notify) {
      notify("waiting for " + db_path + ", in use by " + holder + " (Ctrl-C to give up)");
      notified = true;
    }
    if (cancel && cancel->load()) {
      ::close(fd_);
      throw Interrupted("[results] interrupted while waiting for " + db_path);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  std::string info = "pid " + std::to_string(::getpid()) + " on " + host_name() + " (" + what + ", since " +
                     utc_now_iso() + ")\n";
  if (::ftruncate(fd_, 0) == 0) {
    ssize_t w = ::pwrite(fd_, info.data(), info.size(), 0);
    (void)w;
  }
}

RunnerLock::~RunnerLock() {
  if (fd_ >= 0) {
    if (::ftruncate(fd_, 0) != 0) {
      // Only the holder's description is lost; the lock itself is released by close().
    }
    ::flock(fd_, LOCK_UN);
    ::close(fd_);
  }
}

}  // namespace scalelab::lab

#pragma once
// Typed errors of scalelab. Library code throws these; only src/cli/ turns them into exit
// codes (see exit_code()). Messages follow "[where] what failed (values) — what to do".
#include <cstddef>
#include <stdexcept>
#include <string>

namespace scalelab {

enum class ErrorKind {
  kInvalidInput,  // flags, configs, files a user gave us: exit 2
  kOutOfMemory,   // the device-memory allocator's capacity was exceeded: exit 3
  kRuntime,       // anything else: exit 1
};

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& message) : std::runtime_error(message), kind_(kind) {}
  ErrorKind kind() const { return kind_; }

 private:
  ErrorKind kind_;
};

// Bad input from the user: flags, config files, data files, checkpoints.
class InvalidInput : public Error {
 public:
  explicit InvalidInput(const std::string& message) : Error(ErrorKind::kInvalidInput, message) {}
};

// A failure that is not the user's input and not memory: I/O, a child process, a bug.
class RuntimeError : public Error {
 public:
  explicit RuntimeError(const std::string& message) : Error(ErrorKind::kRuntime, message) {}
};

// The device-memory allocator could not satisfy a request within its capacity.
class OutOfMemory : public Error {
 public:
  OutOfMemory(const std::string& message, std::size_t requested, std::size_t allocated,
              std::size_t reserved, std::size_t capacity)
      : Error(ErrorKind::kOutOfMemory, message),
        requested_(requested),
        allocated_(allocated),
        reserved_(reserved),
        capacity_(capacity) {}
  std::size_t requested() const { return requested_; }
  std::size_t allocated() const { return allocated_; }
  std::size_t reserved() const { return reserved_; }
  std::size_t capacity() const { return capacity_; }

 private:
  std::size_t requested_, allocated_, reserved_, capacity_;
};

// Process exit code for an error, per DESIGN.md: 2 invalid input, 3 out of memory, 1 otherwise.
inline int exit_code(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kInvalidInput: return 2;
    case ErrorKind::kOutOfMemory: return 3;
    case ErrorKind::kRuntime: return 1;
  }
  return 1;
}

// Throws InvalidInput/RuntimeError with a formatted message when cond is false.
#define SCALELAB_CHECK_INPUT(cond, msg)                      \
  do {                                                      \
    if (!(cond)) throw ::scalelab::InvalidInput(msg);       \
  } while (0)
#define SCALELAB_CHECK(cond, msg)                            \
  do {                                                      \
    if (!(cond)) throw ::scalelab::RuntimeError(msg);       \
  } while (0)

}  // namespace scalelab

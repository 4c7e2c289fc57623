#pragma once
// The user interrupted a runner (Ctrl-C / SIGTERM, seen through LabOptions::cancel): the running
// trial was killed and not recorded. The CLI reports it and exits 130.
#include <string>

#include "core/error.h"

namespace scalelab::lab {

class Interrupted : public RuntimeError {
 public:
  explicit Interrupted(const std::string& message) : RuntimeError(message) {}
};

}  // namespace scalelab::lab

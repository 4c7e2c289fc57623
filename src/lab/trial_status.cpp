#include "lab/trial_status.h"

namespace scalelab::lab {

const char* status_name(TrialStatus s) {
  switch (s) {
    case TrialStatus::kOk: return "ok";
    case TrialStatus::kOom: return "oom";
    case TrialStatus::kError: return "error";
    case TrialStatus::kTimeout: return "timeout";
  }
  return "error";
}

std::optional<TrialStatus> parse_status(const std::string& name) {
  if (name == "ok") return TrialStatus::kOk;
  if (name == "oom") return TrialStatus::kOom;
  if (name == "error") return TrialStatus::kError;
  if (name == "timeout") return TrialStatus::kTimeout;
  return std::nullopt;
}

}  // namespace scalelab::lab

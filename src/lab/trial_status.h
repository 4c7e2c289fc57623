#pragma once
// How a trial ended. The lab works with the enum; its names ("ok", "oom", "error", "timeout")
// appear only where a trial leaves the program: the results database, JSON and tables, and the
// progress lines.
#include <optional>
#include <string>

namespace scalelab::lab {

enum class TrialStatus { kOk, kOom, kError, kTimeout };

const char* status_name(TrialStatus s);
// nullopt for a name that is not a trial status.
std::optional<TrialStatus> parse_status(const std::string& name);

}  // namespace scalelab::lab

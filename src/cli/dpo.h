#pragma once
// `scalelab dpo` (src/cli/dpo.cpp): declared apart from command.h's list so that adding it did not
// rebuild every command; registered in main.cpp like the others.
#include "cli/command.h"

namespace scalelab::cli {

Subcommand add_dpo_command(CLI::App& root);

}  // namespace scalelab::cli

#pragma once
// Runs the built scalelab binary (SCALELAB_EXE) for the end-to-end CLI tests: its exit code and
// its stdout and stderr together; read_json parses a file it wrote.
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

namespace scalelab::cli_test {

struct CmdResult {
  int code;
  std::string output;  // stdout and stderr
};

inline CmdResult run(const std::string& args) {
  const std::string cmd = std::string(SCALELAB_EXE) + " " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  std::array<char, 4096> buf{};
  while (p && fgets(buf.data(), buf.size(), p)) out += buf.data();
  const int status = p ? pclose(p) : -1;
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

inline nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

}  // namespace scalelab::cli_test

// `scalelab selftest`: every op check of kernels/selftest.h on a device against the CPU reference
// (a user's first command on a new cluster: `scalelab selftest --device cuda`).
//
// Exit status: 0 when every comparison passes, 1 when one fails (or a check throws), 2 for bad
// flags or a device that is not available (no GPU, no driver, a driver too old for this build).
// Counted are compared outputs (one per CheckResult); a check that throws, or that compares
// nothing, counts as one failure with its message.
#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "core/allocator.h"
#include "core/device.h"
#include "core/error.h"
#include "kernels/selftest.h"
#include "train/trainer.h"

namespace scalelab::cli {

namespace {

struct SelftestOptions {
  std::string device = "cuda";
  std::string dtypes = "fp32,bf16,fp16";
  std::string filter;
  std::string json;
  std::uint64_t seed = 1;
};

std::vector<DType> parse_dtype_list(const std::string& text) {
  std::vector<DType> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    const DType t = parse_dtype(item, "--dtype");
    if (t == DType::kI32) throw InvalidInput("[--dtype] the op checks run float dtypes: fp32, bf16, fp16");
    out.push_back(t);
  }
  if (out.empty()) throw InvalidInput("[--dtype] give at least one of fp32, bf16, fp16 (comma-separated)");
  return out;
}

struct Row {
  std::string family, check, dtype, output;
  double rel_error = 0, tolerance = 0;
  bool ok = false;
  std::string error;  // the check threw (or compared nothing)
};

std::string fmt_err(double e) {
  if (std::isinf(e)) return "inf";
  if (std::isnan(e)) return "nan";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3e", e);
  return buf;
}

int run_selftest(const SelftestOptions& o) {
  const DeviceType dev = parse_device_type(o.device, "--device");
  if (dev == DeviceType::kMeta) {
    throw InvalidInput("[--device] meta holds no data to compare — use --device cuda (or cpu, which checks the CPU "
                       "against itself)");
  }
  const std::vector<DType> dtypes = parse_dtype_list(o.dtypes);
  std::regex filter;
  if (!o.filter.empty()) {
    try {
      filter = std::regex(o.filter, std::regex::ECMAScript);
    } catch (const std::regex_error& e) {
      throw InvalidInput("[--filter] '" + o.filter + "' is not a regular expression: " + e.what());
    }
  }
  std::string why;
  if (!device_available(dev, &why)) {
    throw InvalidInput("[--device] " + device_type_name(dev) + " is not available: " + why);
  }
  DeviceRuntime& rt = device_runtime(dev);
  std::printf("Device: %s (%s)\n", device_type_name(dev).c_str(), rt.describe().c_str());
  std::fflush(stdout);

  DeviceAllocator host(make_host_backend(), host_physical_memory());
  DeviceAllocator device(rt.make_memory_backend(), rt.total_memory());
  kernels::selftest::CheckEnv env{&host, &device, o.seed};

  // Rows are printed as they come, so that a check that kills the process (a device fault) is
  // the line after the last one printed.
  std::printf("%-12s %-36s %-5s %-10s %11s %11s  %s\n", "family", "check", "dtype", "output", "rel error", "tolerance",
              "result");
  std::fflush(stdout);
  std::vector<Row> rows;
  std::size_t printed = 0;
  auto print_new_rows = [&] {
    for (; printed < rows.size(); ++printed) {
      const Row& r = rows[printed];
      if (r.error.empty()) {
        std::printf("%-12s %-36s %-5s %-10s %11s %11s  %s\n", r.family.c_str(), r.check.c_str(), r.dtype.c_str(),
                    r.output.c_str(), fmt_err(r.rel_error).c_str(), fmt_err(r.tolerance).c_str(), r.ok ? "ok" : "FAIL");
      } else {
        std::printf("%-12s %-36s %-5s %-10s %11s %11s  FAIL: %s\n", r.family.c_str(), r.check.c_str(),
                    r.dtype.c_str(), r.output.c_str(), "-", "-", r.error.c_str());
      }
    }
    std::fflush(stdout);
  };
  const auto& checks = kernels::selftest::all_op_checks();
  for (const auto& c : checks) {
    if (!o.filter.empty() && !std::regex_search(c.family + "/" + c.name, filter)) continue;
    for (DType t : dtypes) {
      bool supported = false;
      for (DType s : c.dtypes) supported = supported || s == t;
      if (!supported) continue;
      Row base{c.family, c.name, std::string(dtype_name(t)), "-", 0, 0, false, ""};
      try {
        const auto results = c.run(env, t);
        if (results.empty()) {
          base.error = "the check compared no output";
          rows.push_back(base);
        }
        for (const auto& r : results) {
          Row row = base;
          row.output = r.output;
          row.rel_error = r.rel_error;
          row.tolerance = r.tolerance;
          row.ok = r.passed();
          rows.push_back(row);
        }
      } catch (const std::exception& e) {
        base.error = e.what();
        base.rel_error = std::numeric_limits<double>::infinity();
        rows.push_back(base);
        // A failed kernel may leave an error pending on the device: let it surface here, not in
        // the next check.
        try {
          rt.synchronize();
        } catch (...) {
        }
      }
      print_new_rows();
    }
  }

  int passed = 0, failed = 0;
  for (const auto& r : rows) (r.ok ? passed : failed) += 1;
  if (checks.empty()) std::printf("(no op checks are registered in this build)\n");
  std::printf("%d passed, %d failed\n", passed, failed);

  if (!o.json.empty()) {
    nlohmann::json j;
    j["device"] = device_type_name(dev);
    j["description"] = rt.describe();
    j["seed"] = o.seed;
    j["passed"] = passed;
    j["failed"] = failed;
    nlohmann::json arr = nlohmann::json::array();
    for (const auto& r : rows) {
      arr.push_back({{"family", r.family},
                     {"check", r.check},
                     {"dtype", r.dtype},
                     {"output", r.output},
                     {"rel_error", std::isfinite(r.rel_error) ? nlohmann::json(r.rel_error) : nlohmann::json(nullptr)},
                     {"tolerance", r.tolerance},
                     {"ok", r.ok},
                     {"error", r.error.empty() ? nlohmann::json(nullptr) : nlohmann::json(r.error)}});
    }
    j["results"] = arr;
    write_json_file(o.json, j);
  }
  return failed == 0 ? 0 : 1;
}

}  // namespace

Subcommand add_selftest_command(CLI::App& root) {
  auto opts = std::make_shared<SelftestOptions>();
  auto* app = root.add_subcommand(
      "selftest", "Check every op (forward and backward) on a device against the CPU reference, per dtype");
  app->add_option("--device", opts->device, "cuda | cpu (cpu checks the reference against itself)")
      ->capture_default_str();
  app->add_option("--dtype", opts->dtypes, "Comma-separated storage dtypes: fp32, bf16, fp16")->capture_default_str();
  app->add_option("--filter", opts->filter, "Only the checks whose 'family/check' matches this regular expression");
  app->add_option("--json", opts->json, "Write every comparison (JSON) to this file");
  app->add_option("--seed", opts->seed, "Seed of the random inputs")->capture_default_str();
  return {app, [opts] { return run_selftest(*opts); }};
}

}  // namespace scalelab::cli

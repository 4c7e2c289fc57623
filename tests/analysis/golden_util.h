#pragma once
// Shared by the analysis tests: the committed golden sweep (tests/golden/analysis/sweep.json,
// made by make_golden.py) inserted into a fresh results database, and tolerance helpers.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "lab/store.h"

namespace scalelab::analysis::testing {

using Json = nlohmann::json;

inline std::string golden_dir() { return std::string(SCALELAB_SOURCE_DIR) + "/tests/golden/analysis"; }

inline Json read_json_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("missing " + path);
  return Json::parse(in);
}

// Inserts every trial of sweep.json into a new database at db_path, as the lab would.
inline void build_golden_db(const std::string& db_path, const Json& sweep) {
  lab::ResultsStore store(db_path, lab::ResultsStore::Mode::kReadWrite);
  auto id = store.ensure_sweep(sweep["sweep"].get<std::string>(), "sweep", Json::object());
  for (const auto& t : sweep["trials"]) {
    lab::TrialRecord r;
    r.config = {{"workload", {{"kind", "native"}}}, {"params", t["params"]}};
    r.config_hash = lab::fnv1a_hex(t["params"].dump());
    r.repeat = t["repeat"].get<int>();
    r.status = *lab::parse_status(t["status"].get<std::string>());
    r.metrics = t["metrics"];
    r.started_at = r.ended_at = "2026-01-01T00:00:00.000Z";
    std::vector<lab::TelemetrySample> samples;
    for (const auto& s : t["telemetry"])
      samples.push_back({0, s[0].get<double>(), s[1].get<std::string>(), s[2].get<std::string>(), s[3].get<std::string>(), s[4].get<double>()});
    store.insert_trial(id, r, samples);
  }
}

// A scaling sweep: ranks 1, 2, 4, 8 for micro-batch 1 and 2, total tokens/s = 1000 mb n eff(n)
// with eff = 1, 0.95, 0.85, 0.7 (so efficiency falls below 80 % from 8 devices on).
inline void build_scaling_db(const std::string& db_path) {
  lab::ResultsStore store(db_path, lab::ResultsStore::Mode::kReadWrite);
  auto id = store.ensure_sweep("scaling", "sweep", Json::object());
  const int ranks[] = {1, 2, 4, 8};
  const double eff[] = {1.0, 0.95, 0.85, 0.7};
  for (int mb : {1, 2})
    for (int k = 0; k < 4; ++k) {
      lab::TrialRecord r;
      Json params{{"ranks", ranks[k]}, {"micro_batch_size", mb}, {"model", "llama-small"}};
      r.config = {{"workload", {{"kind", "native"}}}, {"params", params}};
      r.config_hash = lab::fnv1a_hex(params.dump());
      r.status = lab::TrialStatus::kOk;
      const double total = 1000.0 * mb * ranks[k] * eff[k];
      r.metrics = {{"tokens_per_s", total}, {"tokens_per_s_per_device", total / ranks[k]}, {"step_time_s", 1.0 / eff[k]}};
      r.started_at = r.ended_at = "2026-01-01T00:00:00.000Z";
      store.insert_trial(id, r);
    }
}

// Closed forms: relative 1e-10 (absolute below 1e-3 in magnitude, where relative error says
// nothing about a difference of two rounded sums).
inline void expect_close(double got, const Json& want, const std::string& what, double rel = 1e-10) {
  if (want.is_null()) {
    EXPECT_TRUE(std::isnan(got)) << what << ": expected undefined, got " << got;
    return;
  }
  const double w = want.get<double>();
  EXPECT_LE(std::fabs(got - w), rel * std::max(std::fabs(w), 1e-3)) << what << ": got " << got << ", want " << w;
}
inline void expect_close(const Json& got, const Json& want, const std::string& what, double rel = 1e-10) {
  expect_close(got.is_null() ? NAN : got.get<double>(), want, what, rel);
}
// p-values: absolute 1e-9.
inline void expect_p(const Json& got, const Json& want, const std::string& what) {
  ASSERT_FALSE(got.is_null()) << what;
  EXPECT_LE(std::fabs(got.get<double>() - want.get<double>()), 1e-9) << what << ": got " << got << ", want " << want;
}

}  // namespace scalelab::analysis::testing

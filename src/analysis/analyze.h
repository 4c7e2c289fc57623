#pragma once
// `scalelab analyze`: the whole analysis of one data table (analysis/frame.h) as one JSON
// document (analysis.json: every number), the tables behind it (one CSV each) and a Markdown
// summary. The report (report/report.h) draws this JSON and computes nothing itself.
//
// Sections: table, descriptive (#5), correlation (#3), pairs (#4), ols (#10), fits (#8),
// distributions (#9), groups (#6, with grouped histograms), trees (#11; SHAP interactions,
// dependence and bootstrap stability, #12), scaling (#2, when the table has scaling columns), problems
// (what could not be computed and why). docs/analysis.md gives the formula for each number.
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "analysis/frame.h"
#include "lab/table.h"

namespace scalelab::analysis {

struct AnalyzeOptions {
  std::vector<std::string> targets;   // empty: a default (val_loss, else tokens_per_s_per_device, ...)
  std::vector<std::string> features;  // empty: auto (parameters; for a CSV every non-target column)
  std::optional<double> split;        // training fraction, for the train/test statistics
  std::uint64_t seed = 0;
  std::optional<int> cv;              // folds for the cross-validated R^2 of the OLS models
  int bins = 20;
  bool trees = true;                  // xgboost importances (#11)
  int bootstrap = 50;                 // resamples for the importances' stability (#12; 0: none)
};

struct Analysis {
  Json json;                                       // analysis.json
  std::vector<std::pair<std::string, lab::Table>> tables;  // file stem -> table
  std::string markdown;
};

// InvalidInput for a target or feature that is not a column (listing the columns), a target that
// is not numeric, a split outside (0, 1), cv < 2 or more folds than rows.
Analysis analyze(const Frame& frame, const AnalyzeOptions& options);

// Writes analysis.json and <stem>.csv for each table into `dir` (created), each file through a
// temporary name and a rename. Returns the paths written.
std::vector<std::string> write_analysis(const Analysis& a, const std::string& dir);

}  // namespace scalelab::analysis

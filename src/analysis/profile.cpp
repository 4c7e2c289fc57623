#include "analysis/profile.h"

#include "lab/store.h"
#include "lab/views.h"

namespace scalelab::analysis {
namespace {

Json table_json(const lab::Table& t) {
  Json cols = Json::array();
  for (const auto& c : t.columns) cols.push_back({{"key", c.key}, {"title", c.title}});
  return {{"columns", cols}, {"rows", t.rows}, {"notes", t.notes}};
}

}  // namespace

void add_profile(Analysis& a, const lab::ResultsStore& store, const std::string& sweep_name) {
  const auto sweep = store.find_sweep(sweep_name);
  if (!sweep) return;
  const std::vector<lab::TrialRow> rows = store.trials(sweep->sweep_id);
  const std::vector<std::string> order = lab::parameter_order(*sweep);
  lab::Table ops = lab::profile_table(rows, {}, order);
  if (ops.rows.empty()) return;  // no trial was profiled
  lab::Table compare = lab::profile_compare_table(rows, {}, order, false);
  a.json["profile"] = {{"ops", table_json(ops)}, {"compare", table_json(compare)}};
  a.tables.emplace_back("profile", std::move(ops));
  a.tables.emplace_back("profile_compare", std::move(compare));
}

}  // namespace scalelab::analysis

#include "analysis/scale_study.h"

#include "lab/scale.h"
#include "lab/store.h"

namespace scalelab::analysis {

void add_scale_study(Analysis& a, const lab::ResultsStore& store, const std::string& sweep_name) {
  auto sweep = store.find_sweep(sweep_name);
  if (!sweep || sweep->kind != lab::kScaleKind) return;
  lab::Table t = lab::scale_sweep_table(*sweep, store);
  Json cols = Json::array();
  for (const auto& c : t.columns) cols.push_back({{"key", c.key}, {"title", c.title}});
  a.json["scale_study"] = {{"columns", cols}, {"rows", t.rows}, {"notes", t.notes}};
  a.tables.push_back({"scale", t});
  a.markdown += "\n## Scaling study\n\n" + lab::render_markdown(t);
}

}  // namespace scalelab::analysis

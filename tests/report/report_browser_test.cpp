// The report in a real browser: headless Chromium (Debian's `chromium`, installed by
// scripts/deps.sh) opens the file from disk; every chart must have rendered (an SVG, and each
// named mark drawing as many items as its data has rows), the console must show no error, and a
// screenshot is saved (build/report-screenshot.png) for a person to look at. Without Chromium
// the test fails: it is a dependency, not an option.
#include <gtest/gtest.h>

#include <array>
#include <vector>
#include <cmath>
#include <set>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "../analysis/golden_util.h"
#include "../cli/cli_run.h"
#include "lab/params.h"
#include "lab/store.h"

namespace scalelab {
namespace {

namespace fs = std::filesystem;
using analysis::testing::Json;

std::string chromium_path() {
  for (const char* p : {"/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome"})
    if (fs::exists(p)) return p;
  return "";
}

std::string capture(const std::string& cmd) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  std::array<char, 65536> buf{};
  std::size_t k;
  while (p && (k = fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), k);
  if (p) pclose(p);
  return out;
}

std::string html_unescape(std::string s) {
  const std::pair<const char*, const char*> table[] = {{"&quot;", "\""}, {"&lt;", "<"}, {"&gt;", ">"}, {"&#39;", "'"}, {"&amp;", "&"}};
  for (const auto& [from, to] : table)
    for (std::size_t pos = 0; (pos = s.find(from, pos)) != std::string::npos; pos += std::string(to).size()) s.replace(pos, std::string(from).size(), to);
  return s;
}

// The analysis.json the page embeds (and draws).
Json embedded_analysis(const std::string& page) {
  const std::string open = "<script type=\"application/json\" id=\"analysis-data\">";
  const auto a = page.find(open);
  if (a == std::string::npos) return Json();
  const auto b = page.find("</script>", a);
  return Json::parse(page.substr(a + open.size(), b - a - open.size()));
}

const Json* table_column(const Json& a, const std::string& name) {
  for (const auto& c : a["table"]["columns"])
    if (c["name"] == name) return &c;
  return nullptr;
}

// The brushed runs of the page's #selftest (the lower half of the first target's axis).
std::set<std::string> brushed_rows(const Json& status) {
  std::set<std::string> out;
  for (const auto& r : status["selftest"]["brush"]["rows"]) out.insert(r.get<std::string>());
  return out;
}

// Brushing reaches a per-run chart: of its rows (`rows`: objects with "row" and `field`), the
// brushed ones are ringed (points_hl) and the others dimmed (the mark `mark`); clearing the brush
// leaves nothing ringed or dimmed on the page.
void expect_brush_reaches(const Json& status, const std::string& id, const std::string& mark, const Json& rows, const std::string& field) {
  const std::set<std::string> brushed = brushed_rows(status);
  long in = 0, out = 0;
  for (const auto& r : rows) {
    if (!r.contains(field) || !r[field].is_number()) continue;
    (brushed.count(r["row"].get<std::string>()) ? in : out) += 1;
  }
  const Json& B = status["selftest"]["brush"];
  EXPECT_GT(in, 0) << id << ": the brush selects some of its runs";
  EXPECT_EQ(B["points_hl"].value(id, 0L), in) << id << ": a ring per brushed run";
  ASSERT_TRUE(B["dimmed"].contains(id)) << id << " is not linked";
  EXPECT_EQ(B["dimmed"][id][mark], out) << id << ": the other runs dim";
  EXPECT_EQ(B["cleared_dimmed"], 0);
  EXPECT_EQ(B["cleared_rings"], 0);
}

// What every page's #selftest must show: each chart exported as SVG and PNG (offline: a blob or
// data URL made in the page).
void expect_exports(const Json& status) {
  ASSERT_TRUE(status.contains("selftest")) << "the page's #selftest did not run";
  const Json& ex = status["selftest"]["exports"];
  EXPECT_EQ(ex.size(), status["charts"].get<std::size_t>());
  for (auto it = ex.begin(); it != ex.end(); ++it) {
    const std::string svg = it.value()["svg"], png = it.value()["png"];
    EXPECT_TRUE(svg.rfind("blob:", 0) == 0 || svg.rfind("data:image/svg", 0) == 0) << it.key() << " SVG export: " << svg;
    EXPECT_EQ(png.rfind("data:image/png;base64,", 0), 0u) << it.key() << " PNG export: " << png;
    EXPECT_GT(it.value()["png_bytes"].get<long>(), 1000) << it.key();
  }
}

class ReportInBrowser : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("scalelab-report-" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  // Renders `html` in headless Chromium; returns the page's render status.
  Json render(const std::string& html, const std::string& screenshot) {
    const std::string chrome = chromium_path();
    if (chrome.empty()) {
      ADD_FAILURE() << "Chromium not found (/usr/bin/chromium): install it with scripts/deps.sh — the report's browser test needs it";
      return Json();
    }
    const std::string flags = " --headless=new --no-sandbox --disable-gpu --disable-dev-shm-usage --no-first-run --user-data-dir=" +
                              (dir_ / "profile").string() + " --virtual-time-budget=60000 --hide-scrollbars ";
    const std::string url = "file://" + fs::absolute(html).string();
    // #selftest: after rendering, the page exercises its interactions (filter, brush, zoom,
    // target selector, SVG/PNG export) and records what the charts drew (report.cpp).
    const std::string dom = capture(chrome + flags + "--enable-logging=stderr --v=0 --dump-dom '" + url + "#selftest' 2>" + (dir_ / "console.txt").string());
    std::ifstream console(dir_ / "console.txt");
    std::stringstream cs;
    cs << console.rdbuf();
    console_ = cs.str();
    if (!screenshot.empty())
      capture(chrome + flags + "--window-size=1400,8800 --screenshot=" + screenshot + " '" + url + "' 2>/dev/null");
    const std::string open = "<pre id=\"render-status\">";
    auto a = dom.find(open);
    if (a == std::string::npos) {
      ADD_FAILURE() << "no render status in the page; DOM starts: " << dom.substr(0, 400) << "\nconsole: " << console_;
      return Json();
    }
    auto b = dom.find("</pre>", a);
    const std::string text = html_unescape(dom.substr(a + open.size(), b - a - open.size()));
    if (text.empty()) {
      ADD_FAILURE() << "the page did not finish rendering; console: " << console_;
      return Json();
    }
    return Json::parse(text);
  }
  fs::path dir_;
  std::string console_;
};

TEST_F(ReportInBrowser, EveryChartRendersWithItsMarksAndNoErrors) {
  const std::string db = (dir_ / "golden.db").string();
  analysis::testing::build_golden_db(db, analysis::testing::read_json_file(analysis::testing::golden_dir() + "/sweep.json"));
  const std::string html = (dir_ / "report.html").string();
  auto r = cli_test::run("report --db " + db + " --sweep golden --target val_loss,tokens_per_s_per_device --cv 5 -o " + html);
  ASSERT_EQ(r.code, 0) << r.output;
  // Kept beside the screenshot for a person to open.
  fs::copy_file(html, std::string(SCALELAB_BINARY_DIR) + "/report-golden.html", fs::copy_options::overwrite_existing);

  // Self-contained: no external URL to fetch (the only http(s) strings allowed are the Vega
  // schema id, which is never fetched, and the library's own documentation links in comments).
  std::ifstream in(html);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string page = ss.str();
  EXPECT_EQ(page.find("<script src"), std::string::npos);
  EXPECT_EQ(page.find("<link"), std::string::npos);
  EXPECT_LT(page.size(), 3u << 20) << "the report's size budget is 3 MB";

  Json status = render(html, std::string(SCALELAB_BINARY_DIR) + "/report-screenshot.png");
  ASSERT_TRUE(status.is_object());
  EXPECT_TRUE(status["errors"].empty()) << status["errors"].dump() << "\nconsole: " << console_;
  EXPECT_EQ(console_.find("Uncaught"), std::string::npos) << console_;
  ASSERT_GE(status["charts"].get<int>(), 8);
  EXPECT_EQ(status["rendered"], status["charts"]);
  for (auto it = status["expected"].begin(); it != status["expected"].end(); ++it) {
    EXPECT_EQ(status["svg"][it.key()].get<int>(), 1) << it.key();
    for (auto m = it.value().begin(); m != it.value().end(); ++m)
      EXPECT_EQ(status["marks"][it.key()][m.key()], m.value()) << it.key() << " mark " << m.key();
  }
  // The charts the golden sweep must produce.
  for (const char* id : {"corr-heatmap", "pairs", "ols-val_loss", "fit-val_loss", "dist-val_loss", "group-attn-val_loss", "telemetry", "imbalance", "trees-random_forest-val_loss", "trees-gradient_boosting-val_loss", "agree-nvml.mem_used_bytes-engine.mem_reserved_bytes", "pareto", "importance-objectives"})
    EXPECT_TRUE(status["expected"].contains(id)) << id;
  // The heatmap draws one cell per variable pair.
  Json a = analysis::testing::read_json_file(analysis::testing::golden_dir() + "/expected.json");
  const long k = static_cast<long>(a["correlation"]["variables"].size());
  EXPECT_EQ(status["marks"]["corr-heatmap"]["cells"].get<long>(), k * k);
  EXPECT_TRUE(fs::exists(std::string(SCALELAB_BINARY_DIR) + "/report-screenshot.png"));

  // The interactions (the page's #selftest, through the Vega view API and the page's controls).
  expect_exports(status);
  const Json& T = status["selftest"];
  const Json emb = embedded_analysis(page);
  ASSERT_TRUE(emb.is_object());
  const long rows = emb["table"]["rows"].get<long>();
  EXPECT_EQ(status["marks"]["parcoords"]["runs"], rows) << "a line per run";
  // The filter (the first parameter = its first value) keeps exactly the matching rows, in the
  // runs table and in every linked chart; "show all" brings every row back.
  ASSERT_TRUE(T.contains("filter"));
  const Json* fc = table_column(emb, T["filter"]["column"].get<std::string>());
  ASSERT_NE(fc, nullptr);
  long match = 0, match_tokens = 0;
  const Json* tokens = table_column(emb, "tokens_per_s_per_device");
  for (long i = 0; i < rows; ++i) {
    const Json& v = (*fc)["values"][i];
    const bool m = !v.is_null() && (v.is_string() ? v.get<std::string>() : Json(v).dump()) == T["filter"]["value"].get<std::string>();
    match += m;
    match_tokens += m && (*tokens)["values"][i].is_number();
  }
  EXPECT_GT(match, 0);
  EXPECT_LT(match, rows);
  EXPECT_EQ(T["filter"]["kept"], match);
  EXPECT_EQ(T["filter"]["rows_visible"], match);
  EXPECT_EQ(T["filter"]["marks"]["parcoords"]["runs"], match);
  EXPECT_EQ(T["filter"]["marks"]["fit-tokens_per_s_per_device"]["points"], match_tokens);
  EXPECT_LT(T["filter"]["marks"]["pareto"]["points"].get<long>(), status["marks"]["pareto"]["points"].get<long>());
  // The telemetry card moved to a trial of a kept row.
  const std::string tel_row = T["filter"].value("telemetry_row", std::string());
  bool tel_kept = false;
  for (long i = 0; i < rows; ++i)
    if (emb["table"]["row_labels"][i] == tel_row) tel_kept = (*fc)["values"][i] == T["filter"]["value"];
  EXPECT_TRUE(tel_kept) << "telemetry shows " << tel_row;
  EXPECT_GT(T["filter"]["marks"]["telemetry"]["tel_line"].get<long>(), 0);
  EXPECT_EQ(T["unfiltered"]["rows_visible"], rows);
  EXPECT_EQ(T["unfiltered"]["marks"]["parcoords"]["runs"], rows);
  EXPECT_EQ(T["unfiltered"]["marks"]["pareto"]["points"], status["marks"]["pareto"]["points"]);
  // The brush on the lower half of the first target's axis (val_loss) selects the runs of the
  // lowest val_loss: every brushed run is below every other one; they are shaded in the runs
  // table and ringed in the scatter plots; clearing the brush clears them.
  ASSERT_TRUE(T.contains("brush"));
  const Json& B = T["brush"];
  const long sel = B["selected"].get<long>();
  EXPECT_GT(sel, 0);
  EXPECT_LT(sel, rows);
  EXPECT_EQ(B["hl"], sel);
  EXPECT_EQ(B["table_hl"], sel);
  EXPECT_EQ(B["points_hl"]["fit-tokens_per_s_per_device"], sel);
  EXPECT_EQ(B["cleared_hl"], 0);
  std::set<std::string> brushed;
  for (const auto& r : B["rows"]) brushed.insert(r.get<std::string>());
  const Json* vl = table_column(emb, "val_loss");
  double max_in = -INFINITY, min_out = INFINITY;
  for (long i = 0; i < rows; ++i) {
    if (!(*vl)["values"][i].is_number()) continue;
    const double v = (*vl)["values"][i].get<double>();
    if (brushed.count(emb["table"]["row_labels"][i].get<std::string>())) max_in = std::max(max_in, v);
    else min_out = std::min(min_out, v);
  }
  EXPECT_LT(max_in, min_out) << "the brushed runs are the ones of lowest val_loss";
  // ... and every per-run chart rings them and dims the others: the scatter of a target against
  // the first parameter, the Pareto front.
  {
    Json fit_rows = Json::array();
    for (long i = 0; i < rows; ++i)
      if ((*tokens)["values"][i].is_number()) fit_rows.push_back({{"row", emb["table"]["row_labels"][i]}, {"y", (*tokens)["values"][i]}});
    expect_brush_reaches(status, "fit-tokens_per_s_per_device", "points", fit_rows, "y");
    expect_brush_reaches(status, "pareto", "points", emb["pareto"]["rows"], "x");
  }
  // The same brush by mouse (synthetic events on the axis: press at half height, drag down,
  // release) selects the same runs; a double-click clears it.
  ASSERT_TRUE(T.contains("brush_mouse"));
  std::set<std::string> by_mouse;
  for (const auto& r : T["brush_mouse"]["rows"]) by_mouse.insert(r.get<std::string>());
  EXPECT_EQ(by_mouse, brushed);
  EXPECT_EQ(T["brush_mouse"]["cleared_hl"], 0);
  // Zoom by mouse (drag across the left half of a telemetry panel), reset by double-click.
  ASSERT_TRUE(T.contains("zoom_mouse"));
  EXPECT_LT(T["zoom_mouse"]["after"].get<long>(), T["zoom_mouse"]["before"].get<long>());
  EXPECT_GT(T["zoom_mouse"]["after"].get<long>(), 0);
  EXPECT_EQ(T["zoom_mouse"]["reset"], T["zoom_mouse"]["before"]);
  // Zoom on the first half of the telemetry: fewer points, all of them back after the reset.
  ASSERT_TRUE(T.contains("zoom"));
  EXPECT_LT(T["zoom"]["after"].get<long>(), T["zoom"]["before"].get<long>());
  EXPECT_GT(T["zoom"]["after"].get<long>(), 0);
  EXPECT_EQ(T["zoom"]["reset"], T["zoom"]["before"]);
  // Powers of two on a log2 axis read 1, 2, 4, 8, 16 (not exponents, not 10^x).
  ASSERT_TRUE(T.contains("fit_log2"));
  EXPECT_EQ(T["fit_log2"]["param"], "micro_batch_size");
  EXPECT_EQ(T["fit_log2"]["labels"], Json({"1", "2", "4", "8", "16"}));
  std::set<std::string> pc_labels;
  for (const auto& l : T["pc_axis_labels"]) pc_labels.insert(l.get<std::string>());
  for (const char* l : {"1", "2", "4", "8", "16", "128", "256", "512", "eager", "flash", "sdpa"}) EXPECT_TRUE(pc_labels.count(l)) << l;
  // The target selector shows only the cards of the chosen target.
  ASSERT_TRUE(T.contains("target"));
  EXPECT_EQ(T["target"]["target"], "tokens_per_s_per_device");
  EXPECT_GT(T["target"]["visible"].size(), 0u);
  EXPECT_LT(T["target"]["visible"].size(), T["target"]["all"].get<std::size_t>());
  for (const auto& v : T["target"]["visible"]) EXPECT_EQ(v, "tokens_per_s_per_device");
  // Every card has a one-line finding.
  for (std::size_t pos = 0; (pos = page.find("<p class=\"finding", pos)) != std::string::npos; ++pos)
    EXPECT_NE(page.compare(page.find('>', pos) + 1, 4, "</p>"), 0) << "an empty finding at " << pos;
}

// A sweep with one trial: nothing can be modelled, and the page says so instead of drawing
// empty charts; it still renders without an error.
TEST_F(ReportInBrowser, OneTrialSweepSaysWhatItCannotCompute) {
  Json sweep = analysis::testing::read_json_file(analysis::testing::golden_dir() + "/sweep.json");
  sweep["trials"] = Json::array({sweep["trials"][1]});
  const std::string db = (dir_ / "one.db").string();
  analysis::testing::build_golden_db(db, sweep);
  const std::string html = (dir_ / "one.html").string();
  auto r = cli_test::run("report --db " + db + " --sweep golden --target val_loss -o " + html);
  ASSERT_EQ(r.code, 0) << r.output;
  std::ifstream in(html);
  std::stringstream ss;
  ss << in.rdbuf();
  EXPECT_NE(ss.str().find("only 1 row(s)"), std::string::npos);
  EXPECT_NE(ss.str().find("target 'val_loss' is constant"), std::string::npos);
  Json status = render(html, "");
  ASSERT_TRUE(status.is_object());
  EXPECT_TRUE(status["errors"].empty()) << status["errors"].dump();
  EXPECT_EQ(status["rendered"], status["charts"]);
}

// --baseline: the golden sweep against a copy whose throughput is 20 % higher, so every
// configuration regresses on tokens/s, and the loss (unchanged) does not.
TEST_F(ReportInBrowser, BaselineFlagsRegressions) {
  Json sweep = analysis::testing::read_json_file(analysis::testing::golden_dir() + "/sweep.json");
  const std::string db = (dir_ / "two.db").string();
  analysis::testing::build_golden_db(db, sweep);
  Json faster = sweep;
  faster["sweep"] = "before";
  for (auto& t : faster["trials"])
    if (t["metrics"].contains("tokens_per_s_per_device")) t["metrics"]["tokens_per_s_per_device"] = t["metrics"]["tokens_per_s_per_device"].get<double>() * 1.25;
  analysis::testing::build_golden_db(db, faster);
  const std::string html = (dir_ / "baseline.html").string();
  auto r = cli_test::run("report --db " + db + " --sweep golden --baseline before --target val_loss,tokens_per_s_per_device -o " + html);
  ASSERT_EQ(r.code, 0) << r.output;
  Json status = render(html, std::string(SCALELAB_BINARY_DIR) + "/report-baseline-screenshot.png");
  ASSERT_TRUE(status.is_object());
  EXPECT_TRUE(status["errors"].empty()) << status["errors"].dump();
  EXPECT_EQ(status["marks"]["baseline-tokens_per_s_per_device"]["ratios"], 30);
  std::ifstream in(html);
  std::stringstream ss;
  ss << in.rdbuf();
  EXPECT_NE(ss.str().find("30 of 30 configurations regress on tokens_per_s_per_device"), std::string::npos);
  EXPECT_NE(ss.str().find("0 of 29 configurations regress on val_loss"), std::string::npos);
  // A baseline that does not exist is exit 2.
  r = cli_test::run("report --db " + db + " --sweep golden --baseline nope -o " + html);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.output.find("--baseline: no sweep 'nope'"), std::string::npos) << r.output;
}

// A scaling sweep: the speedup, efficiency and Karp–Flatt cards render a point per measured row
// and the efficiency card says where it falls below 80 %.
TEST_F(ReportInBrowser, ScalingCardsRender) {
  const std::string db = (dir_ / "scaling.db").string();
  analysis::testing::build_scaling_db(db);
  const std::string html = (dir_ / "scaling.html").string();
  auto r = cli_test::run("report --db " + db + " --sweep scaling -o " + html);
  ASSERT_EQ(r.code, 0) << r.output;
  fs::copy_file(html, std::string(SCALELAB_BINARY_DIR) + "/report-scaling.html", fs::copy_options::overwrite_existing);
  Json status = render(html, std::string(SCALELAB_BINARY_DIR) + "/report-scaling-screenshot.png");
  ASSERT_TRUE(status.is_object());
  EXPECT_TRUE(status["errors"].empty()) << status["errors"].dump();
  EXPECT_EQ(status["rendered"], status["charts"]);
  EXPECT_EQ(status["marks"]["scaling-speedup"]["points"], 8);
  EXPECT_EQ(status["marks"]["scaling-efficiency"]["points"], 8);
  EXPECT_EQ(status["marks"]["scaling-karp-flatt"]["points"], 6);
  std::ifstream in(html);
  std::stringstream ss;
  ss << in.rdbuf();
  EXPECT_NE(ss.str().find("Efficiency falls below 80 % from 8 devices on"), std::string::npos);
  // Brushing in the parallel coordinates reaches the speedup, efficiency and Karp–Flatt charts:
  // the brushed runs ringed, the others dimmed.
  const Json emb = embedded_analysis(ss.str());
  ASSERT_TRUE(status["selftest"].contains("brush"));
  EXPECT_GT(status["selftest"]["brush"]["selected"].get<long>(), 0);
  expect_brush_reaches(status, "scaling-speedup", "points", emb["scaling"]["rows"], "speedup");
  expect_brush_reaches(status, "scaling-efficiency", "points", emb["scaling"]["rows"], "efficiency_pct");
  expect_brush_reaches(status, "scaling-karp-flatt", "points", emb["scaling"]["rows"], "karp_flatt");
}

// A scaling sweep over two models, three micro-batch sizes, two sequence lengths and 1/2/4
// devices; the efficiency falls with the devices and rises with the work per step.
void build_model_scaling_db(const std::string& db_path) {
  lab::ResultsStore store(db_path, lab::ResultsStore::Mode::kReadWrite);
  auto id = store.ensure_sweep("facets", "sweep", Json::object());
  for (const char* model : {"llama-small", "opt-small"})
    for (int mb : {1, 2, 4})
      for (int seq : {128, 256})
        for (int ranks : {1, 2, 4}) {
          lab::TrialRecord r;
          Json params{{"ranks", ranks}, {"micro_batch_size", mb}, {"seq_len", seq}, {"model", model}};
          r.config = {{"workload", {{"kind", "native"}}}, {"params", params}};
          r.config_hash = lab::fnv1a_hex(params.dump());
          r.status = lab::TrialStatus::kOk;
          const double eff = ranks == 1 ? 1.0 : 1.0 - 0.1 * ranks / (mb * seq / 128.0) - (model[0] == 'o' ? 0.05 : 0.0);
          const double total = 1000.0 * mb * seq / 128.0 * ranks * eff;
          r.metrics = {{"tokens_per_s", total}, {"tokens_per_s_per_device", total / ranks}, {"step_time_s", mb * seq / total}};
          r.started_at = r.ended_at = "2026-01-01T00:00:00.000Z";
          store.insert_trial(id, r);
        }
}

// Speedup and efficiency against the batch size and the sequence length: a panel per model, a
// point per row, the ideal level per device count and panel; the filter narrows the points.
TEST_F(ReportInBrowser, ScalingAgainstBatchAndSequencePerModel) {
  const std::string db = (dir_ / "facets.db").string();
  build_model_scaling_db(db);
  const std::string html = (dir_ / "facets.html").string();
  auto r = cli_test::run("report --db " + db + " --sweep facets -o " + html);
  ASSERT_EQ(r.code, 0) << r.output;
  fs::copy_file(html, std::string(SCALELAB_BINARY_DIR) + "/report-facets.html", fs::copy_options::overwrite_existing);
  Json status = render(html, std::string(SCALELAB_BINARY_DIR) + "/report-facets-screenshot.png");
  ASSERT_TRUE(status.is_object());
  EXPECT_TRUE(status["errors"].empty()) << status["errors"].dump();
  EXPECT_EQ(status["rendered"], status["charts"]);
  for (const char* id : {"scaling-vs-batch", "scaling-vs-seq"}) {
    ASSERT_TRUE(status["marks"].contains(id)) << id;
    EXPECT_EQ(status["marks"][id]["sf_points"], 36) << id;
    EXPECT_EQ(status["marks"][id]["sf_facet"], 2) << id << ": a panel per model";
    EXPECT_EQ(status["marks"][id]["sf_ideal_rule"], 6) << id << ": 3 device counts × 2 models";
  }
  expect_exports(status);
  // The filter (the first parameter = its first value) keeps a point per kept row.
  ASSERT_TRUE(status["selftest"].contains("filter"));
  const long kept = status["selftest"]["filter"]["kept"].get<long>();
  EXPECT_TRUE(kept == 18 || kept == 12) << kept << " of 36 (a model: 18, a batch size or a device count: 12)";
  EXPECT_EQ(status["selftest"]["filter"]["marks"]["scaling-vs-batch"]["sf_points"], kept);
  EXPECT_EQ(status["selftest"]["filter"]["marks"]["scaling-vs-seq"]["sf_points"], kept);
  // The brush rings the brushed runs in both cards and dims the others.
  std::ifstream emb_in(html);
  std::stringstream emb_ss;
  emb_ss << emb_in.rdbuf();
  const Json emb = embedded_analysis(emb_ss.str());
  for (const char* id : {"scaling-vs-batch", "scaling-vs-seq"}) expect_brush_reaches(status, id, "sf_points", emb["scaling_curves"]["rows"], "speedup");
  std::ifstream in(html);
  std::stringstream ss;
  ss << in.rdbuf();
  // At 4 devices: efficiency 1 − 0.4/(mb·seq/128) (− 0.05 for opt): highest 95 % at mb 4, lowest 55 % at mb 1.
  EXPECT_NE(ss.str().find("At 4 devices the efficiency is highest (95 %) at micro_batch_size = 4 and lowest (55 %) at micro_batch_size = 1"), std::string::npos);
}

// A methods sweep as examples/finetune-methods.toml runs it ([presets.method]: full, lora, qlora,
// and a QAT that ran out of memory): the memory card draws a stacked bar per configuration of the
// plan's parts with the measured peak as a marker, labelled by the preset; the runs table shows the
// preset label and folds the parameters it stands for (they stay in analysis.json).
void build_methods_db(const std::string& db_path) {
  lab::ResultsStore store(db_path, lab::ResultsStore::Mode::kReadWrite);
  const Json lora = {{"lora_rank", 16}, {"lora_alpha", 32}};
  const Json qlora = {{"lora_rank", 8}, {"lora_alpha", 32}, {"quantize_base", "nf4-bnb"}};  // lora_rank varies: a column of the runs
  const Json presets = {{"method", {{"full", Json::object()}, {"lora", lora}, {"qlora", qlora}, {"qat", {{"qat", "8da4w"}}}}}};
  auto id = store.ensure_sweep("methods", "sweep", {{"presets", presets}, {"parameter_order", Json::array({"model", "method"})}});
  const double M = 1024.0 * 1024;
  struct Method { const char* name; double weights, grads, optim, acts, extra; const char* extra_part; const char* status; double tps; };
  const Method methods[] = {{"full", 400, 400, 800, 120, 0, "", "ok", 900},
                            {"lora", 400, 8, 16, 110, 0, "", "ok", 1300},
                            {"qlora", 60, 8, 16, 110, 4, "nf4_tiles", "ok", 1000},
                            {"qat", 400, 400, 800, 300, 0, "", "oom", 0}};
  Json configs = Json::array();
  for (int rep = 0; rep < 2; ++rep)
    for (const auto& m : methods) {
      lab::TrialRecord r;
      Json params = {{"model", "llama-small"}, {"method", m.name}, {"seed", 0}};
      for (auto it = presets["method"][m.name].begin(); it != presets["method"][m.name].end(); ++it) params[it.key()] = it.value();
      r.config = {{"workload", {{"kind", "native"}}}, {"params", params}};
      r.config_hash = lab::fnv1a_hex(params.dump());
      r.repeat = rep;
      r.status = *lab::parse_status(m.status);
      const double total = (m.weights + m.grads + m.optim + m.acts + m.extra) * M;
      r.metrics = {{"plan_weights_bytes", m.weights * M}, {"plan_gradients_bytes", m.grads * M}, {"plan_optimizer_states_bytes", m.optim * M},
                   {"plan_activations_bytes", m.acts * M}, {"plan_total_bytes", total}, {"max_reserved_bytes", m.name[0] == 'l' ? total + M : total}};
      if (m.extra > 0) r.metrics["plan_" + std::string(m.extra_part) + "_bytes"] = m.extra * M;
      if (r.status == lab::TrialStatus::kOk)
        r.metrics.update({{"tokens_per_s", m.tps + rep}, {"tokens_per_s_per_device", m.tps + rep}, {"step_time_s", 256.0 / (m.tps + rep)},
                          {"val_loss", 3.0 - m.tps / 1000 + 0.01 * rep}});
      else
        r.reason = "out of memory";
      r.started_at = r.ended_at = "2026-01-01T00:00:00.000Z";
      store.insert_trial(id, r);
      if (rep == 0) configs.push_back(r.config_hash);
    }
  // The sweep's membership, as `sweep` stores it, and a probe of an [oom_search] in the same sweep
  // (another micro-batch size): not a configuration of the sweep, so neither a bar nor a run.
  store.set_sweep_result(id, {{"configs", configs}, {"repeats", 2}});
  lab::TrialRecord probe;
  Json params = {{"model", "llama-small"}, {"method", "lora"}, {"seed", 0}, {"lora_rank", 16}, {"lora_alpha", 32}, {"micro_batch_size", 64}};
  probe.config = {{"workload", {{"kind", "native"}}}, {"params", params}};
  probe.config_hash = lab::fnv1a_hex(params.dump());
  probe.role = "oom-search";
  probe.status = lab::TrialStatus::kOom;
  probe.metrics = {{"plan_weights_bytes", 400 * M}, {"plan_activations_bytes", 4000 * M}, {"plan_total_bytes", 4400 * M}};
  probe.started_at = probe.ended_at = "2026-01-01T00:00:00.000Z";
  store.insert_trial(id, probe);
}

TEST_F(ReportInBrowser, MemoryByPartPerMethod) {
  const std::string db = (dir_ / "methods.db").string();
  build_methods_db(db);
  const std::string html = (dir_ / "methods.html").string();
  auto r = cli_test::run("report --db " + db + " --sweep methods --target val_loss -o " + html);
  ASSERT_EQ(r.code, 0) << r.output;
  fs::copy_file(html, std::string(SCALELAB_BINARY_DIR) + "/report-methods.html", fs::copy_options::overwrite_existing);
  Json status = render(html, std::string(SCALELAB_BINARY_DIR) + "/report-methods-screenshot.png");
  ASSERT_TRUE(status.is_object());
  EXPECT_TRUE(status["errors"].empty()) << status["errors"].dump();
  EXPECT_EQ(status["rendered"], status["charts"]);
  // 4 configurations: full, lora (4 parts each), qlora (5: the NF4 tiles), qat (4; out of memory).
  ASSERT_TRUE(status["marks"].contains("memory-parts")) << status["marks"].dump();
  EXPECT_EQ(status["marks"]["memory-parts"]["mem_parts"], 17);
  EXPECT_EQ(status["marks"]["memory-parts"]["mem_peak"], 4);
  std::ifstream in(html);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string page = ss.str();
  const Json emb = embedded_analysis(page);
  ASSERT_TRUE(emb.contains("memory"));
  std::vector<std::string> labels;
  for (const auto& row : emb["memory"]["rows"]) labels.push_back(row["label"]);
  EXPECT_EQ(labels, (std::vector<std::string>{"method=full", "method=lora", "method=qlora", "method=qat"}));
  EXPECT_EQ(emb["memory"]["parts"], Json({"weights", "gradients", "optimizer_states", "activations", "nf4_tiles"}));
  EXPECT_EQ(emb["memory"]["rows"][3]["status"], "oom");
  EXPECT_NE(page.find("method=full plans the most memory (1.68 GiB)"), std::string::npos);
  EXPECT_NE(page.find("the measured peak equals the plan in 2 of 3 finished configuration(s)"), std::string::npos);
  // The runs table: the preset label, not the parameters it stands for (in analysis.json still).
  const std::string runs = page.substr(page.find("<table id=\"runs\">"));
  EXPECT_NE(runs.find("<th class=\"t\">method</th>"), std::string::npos);
  // (lora_alpha and quantize_base are the same wherever set: constant columns, dropped as such.)
  for (const char* k : {"lora_rank", "lora_alpha", "quantize_base"}) EXPECT_EQ(runs.substr(0, runs.find("</tr>")).find(k), std::string::npos) << k;
  EXPECT_NE(table_column(emb, "lora_rank"), nullptr) << "lora_rank stays in analysis.json";
  EXPECT_NE(page.find("method stands for its preset's parameters (lora_rank): folded here"), std::string::npos);
  // The memory card is linked: the filter keeps the bars of the kept runs, the brush rings them.
  ASSERT_TRUE(status["selftest"].contains("filter"));
  EXPECT_EQ(status["selftest"]["filter"]["column"], "method") << "the filter offers the preset label, not its parameters";
  EXPECT_LT(status["selftest"]["filter"]["marks"]["memory-parts"]["mem_peak"].get<long>(), 4);
  // The results table folds the same way; its CSV keeps every parameter.
  auto md = cli_test::run("results --db " + db + " --sweep methods --view memory");
  ASSERT_EQ(md.code, 0) << md.output;
  EXPECT_EQ(md.output.substr(0, md.output.find('\n')).find("lora_rank"), std::string::npos) << md.output;
  EXPECT_NE(md.output.find("| qlora"), std::string::npos) << md.output;
  auto csv = cli_test::run("results --db " + db + " --sweep methods --view memory --format csv");
  ASSERT_EQ(csv.code, 0) << csv.output;
  const std::string header = csv.output.substr(csv.output.find("trial_id,"));  // (the notes go to stderr)
  EXPECT_NE(header.substr(0, header.find('\n')).find("lora_rank"), std::string::npos) << csv.output;
}

// A `scalelab scale` study with a price: the cost per 1M tokens against the device count
// (charts_stats.cpp's card, from the scaling curves) renders a point per device count, and every
// chart of the page exports.
TEST_F(ReportInBrowser, ScaleStudyCostChart) {
  const std::string db = (dir_ / "study.db").string();
  auto sc = cli_test::run("scale --ranks 1,2 --model llama-tiny --seq-len 16 --micro-batch-size 1 --max-steps 3 --price-per-device-hour 2.5 --db " + db +
                          " --log-dir " + (dir_ / "logs").string());
  ASSERT_EQ(sc.code, 0) << sc.output;
  const std::string html = (dir_ / "study.html").string();
  auto r = cli_test::run("report --db " + db + " -o " + html);
  ASSERT_EQ(r.code, 0) << r.output;
  Json status = render(html, "");
  ASSERT_TRUE(status.is_object());
  EXPECT_TRUE(status["errors"].empty()) << status["errors"].dump();
  EXPECT_EQ(status["rendered"], status["charts"]);
  ASSERT_TRUE(status["marks"].contains("scaling-cost-energy")) << status["marks"].dump();
  EXPECT_EQ(status["marks"]["scaling-cost-energy"]["points"], 2);
  expect_exports(status);
}

// A sweep whose trials ran with --profile: the profile card (each trial's time by op family as
// stacked bars, one segment per trial and family) and the profile comparison table.
TEST_F(ReportInBrowser, ProfiledSweepGetsAProfileCard) {
  const std::string spec = (dir_ / "profiled.toml").string();
  std::ofstream(spec) << "name = \"profiled\"\n[workload]\ntype = \"native\"\n[parameters]\nmodel = [\"llama-tiny\"]\n"
                         "seq_len = [16]\nmicro_batch_size = [1, 2]\nmax_steps = [3]\n";
  const std::string db = (dir_ / "profiled.db").string();
  auto sw = cli_test::run("sweep " + spec + " --db " + db + " --profile --log-dir " + (dir_ / "logs").string());
  ASSERT_EQ(sw.code, 0) << sw.output;
  const std::string out = (dir_ / "profiled-analysis").string();
  auto an = cli_test::run("analyze --db " + db + " --sweep profiled --format json -o " + out);
  ASSERT_EQ(an.code, 0) << an.output;
  const Json a = analysis::testing::read_json_file(out + "/analysis.json");
  ASSERT_TRUE(a.contains("profile")) << "the profiled trials' op families";
  ASSERT_EQ(a["profile"]["ops"]["rows"].size(), 2u);
  long cells = 0;
  for (const auto& r : a["profile"]["ops"]["rows"])
    for (auto it = r.begin(); it != r.end(); ++it)
      if (it.key().rfind("pct_", 0) == 0 && it.value().is_number()) ++cells;
  EXPECT_GT(cells, 10) << "matmul, attention, norm, ... for each trial";
  EXPECT_TRUE(fs::exists(out + "/profile.csv"));
  EXPECT_TRUE(fs::exists(out + "/profile_compare.csv"));
  const std::string html = (dir_ / "profiled.html").string();
  auto r = cli_test::run("report --db " + db + " --sweep profiled -o " + html);
  ASSERT_EQ(r.code, 0) << r.output;
  Json status = render(html, std::string(SCALELAB_BINARY_DIR) + "/report-profile-screenshot.png");
  ASSERT_TRUE(status.is_object());
  EXPECT_TRUE(status["errors"].empty()) << status["errors"].dump();
  EXPECT_EQ(status["rendered"], status["charts"]);
  EXPECT_EQ(status["marks"]["profile-ops"]["segments"].get<long>(), cells);
  std::ifstream in(html);
  std::stringstream ss;
  ss << in.rdbuf();
  EXPECT_NE(ss.str().find("Profile comparison"), std::string::npos);
  EXPECT_NE(ss.str().find("of the profiled time on average"), std::string::npos);
}

}  // namespace
}  // namespace scalelab

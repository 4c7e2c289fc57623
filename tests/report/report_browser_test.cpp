// The report in a real browser: headless Chromium (Debian's `chromium`, installed by
// scripts/deps.sh) opens the file from disk; every chart must have rendered (an SVG, and each
// named mark drawing as many items as its data has rows), the console must show no error, and a
// screenshot is saved (build/report-screenshot.png) for a person to look at. Without Chromium
// the test fails: it is a dependency, not an option.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "../analysis/golden_util.h"
#include "../cli/cli_run.h"

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
  for (const char* id : {"corr-heatmap", "pairs", "ols-val_loss", "fit-val_loss", "dist-val_loss", "group-attn-val_loss", "telemetry", "imbalance", "trees-random_forest-val_loss", "trees-gradient_boosting-val_loss", "agree-nvml.mem_used_bytes-engine.mem_reserved_bytes", "pareto"})
    EXPECT_TRUE(status["expected"].contains(id)) << id;
  // The heatmap draws one cell per variable pair.
  Json a = analysis::testing::read_json_file(analysis::testing::golden_dir() + "/expected.json");
  const long k = static_cast<long>(a["correlation"]["variables"].size());
  EXPECT_EQ(status["marks"]["corr-heatmap"]["cells"].get<long>(), k * k);
  EXPECT_TRUE(fs::exists(std::string(SCALELAB_BINARY_DIR) + "/report-screenshot.png"));
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

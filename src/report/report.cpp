#include "report/report.h"

#include <cmath>
#include <cstdio>
#include <sstream>

#include "report/charts.h"

#if SCALELAB_HAVE_VEGA
namespace scalelab::report {
extern const char kVegaBundle[];
extern const std::size_t kVegaBundleSize;
}  // namespace scalelab::report
#endif

namespace scalelab::report {
namespace {

std::string esc(const std::string& s) {
  std::string o;
  for (char c : s) {
    switch (c) {
      case '&': o += "&amp;"; break;
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '"': o += "&quot;"; break;
      default: o += c;
    }
  }
  return o;
}

// JSON inside <script>: "</" cannot end the element when written "<\/" (a valid JSON escape).
std::string script_json(const Json& j) {
  std::string s = j.dump();
  std::string o;
  o.reserve(s.size());
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '<' && i + 1 < s.size() && s[i + 1] == '/') { o += "<\\/"; ++i; }
    else o += s[i];
  }
  return o;
}

std::string cell(const Json& v) {
  if (v.is_null()) return "";
  if (v.is_number_float()) {
    double d = v.get<double>();
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.4g", d);
    return buf;
  }
  if (v.is_string()) return esc(v.get<std::string>());
  return esc(v.dump());
}

const char* kStyle = R"CSS(
body{font-family:"DejaVu Sans",system-ui,sans-serif;margin:0;background:#f4f6f8;color:#222}
header{background:#1f3a5f;color:#fff;padding:14px 24px}
header h1{margin:0;font-size:22px} header p{margin:4px 0 0;font-size:13px;opacity:.9}
main{padding:16px 24px}
section h2{font-size:18px;margin:22px 0 8px;border-bottom:2px solid #1f3a5f;padding-bottom:4px}
.cards{display:flex;flex-wrap:wrap;gap:16px}
.card{background:#fff;border-radius:6px;box-shadow:0 1px 3px rgba(0,0,0,.15);padding:12px 14px;max-width:100%;overflow-x:auto}
.card h3{margin:0 0 4px;font-size:15px}
.finding{margin:0 0 8px;font-size:13px;color:#1f3a5f;font-weight:600;max-width:620px}
.finding.warn{color:#b03a2e}
.actions{font-size:12px;margin-top:4px} .actions button{font-size:12px;margin-right:6px;cursor:pointer}
.problems{background:#fff4e5;border-left:4px solid #e67e22;padding:8px 14px;font-size:13px}
table{border-collapse:collapse;font-size:12px;background:#fff}
th,td{border:1px solid #ddd;padding:3px 7px;text-align:right;white-space:nowrap}
th{background:#eef2f7;position:sticky;top:0} td.t,th.t{text-align:left}
.tablewrap{max-height:420px;overflow:auto;max-width:100%}
#render-status{display:none}
.vega-bindings{font-size:12px;margin:4px 0}
)CSS";

const char* kRenderScript = R"JS(
(function(){
  var charts = JSON.parse(document.getElementById('charts-data').textContent);
  var status = {charts: charts.length, rendered: 0, marks: {}, expected: {}, svg: {}, errors: window.__errors};
  function count(scene, name, acc){
    if (!scene) return;
    if (scene.marktype && scene.name === name) acc.n += (scene.items || []).length;
    (scene.items || []).forEach(function(it){ (it.items || []).forEach(function(m){ count(m, name, acc); }); });
  }
  function finish(){
    document.getElementById('render-status').textContent = JSON.stringify(status);
    document.title = document.title.replace(/^\(rendering\) /, '');
    document.body.setAttribute('data-rendered', 'true');
  }
  var pending = charts.length;
  if (!pending) finish();
  charts.forEach(function(c, k){
    var el = document.getElementById('chart-' + k);
    try {
      var view = new vega.View(vega.parse(c.spec), {renderer: 'svg', container: el, hover: true});
      view.runAsync().then(function(){
        var m = {};
        Object.keys(c.expect_marks).forEach(function(name){ var acc = {n: 0}; count(view.scenegraph().root, name, acc); m[name] = acc.n; });
        status.marks[c.id] = m; status.expected[c.id] = c.expect_marks;
        status.svg[c.id] = el.querySelectorAll('svg').length;
        status.rendered += 1;
        var bar = document.getElementById('actions-' + k);
        ['svg', 'png'].forEach(function(type){
          var b = document.createElement('button'); b.textContent = 'save ' + type.toUpperCase();
          b.onclick = function(){ view.toImageURL(type, type === 'png' ? 2 : 1).then(function(url){
            var a = document.createElement('a'); a.href = url; a.download = c.id + '.' + type; document.body.appendChild(a); a.click(); a.remove(); }); };
          bar.appendChild(b);
        });
      }).catch(function(e){ window.__errors.push(c.id + ': ' + e); }).finally(function(){ if (--pending === 0) finish(); });
    } catch (e) { window.__errors.push(c.id + ': ' + e); if (--pending === 0) finish(); }
  });
})();
)JS";

}  // namespace

bool have_vega() {
#if SCALELAB_HAVE_VEGA
  return true;
#else
  return false;
#endif
}

std::size_t vega_bundle_bytes() {
#if SCALELAB_HAVE_VEGA
  return kVegaBundleSize;
#else
  return 0;
#endif
}

std::string render_report(const Json& a, const std::string& title) {
  auto charts = build_charts(a);
  Json cj = Json::array();
  for (const auto& c : charts) cj.push_back({{"id", c.id}, {"spec", c.spec}, {"expect_marks", c.expect_marks}});
  std::ostringstream h;
  h << "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n<title>(rendering) " << esc(title) << "</title>\n";
  h << "<style>" << kStyle << "</style>\n";
  // First script: every error and console.error lands in window.__errors (the browser test reads it).
  h << "<script>window.__errors=[];window.addEventListener('error',function(e){window.__errors.push(String(e.message));});"
       "(function(){var ce=console.error;console.error=function(){window.__errors.push(Array.prototype.join.call(arguments,' '));ce.apply(console,arguments);};})();</script>\n";
#if SCALELAB_HAVE_VEGA
  h << "<script>" << kVegaBundle << "</script>\n";
#endif
  h << "<script type=\"application/json\" id=\"analysis-data\">" << script_json(a) << "</script>\n";
  h << "<script type=\"application/json\" id=\"charts-data\">" << script_json(cj) << "</script>\n";
  h << "</head><body>\n<header><h1>" << esc(title) << "</h1><p>" << esc(a.value("source", "")) << " · "
    << a["table"]["rows"].get<std::size_t>() << " rows · targets: ";
  for (std::size_t k = 0; k < a["options"]["targets"].size(); ++k) h << (k ? ", " : "") << esc(a["options"]["targets"][k].get<std::string>());
  h << " · made by scalelab analyze; every number is in the embedded analysis.json</p></header>\n<main>\n";
  if (!a["problems"].empty() || !a["table"]["dropped_constant"].empty() || !a["table"]["notes"].empty()) {
    h << "<div class=\"problems\"><b>Not computed, left out, or worth knowing</b><ul>";
    for (const auto& p : a["problems"]) h << "<li>" << esc(p.get<std::string>()) << "</li>";
    for (const auto& p : a["table"]["notes"]) h << "<li>" << esc(p.get<std::string>()) << "</li>";
    if (!a["table"]["dropped_constant"].empty()) {
      h << "<li>Constant columns dropped: ";
      for (std::size_t k = 0; k < a["table"]["dropped_constant"].size(); ++k) h << (k ? ", " : "") << esc(a["table"]["dropped_constant"][k].get<std::string>());
      h << "</li>";
    }
    h << "</ul></div>\n";
  }
  std::string section;
  for (std::size_t k = 0; k < charts.size(); ++k) {
    const auto& c = charts[k];
    if (c.section != section) {
      if (!section.empty()) h << "</div></section>\n";
      section = c.section;
      h << "<section><h2>" << esc(section) << "</h2><div class=\"cards\">\n";
    }
    h << "<div class=\"card\" id=\"card-" << esc(c.id) << "\"><h3>" << esc(c.title) << "</h3><p class=\"finding" << (c.finding.rfind("SURROGATE UNRELIABLE", 0) == 0 ? " warn" : "") << "\">" << esc(c.finding)
      << "</p><div class=\"chart\" id=\"chart-" << k << "\"></div><div class=\"actions\" id=\"actions-" << k << "\"></div></div>\n";
  }
  if (!section.empty()) h << "</div></section>\n";
  // A scaling study's own table (cost and energy per device count, recommendations).
  if (a.contains("scale_study")) {
    const auto& ss = a["scale_study"];
    h << "<section><h2>Scaling study</h2><div class=\"card\"><p class=\"finding\">The study's table as `scalelab results` prints it: "
         "throughput, speedup, efficiency, cost and energy per device count.</p><div class=\"tablewrap\"><table><tr>";
    for (const auto& c : ss["columns"]) h << "<th>" << esc(c["title"].get<std::string>()) << "</th>";
    h << "</tr>\n";
    for (const auto& r : ss["rows"]) {
      h << "<tr>";
      for (const auto& c : ss["columns"]) h << "<td>" << cell(r.value(c["key"].get<std::string>(), Json())) << "</td>";
      h << "</tr>\n";
    }
    h << "</table></div><ul>";
    for (const auto& n : ss["notes"]) h << "<li>" << esc(n.get<std::string>()) << "</li>";
    h << "</ul></div></section>\n";
  }
  // The profiles' derived figures side by side (`results --view profile-compare`).
  if (a.contains("profile")) {
    const auto& pc = a["profile"]["compare"];
    h << "<section><h2>Profile comparison</h2><div class=\"card\"><p class=\"finding\">Each trial's profile figures "
         "side by side, as `scalelab results --view profile-compare` prints them (step time, time in ops, launch and "
         "synchronization API time, host-to-device copies, NCCL kernels, communication hidden / exposed).</p>"
         "<div class=\"tablewrap\"><table><tr>";
    for (const auto& c : pc["columns"]) h << "<th>" << esc(c["title"].get<std::string>()) << "</th>";
    h << "</tr>\n";
    for (const auto& r : pc["rows"]) {
      h << "<tr>";
      for (const auto& c : pc["columns"]) h << "<td>" << cell(r.value(c["key"].get<std::string>(), Json())) << "</td>";
      h << "</tr>\n";
    }
    h << "</table></div><ul>";
    for (const auto& n : pc["notes"]) h << "<li>" << esc(n.get<std::string>()) << "</li>";
    h << "</ul></div></section>\n";
  }
  // The descriptive statistics and the data table, as HTML tables.
  h << "<section><h2>Descriptive statistics</h2><div class=\"card\"><p class=\"finding\">std (ddof=0), skew g1 and kurtosis g2 (biased, excess) as numpy/scipy; "
       "ddof=1, G1, G2 as pandas.</p><div class=\"tablewrap\"><table><tr><th class=\"t\">column</th><th class=\"t\">role</th><th>n</th><th>missing</th><th>mean</th>"
       "<th>std (ddof=0)</th><th>std (ddof=1)</th><th>min</th><th>median</th><th>max</th><th>skew g1</th><th>kurt g2</th></tr>\n";
  for (const auto& dsc : a["descriptive"]) {
    const auto& s = dsc["all"];
    h << "<tr><td class=\"t\">" << esc(dsc["column"].get<std::string>()) << "</td><td class=\"t\">" << esc(dsc["role"].get<std::string>()) << "</td>";
    for (const char* k : {"n", "missing", "mean", "std0", "std1", "min", "median", "max", "skew_g1", "kurt_g2"}) h << "<td>" << cell(s[k]) << "</td>";
    h << "</tr>\n";
  }
  h << "</table></div></div></section>\n";
  const auto& t = a["table"];
  h << "<section><h2>Runs</h2><div class=\"card\"><p class=\"finding\">" << t["rows"].get<std::size_t>()
    << " rows (one per configuration; repeats averaged).</p><div class=\"tablewrap\"><table><tr><th class=\"t\">row</th><th>repeats</th>";
  for (const auto& c : t["columns"]) h << "<th class=\"t\">" << esc(c["name"].get<std::string>()) << "</th>";
  h << "</tr>\n";
  for (std::size_t i = 0; i < t["rows"].get<std::size_t>(); ++i) {
    h << "<tr><td class=\"t\">" << esc(t["row_labels"][i].get<std::string>()) << "</td><td>" << t["repeats"][i] << "</td>";
    for (const auto& c : t["columns"]) h << "<td>" << cell(c["values"][i]) << "</td>";
    h << "</tr>\n";
  }
  h << "</table></div></div></section>\n</main>\n<pre id=\"render-status\"></pre>\n";
#if SCALELAB_HAVE_VEGA
  h << "<script>" << kRenderScript << "</script>\n";
#endif
  h << "</body></html>\n";
  return h.str();
}

}  // namespace scalelab::report

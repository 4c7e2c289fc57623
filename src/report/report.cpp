#include "report/report.h"

#include <cmath>
#include <cstdio>
#include <map>
#include <set>
#include <sstream>

#include "report/chart_util.h"
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
#controls{position:sticky;top:0;z-index:5;background:#e8eef5;border-bottom:1px solid #c5d3e3;padding:6px 24px;font-size:13px}
#controls label{margin-right:12px;white-space:nowrap} #controls select,#controls input{font-size:12px;margin-left:2px}
#filter-info{color:#1f3a5f;font-weight:600;margin:0 16px 0 10px} #target-select{white-space:nowrap}
tr.hl td{background:#fde3cf}
.aggnote{display:none;font-size:12px;color:#7f6000;background:#fff8dc;margin:0 0 6px;padding:2px 6px}
body.filtered .card:not(.linked) .aggnote{display:block}
)CSS";

const char* kRenderScript = R"JS(
(function(){
  var charts = JSON.parse(document.getElementById('charts-data').textContent);
  charts.forEach(function(c){ (c.spec.signals || []).forEach(function(s){ if (s.name === 'trial_row') c.trial_row = s.value; }); });
  var A = JSON.parse(document.getElementById('analysis-data').textContent);
  var status = {charts: charts.length, rendered: 0, marks: {}, expected: {}, svg: {}, errors: window.__errors};
  var views = {}; window.__views = views;
  // The page's state: `keep` (the rows the parameter filter lets through, null = all) and `hl`
  // (the rows brushed in the parallel coordinates, null = none), pushed into every linked chart
  // through the Vega view API (signals `keep` and `hl`) and into the runs table.
  var state = {keep: null, hl: null}, lastApply = Promise.resolve();
  function count(scene, name, acc){
    if (!scene) return;
    if (scene.marktype && scene.name === name) acc.n += (scene.items || []).length;
    (scene.items || []).forEach(function(it){ (it.items || []).forEach(function(m){ count(m, name, acc); }); });
  }
  function marksOf(id, name){ var acc = {n: 0}; if (views[id]) count(views[id].scenegraph().root, name, acc); return acc.n; }
  // The items of a named mark drawn dimmed (opacity below 1: a run outside the brush).
  function dimmed(scene, name, acc){
    if (!scene) return;
    if (scene.marktype && scene.name === name) (scene.items || []).forEach(function(it){ if (it.opacity !== undefined && it.opacity < 1) acc.n += 1; });
    (scene.items || []).forEach(function(it){ (it.items || []).forEach(function(m){ dimmed(m, name, acc); }); });
  }
  function dimmedOf(id, name){ var acc = {n: 0}; if (views[id]) dimmed(views[id].scenegraph().root, name, acc); return acc.n; }
  function texts(scene, role, acc){
    if (!scene) return acc;
    if (scene.marktype === 'text' && scene.role === role) (scene.items || []).forEach(function(it){ acc.push(String(it.text)); });
    (scene.items || []).forEach(function(it){ (it.items || []).forEach(function(m){ texts(m, role, acc); }); });
    return acc;
  }
  // The labels of the axes of this scale.
  function axisLabels(scene, scale, acc){
    if (!scene) return acc;
    (scene.items || []).forEach(function(it){
      if (scene.role === 'axis') {
        if (it.datum && it.datum.scale === scale) (it.items || []).forEach(function(m){ texts(m, 'axis-label', acc); });
        return;
      }
      (it.items || []).forEach(function(m){ axisLabels(m, scale, acc); });
    });
    return acc;
  }
  function keyset(o){ return o ? Object.keys(o).sort().join('\u0001') : '-'; }
  function apply(){
    var jobs = [];
    charts.forEach(function(c){
      var v = views[c.id];
      if (!v || !c.linked) return;
      v.signal('keep', state.keep);
      if (c.id !== 'parcoords') v.signal('hl', state.hl);
      if (c.trial_row) {  // telemetry: keep the trial selector on a trial the filter lets through
        var cur = String(v.signal('trial'));
        if (state.keep && !state.keep[c.trial_row[cur]]) {
          var ok = Object.keys(c.trial_row).filter(function(t){ return state.keep[c.trial_row[t]]; });
          if (ok.length) v.signal('trial', Number(ok[0]));
        }
      }
      jobs.push(v.runAsync());
    });
    var shown = 0;
    document.querySelectorAll('tr[data-row]').forEach(function(tr){
      var r = tr.getAttribute('data-row'), out = !!(state.keep && !state.keep[r]);
      tr.style.display = out ? 'none' : '';
      tr.classList.toggle('hl', !!(state.hl && state.hl[r]));
      shown += out ? 0 : 1;
    });
    document.body.classList.toggle('filtered', !!state.keep);
    var info = document.getElementById('filter-info'), n = A.table.rows;
    if (info) info.textContent = (state.keep ? Object.keys(state.keep).length + ' of ' + n + ' runs match' : 'all ' + n + ' runs') +
      (state.hl ? '; ' + Object.keys(state.hl).length + ' brushed in the parallel coordinates' : '');
    lastApply = Promise.all(jobs);
    return lastApply;
  }
  // The parameter filter: a control per parameter (a value, or a range for a numeric parameter
  // with many values); the page only tests each row's values against it.
  function refilter(){
    var conds = [];
    document.querySelectorAll('#filter [data-col]').forEach(function(el){
      if (el.value === '') return;
      conds.push({col: el.getAttribute('data-col'), op: el.getAttribute('data-op') || 'eq', value: el.value});
    });
    if (!conds.length) { state.keep = null; return apply(); }
    var byName = {};
    A.table.columns.forEach(function(c){ byName[c.name] = c; });
    var keep = {};
    A.table.row_labels.forEach(function(label, i){
      var pass = conds.every(function(k){
        var v = byName[k.col].values[i];
        if (v === null || v === undefined) return false;
        if (k.op === 'min') return v >= Number(k.value);
        if (k.op === 'max') return v <= Number(k.value);
        return String(v) === k.value;
      });
      if (pass) keep[label] = true;
    });
    state.keep = keep;
    return apply();
  }
  function buildFilter(){
    var box = document.getElementById('filter');
    if (!box) return;
    var features = A.options.features || [], folded = {}, names = {};
    // A preset's parameters are filtered through its label (analysis.json "presets").
    A.table.columns.forEach(function(c){ names[c.name] = 1; });
    Object.keys(A.presets || {}).forEach(function(p){ if (names[p]) A.presets[p].forEach(function(k){ folded[k] = 1; }); });
    A.table.columns.forEach(function(c){
      if (folded[c.name]) return;
      if (c.role !== 'parameter' && features.indexOf(c.name) < 0) return;
      var seen = {}, vals = [];
      c.values.forEach(function(v){ if (v !== null && !seen[String(v)]) { seen[String(v)] = 1; vals.push(v); } });
      if (vals.length < 2) return;
      vals.sort(function(x, y){ return typeof x === 'number' ? x - y : String(x) < String(y) ? -1 : 1; });
      var lab = document.createElement('label');
      lab.appendChild(document.createTextNode(c.name + ' '));
      if (c.kind === 'numeric' && vals.length > 12) {
        ['min', 'max'].forEach(function(op){
          var inp = document.createElement('input');
          inp.type = 'number'; inp.placeholder = op; inp.size = 6; inp.setAttribute('data-col', c.name); inp.setAttribute('data-op', op);
          inp.onchange = refilter; lab.appendChild(inp);
        });
      } else {
        var sel = document.createElement('select');
        sel.setAttribute('data-col', c.name);
        var any = document.createElement('option'); any.value = ''; any.textContent = 'any'; sel.appendChild(any);
        vals.forEach(function(v){ var o = document.createElement('option'); o.value = String(v); o.textContent = String(v); sel.appendChild(o); });
        sel.onchange = refilter; lab.appendChild(sel);
      }
      box.appendChild(lab);
    });
    var reset = document.createElement('button');
    reset.textContent = 'show all';
    reset.onclick = function(){ document.querySelectorAll('#filter [data-col]').forEach(function(el){ el.value = ''; }); refilter(); };
    box.appendChild(reset);
  }
  // The target selector: only the cards about one target (and those about no target).
  function showTarget(t){
    document.querySelectorAll('.card[data-target]').forEach(function(card){ card.style.display = !t || card.getAttribute('data-target') === t ? '' : 'none'; });
    document.querySelectorAll('section').forEach(function(sec){
      var cards = sec.querySelectorAll('.card');
      if (!cards.length) return;
      var any = Array.prototype.some.call(cards, function(c){ return c.style.display !== 'none'; });
      sec.style.display = any ? '' : 'none';
    });
  }
  function buildTargets(){
    var box = document.getElementById('target-select'), ts = A.options.targets || [];
    if (!box || ts.length < 2) return;
    var sel = document.createElement('select');
    sel.id = 'target';
    [''].concat(ts).forEach(function(t){ var o = document.createElement('option'); o.value = t; o.textContent = t || 'every target'; sel.appendChild(o); });
    sel.onchange = function(){ showTarget(sel.value); };
    box.appendChild(document.createTextNode('Target: '));
    box.appendChild(sel);
  }
  function linkBrush(){
    var pc = views['parcoords'];
    if (!pc) return;
    pc.addDataListener('pc_selected', function(name, tuples){
      var hl = null;
      if (pc.signal('pc_active')) { hl = {}; tuples.forEach(function(t){ hl[t.row] = true; }); }
      if (keyset(hl) === keyset(state.hl)) return;
      state.hl = hl;
      // Not inside this view's own dataflow run: after it.
      lastApply = new Promise(function(r){ setTimeout(r, 0); }).then(apply);
    });
  }
  function finish(){
    document.getElementById('render-status').textContent = JSON.stringify(status);
    document.title = document.title.replace(/^\(rendering\) /, '');
    document.body.setAttribute('data-rendered', 'true');
  }
  function ready(){
    buildFilter(); buildTargets(); linkBrush(); apply();
    if (/selftest/.test(location.hash)) selftest().catch(function(e){ window.__errors.push('selftest: ' + e); }).then(finish);
    else finish();
  }
  // With #selftest in the URL (the browser test): exercise every interaction through the same
  // code paths a person's clicks take, and record what the charts drew.
  function selftest(){
    var T = status.selftest = {exports: {}}, p = Promise.resolve();
    charts.forEach(function(c){
      p = p.then(function(){ return Promise.all([views[c.id].toImageURL('svg'), views[c.id].toImageURL('png')]); })
           .then(function(u){ T.exports[c.id] = {svg: u[0].slice(0, 20), png: u[1].slice(0, 22), png_bytes: u[1].length}; });
    });
    var linked = charts.filter(function(c){ return c.linked; });
    function linkedMarks(){
      var m = {};
      linked.forEach(function(c){ m[c.id] = {}; Object.keys(c.expect_marks).forEach(function(n){ m[c.id][n] = marksOf(c.id, n); }); });
      return m;
    }
    function visibleRows(){ return Array.prototype.filter.call(document.querySelectorAll('#runs tr[data-row]'), function(tr){ return tr.style.display !== 'none'; }).length; }
    // The filter: the first parameter's first value.
    p = p.then(function(){
      var sel = document.querySelector('#filter select[data-col]');
      if (!sel || sel.options.length < 3) return;
      sel.value = sel.options[1].value;
      return refilter().then(function(){
        T.filter = {column: sel.getAttribute('data-col'), value: sel.value, kept: Object.keys(state.keep).length, rows_visible: visibleRows(), marks: linkedMarks()};
        var tel = charts.filter(function(c){ return c.trial_row; })[0];
        if (tel) T.filter.telemetry_row = tel.trial_row[String(views[tel.id].signal('trial'))];
        sel.value = '';
        return refilter();
      }).then(function(){ T.unfiltered = {rows_visible: visibleRows(), marks: linkedMarks()}; });
    });
    // The brush: the lower half of the first target's axis in the parallel coordinates.
    p = p.then(function(){
      var pc = views['parcoords'];
      if (!pc) return;
      var dims = pc.data('pc_dims'), k = 0;
      dims.forEach(function(dm){ if (dm.target && !k) k = dm.k; });
      var b = 'brush_' + k;
      function settled(){ return new Promise(function(r){ setTimeout(r, 0); }).then(function(){ return lastApply; }); }
      return pc.signal(b, [pc.height() / 2, pc.height()]).runAsync().then(settled).then(function(){
        // Every linked chart: its ringed points and, per named mark, the items drawn dimmed.
        var pts = {}, dim = {};
        charts.forEach(function(c){ var n = marksOf(c.id, 'points_hl'); if (n) pts[c.id] = n; });
        linked.forEach(function(c){
          if (c.id === 'parcoords') return;
          dim[c.id] = {};
          Object.keys(c.expect_marks).concat(['points']).forEach(function(n){ dim[c.id][n] = dimmedOf(c.id, n); });
        });
        T.brush = {axis: k, selected: pc.data('pc_selected').length, rows: state.hl ? Object.keys(state.hl) : [], hl: state.hl ? Object.keys(state.hl).length : 0,
                   table_hl: document.querySelectorAll('#runs tr.hl').length, points_hl: pts, dimmed: dim};
        return pc.signal(b, null).runAsync().then(settled);
      }).then(function(){
        T.brush.cleared_hl = state.hl ? Object.keys(state.hl).length : 0;
        var left = 0, rings = 0;
        linked.forEach(function(c){ rings += marksOf(c.id, 'points_hl'); Object.keys(c.expect_marks).concat(['points']).forEach(function(n){ left += dimmedOf(c.id, n); }); });
        T.brush.cleared_dimmed = left; T.brush.cleared_rings = rings;
      });
    });
    // The same brush by mouse: synthetic mouse events on the axis's hit band (press at half its
    // height, drag to its bottom, release) must select the same runs as the signal above.
    function mouse(target, type, x, y){
      target.dispatchEvent(new MouseEvent(type, {clientX: x, clientY: y, bubbles: true, cancelable: true, view: window, button: 0}));
    }
    p = p.then(function(){
      var pc = views['parcoords'];
      if (!pc || !T.brush) return;
      var band = document.querySelectorAll('#card-parcoords .pc_hit path')[T.brush.axis];
      if (!band) { T.brush_mouse = {error: 'no hit band'}; return; }
      var r = band.getBoundingClientRect(), x = r.left + r.width / 2;
      mouse(band, 'mousedown', x, r.top + r.height / 2);
      mouse(window, 'mousemove', x, r.top + r.height * 0.75);
      mouse(window, 'mousemove', x, r.bottom + 20);
      mouse(window, 'mouseup', x, r.bottom + 20);
      return pc.runAsync().then(function(){ return new Promise(function(res){ setTimeout(res, 0); }); }).then(function(){ return lastApply; }).then(function(){
        T.brush_mouse = {rows: state.hl ? Object.keys(state.hl) : []};
        mouse(band, 'dblclick', x, r.top + 5);
        return pc.runAsync().then(function(){ return new Promise(function(res){ setTimeout(res, 0); }); }).then(function(){ return lastApply; });
      }).then(function(){ T.brush_mouse.cleared_hl = state.hl ? Object.keys(state.hl).length : 0; });
    });
    // Zoom by mouse: drag across the first telemetry panel's left half.
    p = p.then(function(){
      var tel = views['telemetry'];
      if (!tel) return;
      var bg = document.querySelector('#card-telemetry .tel_bg path');
      if (!bg) { T.zoom_mouse = {error: 'no panel'}; return; }
      var before = marksOf('telemetry', 'tel_points'), r = bg.getBoundingClientRect(), y = r.top + r.height / 2;
      mouse(bg, 'mousedown', r.left + 1, y);
      mouse(window, 'mousemove', r.left + r.width / 4, y);
      mouse(window, 'mousemove', r.left + r.width / 2, y);
      mouse(window, 'mouseup', r.left + r.width / 2, y);
      return tel.runAsync().then(function(){
        T.zoom_mouse = {before: before, after: marksOf('telemetry', 'tel_points'), tzoom: tel.signal('tzoom')};
        mouse(bg, 'dblclick', r.left + 5, y);
        return tel.runAsync();
      }).then(function(){ T.zoom_mouse.reset = marksOf('telemetry', 'tel_points'); });
    });
    // Zoom on the telemetry: the first half of the run.
    p = p.then(function(){
      var tel = views['telemetry'];
      if (!tel) return;
      var before = marksOf('telemetry', 'tel_points'), dom = tel.signal('tdom');
      return tel.signal('tzoom', [dom[0], dom[0] + (dom[1] - dom[0]) / 2]).runAsync().then(function(){
        T.zoom = {before: before, after: marksOf('telemetry', 'tel_points')};
        return tel.signal('tzoom', null).runAsync();
      }).then(function(){ T.zoom.reset = marksOf('telemetry', 'tel_points'); });
    });
    // Axis labels of the parallel coordinates (log2 axes read 1, 2, 4, ...).
    p = p.then(function(){ if (views['parcoords']) T.pc_axis_labels = texts(views['parcoords'].scenegraph().root, 'axis-label', []); });
    // A scatter of a target against a powers-of-two parameter on its log2 axis: the x labels.
    p = p.then(function(){
      var c = charts.filter(function(c){ return /^fit-/.test(c.id); })[0], log2 = null;
      if (!c) return;
      A.table.columns.forEach(function(col){ if (col.log2_axis && !log2 && views[c.id].signal('logok')[col.name]) log2 = col.name; });
      if (!log2) return;
      var v = views[c.id], was = v.signal('param');
      return v.signal('param', log2).signal('logx', true).runAsync().then(function(){
        T.fit_log2 = {chart: c.id, param: log2, labels: axisLabels(v.scenegraph().root, 'x', []), points: marksOf(c.id, 'points')};
        return v.signal('param', was).runAsync();
      });
    });
    // The target selector.
    p = p.then(function(){
      var sel = document.getElementById('target');
      if (!sel) return;
      sel.value = sel.options[2].value; sel.onchange();
      var vis = Array.prototype.filter.call(document.querySelectorAll('.card[data-target]'), function(c){ return c.style.display !== 'none'; });
      T.target = {target: sel.value, visible: vis.map(function(c){ return c.getAttribute('data-target'); }),
                  all: document.querySelectorAll('.card[data-target]').length};
      sel.value = ''; sel.onchange();
    });
    return p;
  }
  var pending = charts.length;
  if (!pending) ready();
  charts.forEach(function(c, k){
    var el = document.getElementById('chart-' + k);
    try {
      var view = new vega.View(vega.parse(c.spec), {renderer: 'svg', container: el, hover: true});
      views[c.id] = view;
      view.runAsync().then(function(){
        var m = {};
        Object.keys(c.expect_marks).forEach(function(name){ m[name] = marksOf(c.id, name); });
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
      }).catch(function(e){ window.__errors.push(c.id + ': ' + e); }).finally(function(){ if (--pending === 0) ready(); });
    } catch (e) { window.__errors.push(c.id + ': ' + e); if (--pending === 0) ready(); }
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
  // The target a card is about, for the target selector: its id ends with "-<target>".
  for (auto& c : charts) {
    if (!c.target.empty()) continue;
    for (const auto& t : a["options"]["targets"]) {
      const std::string suffix = std::string("-").append(t.get<std::string>());
      if (c.id.size() > suffix.size() && c.id.compare(c.id.size() - suffix.size(), suffix.size(), suffix) == 0) c.target = t.get<std::string>();
    }
  }
  Json cj = Json::array();
  for (auto& c : charts) {
    cj.push_back({{"id", c.id}, {"spec", c.spec}, {"expect_marks", c.expect_marks}, {"linked", c.linked}});
  }
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
  h << " · made by scalelab analyze; every number is in the embedded analysis.json</p></header>\n";
  // The page-wide controls (filled in by the script): the parameter filter, the count of runs it
  // keeps, and the target selector.
  h << "<div id=\"controls\"><span id=\"filter\"><b>Filter runs:</b> </span><span id=\"filter-info\"></span><span id=\"target-select\"></span></div>\n<main>\n";
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
    h << "<div class=\"card" << (c.linked ? " linked" : "") << "\" id=\"card-" << esc(c.id) << "\"";
    if (!c.target.empty()) h << " data-target=\"" << esc(c.target) << "\"";
    h << "><h3>" << esc(c.title) << "</h3><p class=\"finding" << (c.finding.rfind("SURROGATE UNRELIABLE", 0) == 0 ? " warn" : "") << "\">" << esc(c.finding)
      << "</p><p class=\"aggnote\">All runs: the filter applies to the runs table and the charts that draw one mark per run; statistics are not recomputed in the page.</p>"
      << "<div class=\"chart\" id=\"chart-" << k << "\"></div><div class=\"actions\" id=\"actions-" << k << "\"></div></div>\n";
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
  // A sweep's [presets.NAME]: the preset's label column stands for the parameters it sets; those
  // are folded out of the runs table (they stay in analysis.json and analyze's CSVs).
  std::set<std::string> folded;
  std::map<std::string, std::string> folded_by;  // preset -> its parameters, in the table's order
  const auto preset_of = util::folded_parameters(a);
  for (const auto& c : t["columns"]) {
    auto it = preset_of.find(c["name"].get<std::string>());
    if (it == preset_of.end()) continue;
    folded.insert(it->first);
    folded_by[it->second] += (folded_by[it->second].empty() ? "" : ", ") + it->first;
  }
  std::string fold_note;
  for (const auto& [preset, list] : folded_by) fold_note += " " + preset + " stands for its preset's parameters (" + list + "): folded here, listed in analysis.json.";
  h << "<section><h2>Runs</h2><div class=\"card linked\"><p class=\"finding\">" << t["rows"].get<std::size_t>()
    << " rows (one per configuration; repeats averaged); the filter hides rows, runs brushed in the parallel coordinates are shaded." << esc(fold_note) << "</p>"
       "<div class=\"tablewrap\"><table id=\"runs\"><tr><th class=\"t\">row</th><th>repeats</th>";
  for (const auto& c : t["columns"])
    if (!folded.count(c["name"].get<std::string>())) h << "<th class=\"t\">" << esc(c["name"].get<std::string>()) << "</th>";
  h << "</tr>\n";
  for (std::size_t i = 0; i < t["rows"].get<std::size_t>(); ++i) {
    h << "<tr data-row=\"" << esc(t["row_labels"][i].get<std::string>()) << "\"><td class=\"t\">" << esc(t["row_labels"][i].get<std::string>()) << "</td><td>" << t["repeats"][i] << "</td>";
    for (const auto& c : t["columns"])
      if (!folded.count(c["name"].get<std::string>())) h << "<td>" << cell(c["values"][i]) << "</td>";
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

#pragma once
// The HTML report: one self-contained file (no network, no external URL) that embeds
// analysis.json and the Vega specs built in C++ (report/charts.h), drawn by the Vega bundle
// compiled into scalelab (cmake/vega_bundle.cmake). The page computes nothing: it draws the
// JSON, shows each chart's one-line finding, the data table and what could not be computed.
// Each chart can be saved as SVG or PNG. When every chart has rendered the page writes a status
// object into <pre id="render-status"> (charts, mark counts per named mark, errors) for tests.
#include <string>

#include <nlohmann/json.hpp>

namespace scalelab::report {

bool have_vega();                         // built with libjs-vega
std::size_t vega_bundle_bytes();
// The page. `title` goes into <title> and the header.
std::string render_report(const nlohmann::json& analysis, const std::string& title);

}  // namespace scalelab::report

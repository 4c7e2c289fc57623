#include "lab/table.h"

#include <algorithm>
#include <cstdio>

#include "core/error.h"

namespace scalelab::lab {

TableFormat parse_table_format(const std::string& name) {
  if (name == "md" || name == "markdown") return TableFormat::kMarkdown;
  if (name == "csv") return TableFormat::kCsv;
  if (name == "json") return TableFormat::kJson;
  throw InvalidInput("[results] unknown format '" + name + "' — use md, csv or json");
}

std::string format_cell(const Json& v, CellFormat f) {
  if (v.is_null()) return "";
  if (!v.is_number()) return param_text(v);
  double x = v.get<double>();
  char buf[64];
  switch (f) {
    case CellFormat::kInt: std::snprintf(buf, sizeof buf, "%.0f", x); break;
    case CellFormat::kFixed1: std::snprintf(buf, sizeof buf, "%.1f", x); break;
    case CellFormat::kFixed2: std::snprintf(buf, sizeof buf, "%.2f", x); break;
    case CellFormat::kFixed3: std::snprintf(buf, sizeof buf, "%.3f", x); break;
    case CellFormat::kRatio: std::snprintf(buf, sizeof buf, "%.2fx", x); break;
    case CellFormat::kFixed4: std::snprintf(buf, sizeof buf, "%.4f", x); break;
    case CellFormat::kSig4: std::snprintf(buf, sizeof buf, "%.4g", x); break;
    case CellFormat::kText: return param_text(v);
  }
  return buf;
}

namespace {

std::string cell_of(const Json& row, const Column& c) {
  auto it = row.find(c.key);
  return it == row.end() ? std::string() : format_cell(*it, c.format);
}

std::string md_escape(std::string s) {
  std::string out;
  for (char ch : s) {
    if (ch == '|') out += "\\|";
    else if (ch == '\n') out += ' ';
    else out += ch;
  }
  return out;
}

bool right_aligned(CellFormat f) { return f != CellFormat::kText; }

}  // namespace

std::string render_markdown(const Table& t) {
  if (std::any_of(t.columns.begin(), t.columns.end(), [](const Column& c) { return c.folded; })) {
    Table shown = t;
    std::erase_if(shown.columns, [](const Column& c) { return c.folded; });
    return render_markdown(shown);
  }
  std::vector<std::vector<std::string>> cells;
  std::vector<std::size_t> width(t.columns.size(), 3);
  for (std::size_t c = 0; c < t.columns.size(); ++c) width[c] = std::max(width[c], t.columns[c].title.size());
  for (const auto& r : t.rows) {
    std::vector<std::string> line;
    for (std::size_t c = 0; c < t.columns.size(); ++c) {
      line.push_back(md_escape(cell_of(r, t.columns[c])));
      width[c] = std::max(width[c], line.back().size());
    }
    cells.push_back(std::move(line));
  }
  auto pad = [&](const std::string& s, std::size_t c) {
    std::string fill(width[c] > s.size() ? width[c] - s.size() : 0, ' ');
    return right_aligned(t.columns[c].format) ? fill + s : s + fill;
  };
  std::string out = "|";
  for (std::size_t c = 0; c < t.columns.size(); ++c) {
    out += ' ';
    out += pad(t.columns[c].title, c);
    out += " |";
  }
  out += "\n|";
  for (std::size_t c = 0; c < t.columns.size(); ++c) {
    std::string dash(width[c], '-');
    if (right_aligned(t.columns[c].format)) dash.back() = ':';
    out += " " + dash + " |";
  }
  out += "\n";
  for (const auto& line : cells) {
    out += "|";
    for (std::size_t c = 0; c < line.size(); ++c) {
      out += ' ';
      out += pad(line[c], c);
      out += " |";
    }
    out += "\n";
  }
  if (!t.notes.empty()) {
    out += "\n";
    for (const auto& n : t.notes) out += n + "\n";
  }
  return out;
}

std::string render_csv(const Table& t) {
  auto quote = [](const std::string& s) {
    if (s.find_first_of(",\"\n\r") == std::string::npos) return s;
    std::string out = "\"";
    for (char c : s) out += c == '"' ? std::string("\"\"") : std::string(1, c);
    return out + "\"";
  };
  std::string out;
  for (std::size_t c = 0; c < t.columns.size(); ++c) {
    if (c) out += ',';
    out += quote(t.columns[c].key);
  }
  out += "\n";
  for (const auto& r : t.rows) {
    for (std::size_t c = 0; c < t.columns.size(); ++c) {
      auto it = r.find(t.columns[c].key);
      std::string v = it == r.end() || it->is_null() ? "" : (it->is_number() ? it->dump() : param_text(*it));
      if (c) out += ',';
      out += quote(v);
    }
    out += "\n";
  }
  return out;
}

std::string render_json(const Table& t) { return Json(t.rows).dump(2) + "\n"; }

std::string render(const Table& t, TableFormat format) {
  switch (format) {
    case TableFormat::kMarkdown: return render_markdown(t);
    case TableFormat::kCsv: return render_csv(t);
    case TableFormat::kJson: return render_json(t);
  }
  return render_markdown(t);
}

}  // namespace scalelab::lab

#pragma once
// Tables of results, rendered as Markdown (for people), CSV or JSON (for programs).
// Cells are JSON values, so JSON output keeps numbers as numbers; Markdown formats them per
// column, CSV writes them in full precision.
#include <string>
#include <vector>

#include "lab/params.h"

namespace scalelab::lab {

enum class CellFormat {
  kText,    // as is
  kInt,     // 12
  kFixed1,  // 27542.3
  kFixed2,  // 3.21
  kFixed3,  // 0.123
  kRatio,   // 2.31x
  kFixed4,  // 0.0123
  kSig4,    // 4 significant digits: 0.01234, 1.234e+05
};

struct Column {
  std::string key;    // JSON / CSV name
  std::string title;  // Markdown header
  CellFormat format = CellFormat::kText;
  // Left out of Markdown (for people), kept in CSV and JSON: a parameter a preset label stands
  // for (lab/views.h fold_preset_columns).
  bool folded = false;
};

struct Table {
  std::vector<Column> columns;
  std::vector<Json> rows;          // objects keyed by column key (may hold more keys: JSON keeps them)
  std::vector<std::string> notes;  // lines printed under the Markdown table
};

enum class TableFormat { kMarkdown, kCsv, kJson };
TableFormat parse_table_format(const std::string& name);  // md|markdown|csv|json; InvalidInput otherwise

std::string render_markdown(const Table& t);  // without the folded columns
std::string render_csv(const Table& t);   // RFC 4180 quoting; header = column keys
std::string render_json(const Table& t);  // an array of the row objects
std::string render(const Table& t, TableFormat format);

// A cell as Markdown text ("" for null).
std::string format_cell(const Json& v, CellFormat f);

}  // namespace scalelab::lab

// Tables and filters of `scalelab results`.
#include "lab/views.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/error.h"
#include "lab/ladder.h"
#include "lab_test_util.h"

namespace scalelab::lab {
namespace {

using ::testing::HasSubstr;

TEST(Filters, ParseAndMatch) {
  Filter f = parse_filter("micro_batch_size>=4");
  EXPECT_EQ(f.key, "micro_batch_size");
  EXPECT_EQ(f.op, ">=");
  EXPECT_EQ(f.value, "4");
  EXPECT_EQ(parse_filter("status = ok").op, "=");
  EXPECT_EQ(parse_filter("status==ok").op, "=");
  EXPECT_EQ(parse_filter("seq-len!=8").key, "seq_len");
  EXPECT_THROW(parse_filter("status"), InvalidInput);
  EXPECT_THROW(parse_filter("=ok"), InvalidInput);

  Json row{{"micro_batch_size", 8}, {"status", "ok"}, {"attn", "flash"}};
  EXPECT_TRUE(filter_matches(row, parse_filter("micro_batch_size>=4")));
  EXPECT_FALSE(filter_matches(row, parse_filter("micro_batch_size<8")));
  EXPECT_TRUE(filter_matches(row, parse_filter("micro_batch_size>10")) == false);  // numeric, not text order
  EXPECT_TRUE(filter_matches(row, parse_filter("status=ok")));
  EXPECT_TRUE(filter_matches(row, parse_filter("attn!=eager")));
  EXPECT_FALSE(filter_matches(row, parse_filter("missing=1")));
  EXPECT_TRUE(filter_matches(row, parse_filter("missing!=1")));

  auto kept = apply_filters({row, Json{{"micro_batch_size", 2}, {"status", "oom"}}}, {parse_filter("status=ok")});
  EXPECT_EQ(kept.size(), 1u);
  try {
    apply_filters({row}, {parse_filter("statsu=ok")});
    FAIL();
  } catch (const InvalidInput& e) {
    EXPECT_THAT(e.what(), HasSubstr("no row has a field 'statsu'"));
    EXPECT_THAT(e.what(), HasSubstr("status"));
  }
}

TEST(Tables, Render) {
  Table t;
  t.columns = {{"name", "name"}, {"tps", "tokens/s", CellFormat::kFixed1}, {"x", "speedup", CellFormat::kRatio}};
  t.rows = {Json{{"name", "a|b"}, {"tps", 1234.56}, {"x", 2.0}}, Json{{"name", "c,\"d\""}, {"tps", nullptr}}};
  t.notes = {"note"};
  std::string md = render_markdown(t);
  EXPECT_EQ(md,
            "| name  | tokens/s | speedup |\n"
            "| ----- | -------: | ------: |\n"
            "| a\\|b  |   1234.6 |   2.00x |\n"
            "| c,\"d\" |          |         |\n"
            "\nnote\n");
  EXPECT_THAT(md, HasSubstr("\nnote\n"));
  std::string csv = render_csv(t);
  EXPECT_EQ(csv, "name,tps,x\na|b,1234.56,2.0\n\"c,\"\"d\"\"\",,\n");
  Json j = Json::parse(render_json(t));
  ASSERT_TRUE(j.is_array());
  EXPECT_DOUBLE_EQ(j[0]["tps"].get<double>(), 1234.56);
  EXPECT_EQ(parse_table_format("markdown"), TableFormat::kMarkdown);
  EXPECT_THROW(parse_table_format("xml"), InvalidInput);
}

TrialRow trial(std::int64_t id, const std::string& hash, int mbs, const std::string& status, double tps) {
  TrialRow r;
  r.trial_id = id;
  r.config_hash = hash;
  r.config = {{"params", {{"micro_batch_size", mbs}, {"model", "llama-small"}}}};
  r.status = parse_status(status).value();
  if (status == "ok") r.metrics = {{"tokens_per_s_per_device", tps}, {"max_reserved_gib", 1.5}};
  else r.reason = "out of memory";
  return r;
}

TEST(Tables, SummaryAggregatesRepeats) {
  std::vector<TrialRow> rows = {trial(1, "a", 1, "ok", 100), trial(2, "b", 2, "ok", 180), trial(3, "a", 1, "ok", 120),
                                trial(4, "b", 2, "oom", 0), trial(5, "a", 1, "ok", 90)};
  Table t = summary_table(rows, {});
  ASSERT_EQ(t.rows.size(), 2u);
  EXPECT_EQ(t.columns[0].key, "micro_batch_size");  // model does not vary: no column
  EXPECT_EQ(t.rows[0]["runs"], 3);
  EXPECT_DOUBLE_EQ(t.rows[0]["tokens_per_s_per_device"].get<double>(), 100);
  EXPECT_DOUBLE_EQ(t.rows[0]["tokens_per_s_per_device_min"].get<double>(), 90);
  EXPECT_DOUBLE_EQ(t.rows[0]["tokens_per_s_per_device_max"].get<double>(), 120);
  EXPECT_EQ(t.rows[1]["status"], "ok 1, oom 1");
  EXPECT_EQ(t.rows[1]["reason"], "out of memory");
  Table ok_only = summary_table(rows, {parse_filter("status=ok")});
  EXPECT_EQ(ok_only.rows[1]["status"], "ok");
  Table trials = trials_table(rows, {parse_filter("micro_batch_size=2")});
  EXPECT_EQ(trials.rows.size(), 2u);
  // micro_batch_size stays a column: it varies in the sweep even if not among the kept rows.
  bool has_col = false;
  for (const auto& c : trials.columns) has_col = has_col || c.key == "micro_batch_size";
  EXPECT_TRUE(has_col);
}

TEST(Tables, MemoryPartsSideBySide) {
  auto with_plan = [](std::int64_t id, int rank, double weights, double optim, double total, double measured) {
    TrialRow r = trial(id, "h" + std::to_string(id), 4, "ok", 100);
    r.config["params"]["lora_rank"] = rank;
    r.metrics["plan_weights_bytes"] = weights;
    r.metrics["plan_optimizer_states_bytes"] = optim;
    r.metrics["plan_logits_bytes"] = 0;  // nothing at the peak in any trial: no column
    r.metrics["plan_zeta_part_bytes"] = rank ? 1024.0 * 1024 * 1024 : 0.0;  // a part the order does not know
    r.metrics["plan_total_bytes"] = total;
    r.metrics["max_reserved_bytes"] = measured;
    return r;
  };
  const double G = 1024.0 * 1024 * 1024;
  std::vector<TrialRow> rows = {with_plan(1, 0, 2 * G, 4 * G, 8 * G, 8 * G), with_plan(2, 8, 2 * G, 0.5 * G, 4 * G, 4 * G),
                                trial(3, "h3", 4, "oom", 0)};
  rows[2].config["params"]["lora_rank"] = 16;
  Table t = memory_table(rows, {}, {});
  std::vector<std::string> keys;
  for (const auto& c : t.columns) keys.push_back(c.key);
  EXPECT_THAT(keys, ::testing::Contains("lora_rank"));
  EXPECT_THAT(keys, ::testing::Not(::testing::Contains("plan_logits_gib")));
  // The plan's display order, then unknown parts.
  auto pos = [&](const std::string& k) { return std::find(keys.begin(), keys.end(), k) - keys.begin(); };
  EXPECT_LT(pos("plan_weights_gib"), pos("plan_optimizer_states_gib"));
  EXPECT_LT(pos("plan_optimizer_states_gib"), pos("plan_zeta_part_gib"));
  EXPECT_EQ(pos("plan_zeta_part_gib"), static_cast<std::ptrdiff_t>(keys.size()) - 1);
  ASSERT_EQ(t.rows.size(), 3u);
  EXPECT_DOUBLE_EQ(t.rows[1]["plan_optimizer_states_gib"].get<double>(), 0.5);
  EXPECT_DOUBLE_EQ(t.rows[0]["plan_gib"].get<double>(), 8.0);
  ASSERT_FALSE(t.notes.empty());
  EXPECT_THAT(t.notes[0], HasSubstr("in 2 of 2 trials"));
  EXPECT_EQ(memory_table(rows, {parse_filter("lora_rank=8")}, {}).rows.size(), 1u);
  rows[1].metrics["max_reserved_bytes"] = 5 * G;  // the plan missed: the note counts it
  EXPECT_THAT(memory_table(rows, {}, {}).notes[0], HasSubstr("in 1 of 2 trials"));
  Table none = memory_table({trial(4, "h4", 1, "ok", 1)}, {}, {});
  EXPECT_THAT(none.notes[0], HasSubstr("No trial has a memory plan"));
}

// [presets.NAME]: the preset's label column stays, the parameters it stands for fold out of the
// Markdown table (people read method=lora) and stay in CSV and JSON (programs read every one).
TEST(Tables, PresetParametersFoldIntoTheirLabel) {
  SweepRow sweep;
  sweep.name = "methods";
  sweep.spec = {{"presets", {{"method", {{"full", Json::object()}, {"lora", {{"lora_rank", 16}, {"lora_alpha", 32}}},
                                         {"qlora", {{"lora_rank", 16}, {"lora_alpha", 32}, {"quantize_base", "nf4"}}}}}}}};
  const auto pp = preset_parameters(sweep);
  ASSERT_EQ(pp.size(), 1u);
  EXPECT_EQ(pp.at("method"), (std::vector<std::string>{"lora_alpha", "lora_rank", "quantize_base"}));
  std::vector<TrialRow> rows;
  for (const char* m : {"full", "lora", "qlora"}) {
    TrialRow r = trial(static_cast<std::int64_t>(rows.size() + 1), m, 2, "ok", 100);
    r.config["params"]["method"] = m;
    if (std::string(m) != "full") r.config["params"]["lora_rank"] = 16, r.config["params"]["lora_alpha"] = 32;
    if (std::string(m) == "qlora") r.config["params"]["quantize_base"] = "nf4";
    rows.push_back(r);
  }
  Table t = summary_table(rows, {});
  std::vector<std::string> keys;
  for (const auto& c : t.columns) keys.push_back(c.key);
  EXPECT_THAT(keys, ::testing::Contains("lora_rank"));  // it varies: a column until folded
  fold_preset_columns(t, sweep);
  const std::string md = render_markdown(t);
  EXPECT_THAT(md, HasSubstr("| method"));
  EXPECT_THAT(md, HasSubstr("qlora"));
  for (const char* k : {"lora_rank", "lora_alpha", "quantize_base"}) EXPECT_THAT(md.substr(0, md.find('\n')), ::testing::Not(HasSubstr(k))) << k;
  EXPECT_THAT(md, HasSubstr("`method` stands for its preset's parameters (lora_alpha, lora_rank, quantize_base)"));
  const std::string csv = render_csv(t);
  for (const char* k : {"method", "lora_rank", "lora_alpha", "quantize_base"}) EXPECT_THAT(csv.substr(0, csv.find('\n')), HasSubstr(k)) << k;
  EXPECT_EQ(Json::parse(render_json(t))[2]["quantize_base"], "nf4");
  // A sweep without presets: nothing folds.
  Table plain = summary_table(rows, {});
  fold_preset_columns(plain, SweepRow{});
  EXPECT_THAT(render_markdown(plain), HasSubstr("lora_rank"));
  // The preset column filtered away (one method): its parameters are not folded.
  Table one = trials_table(rows, {});
  std::erase_if(one.columns, [](const Column& c) { return c.key == "method"; });
  fold_preset_columns(one, sweep);
  EXPECT_THAT(render_markdown(one), HasSubstr("lora_rank"));
}

TEST(Tables, LadderSpeedupsAndLargestJump) {
  testing::TempDir dir;
  ResultsStore store(dir / "r.db", ResultsStore::Mode::kReadWrite);
  std::int64_t sw = store.ensure_sweep("l", "ladder", {});
  auto add = [&](double tps) {
    TrialRecord r;
    r.config_hash = fnv1a_hex(std::to_string(tps));
    r.config = {{"params", Json::object()}};
    r.status = TrialStatus::kOk;
    r.metrics = {{"tokens_per_s_per_device", tps}, {"max_reserved_gib", 2.0}};
    r.started_at = r.ended_at = utc_now_iso();
    return store.insert_trial(sw, r);
  };
  LadderResult l;
  auto rung = [&](const std::string& name, std::optional<std::int64_t> id, const std::string& status) {
    RungResult r;
    r.name = name;
    r.status = parse_rung_status(status).value();
    r.trial_id = id;
    if (id) {
      r.params = ladder_baseline();
      r.params["micro_batch_size"] = 4;
      r.micro_batch_size = 4;
    } else {
      r.note = "the command template has no {attn} placeholder";
    }
    l.rungs.push_back(r);
  };
  rung("baseline", add(100), "ok");
  rung("max batch", add(150), "ok");
  rung("flash attention", std::nullopt, "n/a");
  rung("fused", add(450), "ok");
  Table t = ladder_table(LadderResult::from_json(l.to_json()), store);
  ASSERT_EQ(t.rows.size(), 4u);
  EXPECT_DOUBLE_EQ(t.rows[3]["speedup"].get<double>(), 4.5);
  EXPECT_EQ(t.rows[2]["status"], "n/a");
  EXPECT_FALSE(t.rows[2].contains("speedup"));
  EXPECT_EQ(t.rows[3]["largest_jump"], true);
  ASSERT_FALSE(t.notes.empty());
  EXPECT_EQ(t.notes[0], "Largest single jump: 'fused', 3.00x over 'max batch'");
  EXPECT_EQ(t.rows[0]["fused_kernels"], "no");
  EXPECT_EQ(t.rows[0]["devices"], 1);
}

}  // namespace
}  // namespace scalelab::lab

// The hf-trainer prediction as a memory plan for the lab's searches (oom-search / ladder --predict).
#include "cli/hf_predict_plan.h"

#include <algorithm>
#include <cctype>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "model/config.h"
#include "predict/hf_predict.h"

namespace scalelab::cli {

static std::string param_text(const lab::ParamMap& p, const char* key) {
  auto it = p.find(key);
  if (it == p.end()) return "";
  return it->second.is_string() ? it->second.get<std::string>() : it->second.dump();
}

// A switch parameter as the lab writes it (true, or "true" / "1" / "yes" from a spec's text).
static bool param_on(const lab::ParamMap& p, const char* key) {
  const std::string v = param_text(p, key);
  return v == "true" || v == "1" || v == "yes";
}

// --predict hf-trainer: the largest micro-batch `plan --stack hf-trainer` predicts for the
// search's parameters (model, seq_len, device_memory; model_precision, mixed_precision, attn,
// fused_kernels (the ladder's Liger rung), activation_checkpointing, grad_accum_steps, dropout,
// ranks, launcher, torch_version, transformers_version when given), as the search's first guess: the search then
// proves it with two trials (b fits, b+1 runs out of memory) when the prediction is right.
std::string launcher_of_command(const lab::Json& identity) {
  std::vector<std::string> words;
  const lab::Json cmd = identity.contains("command") ? identity["command"] : lab::Json();
  auto split = [&](const std::string& line) {
    std::size_t i = 0;
    while (i < line.size()) {
      while (i < line.size() && std::isspace(static_cast<unsigned char>(line[i]))) ++i;
      std::size_t j = i;
      while (j < line.size() && !std::isspace(static_cast<unsigned char>(line[j]))) ++j;
      if (j > i) words.push_back(line.substr(i, j - i));
      i = j;
    }
  };
  if (cmd.is_string()) split(cmd.get<std::string>());
  if (cmd.is_array())
    for (const auto& w : cmd)
      if (w.is_string()) split(w.get<std::string>());
  for (std::string w : words) {
    while (!w.empty() && (w.back() == ';' || w.back() == '"' || w.back() == '\'')) w.pop_back();
    while (!w.empty() && (w.front() == '"' || w.front() == '\'')) w.erase(0, 1);
    const std::size_t slash = w.rfind('/');
    const std::string base = slash == std::string::npos ? w : w.substr(slash + 1);
    if (base == "torchrun" || w == "torch.distributed.run" || w == "torch.distributed.launch") return "torchrun";
  }
  return "python";
}

lab::PlanFn hf_trainer_plan(const std::string& launcher) {
  return [launcher](const lab::ParamMap& p, std::string* note) -> std::optional<int> {
    const std::string model = param_text(p, "model"), seq = param_text(p, "seq_len"),
                      mem = param_text(p, "device_memory");
    if (model.empty() || seq.empty() || mem.empty()) {
      *note = "--predict hf-trainer needs --model, --seq-len and --device-memory among the parameters";
      return std::nullopt;
    }
    try {
      predict::HfJob job;
      job.model = resolve_model(model);
      job.seq_len = std::stoll(seq);
      if (auto v = param_text(p, "model_precision"); !v.empty()) job.model_precision = v;
      if (auto v = param_text(p, "mixed_precision"); !v.empty()) job.mixed_precision = v;
      if (auto v = param_text(p, "attn"); !v.empty()) job.attn = v == "flash" ? "sdpa" : v;
      job.activation_checkpointing = param_on(p, "activation_checkpointing");
      job.fused_kernels = param_on(p, "fused_kernels");
      if (auto v = param_text(p, "grad_accum_steps"); !v.empty()) job.grad_accum_steps = std::stoll(v);
      if (auto v = param_text(p, "dropout"); !v.empty()) job.model.dropout = std::stod(v);
      // a multi-rank trial (the lab's "ranks"): torchrun DDP, the per-rank prediction
      if (auto v = param_text(p, "ranks"); !v.empty()) job.ranks = std::stoll(v);
      // how the user's command starts it: torchrun wraps even one process in DDP (plan's --launcher)
      job.launcher = launcher;
      if (auto v = param_text(p, "launcher"); !v.empty()) job.launcher = v;
      // the releases the job runs, when the spec names them (plan's --torch-version / --transformers-version)
      if (auto v = param_text(p, "torch_version"); !v.empty()) job.versions.torch = predict::release_of(v);
      if (auto v = param_text(p, "transformers_version"); !v.empty())
        job.versions.transformers = predict::release_of(v);
      predict::HfPredictOptions o;
      o.device_memory = parse_bytes(mem, "device_memory");
      predict::validate_job(job);
      const std::int64_t b = predict::largest_micro_batch(job, o);
      *note = "hf-trainer prediction (torch " + job.versions.torch + ", transformers " + job.versions.transformers +
              (job.ddp() ? ", torchrun DDP" : "") + ")";
      return static_cast<int>(std::min<std::int64_t>(b, 1 << 20));
    } catch (const std::exception& e) {
      *note = std::string("hf-trainer prediction unavailable: ") + e.what();
      return std::nullopt;
    }
  };
}


}  // namespace scalelab::cli

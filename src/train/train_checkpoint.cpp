#include "train/train_checkpoint.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>

#include "core/error.h"
#include "model/checkpoint.h"
#include "model/gguf_model.h"
#include "model/safetensors.h"
#include "scalelab/version.h"

namespace scalelab {

namespace fs = std::filesystem;

nlohmann::json TrainCheckpointState::to_json() const {
  nlohmann::json j = {{"global_step", global_step},
          {"lr_scheduler_step", global_step},
          {"data", {{"micro_batches_read", micro_batches_read}}},
          {"loss_scale", loss_scale},
          {"good_steps", good_steps},
          {"skipped_steps", skipped_steps},
          {"rng", {{"seed", seed},
                   {"kind", "counter-based (Philox / splitmix): synthetic data by sample, dropout by micro-step, "
                            "stochastic rounding by step"}}},
          {"losses", losses},
          {"config", config},
          {"version", SCALELAB_VERSION},
          {"git_revision", SCALELAB_GIT_REV}};
  if (!rebuilt.is_null()) j["rebuilt_from_model"] = rebuilt;
  return j;
}

void check_rebuilt(const std::string& dir, const nlohmann::json& saved, const nlohmann::json& now) {
  if (!now.is_object()) return;
  for (const auto& [part, want] : now.items()) {
    const std::string what = want.value("what", part);
    if (!saved.is_object() || !saved.contains(part)) {
      throw InvalidInput("[--resume] " + dir + " does not record the checksum of " + what +
                         " (a checkpoint of an older scalelab or of another kind of run), so this run cannot check "
                         "that what it rebuilt from --model is what that run trained against — start a new run");
    }
    const nlohmann::json& got = saved[part];
    if (got.value("crc32", std::string()) != want.value("crc32", std::string()) ||
        got.value("bytes", std::int64_t{-1}) != want.value("bytes", std::int64_t{-2})) {
      throw InvalidInput("[--resume] " + what + " rebuilt from --model " + want.value("source", std::string("?")) +
                         " (crc32 " + want.value("crc32", std::string()) + ", " +
                         std::to_string(want.value("bytes", std::int64_t{0})) + " bytes) differs from the one the "
                         "run that wrote " + dir + " had (from " + got.value("source", std::string("?")) + ": crc32 " +
                         got.value("crc32", std::string()) + ", " + std::to_string(got.value("bytes", std::int64_t{0})) +
                         " bytes) — resume with that run's --model, unchanged");
    }
  }
}

const std::vector<std::string>& resume_checked_keys() {
  static const std::vector<std::string> keys = {
      "model_config",  "model_family",      "seq_len",           "micro_batch_size", "grad_accum_steps",
      "max_steps",     "warmup_steps",      "lr",                "lr_scheduler",     "weight_decay",
      "adam_beta1",    "adam_beta2",        "adam_epsilon",      "max_grad_norm",    "model_precision",
      "mixed_precision", "optim_state_dtype", "seed",            "data",             "freeze",
      "dropout_resolved", "world_size",     "zero",              "attn",             "fused_kernels",
      "lora",  "fused_loss_chunk"};  // present only in LoRA runs / when set (so older checkpoints still resume)
  return keys;
}

std::string checkpoint_dir_name(const std::string& root, std::int64_t step) {
  return (fs::path(root) / ("checkpoint-" + std::to_string(step))).string();
}

std::vector<std::string> copy_model_side_files(const std::string& from, const std::string& to) {
  std::vector<std::string> copied;
  std::error_code ec;
  if (is_gguf_path(from)) return write_gguf_side_files(from, to);  // the tokenizer lives in the GGUF's metadata
  if (from.empty() || !fs::is_directory(from, ec)) return copied;
  for (const char* name : {"generation_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                           "chat_template.jinja"}) {
    const fs::path src = fs::path(from) / name, dst = fs::path(to) / name;
    if (!fs::is_regular_file(src, ec)) continue;
    if (fs::exists(dst, ec) && fs::equivalent(src, dst, ec)) continue;  // saving over the source
    fs::copy_file(src, dst, fs::copy_options::overwrite_existing, ec);
    if (ec) {
      throw RuntimeError("[--save] cannot copy '" + src.string() + "' to '" + dst.string() + "': " + ec.message() +
                         " — check free disk space and file-size limits (ulimit -f)");
    }
    copied.push_back(name);
  }
  return copied;
}

namespace {

std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "host";
  std::string h(buf);
  for (char& c : h)
    if (c == '/' || c == '.') c = '_';
  return h;
}

// ".tmp.<host>.<pid>": the process that writes a checkpoint's temporary directory.
std::string temp_suffix(pid_t pid) { return ".tmp." + host_name() + "." + std::to_string(pid); }

// A run killed while saving (SIGKILL, SIGXFSZ at a file-size limit, a power cut) leaves its
// temporary directory: the next save into the same --save removes those of this host's dead
// processes (another host's, on a shared file system, are left alone: their processes are not
// visible here).
void remove_dead_runs_temporaries(const std::string& root) {
  static const std::regex name("\\.checkpoint-[0-9]+\\.tmp\\.(.+)\\.([0-9]{1,9})");
  const std::string host = host_name();
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    std::smatch m;
    const std::string n = e.path().filename().string();
    if (!std::regex_match(n, m, name) || m[1].str() != host) continue;
    const auto pid = static_cast<pid_t>(std::stol(m[2].str()));
    if (pid == ::getpid() || (::kill(pid, 0) == 0 || errno != ESRCH)) continue;
    std::error_code rm;
    fs::remove_all(e.path(), rm);
  }
}

}  // namespace

void save_train_checkpoint(const std::string& root, const ModelConfig& config, const ParamLayout& layout,
                           const Tensor& params, DType param_dtype, const Tensor& m, const Tensor& v,
                           const TrainCheckpointState& state, const std::string& source_model) {
  const std::string final_dir = checkpoint_dir_name(root, state.global_step);
  const std::string tmp = (fs::path(root) / (".checkpoint-" + std::to_string(state.global_step) + temp_suffix(::getpid())))
                              .string();
  std::error_code ec;
  remove_dead_runs_temporaries(root);
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp, ec);
  if (ec) throw InvalidInput("[--save] cannot create '" + tmp + "': " + ec.message() + " — check that --save is writable");
  // A failure on the way (the disk full, a file-size limit) leaves no half checkpoint behind:
  // the temporary directory goes, the earlier checkpoints stay as they were.
  try {
    SaveOptions so;
    so.dtype = param_dtype;
    save_checkpoint(tmp, config, layout, params, so);
    copy_model_side_files(source_model, tmp);
    const std::vector<std::int64_t> shape = {m.numel()};
    write_safetensors((fs::path(tmp) / "optimizer.safetensors").string(),
                      {{"exp_avg", shape, m.raw(), m.dtype(), m.dtype()}, {"exp_avg_sq", shape, v.raw(), v.dtype(), v.dtype()}});
    {
      const fs::path state_path = fs::path(tmp) / "trainer_state.json";
      std::ofstream out(state_path);
      out << state.to_json().dump(1) << "\n";
      out.close();
      if (!out) {
        throw RuntimeError("[--save] writing " + state_path.string() +
                           " failed — check free disk space and file-size limits (ulimit -f)");
      }
    }
    fs::remove_all(final_dir, ec);  // a checkpoint of the same step from an earlier run
    fs::rename(tmp, final_dir, ec);
    if (ec) throw RuntimeError("[--save] cannot move the checkpoint into '" + final_dir + "': " + ec.message());
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
}

std::vector<std::string> rotate_checkpoints(const std::string& root, std::int64_t limit, std::int64_t current) {
  std::vector<std::string> removed;
  if (limit <= 0) return removed;
  std::vector<std::pair<std::int64_t, fs::path>> found;
  std::error_code ec;
  static const std::regex name("checkpoint-([0-9]{1,18})");
  for (const auto& e : fs::directory_iterator(root, ec)) {
    std::smatch m;
    const std::string n = e.path().filename().string();
    if (e.is_directory() && std::regex_match(n, m, name)) found.emplace_back(std::stoll(m[1].str()), e.path());
  }
  std::sort(found.begin(), found.end());
  std::size_t left = found.size();
  for (const auto& [step, path] : found) {
    if (left <= static_cast<std::size_t>(limit)) break;
    if (step == current) continue;
    fs::remove_all(path, ec);
    removed.push_back(path.string());
    --left;
  }
  return removed;
}

TrainCheckpointState read_train_state(const std::string& dir) {
  const fs::path p = fs::path(dir) / "trainer_state.json";
  std::ifstream in(p);
  if (!in) {
    throw InvalidInput("[--resume] '" + p.string() +
                       "' cannot be read — --resume takes a checkpoint directory written by --save-every "
                       "(DIR/checkpoint-STEP)");
  }
  TrainCheckpointState s;
  try {
    const auto j = nlohmann::json::parse(in);
    s.global_step = j.at("global_step").get<std::int64_t>();
    s.micro_batches_read = j.at("data").at("micro_batches_read").get<std::int64_t>();
    s.loss_scale = j.at("loss_scale").get<double>();
    s.good_steps = j.at("good_steps").get<std::int64_t>();
    s.skipped_steps = j.at("skipped_steps").get<std::int64_t>();
    s.seed = j.at("rng").at("seed").get<std::uint64_t>();
    s.config = j.at("config");
    s.losses = j.at("losses").get<std::vector<double>>();
    if (j.contains("rebuilt_from_model")) s.rebuilt = j["rebuilt_from_model"];
  } catch (const nlohmann::json::exception& e) {
    throw InvalidInput("[--resume] '" + p.string() + "' is not a scalelab trainer state (" + e.what() + ")");
  }
  if (s.global_step < 1 || s.micro_batches_read < 0) {
    throw InvalidInput("[--resume] '" + p.string() + "' holds step " + std::to_string(s.global_step) +
                       " — not a checkpoint of a training run");
  }
  return s;
}

void check_resume_config(const std::string& dir, const nlohmann::json& saved, const nlohmann::json& now) {
  std::string diffs;
  std::vector<std::string> keys = resume_checked_keys();
  // DPO (checked when either run is one, so that checkpoints of versions before these keys resume).
  auto is_dpo = [](const nlohmann::json& c) { return c.contains("dpo") && c["dpo"] == true; };
  if (is_dpo(saved) || is_dpo(now)) {
    for (const char* k : {"dpo", "pairs", "beta", "label_smoothing"}) keys.push_back(k);
  }
  for (const auto& k : keys) {
    const nlohmann::json a = saved.contains(k) ? saved[k] : nlohmann::json(nullptr);
    const nlohmann::json b = now.contains(k) ? now[k] : nlohmann::json(nullptr);
    if (a == b) continue;
    if (k == "model_config" && a.is_object() && b.is_object()) {
      for (const auto& [key, value] : a.items()) {
        const nlohmann::json other = b.contains(key) ? b[key] : nlohmann::json(nullptr);
        if (value != other) diffs += "; model " + key + " " + value.dump() + " in the checkpoint, " + other.dump() + " now";
      }
      for (const auto& [key, value] : b.items())
        if (!a.contains(key)) diffs += "; model " + key + " absent in the checkpoint, " + value.dump() + " now";
      continue;
    }
    diffs += "; " + k + " " + a.dump() + " in the checkpoint, " + b.dump() + " now";
  }
  if (!diffs.empty()) {
    throw InvalidInput("[--resume] " + dir + " was written by another model or configuration: " + diffs.substr(2) +
                       " — resume with the flags of the run that wrote it, or start a new run");
  }
}

void load_optimizer_state(const std::string& dir, const std::string& name, const Tensor& dst, std::int64_t begin,
                          std::int64_t total) {
  if (total < 0) total = dst.numel();
  SCALELAB_CHECK(begin >= 0 && begin + dst.numel() <= total, "[--resume] optimizer shard out of range (a bug)");
  const std::string path = (fs::path(dir) / "optimizer.safetensors").string();
  if (!fs::exists(path)) throw InvalidInput("[--resume] '" + path + "' is missing — the checkpoint is incomplete");
  const SafetensorsFile f = SafetensorsFile::open(path);
  const SafetensorsTensor* t = f.find(name);
  if (!t) throw InvalidInput("[--resume] '" + path + "' has no " + name + " — the checkpoint is incomplete");
  if (t->numel() != total) {
    throw InvalidInput("[--resume] '" + path + "': " + name + " has " + std::to_string(t->numel()) +
                       " elements, this run's optimizer state " + std::to_string(total) +
                       " — the checkpoint is of another model or --freeze");
  }
  if (begin == 0 && total == dst.numel()) {
    f.read(*t, dst.raw(), dst.dtype());
    return;
  }
  // A ZeRO-1 rank's shard: the whole state read once on the host, its segment kept.
  const std::size_t es = dtype_size(dst.dtype());
  std::vector<std::uint8_t> all(static_cast<std::size_t>(total) * es);
  f.read(*t, all.data(), dst.dtype());
  std::memcpy(dst.raw(), all.data() + static_cast<std::size_t>(begin) * es, static_cast<std::size_t>(dst.numel()) * es);
}

}  // namespace scalelab

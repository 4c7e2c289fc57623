#include "fuzz/targets.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>

#include "core/allocator.h"
#include "core/error.h"
#include "core/tensor.h"
#include "core/trace.h"
#include "lab/spec.h"
#include "model/checkpoint.h"
#include "model/config.h"
#include "model/params.h"
#include "model/gguf.h"
#include "model/safetensors.h"
#include "model/tokenizer/chat_template.h"
#include "model/tokenizer/tokenizer.h"
#include "profile/readers.h"
#include "profile/summary.h"
#include "train/data.h"

namespace scalelab::fuzz {

namespace fs = std::filesystem;

namespace {

thread_local std::string g_last_rejection;

// A private scratch directory for the process (removed at exit).
const fs::path& scratch() {
  static const fs::path dir = [] {
    std::string tmpl = (fs::temp_directory_path() / "scalelab-fuzz-XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("fuzz: mkdtemp failed");
    std::atexit([] {
      std::error_code ec;
      fs::remove_all(scratch(), ec);
    });
    return fs::path(tmpl);
  }();
  return dir;
}

void write_file(const fs::path& path, const std::uint8_t* data, std::size_t size) {
  // A new file each time, not the last one truncated: on ext4 (auto_da_alloc) truncating a file
  // that holds data makes its close start writeback, which cost the harnesses about a tenth of
  // their time.
  std::error_code ec;
  fs::remove(path, ec);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  if (!out) throw std::runtime_error("fuzz: cannot write " + path.string());
}

DeviceAllocator& host() {
  static DeviceAllocator a(make_host_backend(), std::size_t{1} << 30);
  return a;
}

// Runs `body`; an InvalidInput is a rejection, which must name `must_name`.
template <class F>
Outcome guarded(const std::string& must_name, F&& body) {
  try {
    body();
    return Outcome::kAccepted;
  } catch (const InvalidInput& e) {
    g_last_rejection = e.what();
    if (g_last_rejection.find(must_name) == std::string::npos) {
      throw ContractViolation("InvalidInput does not name '" + must_name + "': " + g_last_rejection);
    }
    return Outcome::kRejected;
  }
}

// The tiny Llama the checkpoint targets load into (GQA, tied embeddings).
const ModelConfig& tiny_llama() {
  static const ModelConfig c = [] {
    nlohmann::json j = {{"model_type", "llama"},      {"hidden_size", 8},       {"intermediate_size", 16},
                        {"num_hidden_layers", 1},     {"num_attention_heads", 2}, {"num_key_value_heads", 1},
                        {"vocab_size", 16},           {"max_position_embeddings", 32},
                        {"tie_word_embeddings", true}};
    return config_from_hf_json(j, "tiny-llama");
  }();
  return c;
}

// --- safetensors: one file, opened and every readable tensor read -------------------------------
Outcome run_safetensors(const std::uint8_t* data, std::size_t size) {
  const fs::path path = scratch() / "fuzz.safetensors";
  write_file(path, data, size);
  return guarded(path.string(), [&] {
    const SafetensorsFile f = SafetensorsFile::open(path.string());
    for (const auto& t : f.tensors()) {
      if (f.find(t.name) != &t) throw ContractViolation("find('" + t.name + "') does not return the tensor");
      if (!t.dtype || t.numel() > (1 << 20)) continue;
      const DType dst = *t.dtype == DType::kI32 ? DType::kI32 : DType::kF32;
      std::vector<std::uint8_t> buf(static_cast<std::size_t>(t.numel()) * dtype_size(dst));
      f.read(t, buf.data(), dst);
    }
  });
}

// --- a checkpoint directory: model.safetensors loaded into the tiny Llama -----------------------
Outcome run_checkpoint(const std::uint8_t* data, std::size_t size) {
  const fs::path dir = scratch() / "ckpt";
  fs::create_directories(dir);
  write_file(dir / "model.safetensors", data, size);
  const ParamLayout layout = ParamLayout::build(tiny_llama());
  Tensor flat = Tensor::zeros({layout.total_numel()}, DType::kF32, host());
  return guarded(dir.string(), [&] { load_weights(dir.string(), tiny_llama(), layout, flat); });
}

// --- a sharded checkpoint: the index fuzzed, beside two valid shards of the tiny Llama ---------
Outcome run_checkpoint_index(const std::uint8_t* data, std::size_t size) {
  const fs::path dir = scratch() / "sharded";
  const ParamLayout layout = ParamLayout::build(tiny_llama());
  static const bool saved = [&] {
    Tensor w = Tensor::zeros({layout.total_numel()}, DType::kF32, host());
    SaveOptions o;
    o.max_shard_bytes = 512;  // several shards
    save_checkpoint(dir.string(), tiny_llama(), layout, w, o);
    return true;
  }();
  (void)saved;
  write_file(dir / "model.safetensors.index.json", data, size);
  Tensor flat = Tensor::zeros({layout.total_numel()}, DType::kF32, host());
  return guarded(dir.string(), [&] { load_weights(dir.string(), tiny_llama(), layout, flat); });
}

// --- config.json of any family: parsed, validated, laid out, written back and re-read ----------
Outcome run_config(const std::uint8_t* data, std::size_t size) {
  const fs::path dir = scratch() / "model";
  fs::create_directories(dir);
  write_file(dir / "config.json", data, size);
  return guarded((dir / "config.json").string(), [&] {
    const ModelConfig c = resolve_model(dir.string());
    const ParamLayout layout = ParamLayout::build(c);
    (void)layout.total_numel();
    (void)describe_config(c);
    // What scalelab writes must read back as the same shapes.
    const ModelConfig back = config_from_hf_json(c.to_hf_json(), (dir / "config.json").string());
    const ParamLayout layout2 = ParamLayout::build(back);
    if (layout2.total_numel() != layout.total_numel() || back.family != c.family) {
      throw ContractViolation("config.json written back does not describe the same model: " + describe_config(c) +
                              " vs " + describe_config(back));
    }
  });
}

// --- sweep spec (TOML): parsed, expanded, described ---------------------------------------------
Outcome run_sweep_spec(const std::uint8_t* data, std::size_t size) {
  const fs::path path = scratch() / "sweep.toml";
  write_file(path, data, size);
  return guarded(path.string(), [&] {
    const lab::SweepSpec spec = lab::load_sweep_spec(path.string());
    (void)spec.expand();
    (void)spec.swept_parameters();
    (void)spec.to_json().dump();
  });
}

// --- token file: the first 4 bytes choose seq-len, micro-batch, vocab and ranks; the rest is the file
Outcome run_token_file(const std::uint8_t* data, std::size_t size) {
  if (size < 4) return Outcome::kRejected;
  DataOptions o;
  o.seq_len = 1 + data[0] % 64;
  o.micro_batch = 1 + data[1] % 4;
  o.vocab_size = 1 + (data[2] | ((data[3] & 0x7f) << 8));
  o.world = 1 + (data[3] >> 7);
  o.rank = o.world - 1;
  o.seed = 1;
  const fs::path path = scratch() / "tokens.bin";
  o.spec = path.string();
  write_file(path, data + 4, size - 4);
  return guarded(path.string(), [&] {
    auto src = make_data_source(o);
    Batch b = make_batch(o.micro_batch, o.seq_len, host());
    for (int i = 0; i < 3; ++i) {
      src->next(b);
      for (std::int64_t k = 0; k < o.micro_batch * o.seq_len; ++k) {
        const auto v = b.inputs.data<std::int32_t>()[k];
        const auto t = b.targets.data<std::int32_t>()[k];
        if (v < 0 || v >= o.vocab_size || t < 0 || t >= o.vocab_size) {
          throw ContractViolation("a batch holds a token outside the vocabulary");
        }
      }
    }
    (void)src->describe();
  });
}

// --- tokenizer.json: the file as a model directory holds it, then encode and decode as training does
Outcome run_tokenizer_json(const std::uint8_t* data, std::size_t size) {
  const fs::path path = scratch() / "tokenizer.json";
  write_file(path, data, size);
  return guarded(path.string(), [&] {
    const tok::Tokenizer t = tok::Tokenizer::load(path.string());
    static const char* const texts[] = {"", "Hello world, it's 2024!\n\n", "  \t\r\n x", "caf\xc3\xa9 \xff\xfe <|endoftext|>",
                                        "<|begin_of_text|>ab c</s>", "\xf0\x9f\x91\x8d\xf0\x9f\x8f\xbd 12345678"};
    for (const char* s : texts) {
      for (bool special : {false, true}) {
        const auto ids = t.encode(s, special);
        for (std::uint32_t id : ids) {
          if (id >= t.vocab_size()) throw ContractViolation("encode gave an id outside the vocabulary");
        }
        (void)t.decode(ids, !special);
      }
    }
    (void)t.describe();
  });
}

// --- a chat template (chat_template.jinja beside a model, as a GGUF's or tokenizer_config.json's
// would be): found, parsed and rendered for a conversation with and without the generation prompt
Outcome run_chat_template(const std::uint8_t* data, std::size_t size) {
  const fs::path dir = scratch() / "chat";
  fs::create_directories(dir);
  const fs::path path = dir / "chat_template.jinja";
  write_file(path, data, size);
  return guarded(path.string(), [&] {
    const std::optional<tok::ChatTemplate> t = tok::ChatTemplate::find(dir.string());
    if (!t) throw ContractViolation("chat_template.jinja beside a model was not found");
    const std::vector<tok::ChatMessage> conversation = {
        {"user", "Hi! caf\xc3\xa9 <|im_end|>\n  two  "}, {"assistant", ""}, {"user", "\xff\xfe ok?"}};
    for (bool generation_prompt : {true, false}) {
      (void)t->render(conversation, generation_prompt, {{"bos_token", "<s>"}, {"eos_token", "</s>"}});
    }
  });
}

// --- GGUF: open, dequantize every tensor, build the tokenizer of the metadata
Outcome run_gguf(const std::uint8_t* data, std::size_t size) {
  const fs::path path = scratch() / "model.gguf";
  write_file(path, data, size);
  return guarded(path.string(), [&] {
    const GgufFile f = GgufFile::open(path.string());
    for (const GgufTensor& t : f.tensors()) {
      if (f.dequantize(t).size() != static_cast<std::size_t>(t.numel())) throw ContractViolation("dequantize gave the wrong count");
    }
    if (f.metadata().contains("tokenizer.ggml.model")) (void)f.tokenizer().encode("Hello 123 <|end_of_text|>", true);
  });
}


// --- JSONL records (`--data jsonl:FILE`): the first 2 bytes choose seq-len, micro-batch and the
// spec's options; the rest is the file, read, split, tokenized, packed and batched as training does
const std::string& jsonl_tokenizer() {
  // The ignore_merges golden tokenizer (261 byte-level tokens, 4 merges) with an EOS added, so
  // that tokenizing costs little next to the parsing being fuzzed.
  static const std::string path = [] {
    const fs::path dir = scratch() / "jsonl-tokenizer";
    fs::create_directories(dir);
    std::ifstream in(fs::path(SCALELAB_SOURCE_DIR) / "tests/golden/data/tokenizer/ignore_merges/tokenizer.json");
    nlohmann::json t = nlohmann::json::parse(in);
    t["added_tokens"] = nlohmann::json::array({{{"id", 261}, {"content", "<|endoftext|>"}, {"single_word", false},
                                                {"lstrip", false}, {"rstrip", false}, {"normalized", false},
                                                {"special", true}}});
    std::ofstream(dir / "tokenizer.json") << t.dump();
    std::ofstream(dir / "tokenizer_config.json") << R"({"eos_token": "<|endoftext|>"})";
    return (dir / "tokenizer.json").string();
  }();
  return path;
}

Outcome run_jsonl(const std::uint8_t* data, std::size_t size) {
  if (size < 2) return Outcome::kRejected;
  const std::uint8_t a = data[0], b = data[1];
  const fs::path path = scratch() / "data.jsonl";
  write_file(path, data + 2, size - 2);
  DataOptions o;
  o.seq_len = 1 + a % 32;
  o.micro_batch = 1 + (a >> 5) % 4;
  o.vocab_size = 300;
  o.world = 1 + ((b >> 5) & 1);
  o.rank = o.world - 1;
  o.seed = 7;
  o.spec = "jsonl:" + path.string();
  if (b & 1) o.spec += ",pad";
  if (b & 2) o.spec += ",shuffle";
  if (((b >> 2) & 3) == 1) o.spec += ",split=train";
  if (((b >> 2) & 3) == 2) o.spec += ",split=val,val-fraction=0.3";
  if (b & 16) o.spec += ",no-eos";
  return guarded(path.string(), [&] {
    // The tokenizer is loaded once: reading tokenizer.json took half of every execution, and the
    // tokenizer has its own harness (tokenizer_json).
    static const auto loaded = std::make_shared<const tok::Tokenizer>(tok::find_tokenizer(jsonl_tokenizer()));
    TextSourceOptions text{jsonl_tokenizer(), "", "--data"};
    text.loaded = loaded;
    auto src = make_data_source(o, text);
    Batch batch = make_batch(o.micro_batch, o.seq_len, host());
    for (int i = 0; i < 3; ++i) {
      src->next(batch);
      for (std::int64_t k = 0; k < o.micro_batch * o.seq_len; ++k) {
        const auto v = batch.inputs.data<std::int32_t>()[k];
        const auto t = batch.targets.data<std::int32_t>()[k];
        if (v < 0 || v >= o.vocab_size || t < -100 || t >= o.vocab_size || (t < 0 && t != -100)) {
          throw ContractViolation("a batch holds a token outside the vocabulary");
        }
      }
    }
    (void)src->describe();
  });
}

// --- `scalelab profile-summary FILE`: a scalelab or PyTorch trace (JSON) or nsys stats CSV, summarized,
// rendered in every format, and read back from its JSON as a run record's profile.summary is
Outcome run_profile_summary(const std::uint8_t* data, std::size_t size) {
  const fs::path path = scratch() / "profile_cuda_api_sum.csv";  // the name hints nsys's report
  write_file(path, data, size);
  return guarded(path.string(), [&] {
    for (bool all_steps : {false, true}) {
      const profile::Report r = profile::summarize_file(path.string(), all_steps);
      (void)profile::render_markdown(r, 2);
      (void)profile::render(r, profile::Format::kMarkdown);
      (void)profile::render(r, profile::Format::kCsv);
      const std::string text = profile::render(r, profile::Format::kJson);
      const profile::Report back = profile::report_from_json(nlohmann::json::parse(text));
      if (back.tables.size() != r.tables.size()) throw ContractViolation("the summary's JSON reads back with other tables");
      for (std::size_t i = 0; i < r.tables.size(); ++i) {
        if (back.tables[i].rows.size() != r.tables[i].rows.size() || back.tables[i].id != r.tables[i].id) {
          throw ContractViolation("table '" + r.tables[i].id + "' reads back from JSON with other rows");
        }
      }
      if (r.source != "scalelab") break;  // --all-steps changes only scalelab traces
    }
  });
}

// --- `scalelab trace-merge`: the input cut at each NUL byte into up to four rank files, each parsed as
// the command does, merged, written, and the merged trace summarized as profile-summary would
Outcome run_trace_merge(const std::uint8_t* data, std::size_t size) {
  const fs::path dir = scratch() / "merge";
  fs::create_directories(dir);
  std::vector<std::string> names;
  std::vector<nlohmann::json> traces;
  return guarded(dir.string(), [&] {
    std::size_t begin = 0;
    for (int k = 0; k < 4 && begin <= size; ++k) {
      const std::uint8_t* nul = static_cast<const std::uint8_t*>(std::memchr(data + begin, 0, size - begin));
      const std::size_t end = nul && k < 3 ? static_cast<std::size_t>(nul - data) : size;
      const fs::path path = dir / ("run.trace.rank" + std::to_string(k) + ".json");
      write_file(path, data + begin, end - begin);
      names.push_back(path.string());
      std::ifstream in(path);
      try {  // as src/cli/profile_summary.cpp reads each input
        traces.push_back(nlohmann::json::parse(in));
      } catch (const nlohmann::json::exception& e) {
        throw InvalidInput("[trace-merge] " + path.string() + " is not valid JSON (" + e.what() + ")");
      }
      begin = end + 1;
    }
    const nlohmann::json merged = merge_traces(traces, names);
    const fs::path out = dir / "merged.json";
    const std::string text = merged.dump();
    write_file(out, reinterpret_cast<const std::uint8_t*>(text.data()), text.size());
    const profile::Report r = profile::summarize_file(out.string());
    if (r.source != "scalelab") throw ContractViolation("a merged trace does not read as a scalelab trace");
    (void)profile::render(r, profile::Format::kJson);
  });
}

}  // namespace

const std::vector<Target>& targets() {
  static const std::vector<Target> t = {
      {"safetensors", run_safetensors}, {"checkpoint", run_checkpoint}, {"checkpoint_index", run_checkpoint_index},
      {"config", run_config},           {"sweep_spec", run_sweep_spec}, {"token_file", run_token_file},
      {"tokenizer_json", run_tokenizer_json}, {"gguf", run_gguf}, {"chat_template", run_chat_template},
      {"jsonl", run_jsonl},             {"profile_summary", run_profile_summary}, {"trace_merge", run_trace_merge}};
  return t;
}

const Target& target(std::string_view name) {
  for (const auto& t : targets())
    if (name == t.name) return t;
  throw std::invalid_argument("fuzz: unknown target '" + std::string(name) + "'");
}

const std::string& last_rejection() { return g_last_rejection; }

}  // namespace scalelab::fuzz

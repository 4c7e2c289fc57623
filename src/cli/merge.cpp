// `scalelab merge ADAPTER --into DIR`: a LoRA adapter (PEFT format) folded into its base model,
// written as a full Hugging Face checkpoint (W + s·B·A for every adapted weight; docs/finetuning.md).
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>

#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "core/allocator.h"
#include "core/error.h"
#include "model/adapter.h"
#include "model/checkpoint.h"
#include "model/config.h"
#include "model/quantize.h"
#include "train/train_checkpoint.h"

namespace scalelab::cli {

namespace {

struct MergeFlags {
  std::string adapter, into, model, save_precision;
};

}  // namespace

Subcommand add_merge_command(CLI::App& root) {
  auto f = std::make_shared<MergeFlags>();
  auto* app = root.add_subcommand("merge", "Fold a LoRA adapter (PEFT format) into its base model: a full HF checkpoint");
  app->add_option("adapter", f->adapter, "The adapter directory (adapter_config.json + adapter_model.safetensors)")
      ->required();
  app->add_option("--into", f->into, "Directory to write the merged model to")->required();
  app->add_option("--model", f->model,
                  "The base model directory (default: adapter_config.json's base_model_name_or_path)");
  app->add_option("--save-precision", f->save_precision, "dtype of the saved weights: fp32 (default), bf16, fp16");
  return {app, [f] {
            const LoraConfig lora = read_adapter_config(f->adapter);
            std::string base = f->model;
            if (base.empty()) {
              std::ifstream in((std::filesystem::path(f->adapter) / "adapter_config.json").string());
              const nlohmann::json c = nlohmann::json::parse(in, nullptr, false);
              if (c.is_object() && c.contains("base_model_name_or_path") && c["base_model_name_or_path"].is_string())
                base = c["base_model_name_or_path"].get<std::string>();
            }
            std::error_code ec;
            if (base.empty() || !std::filesystem::is_directory(base, ec) || !has_weights(base)) {
              throw InvalidInput("[--model] the base model of " + f->adapter + " is not a model directory ('" + base +
                                 "' from adapter_config.json's base_model_name_or_path) — give --model DIR");
            }
            if (std::filesystem::exists(f->into, ec) && std::filesystem::equivalent(f->into, base, ec)) {
              throw InvalidInput("[--into] " + f->into + " is the base model's directory — merge into a new one");
            }
            const DType dtype = f->save_precision.empty() ? DType::kF32 : parse_dtype(f->save_precision, "--save-precision");
            const ModelConfig config = resolve_model(base);
            ParamLayout with;
            try {
              with = ParamLayout::build(config, "", lora);
            } catch (const InvalidInput& e) {
              throw InvalidInput("[adapter] " + f->adapter + " does not fit " + base + ": " + e.what());
            }
            const ParamLayout plain = ParamLayout::build(config);
            DeviceAllocator alloc(make_host_backend(), host_physical_memory());
            Tensor flat = Tensor::empty({with.total_numel()}, DType::kF32, alloc, "weights");
            Tensor merged = Tensor::empty({plain.total_numel()}, DType::kF32, alloc, "merged weights");
            load_weights(base, config, with, flat);
            load_adapter(f->adapter, with, flat);
            merge_adapter(with, flat, plain, merged);
            SaveOptions so;
            so.dtype = dtype;
            save_checkpoint(f->into, config, plain, merged, so);
            copy_model_side_files(base, f->into);
            // QAT + LoRA: the merged weights are what quantize converts, at the training's group size
            // (an adapter without a record leaves none: an earlier merge's goes)
            const std::filesystem::path record = std::filesystem::path(f->into) / kQatRecordFile;
            if (read_qat_group_size(f->adapter) > 0) {
              std::filesystem::copy_file(std::filesystem::path(f->adapter) / kQatRecordFile, record,
                                         std::filesystem::copy_options::overwrite_existing);
            } else {
              std::error_code ec;
              std::filesystem::remove(record, ec);
            }
            std::printf("Merged %s (r %lld, scale %.6g, %lld adapter parameters) into %s: %s\n", f->adapter.c_str(),
                        static_cast<long long>(lora.rank), lora.scale(), static_cast<long long>(with.trainable_numel()),
                        base.c_str(), f->into.c_str());
            return 0;
          }};
}

}  // namespace scalelab::cli

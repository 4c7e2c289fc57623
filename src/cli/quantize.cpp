// `scalelab quantize DIR --to int4`: a QAT-trained checkpoint (train --qat 8da4w --save DIR)
// converted to real int4 weights with their fp32 group scales, as torchao's
// Int8DynActInt4WeightQATQuantizer.convert (model/quantize.h has the layout; docs/finetuning.md).
#include <cstdio>
#include <filesystem>
#include <memory>

#include "cli/command.h"
#include "core/error.h"
#include "model/quantize.h"

namespace scalelab::cli {

namespace {

struct QuantizeFlags {
  std::string dir, out, to = "int4";
  std::int64_t group_size = 0;  // 0: the training's (DIR/qat_config.json), else torchao's 256
};

}  // namespace

Subcommand add_quantize_command(CLI::App& root) {
  auto f = std::make_shared<QuantizeFlags>();
  auto* app = root.add_subcommand(
      "quantize", "Convert a QAT-trained checkpoint (train --qat 8da4w --save DIR) to int4 weights + scales");
  app->add_option("dir", f->dir, "The trained model directory (config.json + model.safetensors)")->required();
  app->add_option("--to", f->to, "int4 (two per byte) | int8 (one int4 value per byte, torchao's convert layout)")
      ->capture_default_str();
  app->add_option("--group-size", f->group_size,
                  "Input columns per scale: the --qat-group-size the model was trained with (default: the one "
                  "recorded in DIR/qat_config.json by train --qat --save, else 256)");
  app->add_option("--out", f->out, "Directory to write (default: DIR-int4, or DIR-int8)");
  return {app, [f] {
            std::string dir = f->dir;
            while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
            const std::string out = f->out.empty() ? dir + "-" + f->to : f->out;
            const std::int64_t trained = read_qat_group_size(dir);
            if (f->group_size == 0) {
              f->group_size = trained > 0 ? trained : 256;
            } else if (trained > 0 && trained != f->group_size) {
              std::fprintf(stderr,
                           "quantize: note: %s was trained with --qat-group-size %lld (%s); converting with "
                           "--group-size %lld as asked, whose scales the training never used\n",
                           dir.c_str(), static_cast<long long>(trained), kQatRecordFile,
                           static_cast<long long>(f->group_size));
            }
            std::fprintf(stderr, "quantize: %s -> %s (%s, group size %lld)\n", dir.c_str(), out.c_str(), f->to.c_str(),
                         static_cast<long long>(f->group_size));
            const QuantizeReport r = quantize_checkpoint(dir, out, {f->to, f->group_size});
            std::printf("Quantized %lld linear modules of %s to %s (group size %lld): %.2f MiB -> %.2f MiB "
                        "(weights + scales + zeros); %lld other tensors copied; wrote %s\n",
                        static_cast<long long>(r.converted), dir.c_str(), f->to.c_str(),
                        static_cast<long long>(f->group_size), static_cast<double>(r.bytes_before) / (1 << 20),
                        static_cast<double>(r.bytes_after) / (1 << 20), static_cast<long long>(r.copied),
                        out.c_str());
            return 0;
          }};
}

}  // namespace scalelab::cli

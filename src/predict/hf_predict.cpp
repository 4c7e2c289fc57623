#include "predict/hf_predict.h"

#include <cstdio>
#include <unordered_map>

#include "core/allocator.h"
#include "core/error.h"

namespace scalelab::predict {

HfPrediction predict_hf(const HfJob& job, const HfPredictOptions& o) {
  if (o.device_memory <= o.cuda_context + o.nccl_memory)
    throw InvalidInput("[plan --stack hf-trainer] --device-memory " + format_bytes(o.device_memory) +
                       " does not exceed the CUDA context (" + format_bytes(o.cuda_context) + ") and NCCL (" +
                       format_bytes(o.nccl_memory) + ") — give the GPU's total");
  const std::vector<ScheduleEvent> ev = hf_trainer_schedule(job);
  HfPrediction p;
  p.allocator_limit = o.device_memory - o.cuda_context - o.nccl_memory;
  p.events = ev.size();
  CachingAllocator alloc(p.allocator_limit, o.allocator);
  struct Live {
    BlockId id;
    std::size_t size;
    Category c;
  };
  std::unordered_map<std::uint32_t, Live> live;
  live.reserve(4096);
  std::size_t by_cat[kNumCategories] = {};
  const char* phase = "load";
  std::int64_t step = 0;
  for (const ScheduleEvent& e : ev) {
    if (e.kind == ScheduleEvent::kPhase) {
      phase = e.label;
      if (std::string_view(phase) == "step_end") {
        p.steps.push_back({alloc.stats().peak_allocated, alloc.stats().peak_reserved, alloc.stats().num_segments,
                           alloc.stats().num_small_segments});
        ++step;
      }
      continue;
    }
    if (e.kind == ScheduleEvent::kFree) {
      auto it = live.find(e.tensor);
      if (it == live.end()) continue;
      by_cat[static_cast<int>(it->second.c)] -= it->second.size;
      alloc.free(it->second.id);
      live.erase(it);
      continue;
    }
    const std::size_t before = alloc.stats().peak_allocated;
    MallocResult r = alloc.malloc(e.bytes);
    if (r.oom) {
      p.oom = true;
      p.oom_at = std::string(phase) + " of step " + std::to_string(step + 1) + ": " + e.label;
      p.oom_request = e.bytes;
      break;
    }
    if (r.id == kNullBlock) continue;
    live[e.tensor] = {r.id, r.block_size, e.category};
    by_cat[static_cast<int>(e.category)] += r.block_size;
    if (alloc.stats().peak_allocated > before) {
      for (int c = 0; c < kNumCategories; ++c) p.breakdown[c] = by_cat[c];
      p.peak_phase = phase;
      p.peak_step = step + 1;
      p.reserved_at_peak = alloc.stats().reserved;
    }
  }
  p.stats = alloc.stats();
  p.max_allocated = p.stats.peak_allocated;
  p.max_reserved = p.stats.peak_reserved;
  return p;
}

std::int64_t largest_micro_batch(HfJob job, const HfPredictOptions& o, std::int64_t limit) {
  auto fits = [&](std::int64_t b) {
    job.micro_batch = b;
    try {
      return !predict_hf(job, o).oom;
    } catch (const InvalidInput&) {
      return false;  // beyond the representable sizes: does not fit
    }
  };
  if (!fits(1)) return 0;
  std::int64_t lo = 1, hi = 2;
  while (hi <= limit && fits(hi)) {
    lo = hi;
    hi *= 2;
  }
  if (hi > limit) hi = limit + 1;
  while (hi - lo > 1) {
    const std::int64_t mid = lo + (hi - lo) / 2;
    (fits(mid) ? lo : hi) = mid;
  }
  return lo;
}

std::string schedule_text(const std::vector<ScheduleEvent>& ev) {
  std::string out;
  std::unordered_map<std::uint32_t, std::size_t> index;
  std::size_t n = 0;
  for (const ScheduleEvent& e : ev) {
    if (e.kind == ScheduleEvent::kPhase) {
      out += "# ";
      out += e.label;
      out += '\n';
    } else if (e.kind == ScheduleEvent::kAlloc) {
      index[e.tensor] = n++;
      out += "a " + std::to_string(e.bytes) + " " + category_name(e.category) + " " + e.label + "\n";
    } else {
      auto it = index.find(e.tensor);
      if (it != index.end()) out += "f " + std::to_string(it->second) + "\n";
    }
  }
  return out;
}

namespace {
double gib(std::size_t b) { return static_cast<double>(b) / static_cast<double>(std::size_t{1} << 30); }
}  // namespace

nlohmann::json prediction_json(const HfJob& job, const HfPredictOptions& o, const HfPrediction& p,
                               std::int64_t largest) {
  nlohmann::json j;
  j["stack"] = "hf-trainer";
  j["versions"] = {{"torch", job.versions.torch}, {"transformers", job.versions.transformers}};
  j["status"] = p.oom ? "oom" : "ok";
  j["config"] = {{"model", job.model.name},
                 {"seq_len", job.seq_len},
                 {"micro_batch_size", job.micro_batch},
                 {"model_precision", job.model_precision},
                 {"mixed_precision", job.mixed_precision},
                 {"attn", job.attn},
                 {"optimizer", job.optimizer},
                 {"grad_accum_steps", job.grad_accum_steps},
                 {"steps", job.steps}};
  j["max_reserved_bytes"] = p.max_reserved;
  j["max_allocated_bytes"] = p.max_allocated;
  j["device_memory_bytes"] = o.device_memory;
  j["cuda_context_bytes"] = o.cuda_context;
  j["nccl_memory_bytes"] = o.nccl_memory;
  j["ranks"] = job.ranks;
  j["launcher"] = job.ddp() ? "torchrun" : "python";
  j["ddp"] = job.ddp();
  j["allocator_limit_bytes"] = p.allocator_limit;
  j["largest_micro_batch"] = largest;
  j["largest_micro_batch_capped"] = largest >= kMicroBatchSearchCap;  // the search stopped there
  j["fits"] = !p.oom;
  if (p.oom) {
    j["oom_at"] = p.oom_at;
    j["oom_request_bytes"] = p.oom_request;
  }
  nlohmann::json b = nlohmann::json::object();
  for (int c = 0; c < kNumCategories; ++c) b[category_name(static_cast<Category>(c))] = p.breakdown[c];
  b["allocator_cached_and_rounding"] = p.max_reserved - std::min(p.max_reserved, p.max_allocated);
  j["breakdown_at_peak_allocated"] = b;
  j["peak_phase"] = p.peak_phase;
  j["peak_step"] = p.peak_step;
  nlohmann::json steps = nlohmann::json::array();
  for (const auto& s : p.steps)
    steps.push_back({{"max_allocated_bytes", s.max_allocated}, {"max_reserved_bytes", s.max_reserved},
                     {"segments", s.segments}, {"large_segments", s.segments - s.small_segments}});
  j["per_step"] = steps;
  j["segments"] = p.stats.num_segments;
  j["large_segments"] = p.stats.num_segments - p.stats.num_small_segments;
  j["device_mallocs"] = p.stats.num_device_mallocs;
  j["alloc_retries"] = p.stats.num_alloc_retries;
  j["schedule_events"] = p.events;
  return j;
}

std::string prediction_table(const HfJob& job, const HfPredictOptions& o, const HfPrediction& p,
                             std::int64_t largest) {
  std::string s;
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "HF Trainer memory prediction (torch %s, transformers %s): %s, seq-len %lld, micro-batch %lld, "
                "%s weights, mixed precision %s, attn %s%s%s, %s\n",
                job.versions.torch.c_str(), job.versions.transformers.c_str(), job.model.name.c_str(),
                static_cast<long long>(job.seq_len), static_cast<long long>(job.micro_batch),
                job.model_precision.c_str(), job.mixed_precision.c_str(), job.attn.c_str(),
                job.fused_kernels ? ", Liger kernels" : "",
                job.activation_checkpointing ? ", gradient checkpointing" : "", job.optimizer.c_str());
  s += buf;
  // which releases an H200 measured (bench/README.md, "Older transformers releases"; the traces in
  // tests/golden/predict/*.tf4.45.events and *.tf4.55.events)
  const bool measured = job.versions.transformers == "4.45" || job.versions.transformers == "4.55";
  const std::string gpu = measured ? ", and measured to the byte on an H200 under " + job.versions.transformers +
                                         (job.versions.transformers == "4.45" ? ".2 with torch 2.11 (Llama fp32 eager by python and torchrun; OPT fp32 and bf16 autocast)"
                                                                              : ".4 with torch 2.11 (Llama fp32 eager and bf16 sdpa; OPT fp32 eager)")
                                   : std::string(", not measured on a GPU");
  if (is_older_transformers(job.versions.transformers)) {
    s += "  transformers " + job.versions.transformers +
         ": its schedule is checked against CPU traces of transformers 4.43.4 to 4.48.3" +
         (records_full_slices(job.versions.torch) ? std::string(" under torch 2.4.0 to 2.8.0") : std::string()) + gpu +
         " (docs/predict.md)\n";
  }
  if (is_late4_transformers(job.versions.transformers)) {
    const bool d56 = late4_minor(job.versions.transformers) >= 56;
    s += "  transformers " + job.versions.transformers +
         ": 5.17's schedule with its training DynamicCache (and, to 4.52, Llama's and Qwen2's [T, T+1] mask; OPT: docs/predict.md), checked against CPU "
         "traces of 4.49.0 to 4.55.4, 4.56.2 and 4.57.6" + (d56 ? std::string(" (4.56 and 4.57: the cache holds torch.cat copies of the key and value)") : std::string()) + gpu + " (docs/predict.md)\n";
  }
  if (is_current_transformers(job.versions.transformers) && job.versions.transformers != kSupportedTransformers) {
    s += "  transformers " + job.versions.transformers + ": 5.17's schedule (its CPU traces equal 5.17's); the GPU "
         "measurements are 5.17's (docs/predict.md)\n";
  }
  if (!is_older_transformers(job.versions.transformers) && job.versions.torch != kSupportedTorch) {
    s += "  torch " + job.versions.torch +
         (records_full_slices(job.versions.torch)
              ? ": its full-slice backward copies are checked against CPU traces of torch 2.8.0, not measured on a GPU"
              : ": its CPU traces equal torch 2.11's; the GPU measurements are 2.11's") +
         " (docs/predict.md)\n";
  }
  if (job.ranks > 1) {
    std::snprintf(buf, sizeof buf, "  per rank of %lld (torchrun DDP: gradient buckets, gradient_as_bucket_view False)\n",
                  static_cast<long long>(job.ranks));
    s += buf;
  } else if (job.ddp()) {
    s += "  torchrun with one process: accelerate wraps the model in DDP all the same (gradient buckets, "
         "gradient_as_bucket_view False)\n";
  }
  if (p.oom) {
    std::snprintf(buf, sizeof buf, "OUT OF MEMORY at %s (a %s request; the allocator may hold %s)\n", p.oom_at.c_str(),
                  format_bytes(p.oom_request).c_str(), format_bytes(p.allocator_limit).c_str());
    s += buf;
  }
  std::snprintf(buf, sizeof buf, "  max_memory_reserved   %16zu B  %8.2f GiB  %8.2f GB%s\n", p.max_reserved,
                gib(p.max_reserved), static_cast<double>(p.max_reserved) / 1e9, p.oom ? " (until the OOM)" : "");
  s += buf;
  std::snprintf(buf, sizeof buf, "  max_memory_allocated  %16zu B  %8.2f GiB  %8.2f GB\n", p.max_allocated,
                gib(p.max_allocated), static_cast<double>(p.max_allocated) / 1e9);
  s += buf;
  if (job.ddp()) {
    std::snprintf(buf, sizeof buf, "  device %s less CUDA context %s less NCCL %s%s = %s for the allocator\n",
                  format_bytes(o.device_memory).c_str(), format_bytes(o.cuda_context).c_str(),
                  format_bytes(o.nccl_memory).c_str(), o.nccl_memory == 0 ? " (not given: --nccl-memory)" : "",
                  format_bytes(p.allocator_limit).c_str());
  } else {
    std::snprintf(buf, sizeof buf, "  device %s less CUDA context %s = %s for the allocator\n",
                  format_bytes(o.device_memory).c_str(), format_bytes(o.cuda_context).c_str(),
                  format_bytes(p.allocator_limit).c_str());
  }
  s += buf;
  std::snprintf(buf, sizeof buf, "Breakdown at the allocated peak (step %lld, %s):\n",
                static_cast<long long>(p.peak_step), p.peak_phase.c_str());
  s += buf;
  for (int c = 0; c < kNumCategories; ++c) {
    if (p.breakdown[c] == 0) continue;
    std::snprintf(buf, sizeof buf, "  %-24s %10.3f GiB\n", category_name(static_cast<Category>(c)), gib(p.breakdown[c]));
    s += buf;
  }
  std::snprintf(buf, sizeof buf,
                "  %-24s %10.3f GiB  (reserved - allocated at the peaks; %zu segments: %zu small pool, %zu large pool)\n",
                "allocator cache/rounding", gib(p.max_reserved - std::min(p.max_reserved, p.max_allocated)),
                p.stats.num_segments, p.stats.num_small_segments, p.stats.num_segments - p.stats.num_small_segments);
  s += buf;
  for (std::size_t i = 0; i < p.steps.size(); ++i) {
    std::snprintf(buf, sizeof buf,
                  "  after step %zu: max reserved %.2f GiB, max allocated %.2f GiB, segments %zu small + %zu large\n",
                  i + 1, gib(p.steps[i].max_reserved), gib(p.steps[i].max_allocated), p.steps[i].small_segments,
                  p.steps[i].segments - p.steps[i].small_segments);
    s += buf;
  }
  std::snprintf(buf, sizeof buf, "Largest micro-batch that fits in %s: %s%lld%s\n", format_bytes(o.device_memory).c_str(),
                largest >= kMicroBatchSearchCap ? "at least " : "", static_cast<long long>(largest),
                largest >= kMicroBatchSearchCap ? " (the search stops there)" : "");
  s += buf;
  return s;
}

}  // namespace scalelab::predict

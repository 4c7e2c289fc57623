// What torchrun DDP adds to one rank's Trainer schedule (torch 2.11's DistributedDataParallel as
// accelerate 1.13 builds it for the Trainer: bucket_cap_mb 25 with a first bucket of 1 MiB
// (dist._DEFAULT_FIRST_BUCKET_BYTES) unless --ddp-bucket-cap-mb is given, gradient_as_bucket_view
// False (accelerate's default; the Trainer does not set it), broadcast_buffers True,
// find_unused_parameters = not gradient_checkpointing (the Trainer's choice)). Written after
// torch/nn/parallel/distributed.py and c10d's reducer.cpp / comm.cpp, and checked against a
// 2-process gloo run of the real Trainer traced on rank 0 (tools/predict/trace_hf.py, *-ddp2
// goldens, tests/predict/ddp_trace_test.cpp).
//
// Per rank on the device:
// - construction: _sync_module_states broadcasts parameters and buffers from rank 0 through
//   _broadcast_coalesced: flat copies of 250 MiB buckets (per dtype), at most two in flight; then
//   the Reducer allocates one flat gradient buffer per bucket (parameters in module order, a bucket
//   closes when it reaches its cap: 1 MiB for the first, then the cap; the list reversed, so the
//   last layers' bucket is allocated first); with find_unused_parameters, the used-parameter map
//   (int32 per parameter). With checkpointing (find_unused_parameters False) the first iteration
//   has a single bucket of every parameter, rebuilt before step 2's forward in the order the
//   gradients became ready (the old buffer freed first).
// - gradient accumulation: the Trainer runs all micro-steps but a step's last under no_sync. Those
//   backwards reduce nothing and record no gradient order, so the rebuild (checkpointing) waits for
//   the first synchronized backward, and the buffers are broadcast only before a forward that
//   follows a synchronized one (the first micro-step's).
// - every forward: the buffers (the rotary inv_freq tables) broadcast flat; with
//   find_unused_parameters, _DDPSink clones the outputs (the loss and the logits: a second
//   logits-sized tensor for a moment) and the originals go.
// - backward: each gradient is copied into its bucket (no allocation: gradient_as_bucket_view
//   False keeps .grad and the bucket apart, so the gradients are held twice); after the
//   all-reduce the buckets are copied back into .grad. The buckets live as long as the model.
// NCCL's own buffers are outside the caching allocator (hf_predict.h: nccl_memory).
#include <algorithm>
#include <cstdint>
#include <limits>
#include <string_view>
#include <vector>

#include "predict/schedule_internal.h"

namespace scalelab::predict::detail {

namespace {

constexpr u64 kBroadcastBucket = u64{250} << 20;  // DistributedDataParallel.broadcast_bucket_size
constexpr u64 kFirstBucket = u64{1} << 20;        // dist._DEFAULT_FIRST_BUCKET_BYTES

struct Bucket {
  u64 bytes = 0;
  u64 tensors = 0;
};

// c10d compute_bucket_assignment_by_size for tensors of one dtype, in the given order: a bucket
// takes tensors until its size reaches its limit (the limits list is walked, its last repeating).
std::vector<Bucket> buckets_of(const std::vector<u64>& sizes, const std::vector<u64>& limits) {
  std::vector<Bucket> out;
  Bucket cur;
  std::size_t li = 0;
  for (u64 s : sizes) {
    cur.bytes += s;
    ++cur.tensors;
    if (cur.bytes >= limits[li]) {
      out.push_back(cur);
      cur = {};
      if (li + 1 < limits.size()) ++li;
    }
  }
  if (cur.tensors > 0) out.push_back(cur);
  return out;
}

std::vector<u64> bucket_sizes(const std::vector<u64>& sizes, const std::vector<u64>& limits) {
  std::vector<u64> out;
  for (const Bucket& b : buckets_of(sizes, limits)) out.push_back(b.bytes);
  return out;
}

}  // namespace

void ddp_construct(Tape& t, Model& m, const Dims& d) {
  // _verify_param_shape_across_processes: every parameter's sizes and strides (int64) copied to
  // the device and broadcast from rank 0 for comparison.
  u64 meta = 0;
  for (Param* p : m.order) {
    const std::string_view name = p->name;
    const bool vec = name.find("norm") != std::string_view::npos || name.find("bias") != std::string_view::npos;
    meta += (vec ? 2 : 4) * 8;
  }
  Id meta_dev = t.alloc(meta, Category::kDdp, "DDP parameter shapes (verify across ranks)");
  t.free(meta_dev);
  // _sync_module_states: parameters (module order) then buffers; grouped by dtype, each group cut
  // in 250 MiB buckets; buckets ordered by their first tensor (the parameters' first). With
  // fp32 parameters the fp32 rotary buffers join the parameters' last bucket.
  std::vector<u64> params;
  for (Param* p : m.order) params.push_back(p->bytes);
  std::vector<u64> buffers(m.buffer_count, m.buffer_count ? m.buffer_bytes / m.buffer_count : 0);
  std::vector<Bucket> flats;
  if (d.e_w == 4) {
    std::vector<u64> all = params;
    all.insert(all.end(), buffers.begin(), buffers.end());
    flats = buckets_of(all, {kBroadcastBucket});
  } else {
    flats = buckets_of(params, {kBroadcastBucket});
    if (!buffers.empty()) flats.push_back(Bucket{m.buffer_bytes, m.buffer_count});
  }
  // comm.cpp broadcast_coalesced: at most two buckets in flight; the oldest is finished (copied
  // back, its flat freed) before the next is made. A bucket of one tensor is broadcast in place:
  // flatten_dense_tensors of a single tensor is a view (a 300 MiB tensor, or one 16-float buffer,
  // allocates nothing under torch 2.4 and 2.11 alike: dist._broadcast_coalesced profiled on the
  // CPU), so Llama-3.2-1B's 1 GB embedding has no flat copy.
  std::vector<Id> in_flight;
  for (const Bucket& b : flats) {
    if (in_flight.size() >= 2) {
      t.free(in_flight.front());
      in_flight.erase(in_flight.begin());
    }
    in_flight.push_back(b.tensors > 1 ? t.alloc(b.bytes, Category::kDdp, "DDP broadcast of module states (flat bucket)")
                                      : 0);
  }
  for (Id& id : in_flight) t.free(id);
  // The Reducer's buckets.
  std::vector<u64> limits = {d.ddp_bucket_cap};
  if (!d.ddp_find_unused) {
    limits = {std::numeric_limits<u64>::max()};  // the first iteration: one bucket
  } else if (d.ddp_first_bucket) {
    limits = {kFirstBucket, d.ddp_bucket_cap};
  }
  std::vector<u64> buckets = bucket_sizes(params, limits);
  std::reverse(buckets.begin(), buckets.end());
  for (u64 b : buckets) m.ddp_buckets.push_back(t.alloc(b, Category::kDdp, "DDP gradient bucket"));
  if (d.ddp_find_unused)
    m.ddp_used_map = t.alloc(m.order.size() * 4, Category::kDdp, "DDP local_used_map (device)");
}

void ddp_pre_forward(Tape& t, Model& m, const Dims& d) {
  if (m.ddp_rebuild) {
    // Reducer::rebuild_buckets (find_unused_parameters False, after the first iteration): the
    // parameters in the order their gradients became ready, caps 1 MiB then the cap, not sorted.
    m.ddp_rebuild = false;
    std::vector<Param*> ready = m.order;
    std::stable_sort(ready.begin(), ready.end(), [](const Param* a, const Param* b) { return a->ready < b->ready; });
    std::vector<u64> sizes;
    for (Param* p : ready) sizes.push_back(p->bytes);
    for (Id& b : m.ddp_buckets) t.free(b);
    m.ddp_buckets.clear();
    std::vector<u64> limits = {d.ddp_bucket_cap};
    if (d.ddp_first_bucket) limits = {kFirstBucket, d.ddp_bucket_cap};
    for (u64 b : bucket_sizes(sizes, limits)) m.ddp_buckets.push_back(t.alloc(b, Category::kDdp, "DDP gradient bucket"));
  }
  // broadcast_buffers: _sync_buffers before a forward when the previous forward synchronized
  // (will_sync_module_buffers: require_forward_param_sync, which _post_forward sets to
  // require_backward_grad_sync); every forward without gradient accumulation
  if (m.buffer_count > 1 && m.ddp_forward_param_sync) {  // one buffer is broadcast in place
    Id flat = t.alloc(m.buffer_bytes, Category::kDdp, "DDP broadcast of buffers (flat)");
    t.free(flat);
  }
  m.ddp_forward_param_sync = m.ddp_sync;
}

}  // namespace scalelab::predict::detail

#pragma once
// The device a training run uses, set up in one place: which device (--device), its allocator
// (capacity --device-memory or the device's memory), the line that names it, and the host staging
// that moves data the host produces (initial weights, checkpoints, batches) onto it.
//
// On the CPU the device is the host: nothing is staged and no copy is made, so a CPU run allocates
// exactly what it did before devices existed (the memory plan's tests rely on it).
#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "core/allocator.h"
#include "core/tensor.h"
#include "model/model.h"

namespace scalelab {

struct TrainDevice {
  DeviceType type = DeviceType::kCPU;
  std::string name;         // "cpu", "cuda": the telemetry engine source and the run record
  std::string description;  // device_runtime(type).describe(), for the start line
  // The engine source's device in telemetry: "cpu", or "cuda:0" so that the allocator's series
  // line up with NVML's and nvidia-smi's for the same GPU (one process trains on CUDA ordinal 0;
  // data-parallel runs are CPU-only for now).
  std::string telemetry_name;
  std::size_t capacity = 0;
  std::unique_ptr<DeviceAllocator> alloc;  // every byte of the run's device memory
  // Host memory for staging (null on the CPU, where the device allocator is the host's).
  std::unique_ptr<DeviceAllocator> host;
  bool staged() const { return host != nullptr; }
  // Waits for the work queued on the device (the step timer's end); nothing to wait for on the CPU.
  void synchronize() const;
};

// Checks --device for `scalelab train`: cpu or cuda (throws InvalidInput, exit 2, for meta — the
// memory plan's device — and for unknown names). Availability is not checked here.
DeviceType parse_train_device(const std::string& device);

// Resolves --device and --device-memory (empty: the device's total memory) and builds the run's
// allocator. Throws RuntimeError (exit 1) naming the reason when the device is not available
// (a build without CUDA, no driver, no GPU).
TrainDevice make_train_device(const std::string& device, const std::string& device_memory);

// Runs `fill` (code that writes host memory: init_params, load_weights) on `dst` directly when it
// is on the host, else on a host tensor of the same shape and dtype that is then copied to `dst`.
void fill_through_host(const Tensor& dst, TrainDevice& dev, const std::function<void(const Tensor&)>& fill);

// `t` itself when it is on the host, else a host copy of it (for code that reads host memory:
// save_checkpoint).
Tensor host_view_of(const Tensor& t, TrainDevice& dev);

// The batch the model reads (on the device) and the one the data source writes (on the host; the
// same one when the device is the host). upload() copies the host batch to the device after each
// DataSource::next.
struct StagedBatch {
  Batch device;
  Batch host;
  bool staged = false;
  void upload();
};
StagedBatch make_staged_batch(std::int64_t micro_batch, std::int64_t seq_len, TrainDevice& dev);

}  // namespace scalelab

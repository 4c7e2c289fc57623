#include "train/device_setup.h"

#include "core/device.h"
#include "core/error.h"
#include "telemetry/cuda_visible.h"
#include "train/data.h"

namespace scalelab {

DeviceType parse_train_device(const std::string& device) {
  const DeviceType d = parse_device_type(device, "--device");
  if (d == DeviceType::kMeta) {
    throw InvalidInput(
        "[--device] meta holds no data, so it cannot train: it is the device of the memory plan "
        "(`scalelab plan`) — use --device cpu or --device cuda");
  }
  return d;
}

TrainDevice make_train_device(const std::string& device, const std::string& device_memory) {
  TrainDevice dev;
  dev.type = parse_train_device(device);
  dev.name = device_type_name(dev.type);
  dev.telemetry_name = dev.type == DeviceType::kCUDA ? cuda_device_name(0) : dev.name;
  std::string why;
  if (!device_available(dev.type, &why)) {
    // The user can fix this (another --device, a GPU node, a driver): exit 2, as the CUDA issue asks.
    throw InvalidInput("[--device] " + dev.name + " is not available: " + why);
  }
  DeviceRuntime& rt = device_runtime(dev.type);
  dev.description = rt.describe();
  dev.capacity = device_memory.empty() ? rt.total_memory() : parse_bytes(device_memory, "--device-memory");
  dev.alloc = std::make_unique<DeviceAllocator>(rt.make_memory_backend(), dev.capacity);
  if (dev.type != DeviceType::kCPU) {
    dev.host = std::make_unique<DeviceAllocator>(make_host_backend(), host_physical_memory());
  }
  return dev;
}

void TrainDevice::synchronize() const {
  if (type != DeviceType::kCPU) device_runtime(type).synchronize();
}

void fill_through_host(const Tensor& dst, TrainDevice& dev, const std::function<void(const Tensor&)>& fill) {
  if (dst.device() == DeviceType::kCPU) {
    fill(dst);
    return;
  }
  SCALELAB_CHECK(dev.host != nullptr, "[train] no host staging allocator for a device tensor (a bug)");
  Tensor staging = Tensor::empty(dst.shape(), dst.dtype(), *dev.host, "host staging");
  fill(staging);
  Tensor target = dst;
  target.copy_from(staging);
}

Tensor host_view_of(const Tensor& t, TrainDevice& dev) {
  if (t.device() == DeviceType::kCPU) return t;
  SCALELAB_CHECK(dev.host != nullptr, "[train] no host staging allocator for a device tensor (a bug)");
  return t.to(*dev.host, "host copy");
}

void StagedBatch::upload() {
  if (!staged) return;
  device.inputs.copy_from(host.inputs);
  device.targets.copy_from(host.targets);
}

StagedBatch make_staged_batch(std::int64_t micro_batch, std::int64_t seq_len, TrainDevice& dev) {
  StagedBatch b;
  b.device = make_batch(micro_batch, seq_len, *dev.alloc);
  if (dev.staged()) {
    b.host = make_batch(micro_batch, seq_len, *dev.host);
    b.staged = true;
  } else {
    b.host = b.device;
  }
  return b;
}

}  // namespace scalelab

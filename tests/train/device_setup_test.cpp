// The trainer's device setup: which devices train accepts, the allocator's capacity, and the host
// staging of what the host writes (weights, batches) — exercised on the CPU (no staging) and on
// the meta device (staging through a host tensor, nothing stored on the device side).
#include <gtest/gtest.h>

#include <cstdint>

#include "core/error.h"
#include "train/data.h"
#include "train/device_setup.h"
#include "train/trainer.h"

namespace scalelab {
namespace {

TEST(TrainDevice, AcceptsCpuAndCudaRefusesMetaAndUnknown) {
  EXPECT_EQ(parse_train_device("cpu"), DeviceType::kCPU);
  EXPECT_EQ(parse_train_device("cuda"), DeviceType::kCUDA);
  try {
    parse_train_device("meta");
    FAIL() << "meta accepted";
  } catch (const InvalidInput& e) {
    EXPECT_NE(std::string(e.what()).find("plan"), std::string::npos) << e.what();
  }
  EXPECT_THROW(parse_train_device("tpu"), InvalidInput);
}

TEST(TrainDevice, CpuUsesTheHostWithoutStagingAndTheGivenCapacity) {
  TrainDevice dev = make_train_device("cpu", "3GiB");
  EXPECT_EQ(dev.type, DeviceType::kCPU);
  EXPECT_EQ(dev.name, "cpu");
  EXPECT_EQ(dev.telemetry_name, "cpu");
  EXPECT_FALSE(dev.description.empty());
  EXPECT_EQ(dev.capacity, std::size_t{3} << 30);
  EXPECT_EQ(dev.alloc->capacity(), std::size_t{3} << 30);
  EXPECT_FALSE(dev.staged());
  // Default capacity: the device's memory (the host's, on the CPU).
  EXPECT_EQ(make_train_device("cpu", "").capacity, device_runtime(DeviceType::kCPU).total_memory());

  // No staging: the fill writes the tensor itself; the batch the data source fills is the model's.
  Tensor t = Tensor::empty({4}, DType::kF32, *dev.alloc);
  fill_through_host(t, dev, [&](const Tensor& h) {
    EXPECT_EQ(h.raw(), t.raw());
    for (int i = 0; i < 4; ++i) h.f32()[i] = static_cast<float>(i + 1);
  });
  EXPECT_EQ(t.f32()[3], 4.0f);
  EXPECT_EQ(host_view_of(t, dev).raw(), t.raw());
  StagedBatch b = make_staged_batch(2, 3, dev);
  EXPECT_FALSE(b.staged);
  EXPECT_EQ(b.host.inputs.raw(), b.device.inputs.raw());
  b.upload();  // nothing to do
}

TEST(TrainDevice, CudaWithoutAGpuIsInvalidInputNamingWhy) {
  std::string why;
  if (device_available(DeviceType::kCUDA, &why)) GTEST_SKIP() << "a CUDA device is present";
  try {
    make_train_device("cuda", "");
    FAIL() << "cuda accepted without a device";
  } catch (const InvalidInput& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("cuda"), std::string::npos) << msg;
    EXPECT_NE(msg.find(why), std::string::npos) << msg;
  }
}

// A device that is not the host: the staging path. Meta stores nothing, so this checks the
// plumbing (a host tensor of the same shape and dtype is filled, the device side gets a copy
// without error), not values.
TEST(TrainDevice, StagesThroughHostMemoryForAnotherDevice) {
  TrainDevice dev;
  dev.type = DeviceType::kMeta;
  dev.name = "meta";
  dev.alloc = std::make_unique<DeviceAllocator>(make_meta_backend(), std::size_t{1} << 40);
  dev.host = std::make_unique<DeviceAllocator>(make_host_backend(), std::size_t{1} << 30);
  Tensor p = Tensor::empty({10}, DType::kBF16, *dev.alloc);
  bool called = false;
  fill_through_host(p, dev, [&](const Tensor& h) {
    called = true;
    EXPECT_EQ(h.device(), DeviceType::kCPU);
    EXPECT_EQ(h.dtype(), DType::kBF16);
    EXPECT_EQ(h.numel(), 10);
  });
  EXPECT_TRUE(called);
  EXPECT_EQ(dev.host->stats().allocated, 0u);  // the staging buffer is freed again

  StagedBatch b = make_staged_batch(2, 5, dev);
  EXPECT_TRUE(b.staged);
  EXPECT_EQ(b.host.inputs.device(), DeviceType::kCPU);
  EXPECT_EQ(b.device.inputs.device(), DeviceType::kMeta);
  EXPECT_EQ(b.device.batch, 2);
  EXPECT_EQ(b.device.seq, 5);
  auto data = make_data_source({"synthetic", 5, 2, 100, 7, 0, 1});
  data->next(b.host);
  b.upload();
}

TEST(TrainDevice, RunTrainingRefusesMetaAndAnAbsentCuda) {
  TrainOptions o;
  o.model = "llama-tiny";
  o.seq_len = 8;
  o.micro_batch_size = 1;
  o.max_steps = 1;
  o.quiet = true;
  o.device = "meta";
  EXPECT_THROW(run_training(o), InvalidInput);
  if (!device_available(DeviceType::kCUDA)) {
    o.device = "cuda";
    EXPECT_THROW(run_training(o), InvalidInput);  // exit 2: the user can fix it
  }
}

TEST(TrainDevice, AllowTf32IsRecordedInTheConfig) {
  TrainOptions o;
  EXPECT_EQ(o.to_json()["allow_tf32"], false);
  o.allow_tf32 = true;
  EXPECT_EQ(o.to_json()["allow_tf32"], true);
}

}  // namespace
}  // namespace scalelab

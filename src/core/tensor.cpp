#include "core/tensor.h"

#include <cstring>
#include <vector>

#include "core/device.h"
#include "core/error.h"

namespace scalelab {

Shape::Shape(std::initializer_list<std::int64_t> dims) {
  SCALELAB_CHECK(dims.size() <= kMaxDims, "[tensor] rank above 5 is not supported");
  for (auto v : dims) d_[static_cast<std::size_t>(rank_++)] = v;
}

std::int64_t Shape::numel() const {
  std::int64_t n = 1;
  for (int i = 0; i < rank_; ++i) n *= d_[static_cast<std::size_t>(i)];
  return n;
}

bool Shape::operator==(const Shape& o) const {
  if (rank_ != o.rank_) return false;
  for (int i = 0; i < rank_; ++i)
    if (d_[static_cast<std::size_t>(i)] != o.d_[static_cast<std::size_t>(i)]) return false;
  return true;
}

std::string Shape::str() const {
  std::string s = "[";
  for (int i = 0; i < rank_; ++i) {
    if (i) s += ", ";
    s += std::to_string(d_[static_cast<std::size_t>(i)]);
  }
  return s + "]";
}

Storage::Storage(DeviceAllocator* alloc, std::size_t bytes, const char* what)
    : alloc_(alloc), ptr_(alloc->allocate(bytes, what)), bytes_(bytes), device_(alloc->device()) {}

Storage::Storage(void* external, std::size_t bytes, DeviceType device)
    : alloc_(nullptr), ptr_(external), bytes_(bytes), device_(device) {}

Storage::~Storage() {
  if (alloc_ != nullptr) alloc_->deallocate(ptr_);
}

Tensor Tensor::empty(const Shape& shape, DType dtype, DeviceAllocator& alloc, const char* what) {
  for (int i = 0; i < shape.rank(); ++i) {
    SCALELAB_CHECK(shape[i] >= 0, "[tensor] negative dimension in shape " + shape.str());
  }
  Tensor t;
  t.shape_ = shape;
  t.dtype_ = dtype;
  t.storage_ = std::make_shared<Storage>(&alloc, t.nbytes(), what);
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, DeviceAllocator& alloc, const char* what) {
  Tensor t = empty(shape, dtype, alloc, what);
  t.zero_();
  return t;
}

Tensor Tensor::from_external(void* data, const Shape& shape, DType dtype, DeviceType device) {
  Tensor t;
  t.shape_ = shape;
  t.dtype_ = dtype;
  t.storage_ = std::make_shared<Storage>(data, t.nbytes(), device);
  return t;
}

float* Tensor::f32() const {
  SCALELAB_CHECK(dtype_ == DType::kF32, "[tensor] expected an fp32 tensor, got " + std::string(dtype_name(dtype_)));
  return data<float>();
}

Tensor Tensor::view(const Shape& shape) const {
  SCALELAB_CHECK(shape.numel() == numel(),
                 "[tensor] view " + shape.str() + " does not match " + shape_.str() + " elements");
  Tensor t = *this;
  t.shape_ = shape;
  return t;
}

Tensor Tensor::slice(std::int64_t begin, std::int64_t end) const {
  SCALELAB_CHECK(rank() >= 1 && begin >= 0 && begin <= end && end <= shape_[0],
                 "[tensor] slice [" + std::to_string(begin) + ", " + std::to_string(end) + ") of " + shape_.str());
  Tensor t = *this;
  const std::int64_t row = shape_[0] == 0 ? 0 : numel() / shape_[0];
  t.offset_ = offset_ + static_cast<std::size_t>(begin * row) * dtype_size(dtype_);
  Shape s = shape_;
  // Rebuild the shape with dim 0 replaced.
  switch (rank()) {
    case 1: t.shape_ = Shape{end - begin}; break;
    case 2: t.shape_ = Shape{end - begin, s[1]}; break;
    case 3: t.shape_ = Shape{end - begin, s[1], s[2]}; break;
    case 4: t.shape_ = Shape{end - begin, s[1], s[2], s[3]}; break;
    default: t.shape_ = Shape{end - begin, s[1], s[2], s[3], s[4]}; break;
  }
  return t;
}

void Tensor::zero_() { device_runtime(device()).fill_zero(raw(), nbytes()); }

void Tensor::copy_from(const Tensor& src) {
  SCALELAB_CHECK(src.numel() == numel(), "[tensor] copy_from " + src.shape().str() + " into " + shape_.str());
  const std::size_t n = static_cast<std::size_t>(numel());
  const DeviceType dd = device(), sd = src.device();
  if (dd == sd) {
    device_runtime(dd).convert(src.raw(), src.dtype(), raw(), dtype_, n);
    return;
  }
  if (dd == DeviceType::kMeta) return;  // nothing is stored on meta
  if (sd == DeviceType::kMeta) {
    throw RuntimeError("[tensor] copy_from a meta tensor: it holds no data — this is a bug in the caller");
  }
  // Between the host and a device: move the bytes in the source dtype, convert on the side that
  // has a converter (the host when the destination is the host, the device otherwise).
  if (dd == DeviceType::kCPU) {
    if (src.dtype() == dtype_) {
      device_runtime(sd).copy_to_host(raw(), src.raw(), nbytes());
    } else {
      std::vector<char> stage(src.nbytes());
      device_runtime(sd).copy_to_host(stage.data(), src.raw(), src.nbytes());
      convert(stage.data(), src.dtype(), raw(), dtype_, n);
    }
    return;
  }
  if (sd == DeviceType::kCPU) {
    if (src.dtype() == dtype_) {
      device_runtime(dd).copy_from_host(raw(), src.raw(), nbytes());
    } else {
      std::vector<char> stage(nbytes());
      convert(src.raw(), src.dtype(), stage.data(), dtype_, n);
      device_runtime(dd).copy_from_host(raw(), stage.data(), nbytes());
    }
    return;
  }
  // Two devices that are not the host (cuda <-> another cuda kind): through the host.
  std::vector<char> stage(src.nbytes());
  device_runtime(sd).copy_to_host(stage.data(), src.raw(), src.nbytes());
  Tensor host = from_external(stage.data(), src.shape(), src.dtype(), DeviceType::kCPU);
  copy_from(host);
}

void Tensor::copy_to_host(void* dst) const { device_runtime(device()).copy_to_host(dst, raw(), nbytes()); }

void Tensor::copy_from_host(const void* src) { device_runtime(device()).copy_from_host(raw(), src, nbytes()); }

Tensor Tensor::to(DeviceAllocator& alloc, const char* what) const {
  Tensor t = empty(shape_, dtype_, alloc, what);
  t.copy_from(*this);
  return t;
}

}  // namespace scalelab

#pragma once
// Tensors: a contiguous, row-major view (shape, dtype, byte offset) over a device storage.
//
// Storage is reference counted and returns its block to the allocator that made it. Views
// (view(), slice()) share storage; nothing here is strided, which keeps every kernel a loop over
// plain arrays with leading dimensions passed explicitly where a kernel reads sub-matrices.
#include <array>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>

#include "core/allocator.h"
#include "core/dtype.h"

namespace scalelab {

class Shape {
 public:
  static constexpr int kMaxDims = 5;
  Shape() = default;
  Shape(std::initializer_list<std::int64_t> dims);
  int rank() const { return rank_; }
  std::int64_t operator[](int i) const { return d_[static_cast<std::size_t>(i < 0 ? i + rank_ : i)]; }
  std::int64_t numel() const;
  bool operator==(const Shape& o) const;
  std::string str() const;  // "[2, 3, 4]"

 private:
  std::array<std::int64_t, kMaxDims> d_{};
  int rank_ = 0;
};

class Storage {
 public:
  // Owning: allocated from (and returned to) `alloc`.
  Storage(DeviceAllocator* alloc, std::size_t bytes, const char* what = nullptr);
  // Non-owning wrapper of memory that lives elsewhere (e.g. a mapped file); never freed here.
  Storage(void* external, std::size_t bytes, DeviceType device);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  void* data() const { return ptr_; }
  std::size_t bytes() const { return bytes_; }
  DeviceType device() const { return device_; }

 private:
  DeviceAllocator* alloc_;
  void* ptr_;
  std::size_t bytes_;
  DeviceType device_;
};

class Tensor {
 public:
  Tensor() = default;
  // Uninitialized tensor from `alloc`; `what` names it in an out-of-memory message.
  static Tensor empty(const Shape& shape, DType dtype, DeviceAllocator& alloc, const char* what = nullptr);
  static Tensor zeros(const Shape& shape, DType dtype, DeviceAllocator& alloc, const char* what = nullptr);
  // Wraps external memory without owning it.
  static Tensor from_external(void* data, const Shape& shape, DType dtype, DeviceType device = DeviceType::kCPU);

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  std::int64_t dim(int i) const { return shape_[i]; }
  int rank() const { return shape_.rank(); }
  DType dtype() const { return dtype_; }
  DeviceType device() const { return storage_ ? storage_->device() : DeviceType::kCPU; }
  std::int64_t numel() const { return shape_.numel(); }
  std::size_t nbytes() const { return static_cast<std::size_t>(numel()) * dtype_size(dtype_); }

  void* raw() const { return static_cast<char*>(storage_->data()) + offset_; }
  // Whether this view begins where `prev` ends, in the same storage (no pointer arithmetic, so it
  // holds for storages without host-visible data too: the meta device's).
  bool follows(const Tensor& prev) const {
    return storage_ != nullptr && storage_ == prev.storage_ && offset_ == prev.offset_ + prev.nbytes();
  }
  template <class T>
  T* data() const {
    return static_cast<T*>(raw());
  }
  // Typed float access; throws if the dtype is not fp32.
  float* f32() const;

  // Same storage, new shape with the same number of elements.
  Tensor view(const Shape& shape) const;
  // Rows [begin, end) of dimension 0, same storage.
  Tensor slice(std::int64_t begin, std::int64_t end) const;

  // Fill and copies go through the device's runtime (core/device.h): any device, any dtype.
  void zero_();
  // Copies (and converts dtype) from another tensor with the same numel, on any devices.
  void copy_from(const Tensor& src);
  // Plain byte transfers of the whole tensor to / from host memory of nbytes().
  void copy_to_host(void* dst) const;
  void copy_from_host(const void* src);
  // A copy on `alloc`'s device (same shape and dtype).
  Tensor to(DeviceAllocator& alloc, const char* what = nullptr) const;

 private:
  std::shared_ptr<Storage> storage_;
  std::size_t offset_ = 0;
  Shape shape_;
  DType dtype_ = DType::kF32;
};

}  // namespace scalelab

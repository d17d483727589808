// Float32 tensors and typed arrays whose storage lives on one device: the host, pinned host memory,
// or a CUDA device's memory. Storage is shared (copies of a Tensor alias it) and comes from an
// Allocator; moving data between devices is always an explicit call of a Backend (ops/backend.h),
// never a side effect of reading a tensor.
//
// Layout convention: 4-D activations have the logical shape (N, C, H, W); each backend stores them
// in the layout its kernels consume without reorders (ops/backend.h: channelsLast()). Parameters
// keep PyTorch's layouts on every device: conv weights (C_out, C_in, kH, kW), linear (out, in).
#pragma once
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/errors.h"

namespace accordion {

using Shape = std::vector<int64_t>;

inline int64_t numelOf(const Shape& shape) {
  return std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<int64_t>());
}

inline std::string shapeString(const Shape& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + (shape.size() == 1 ? ",)" : ")");
}

// Hands out storage on one device. Memory is released when the last owner of the returned pointer
// goes away.
class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual Device device() const = 0;
  virtual std::shared_ptr<void> allocate(size_t bytes) = 0;
};

// Pageable host memory, 64-byte aligned (what oneDNN and AVX-512 loads like best).
Allocator& hostAllocator();

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(Shape shape, Allocator& allocator = hostAllocator())
      : shape_(std::move(shape)), numel_(numelOf(shape_)), device_(allocator.device()) {
    if (numel_ > 0) storage_ = std::static_pointer_cast<float>(allocator.allocate(static_cast<size_t>(numel_) * sizeof(float)));
  }
  // A tensor over storage that already holds numelOf(shape) floats on `device`.
  static Tensor wrap(Shape shape, Device device, std::shared_ptr<void> storage) {
    Tensor t;
    t.shape_ = std::move(shape);
    t.numel_ = numelOf(t.shape_);
    t.device_ = device;
    t.storage_ = std::static_pointer_cast<float>(std::move(storage));
    return t;
  }
  // Host only; device tensors are filled by their backend.
  static Tensor zeros(Shape shape) {
    Tensor t(std::move(shape));
    t.fill(0.0f);
    return t;
  }

  const Shape& shape() const { return shape_; }
  int64_t dim(size_t i) const { return shape_.at(i); }
  size_t rank() const { return shape_.size(); }
  int64_t numel() const { return numel_; }
  size_t bytes() const { return static_cast<size_t>(numel_) * sizeof(float); }
  Device device() const { return device_; }
  bool defined() const { return storage_ != nullptr; }
  // The storage's address on its device: dereference it on the host only for host tensors.
  float* data() { return storage_.get(); }
  const float* data() const { return storage_.get(); }
  // Shares ownership of the storage (to keep it alive while a device copies from it).
  std::shared_ptr<const void> storage() const { return storage_; }

  // Host-tensor conveniences; device tensors go through their backend.
  void fill(float v) {
    requireHost("fill");
    std::fill(data(), data() + numel_, v);
  }
  void copyFrom(const Tensor& other) {
    requireHost("copyFrom");
    other.requireHost("copyFrom");
    if (other.numel_ != numel_) throw invalidArgument("copy between tensors of different sizes");
    if (numel_) std::memcpy(data(), other.data(), bytes());
  }
  Tensor clone() const {
    Tensor t(shape_);
    t.copyFrom(*this);
    return t;
  }
  // Same storage, another shape with the same number of elements.
  Tensor reshaped(Shape shape) const {
    if (numelOf(shape) != numel_) throw invalidArgument("cannot view " + shapeString(shape_) + " as " + shapeString(shape));
    Tensor t = *this;
    t.shape_ = std::move(shape);
    return t;
  }

 private:
  void requireHost(const char* what) const {
    if (!device_.isCpu()) throw invalidArgument(std::string("Tensor::") + what + " on a " + device_.name() + " tensor");
  }
  Shape shape_;
  int64_t numel_ = 0;
  Device device_;
  std::shared_ptr<float> storage_;
};

// A flat array of T on one device (labels, masks, indices).
template <typename T>
class Array {
 public:
  Array() = default;
  explicit Array(int64_t size, Allocator& allocator = hostAllocator()) : size_(size), device_(allocator.device()) {
    if (size > 0) storage_ = std::static_pointer_cast<T>(allocator.allocate(static_cast<size_t>(size) * sizeof(T)));
  }
  static Array wrap(int64_t size, Device device, std::shared_ptr<void> storage) {
    Array a;
    a.size_ = size;
    a.device_ = device;
    a.storage_ = std::static_pointer_cast<T>(std::move(storage));
    return a;
  }
  int64_t size() const { return size_; }
  size_t bytes() const { return static_cast<size_t>(size_) * sizeof(T); }
  Device device() const { return device_; }
  bool defined() const { return storage_ != nullptr; }
  T* data() { return storage_.get(); }
  const T* data() const { return storage_.get(); }
  std::shared_ptr<const void> storage() const { return storage_; }
  // Host arrays only.
  T& operator[](int64_t i) { return storage_.get()[i]; }
  const T& operator[](int64_t i) const { return storage_.get()[i]; }

 private:
  int64_t size_ = 0;
  Device device_;
  std::shared_ptr<T> storage_;
};

// Reuses `slot`'s storage when it already has `shape` on the allocator's device (no allocation on
// the hot path), else allocates.
inline Tensor& ensureShape(Tensor& slot, const Shape& shape, Allocator& allocator = hostAllocator()) {
  if (slot.shape() != shape || !slot.data() || slot.device() != allocator.device()) slot = Tensor(shape, allocator);
  return slot;
}

template <typename T>
Array<T>& ensureSize(Array<T>& slot, int64_t size, Allocator& allocator = hostAllocator()) {
  if (slot.size() != size || !slot.data() || slot.device() != allocator.device()) slot = Array<T>(size, allocator);
  return slot;
}

// A trainable parameter: PyTorch's state_dict name, its value and its gradient (same layout).
struct Parameter {
  std::string name;
  Tensor value;
  Tensor grad;
};

// A float buffer that is state but not trained (BatchNorm running statistics).
struct Buffer {
  std::string name;
  Tensor value;
};

// An int64 counter in the state_dict (BatchNorm's num_batches_tracked), kept on the host.
struct Counter {
  std::string name;
  int64_t* value;
};

}  // namespace accordion

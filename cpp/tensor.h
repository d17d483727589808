// A float32 tensor with shared, 64-byte aligned storage.
//
// Layout convention: 4-D activations have the logical shape (N, C, H, W) but are stored
// channels-last (NHWC), the layout oneDNN's convolution kernels consume without reorders.
// Parameters keep PyTorch's layouts: conv weights (C_out, C_in, kH, kW), linear (out, in).
#pragma once
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "errors.h"

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

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(Shape shape) : shape_(std::move(shape)), numel_(numelOf(shape_)) {
    if (numel_ > 0) {
      size_t bytes = ((static_cast<size_t>(numel_) * sizeof(float) + 63) / 64) * 64;
      float* p = static_cast<float*>(std::aligned_alloc(64, bytes));
      if (!p) throw EngineError("ERR_OUT_OF_MEMORY", "cannot allocate a tensor of shape " + shapeString(shape_));
      storage_ = std::shared_ptr<float>(p, std::free);
    }
  }
  static Tensor zeros(Shape shape) {
    Tensor t(std::move(shape));
    t.fill(0.0f);
    return t;
  }

  const Shape& shape() const { return shape_; }
  int64_t dim(size_t i) const { return shape_.at(i); }
  size_t rank() const { return shape_.size(); }
  int64_t numel() const { return numel_; }
  bool defined() const { return storage_ != nullptr; }
  float* data() { return storage_.get(); }
  const float* data() const { return storage_.get(); }

  void fill(float v) { std::fill(data(), data() + numel_, v); }
  void copyFrom(const Tensor& other) {
    if (other.numel_ != numel_) throw invalidArgument("copy between tensors of different sizes");
    if (numel_) std::memcpy(data(), other.data(), numel_ * sizeof(float));
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
  Shape shape_;
  int64_t numel_ = 0;
  std::shared_ptr<float> storage_;
};

// Reuses `slot`'s storage when it already has `shape` (no allocation on the hot path), else allocates.
inline Tensor& ensureShape(Tensor& slot, const Shape& shape) {
  if (slot.shape() != shape || !slot.data()) slot = Tensor(shape);
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

// An int64 counter in the state_dict (BatchNorm's num_batches_tracked).
struct Counter {
  std::string name;
  int64_t* value;
};

}  // namespace accordion

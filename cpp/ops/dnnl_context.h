// The oneDNN CPU engine and a per-thread stream, plus memory descriptors for the engine's layouts.
#pragma once
#include <oneapi/dnnl/dnnl.hpp>

#include "core/tensor.h"

namespace accordion {

inline dnnl::engine& cpuEngine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

// oneDNN streams must not be shared between threads; each engine thread gets its own.
inline dnnl::stream& cpuStream() {
  thread_local dnnl::stream stream(cpuEngine());
  return stream;
}

inline dnnl::memory::dims dimsOf(const Shape& shape) { return dnnl::memory::dims(shape.begin(), shape.end()); }

// A 4-D activation (N, C, H, W) stored channels-last, in fp32 unless `type` says otherwise.
inline dnnl::memory::desc activationDesc(const Shape& shape, dnnl::memory::data_type type = dnnl::memory::data_type::f32) {
  return dnnl::memory::desc(dimsOf(shape), type, dnnl::memory::format_tag::nhwc);
}

inline dnnl::memory::desc plainDesc(const Shape& shape, dnnl::memory::format_tag tag) {
  return dnnl::memory::desc(dimsOf(shape), dnnl::memory::data_type::f32, tag);
}

inline dnnl::memory wrap(const dnnl::memory::desc& desc, const float* data) {
  return dnnl::memory(desc, cpuEngine(), const_cast<float*>(data));
}

// Converts memory into another layout, keeping the reorder primitive and the destination buffer
// between calls of the same shape (creating a oneDNN primitive costs far more than running it).
class CachedReorder {
 public:
  // Returns `src` itself when it already has the wanted layout.
  dnnl::memory operator()(const dnnl::memory& src, const dnnl::memory::desc& to) {
    if (src.get_desc() == to) return src;
    if (!output_ || output_.get_desc() != to || from_ != src.get_desc()) {
      from_ = src.get_desc();
      output_ = dnnl::memory(to, cpuEngine());
      primitive_ = dnnl::reorder(dnnl::reorder::primitive_desc(cpuEngine(), from_, cpuEngine(), to));
    }
    primitive_.execute(cpuStream(), const_cast<dnnl::memory&>(src), output_);
    return output_;
  }
  // Reorders `src` into caller-owned memory `dst` (for results that must land in a given buffer).
  void into(const dnnl::memory& src, const dnnl::memory& dst) {
    if (!primitive_ || from_ != src.get_desc() || to_ != dst.get_desc()) {
      from_ = src.get_desc();
      to_ = dst.get_desc();
      primitive_ = dnnl::reorder(dnnl::reorder::primitive_desc(cpuEngine(), from_, cpuEngine(), to_));
    }
    primitive_.execute(cpuStream(), const_cast<dnnl::memory&>(src), const_cast<dnnl::memory&>(dst));
  }

 private:
  dnnl::memory::desc from_, to_;
  dnnl::memory output_;
  dnnl::reorder primitive_;
};

}  // namespace accordion

// The fused SGD update of every parameter, as torch.optim.SGD (see ops/backend.h): one launch for
// the whole list, a block per chunk of a parameter (kernels.cuh), one read of p and g (and of the
// momentum buffer after the first step) and one write of p (and the buffer).
#include "ops/kernels.cuh"

namespace accordion::cuda {

namespace {

struct SgdTensor {
  float* value;
  const float* grad;
  float* momentum;
  int64_t size;
  int64_t packed;  // every pointer allows 16-byte packs
};

struct SgdStep {
  float learningRate, momentum, weightDecay;
  bool useMomentum, nesterov, first;
};

// The CPU's formula, element by element.
__device__ __forceinline__ void step(float& p, float g, float& buf, const SgdStep& s) {
  float d = g + s.weightDecay * p;
  if (s.useMomentum) {
    buf = s.first ? d : s.momentum * buf + d;
    d = s.nesterov ? d + s.momentum * buf : buf;
  }
  p -= s.learningRate * d;
}

__global__ void __launch_bounds__(kThreads) sgdKernel(const SgdTensor* tensors, const TensorChunk* chunks, SgdStep s) {
  const TensorChunk chunk = chunks[blockIdx.x];
  const SgdTensor t = tensors[chunk.tensor];
  // The first step overwrites the momentum buffer without reading it.
  const bool readMomentum = s.useMomentum && !s.first;
  forEachInChunk(
      t.size, chunk.chunk, t.packed,
      [&](int64_t i) {
        Pack<float, 4> p = loadPack<4>(t.value, i), buf{};
        const Pack<float, 4> g = loadPack<4>(t.grad, i);
        if (readMomentum) buf = loadPack<4>(t.momentum, i);
#pragma unroll
        for (int l = 0; l < 4; ++l) step(p.v[l], g.v[l], buf.v[l], s);
        storePack<4>(t.value, i, p);
        if (s.useMomentum) storePack<4>(t.momentum, i, buf);
      },
      [&](int64_t i) {
        float p = t.value[i], buf = readMomentum ? t.momentum[i] : 0.0f;
        step(p, t.grad[i], buf, s);
        t.value[i] = p;
        if (s.useMomentum) t.momentum[i] = buf;
      });
}

}  // namespace

void CudaBackend::sgdUpdate(const std::vector<SgdSlot>& slots, const SgdHyper& hyper, bool first) {
  const bool useMomentum = hyper.momentum != 0.0f;
  std::vector<SgdTensor> tensors;
  tensors.reserve(slots.size());
  for (const SgdSlot& slot : slots) {
    const bool packed = packable(slot.value) && packable(slot.grad) && (!useMomentum || packable(slot.momentum));
    tensors.push_back({slot.value, slot.grad, slot.momentum, slot.size, packed});
  }
  launchMultiTensor(*this, "sgdUpdate", sgdKernel, tensors,
                    SgdStep{hyper.learningRate, hyper.momentum, hyper.weightDecay, useMomentum, hyper.nesterov, first});
}

}  // namespace accordion::cuda

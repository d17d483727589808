#include "compress/topk.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace accordion {

TopKCompressor::TopKCompressor(const std::vector<Parameter*>& parameters, double level, Precision sent, Backend& backend)
    : ErrorFeedbackCompressor(parameters, sent, backend) {
  checkLevel(level, "initial level");
}

void TopKCompressor::checkLevel(double level, const std::string& where) const {
  if (!(level > 0 && level <= 1))
    throw invalidArgument(where + ": a TopK ratio must lie in (0, 1] (or be 0: dense, -1: dense in bf16), got " + std::to_string(level));
}

int64_t TopKCompressor::floats(int64_t rows, int64_t cols, double level, int world) const {
  return 2 * topkCount(level, rows * cols) * world;
}

void TopKCompressor::exchange(const std::vector<MatrixView>& views, TimedGroup& group) {
  const int world = group.size();
  std::vector<TopKTensor> tensors;
  int64_t perWorker = 0;
  for (const MatrixView& v : views) {
    const int64_t n = v.parameter->grad.numel(), s = topkCount(v.level, n);
    tensors.push_back({v.parameter->grad.data(), memory_[v.index].data(), nullptr, n, s, perWorker});
    perWorker += 2 * s;
  }
  float* send = scratch(sendBuffer_, perWorker, backend_);
  for (TopKTensor& t : tensors) t.send = send + t.offset;
  kernels_.topKSelect(tensors);
  const float* gathered = send;
  if (world > 1) {
    float* receive = scratch(receiveBuffer_, perWorker * world, backend_);
    if (sent_ == Precision::Fp32) group.allGather(send, perWorker, receive);
    else gatherRounded(tensors, perWorker, receive, group);
    gathered = receive;
  }
  kernels_.topKCombine(tensors, gathered, world, perWorker, 1.0f / static_cast<float>(world));
}

void TopKCompressor::gatherRounded(const std::vector<TopKTensor>& tensors, int64_t perWorker, float* gathered, TimedGroup& group) {
  const int world = group.size();
  const int64_t pairs = perWorker / 2;
  indices_.resize(pairs);
  values_.resize(pairs);
  int64_t k = 0;
  for (const TopKTensor& t : tensors)
    for (int64_t j = 0; j < t.count; ++j, ++k) {
      const float value = t.send[t.count + j];
      int32_t index;
      std::memcpy(&index, &t.send[j], sizeof(index));
      indices_[k] = t.send[j];
      values_[k] = value;
      t.memory[index] = value - roundTo(sent_, value);  // zero after the selection: e = a − sparse(a)
    }
  allIndices_.resize(pairs * world);
  allValues_.resize(pairs * world);
  group.allGather(indices_.data(), pairs, allIndices_.data());
  group.allGather(values_.data(), pairs, allValues_.data(), sent_);
  for (int w = 0; w < world; ++w) {
    k = w * pairs;
    for (const TopKTensor& t : tensors) {
      float* pairsOut = gathered + w * perWorker + t.offset;
      std::copy(&allIndices_[k], &allIndices_[k] + t.count, pairsOut);
      std::copy(&allValues_[k], &allValues_[k] + t.count, pairsOut + t.count);
      k += t.count;
    }
  }
}

std::function<void()> TopKCompressor::compressOnce(const MatrixView& v, Tensor& g, Tensor& residual) {
  const int64_t numel = g.numel(), s = topkCount(v.level, numel);
  Tensor send = backend_.empty({2 * s});
  return [this, t = std::vector<TopKTensor>{{g.data(), residual.data(), send.data(), numel, s, 0}}, send] { kernels_.topKSelect(t); };
}

}  // namespace accordion

#include "compress/topk.h"

#include <algorithm>
#include <cmath>

namespace accordion {

TopKCompressor::TopKCompressor(const std::vector<Parameter*>& parameters, double level, Backend& backend)
    : ErrorFeedbackCompressor(parameters, backend) {
  checkLevel(level, "initial level");
}

void TopKCompressor::checkLevel(double level, const std::string& where) const {
  if (!(level > 0 && level <= 1))
    throw invalidArgument(where + ": a TopK ratio must lie in (0, 1] (or be 0: dense), got " + std::to_string(level));
}

int64_t TopKCompressor::count(double ratio, int64_t numel) {
  return std::max<int64_t>(1, static_cast<int64_t>(std::floor(ratio * static_cast<double>(numel))));
}

int64_t TopKCompressor::floats(int64_t rows, int64_t cols, double level, int world) const {
  return 2 * count(level, rows * cols) * world;
}

int64_t TopKCompressor::exchange(const std::vector<MatrixView>& views, TimedGroup& group) {
  const int world = group.size();
  std::vector<TopKTensor> tensors;
  int64_t perWorker = 0;
  for (const MatrixView& v : views) {
    const int64_t n = v.parameter->grad.numel(), s = count(v.level, n);
    tensors.push_back({v.parameter->grad.data(), memory_[v.index].data(), nullptr, n, s, perWorker});
    perWorker += 2 * s;
  }
  float* send = scratch(sendBuffer_, perWorker, backend_);
  for (TopKTensor& t : tensors) t.send = send + t.offset;
  kernels_.topKSelect(tensors);
  const float* gathered = send;
  if (world > 1) {
    float* receive = scratch(receiveBuffer_, perWorker * world, backend_);
    group.allGather(send, perWorker, receive);
    gathered = receive;
  }
  kernels_.topKCombine(tensors, gathered, world, perWorker, 1.0f / static_cast<float>(world));
  return perWorker * world;
}

std::function<void()> TopKCompressor::compressOnce(const MatrixView& v, Tensor& g, Tensor& residual) {
  const int64_t numel = g.numel(), s = count(v.level, numel);
  Tensor send = backend_.empty({2 * s});
  return [this, t = std::vector<TopKTensor>{{g.data(), residual.data(), send.data(), numel, s, 0}}, send] { kernels_.topKSelect(t); };
}

}  // namespace accordion

#include "compress/compressor.h"

#include <chrono>
#include <cmath>

namespace accordion {

Compressor parseCompressor(const std::string& name) {
  if (name == "none") return Compressor::None;
  if (name == "powersgd") return Compressor::PowerSgd;
  if (name == "topk") return Compressor::TopK;
  throw invalidArgument("unknown compressor '" + name + "' (known: none, powersgd, topk)");
}

const char* compressorName(Compressor c) {
  switch (c) {
    case Compressor::PowerSgd: return "powersgd";
    case Compressor::TopK: return "topk";
    default: return "none";
  }
}

void TimedGroup::timed(double sentBytes, const std::function<void()>& collective) {
  if (group_.onDevice()) backend_.synchronize();
  const auto start = std::chrono::steady_clock::now();
  collective();
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  seconds += took;
  if (group_.size() > 1) times.push_back({sentBytes, took});
}

float* scratch(Tensor& buffer, int64_t n, Backend& backend) {
  if (buffer.numel() < n) buffer = backend.empty({n});
  return buffer.data();
}

ErrorFeedbackCompressor::ErrorFeedbackCompressor(const std::vector<Parameter*>& parameters, Precision sent, Backend& backend)
    : sent_(sent), backend_(backend), kernels_(backend.compression()), memory_(parameters.size()), owed_(parameters.size(), 0) {
  for (size_t i = 0; i < parameters.size(); ++i)
    if (parameters[i]->value.rank() > 1) memory_[i] = backend.zeros(parameters[i]->value.shape());
}

std::vector<std::pair<std::string, Tensor*>> ErrorFeedbackCompressor::state(size_t index) {
  if (!memory_.at(index).defined()) return {};
  return {{"memory", &memory_[index]}};
}

void ErrorFeedbackCompressor::reset(const std::vector<MatrixView>& matrices) {
  for (Tensor& m : memory_)
    if (m.defined()) backend_.fill(m.data(), m.numel(), 0.0f);
}

void ErrorFeedbackCompressor::payOwed(const std::vector<size_t>& indices, const std::vector<Parameter*>& parameters) {
  std::vector<size_t> paid;
  std::vector<Span> grads;
  std::vector<ConstSpan> memories;
  for (size_t i : indices) {
    if (!owed_[i] || !memory_[i].defined()) continue;
    owed_[i] = false;
    paid.push_back(i);
    grads.push_back({parameters[i]->grad.data(), parameters[i]->grad.numel()});
    memories.push_back({memory_[i].data(), memory_[i].numel()});
  }
  if (paid.empty()) return;
  backend_.accumulate(grads, memories);
  for (size_t i : paid) backend_.fill(memory_[i].data(), memory_[i].numel(), 0.0f);
}

void ErrorFeedbackCompressor::exchangeRounded(const std::vector<MatrixView>& matrices, Precision sent, TimedGroup& group) {
  std::vector<Span> grads, memories;
  std::vector<ConstSpan> memoryValues, gradValues;
  int64_t total = 0;
  for (const MatrixView& v : matrices) {
    Tensor& g = v.parameter->grad;
    Tensor& e = memory_.at(v.index);
    grads.push_back({g.data(), g.numel()});
    memories.push_back({e.data(), e.numel()});
    memoryValues.push_back({e.data(), e.numel()});
    gradValues.push_back({g.data(), g.numel()});
    total += g.numel();
  }
  float* buffer = scratch(roundedBuffer_, total, backend_);
  backend_.accumulate(grads, memoryValues);  // g = M = g + e
  kernels_.pack(grads, buffer);
  group.allReduceSum(buffer, total, sent);
  kernels_.unpack(buffer, memories, -1.0f / static_cast<float>(group.size()));  // e = −out
  backend_.accumulate(memories, gradValues);                                      // e = M − out
  kernels_.unpack(buffer, grads, 1.0f / static_cast<float>(group.size()));      // g = out
}

LevelCost ErrorFeedbackCompressor::price(const MatrixView& view, const Tensor& sum, int world) {
  const int64_t numel = sum.numel();
  LevelCost cost{view.level, 0, floats(view.rows, view.cols, view.level, world), bytes(view.rows, view.cols, view.level, world), 0};
  Tensor g = backend_.empty(sum.shape()), residual = backend_.empty(sum.shape());
  backend_.copy(g.data(), sum.data(), g.bytes());
  backend_.fill(residual.data(), numel, 0.0f);
  const std::function<void()> compress = compressOnce(view, g, residual);
  backend_.synchronize();
  const auto start = std::chrono::steady_clock::now();
  compress();
  backend_.synchronize();
  cost.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double norm = std::sqrt(backend_.sumsOfSquares({{sum.data(), numel}})[0]);
  if (norm > 0) cost.error = std::sqrt(backend_.sumsOfSquares({{residual.data(), numel}})[0]) / norm;
  return cost;
}

}  // namespace accordion

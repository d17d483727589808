#include "compress/powersgd.h"

#include <algorithm>
#include <cmath>

#include "core/random.h"

namespace accordion {

static uint64_t mix(uint64_t a, uint64_t b) { return finalise(a * kGolden + b + 0x2545F4914F6CDD1Dull); }

PowerSgdCompressor::PowerSgdCompressor(const std::vector<Parameter*>& parameters, double level, uint64_t seed,
                                       float eps, Precision sent, Backend& backend)
    : ErrorFeedbackCompressor(parameters, sent, backend), seed_(seed), eps_(eps),
      q_(parameters.size()) {
  checkLevel(level, "initial level");
  for (size_t i = 0; i < parameters.size(); ++i) {
    const Tensor& v = parameters[i]->value;
    if (v.rank() > 1) levelChanged({i, parameters[i], v.dim(0), v.numel() / v.dim(0), level});
  }
}

void PowerSgdCompressor::checkLevel(double level, const std::string& where) const {
  if (!std::isfinite(level) || level < 1 || level != std::floor(level))
    throw invalidArgument(where + ": a PowerSGD rank must be a positive integer (or 0: dense, -1: dense in bf16), got " + std::to_string(level));
}

int64_t PowerSgdCompressor::floats(int64_t rows, int64_t cols, double level, int) const {
  return (rows + cols) * powerSgdRank(rows, cols, level);
}

Tensor PowerSgdCompressor::initialQ(const MatrixView& view) const {
  Tensor q({view.cols, rank(view)});
  Random rng(mix(seed_, view.index));
  for (int64_t i = 0; i < q.numel(); ++i) q.data()[i] = rng.normal();
  return backend_.toDevice(q);
}

std::vector<std::pair<std::string, Tensor*>> PowerSgdCompressor::state(size_t index) {
  auto out = ErrorFeedbackCompressor::state(index);
  if (q_.at(index).defined()) out.emplace_back("q", &q_[index]);
  return out;
}

void PowerSgdCompressor::reset(const std::vector<MatrixView>& matrices) {
  ErrorFeedbackCompressor::reset(matrices);
  for (const MatrixView& m : matrices)
    if (q_.at(m.index).defined()) levelChanged(m);
}

void PowerSgdCompressor::exchange(const std::vector<MatrixView>& views, TimedGroup& group) {
  int64_t pTotal = 0, qTotal = 0;
  for (const MatrixView& v : views) {
    pTotal += v.rows * rank(v);
    qTotal += v.cols * rank(v);
  }
  float* p = scratch(pBuffer_, pTotal, backend_);
  float* qt = scratch(qBuffer_, qTotal, backend_);  // holds Qᵀ per matrix while it travels
  std::vector<PowerSgdMatrix> matrices;
  for (const MatrixView& v : views) {
    const int64_t r = rank(v);
    matrices.push_back({v.parameter->grad.data(), memory_[v.index].data(), q_[v.index].data(), p, qt, v.rows, v.cols, r});
    p += v.rows * r;
    qt += v.cols * r;
  }
  // M = g + e and P = M·Q for every matrix, then one all-reduce of all P's.
  kernels_.powerSgdProject(matrices);
  group.allReduceSum(pBuffer_.data(), pTotal, sent_);
  // Orthogonalise, Qᵀ = P̂ᵀ·M, then one all-reduce of all Q's.
  kernels_.powerSgdProjectBack(matrices, eps_);
  group.allReduceSum(qBuffer_.data(), qTotal, sent_);
  // out = P̂·Qᵀ becomes the gradient; the memory keeps M − out; Q is kept for the next step.
  kernels_.powerSgdDecompress(matrices, 1.0f / static_cast<float>(group.size()));
}

std::function<void()> PowerSgdCompressor::compressOnce(const MatrixView& v, Tensor& g, Tensor& residual) {
  const int64_t r = rank(v);
  Tensor q = initialQ(v), p = backend_.empty({v.rows * r}), qt = backend_.empty({v.cols * r});
  return [this, m = std::vector<PowerSgdMatrix>{{g.data(), residual.data(), q.data(), p.data(), qt.data(), v.rows, v.cols, r}}, q, p, qt] {
    kernels_.powerSgdProject(m);
    kernels_.powerSgdProjectBack(m, eps_);
    kernels_.powerSgdDecompress(m, 1.0f);
  };
}

}  // namespace accordion

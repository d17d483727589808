// TopK (ratio K, error feedback) as a compressor of the exchange:
//   a = g + e; the s = max(1, ⌊K·numel⌋) entries of largest |a| (ties: lowest index); e = a − sparse(a);
//   all-gather (index, value); out = Σ_w sparse_w / W                       floats sent: 2·s·W
// Every matrix's pairs travel in one all-gather. Values sent in 16 bits (indices stay 32-bit) travel
// in a second all-gather; what rounding a value loses joins the error memory at its index.
#pragma once
#include "compress/compressor.h"
#include "compress/traffic.h"

namespace accordion {

class TopKCompressor : public ErrorFeedbackCompressor {
 public:
  TopKCompressor(const std::vector<Parameter*>& parameters, double level, Precision sent, Backend& backend);
  Compressor kind() const override { return Compressor::TopK; }
  void checkLevel(double level, const std::string& where) const override;
  int64_t floats(int64_t rows, int64_t cols, double level, int world) const override;
  int64_t bytes(int64_t rows, int64_t cols, double level, int world) const override {
    return topkCount(level, rows * cols) * world * (4 + bytesPerValue(sent_));
  }
  void exchange(const std::vector<MatrixView>& matrices, TimedGroup& group) override;

 private:
  std::function<void()> compressOnce(const MatrixView& view, Tensor& g, Tensor& residual) override;

  // The values of the pairs apart from their indices, rounded, with their rounding error fed back;
  // `gathered` (the pairs of every worker, as the fp32 all-gather lays them out) put together again.
  void gatherRounded(const std::vector<TopKTensor>& tensors, int64_t perWorker, float* gathered, TimedGroup& group);

  Tensor sendBuffer_, receiveBuffer_;
  std::vector<float> indices_, values_, allIndices_, allValues_;
};

}  // namespace accordion

// PowerSGD (rank r, warm start, error feedback) as a compressor of the exchange:
//   M = g + e viewed as (n, m) = (out, in·kh·kw); P = M·Q; all-reduce P; orthogonalise P (modified
//   Gram-Schmidt, eps); Q = Mᵀ·P̂; all-reduce Q, divide by W; out = P̂·Qᵀ; e = M − out; Q is kept
//   for the next step (warm start).                                        floats sent: (n + m)·r
// Every matrix's P (and Q) travels in one all-reduce, in the exchange's precision (summed in fp32);
// since e = M − out is taken from the decompressed average, what rounding P and Q loses stays in e. The rank is clipped to min(n, m); a matrix
// stays dense unless (n + m)·r·rate < n·m (PyTorch's min_compression_rate; 0 compresses all). Q is
// drawn on the host from the shared seed and the parameter's index, so every worker and every
// device starts alike.
#pragma once
#include "compress/compressor.h"
#include "compress/traffic.h"

namespace accordion {

class PowerSgdCompressor : public ErrorFeedbackCompressor {
 public:
  PowerSgdCompressor(const std::vector<Parameter*>& parameters, double level, uint64_t seed, float eps,
                     Precision sent, Backend& backend);
  Compressor kind() const override { return Compressor::PowerSgd; }
  void checkLevel(double level, const std::string& where) const override;
  int64_t floats(int64_t rows, int64_t cols, double level, int world) const override;
  int64_t bytes(int64_t rows, int64_t cols, double level, int world) const override {
    return floats(rows, cols, level, world) * bytesPerValue(sent_);
  }
  // A fresh Q at a compressed level; none while the matrix is sent dense (the next compressed level
  // draws one), so a checkpoint holds a Q exactly for the matrices that use one.
  void levelChanged(const MatrixView& view) override { q_.at(view.index) = view.level > 0 ? initialQ(view) : Tensor(); }
  void exchange(const std::vector<MatrixView>& matrices, TimedGroup& group) override;
  std::vector<std::pair<std::string, Tensor*>> state(size_t index) override;
  void reset(const std::vector<MatrixView>& matrices) override;

 private:
  std::function<void()> compressOnce(const MatrixView& view, Tensor& g, Tensor& residual) override;
  static int64_t rank(const MatrixView& view) { return powerSgdRank(view.rows, view.cols, view.level); }
  // Q (cols, r), drawn from the shared seed, on the backend's device.
  Tensor initialQ(const MatrixView& view) const;

  uint64_t seed_;
  float eps_;
  std::vector<Tensor> q_;  // per parameter: (cols, r), row-major; undefined for 1-D
  Tensor pBuffer_, qBuffer_;
};

}  // namespace accordion

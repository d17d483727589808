// Word-level language model: embedding → multi-layer LSTM → linear decoder whose weight is the
// embedding's (tied), trained by truncated backpropagation through time. The hidden and cell states
// are carried from one window to the next and cut from the graph, as in PyTorch's word_language_model.
// Parameter names follow that model: encoder.weight, rnn.weight_ih_l{k}, rnn.weight_hh_l{k},
// rnn.bias_ih_l{k}, rnn.bias_hh_l{k}, decoder.bias (decoder.weight is encoder.weight).
#pragma once
#include <vector>

#include "models/layers.h"

namespace accordion {

struct LanguageModelSpec {
  int64_t vocabulary = 0;
  int64_t hidden = 650;  // also the embedding size (tied weights need them equal)
  int64_t layers = 2;
  float dropout = 0.4f;
  uint64_t seed = 0;
};

class LanguageModel {
 public:
  // Runs on the CPU backend `ops` (its loss op); the recurrence is its own OpenBLAS code.
  LanguageModel(const LanguageModelSpec& spec, Backend& ops);
  const LanguageModelSpec& spec() const { return spec_; }
  StateRefs& state() { return state_; }
  std::vector<Parameter*>& parameters() { return state_.parameters; }
  void setTraining(bool training) { training_ = training; }
  bool training() const { return training_; }
  // Zeroes the carried hidden and cell states (at the start of an epoch or an evaluation).
  void resetState();
  // inputs and targets are (T, B) time-major token ids. Returns the mean cross-entropy over the T·B
  // predictions; with `backward`, writes every parameter's gradient (through T steps, not into
  // the carried state). The final states are carried into the next call.
  double forwardBackward(const int32_t* inputs, const int32_t* targets, int64_t steps, int64_t batch, bool backward,
                         int64_t* correct);
  Random& dropoutRandom() { return dropoutRng_; }

 private:
  struct Layer {
    Parameter weightIh, weightHh, biasIh, biasHh;  // (4H, In), (4H, H), (4H), (4H); gates i, f, g, o
    Tensor h, c;                                    // carried (B, H)
    // Caches of the last forward, over the T·B rows of a window.
    Tensor input, gates, cells, tanhCells, output, h0, c0;
  };
  void dropout(Tensor& x, std::vector<uint8_t>& mask);
  void dropoutBackward(Tensor& dx, const std::vector<uint8_t>& mask) const;

  LanguageModelSpec spec_;
  Backend& ops_;
  bool training_ = true;
  Parameter encoder_, decoderBias_;
  std::vector<Layer> layers_;
  StateRefs state_;
  Random dropoutRng_;
  std::vector<int32_t> inputs_;
  std::vector<std::vector<uint8_t>> masks_;  // embedding output, between layers, last output
  Tensor embedded_, decoderInput_, logits_, gradLogits_;
};

}  // namespace accordion

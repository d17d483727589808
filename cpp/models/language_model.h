// Word-level language model: embedding → multi-layer LSTM → linear decoder whose weight is the
// embedding's (tied), trained by truncated backpropagation through time. The hidden and cell states
// are carried from one window to the next and cut from the graph, as in PyTorch's word_language_model.
// Parameter names follow that model: encoder.weight, rnn.weight_ih_l{k}, rnn.weight_hh_l{k},
// rnn.bias_ih_l{k}, rnn.bias_hh_l{k}, decoder.bias (decoder.weight is encoder.weight).
#pragma once
#include <vector>

#include "models/network.h"

namespace accordion {

struct LanguageModelSpec {
  int64_t vocabulary = 0;
  int64_t hidden = 650;  // also the embedding size (tied weights need them equal)
  int64_t layers = 2;
  float dropout = 0.4f;
  uint64_t seed = 0;
};

class LanguageModel : public Network {
 public:
  // Runs every op on `ops`' device; the parameters are initialised on the host (the same weights on
  // every device) and moved there.
  LanguageModel(const LanguageModelSpec& spec, Backend& ops);
  const LanguageModelSpec& spec() const { return spec_; }
  StateRefs& state() override { return state_; }
  std::vector<Parameter*>& parameters() { return state_.parameters; }
  void setTraining(bool training) override { training_ = training; }
  bool training() const override { return training_; }
  // A window of token ids (input.tokens, steps × columns) and its targets (input.labels): forward().
  void forwardLoss(const ModelInput& input, double* status) override;
  // Zeroes the carried hidden and cell states (at the start of an epoch or an evaluation).
  void resetState();
  // A (T, B) time-major window: `inputs` token ids in host memory, `targets` on the device. Writes the
  // mean cross-entropy over the T·B predictions and the correct count to status[0] and status[1]
  // (device memory); the final states are carried into the next window.
  void forward(const int32_t* inputs, const int32_t* targets, int64_t steps, int64_t batch, double* status);
  // Every parameter's gradient of the last forward's loss (through its T steps, not into the carried
  // state); `ready` hears of each layer's parameters as their gradients become final.
  void backward(const GradientsReady* ready) override;
  std::vector<Random*> randomStreams() override { return {&dropoutRng_}; }
  // The logits (T·B, vocabulary) of the last forward, on the model's device.
  const Tensor& logits() const override { return logits_; }
  // The carried states: per layer h then c, each (B, H) on the model's device; empty after a reset.
  std::vector<Tensor> hiddenState() const;
  // Replaces the carried states (per layer h then c, each (B, H) in host memory; all the same B).
  void setHiddenState(const std::vector<Tensor>& hostStates);

 private:
  struct Layer {
    Parameter weightIh, weightHh, biasIh, biasHh;  // (4H, In), (4H, H), (4H), (4H); gates i, f, g, o
    Tensor h, c;                                    // carried (B, H)
    // Caches of the last forward, over the T·B rows of a window: the input, the gate activations,
    // the cells and their tanh, the output (and after dropout, the next layer's input), and the
    // states the window started from.
    Tensor input, gates, cells, tanhCells, output, dropped, h0, c0;
  };
  // A keep mask for n elements, drawn on the device from a key of dropoutRng_'s (ops/dropout_mask.h).
  void drawMask(int64_t n, Array<uint8_t>& mask);

  LanguageModelSpec spec_;
  Backend& ops_;
  bool training_ = true;
  Parameter encoder_, decoderBias_;
  std::vector<Layer> layers_;
  StateRefs state_;
  Random dropoutRng_;
  std::vector<int32_t> inputs_;              // the window's token ids, on the host
  Array<int32_t> inputIds_;                  // and on the device
  int64_t steps_ = 0, batch_ = 0;            // of the last forward
  bool dropped_ = false;                     // whether it drew dropout masks
  std::vector<Array<uint8_t>> masks_;        // embedding output, between layers, last output
  Tensor embedded_, gateBias_, logits_, gradLogits_;
  Tensor dx_, dGates_, dhNext_, dcNext_, hPrev_;
};

}  // namespace accordion

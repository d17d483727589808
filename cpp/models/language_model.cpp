#include "models/language_model.h"

#include <cmath>

namespace accordion {

namespace {

Parameter uniformParameter(Shape shape, float bound, Random& rng) {
  Parameter p{"", Tensor(shape), Tensor::zeros(shape)};
  for (int64_t i = 0; i < p.value.numel(); ++i) p.value.data()[i] = rng.uniform(-bound, bound);
  return p;
}

}  // namespace

LanguageModel::LanguageModel(const LanguageModelSpec& spec, Backend& ops)
    : spec_(spec), ops_(ops), dropoutRng_(spec.seed * 7919 + 101) {
  if (spec.vocabulary < 2) throw invalidArgument("a language model needs a vocabulary of at least 2 words");
  if (spec.hidden < 1 || spec.layers < 1) throw invalidArgument("a language model needs hidden ≥ 1 and layers ≥ 1");
  if (!(spec.dropout >= 0 && spec.dropout < 1)) throw invalidArgument("dropout must lie in [0, 1)");
  Random rng(spec.seed);
  const int64_t v = spec.vocabulary, h = spec.hidden;
  // As PyTorch's word_language_model: embedding U(−0.1, 0.1), decoder bias 0; LSTM weights PyTorch's
  // default U(−1/√H, 1/√H).
  encoder_ = uniformParameter({v, h}, 0.1f, rng);
  encoder_.name = "encoder.weight";
  const float bound = 1.0f / std::sqrt(static_cast<float>(h));
  for (int64_t l = 0; l < spec.layers; ++l) {
    Layer layer;
    const std::string k = std::to_string(l);
    layer.weightIh = uniformParameter({4 * h, h}, bound, rng);
    layer.weightHh = uniformParameter({4 * h, h}, bound, rng);
    layer.biasIh = uniformParameter({4 * h}, bound, rng);
    layer.biasHh = uniformParameter({4 * h}, bound, rng);
    layer.weightIh.name = "rnn.weight_ih_l" + k;
    layer.weightHh.name = "rnn.weight_hh_l" + k;
    layer.biasIh.name = "rnn.bias_ih_l" + k;
    layer.biasHh.name = "rnn.bias_hh_l" + k;
    layers_.push_back(std::move(layer));
  }
  decoderBias_ = Parameter{"decoder.bias", Tensor::zeros({v}), Tensor::zeros({v})};
  state_.add(&encoder_);
  for (Layer& layer : layers_) {
    state_.add(&layer.weightIh);
    state_.add(&layer.weightHh);
    state_.add(&layer.biasIh);
    state_.add(&layer.biasHh);
  }
  state_.add(&decoderBias_);
  placeState(state_, ops_);
  masks_.resize(spec.layers + 1);
}

void LanguageModel::resetState() {
  for (Layer& layer : layers_) {
    layer.h = Tensor();
    layer.c = Tensor();
  }
}

std::vector<Tensor> LanguageModel::hiddenState() const {
  std::vector<Tensor> out;
  for (const Layer& layer : layers_) {
    if (!layer.h.defined()) return {};
    out.push_back(layer.h);
    out.push_back(layer.c);
  }
  return out;
}

void LanguageModel::setHiddenState(const std::vector<Tensor>& hostStates) {
  if (hostStates.size() != 2 * layers_.size())
    throw invalidArgument("the hidden state has " + std::to_string(layers_.size()) + " layers of h and c, got " +
                          std::to_string(hostStates.size()) + " tensors");
  const int64_t batch = hostStates.empty() ? 0 : hostStates[0].dim(0);
  for (const Tensor& t : hostStates)
    if (t.rank() != 2 || t.dim(0) != batch || t.dim(1) != spec_.hidden)
      throw invalidArgument("every hidden and cell state must be (batch, " + std::to_string(spec_.hidden) + "), got " +
                            shapeString(t.shape()));
  for (size_t l = 0; l < layers_.size(); ++l) {
    layers_[l].h = ops_.toDevice(hostStates[2 * l]);
    layers_[l].c = ops_.toDevice(hostStates[2 * l + 1]);
  }
}

void LanguageModel::drawMask(int64_t n, Array<uint8_t>& mask) {
  ensureSize(mask, n, ops_);
  ops_.dropoutMask(dropoutRng_.next(), spec_.dropout, mask.data(), n);
}

void LanguageModel::forwardLoss(const ModelInput& input, double* status) {
  if (!input.tokens) throw invalidArgument("model 'lstm' takes token windows, not images");
  forward(input.tokens, input.labels.data(), input.steps, input.columns, status);
}

void LanguageModel::forward(const int32_t* inputs, const int32_t* targets, int64_t steps, int64_t batch, double* status) {
  const int64_t v = spec_.vocabulary, h = spec_.hidden, rows = steps * batch, g4 = 4 * h;
  for (int64_t i = 0; i < rows; ++i)
    if (inputs[i] < 0 || inputs[i] >= v)
      throw invalidArgument("token id " + std::to_string(inputs[i]) + " at position " + std::to_string(i) +
                            " is outside the vocabulary of " + std::to_string(v));
  inputs_.assign(inputs, inputs + rows);
  ensureSize(inputIds_, rows, ops_);
  ops_.upload(inputIds_.data(), inputs, rows * sizeof(int32_t));
  steps_ = steps;
  batch_ = batch;
  const bool drop = dropped_ = training_ && spec_.dropout > 0.0f;
  const float scale = 1.0f / (1.0f - spec_.dropout);

  // Embedding lookup, then dropout.
  ensureShape(embedded_, {rows, h}, ops_);
  ops_.embeddingForward(encoder_.value.data(), inputIds_.data(), embedded_.data(), rows, h);
  if (drop) {
    drawMask(rows * h, masks_[0]);
    ops_.dropoutForward(embedded_.data(), masks_[0].data(), embedded_.data(), rows * h, scale);
  }

  Tensor x = embedded_;
  for (size_t l = 0; l < layers_.size(); ++l) {
    Layer& L = layers_[l];
    if (!L.h.defined() || L.h.dim(0) != batch) {
      L.h = ops_.zeros({batch, h});
      L.c = ops_.zeros({batch, h});
    }
    L.input = x;
    ensureShape(L.h0, {batch, h}, ops_);
    ensureShape(L.c0, {batch, h}, ops_);
    ops_.copy(L.h0.data(), L.h.data(), L.h.bytes());
    ops_.copy(L.c0.data(), L.c.data(), L.c.bytes());
    ensureShape(L.gates, {rows, g4}, ops_);
    ensureShape(L.cells, {rows, h}, ops_);
    ensureShape(L.tanhCells, {rows, h}, ops_);
    ensureShape(L.output, {rows, h}, ops_);
    // Input contributions of every step in one GEMM: X·W_ihᵀ + b_ih + b_hh.
    ensureShape(gateBias_, {g4}, ops_);
    ops_.add(L.biasIh.value.data(), L.biasHh.value.data(), gateBias_.data(), g4);
    ops_.broadcastRows(gateBias_.data(), L.gates.data(), rows, g4);
    ops_.gemm(false, true, rows, g4, h, x.data(), L.weightIh.value.data(), L.gates.data(), true);
    // Then one GEMM per step for the recurrence, and the gates.
    const float* hPrev = L.h0.data();
    const float* cPrev = L.c0.data();
    for (int64_t t = 0; t < steps; ++t) {
      float* gt = L.gates.data() + t * batch * g4;
      float* ct = L.cells.data() + t * batch * h;
      float* ht = L.output.data() + t * batch * h;
      ops_.gemm(false, true, batch, g4, h, hPrev, L.weightHh.value.data(), gt, true);
      ops_.lstmCellForward(gt, cPrev, ct, L.tanhCells.data() + t * batch * h, ht, batch, h);
      hPrev = ht;
      cPrev = ct;
    }
    // Carry the last states into the next window, cut from this one's graph.
    ops_.copy(L.h.data(), L.output.data() + (steps - 1) * batch * h, L.h.bytes());
    ops_.copy(L.c.data(), L.cells.data() + (steps - 1) * batch * h, L.c.bytes());
    x = L.output;
    if (drop) {
      ensureShape(L.dropped, {rows, h}, ops_);
      drawMask(rows * h, masks_[l + 1]);
      ops_.dropoutForward(L.output.data(), masks_[l + 1].data(), L.dropped.data(), rows * h, scale);
      x = L.dropped;
    }
  }
  // Tied decoder and the loss.
  ensureShape(logits_, {rows, v}, ops_);
  ops_.broadcastRows(decoderBias_.value.data(), logits_.data(), rows, v);
  ops_.gemm(false, true, rows, v, h, x.data(), encoder_.value.data(), logits_.data(), true);
  ensureShape(gradLogits_, logits_.shape(), ops_);
  ops_.softmaxCrossEntropy(logits_.data(), targets, rows, v, gradLogits_.data(), status);
}

void LanguageModel::backward(const GradientsReady* ready) {
  const int64_t v = spec_.vocabulary, h = spec_.hidden, steps = steps_, batch = batch_, rows = steps * batch, g4 = 4 * h;
  if (rows == 0) throw invalidArgument("backward needs a forward first");
  const bool drop = dropped_;
  const float scale = 1.0f / (1.0f - spec_.dropout);
  const Tensor& x = drop ? layers_.back().dropped : layers_.back().output;  // the decoder's input
  // Decoder: dY = dlogits·W; dW (tied, written first) = dlogitsᵀ·Y; db = Σ_rows dlogits.
  Tensor& dx = ensureShape(dx_, {rows, h}, ops_);
  ops_.gemm(false, false, rows, h, v, gradLogits_.data(), encoder_.value.data(), dx.data(), false);
  ops_.gemm(true, false, v, h, rows, gradLogits_.data(), x.data(), encoder_.grad.data(), false);
  ops_.columnSums(gradLogits_.data(), decoderBias_.grad.data(), rows, v);
  if (ready) (*ready)({&decoderBias_});

  ensureShape(dGates_, {rows, g4}, ops_);
  ensureShape(dhNext_, {batch, h}, ops_);
  ensureShape(dcNext_, {batch, h}, ops_);
  ensureShape(hPrev_, {rows, h}, ops_);
  for (int64_t l = static_cast<int64_t>(layers_.size()) - 1; l >= 0; --l) {
    Layer& L = layers_[l];
    if (drop) ops_.dropoutBackward(dx.data(), masks_[l + 1].data(), dx.data(), rows * h, scale);
    // dG: gradients of the gate pre-activations, step by step from the last (dh flows backwards).
    ops_.fill(dhNext_.data(), batch * h, 0.0f);
    ops_.fill(dcNext_.data(), batch * h, 0.0f);
    for (int64_t t = steps - 1; t >= 0; --t) {
      const float* cPrev = t > 0 ? L.cells.data() + (t - 1) * batch * h : L.c0.data();
      float* dg = dGates_.data() + t * batch * g4;
      ops_.lstmCellBackward(L.gates.data() + t * batch * g4, L.tanhCells.data() + t * batch * h, cPrev, dx.data() + t * batch * h,
                            dhNext_.data(), dcNext_.data(), dg, batch, h);
      // dh_{t−1} = dG_t · W_hh
      ops_.gemm(false, false, batch, h, g4, dg, L.weightHh.value.data(), dhNext_.data(), false);
    }
    // Weight gradients over all steps at once; h_{t−1} is the output shifted by one step.
    ops_.copy(hPrev_.data(), L.h0.data(), L.h0.bytes());
    ops_.copy(hPrev_.data() + batch * h, L.output.data(), (rows - batch) * h * sizeof(float));
    ops_.gemm(true, false, g4, h, rows, dGates_.data(), L.input.data(), L.weightIh.grad.data(), false);
    ops_.gemm(true, false, g4, h, rows, dGates_.data(), hPrev_.data(), L.weightHh.grad.data(), false);
    ops_.columnSums(dGates_.data(), L.biasIh.grad.data(), rows, g4);
    ops_.copy(L.biasHh.grad.data(), L.biasIh.grad.data(), L.biasIh.grad.bytes());
    if (ready) (*ready)({&L.weightIh, &L.weightHh, &L.biasIh, &L.biasHh});
    ops_.gemm(false, false, rows, h, g4, dGates_.data(), L.weightIh.value.data(), dx.data(), false);
  }
  if (drop) ops_.dropoutBackward(dx.data(), masks_[0].data(), dx.data(), rows * h, scale);
  // The embedding's gradient adds to the decoder's (one tied parameter).
  ops_.embeddingBackward(dx.data(), inputs_.data(), encoder_.grad.data(), rows, h);
  if (ready) (*ready)({&encoder_});
}

}  // namespace accordion

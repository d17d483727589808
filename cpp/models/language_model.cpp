#include "models/language_model.h"

#include <cblas.h>

#include <cmath>
#include <cstring>

namespace accordion {

namespace {

inline float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

// C (m, n) = A (m, k) · Bᵀ (B is (n, k)), plus C's old value when `accumulate`.
void gemmNT(const float* a, const float* b, float* c, int64_t m, int64_t n, int64_t k, bool accumulate) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0f, a, k, b, k, accumulate ? 1.0f : 0.0f, c, n);
}
// C (m, n) = A (m, k) · B (k, n).
void gemmNN(const float* a, const float* b, float* c, int64_t m, int64_t n, int64_t k, bool accumulate) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0f, a, k, b, n, accumulate ? 1.0f : 0.0f, c, n);
}
// C (m, n) = Aᵀ · B with A (k, m), B (k, n).
void gemmTN(const float* a, const float* b, float* c, int64_t m, int64_t n, int64_t k, bool accumulate) {
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, m, n, k, 1.0f, a, m, b, n, accumulate ? 1.0f : 0.0f, c, n);
}

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
  masks_.resize(spec.layers + 1);
}

void LanguageModel::resetState() {
  for (Layer& layer : layers_) {
    layer.h = Tensor();
    layer.c = Tensor();
  }
}

void LanguageModel::dropout(Tensor& x, std::vector<uint8_t>& mask) {
  if (!training_ || spec_.dropout == 0.0f) {
    mask.clear();
    return;
  }
  const float scale = 1.0f / (1.0f - spec_.dropout);
  mask.resize(x.numel());
  float* p = x.data();
  for (int64_t i = 0; i < x.numel(); ++i) {
    mask[i] = dropoutRng_.uniform() >= spec_.dropout;
    p[i] = mask[i] ? p[i] * scale : 0.0f;
  }
}

void LanguageModel::dropoutBackward(Tensor& dx, const std::vector<uint8_t>& mask) const {
  if (mask.empty()) return;
  const float scale = 1.0f / (1.0f - spec_.dropout);
  float* p = dx.data();
  for (int64_t i = 0; i < dx.numel(); ++i) p[i] = mask[i] ? p[i] * scale : 0.0f;
}

double LanguageModel::forwardBackward(const int32_t* inputs, const int32_t* targets, int64_t steps, int64_t batch, bool backward,
                                      int64_t* correct) {
  const int64_t v = spec_.vocabulary, h = spec_.hidden, rows = steps * batch, g4 = 4 * h;
  for (int64_t i = 0; i < rows; ++i)
    if (inputs[i] < 0 || inputs[i] >= v)
      throw invalidArgument("token id " + std::to_string(inputs[i]) + " at position " + std::to_string(i) +
                            " is outside the vocabulary of " + std::to_string(v));
  inputs_.assign(inputs, inputs + rows);
  // Embedding lookup, then dropout.
  ensureShape(embedded_, {rows, h});
  for (int64_t r = 0; r < rows; ++r) std::memcpy(embedded_.data() + r * h, encoder_.value.data() + inputs[r] * h, h * sizeof(float));
  dropout(embedded_, masks_[0]);

  Tensor x = embedded_;
  for (size_t l = 0; l < layers_.size(); ++l) {
    Layer& L = layers_[l];
    if (!L.h.defined() || L.h.dim(0) != batch) {
      L.h = Tensor::zeros({batch, h});
      L.c = Tensor::zeros({batch, h});
    }
    L.input = x.clone();
    L.h0 = L.h.clone();
    L.c0 = L.c.clone();
    ensureShape(L.gates, {rows, g4});
    ensureShape(L.cells, {rows, h});
    ensureShape(L.tanhCells, {rows, h});
    L.output = Tensor({rows, h});
    // Input contributions of every step at once: X·W_ihᵀ + b_ih + b_hh.
    float* gates = L.gates.data();
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < g4; ++j) gates[r * g4 + j] = L.biasIh.value.data()[j] + L.biasHh.value.data()[j];
    gemmNT(x.data(), L.weightIh.value.data(), gates, rows, g4, h, true);
    const float* hPrev = L.h0.data();
    const float* cPrev = L.c0.data();
    for (int64_t t = 0; t < steps; ++t) {
      float* gt = gates + t * batch * g4;
      gemmNT(hPrev, L.weightHh.value.data(), gt, batch, g4, h, true);
      float* ct = L.cells.data() + t * batch * h;
      float* tc = L.tanhCells.data() + t * batch * h;
      float* ht = L.output.data() + t * batch * h;
      for (int64_t b = 0; b < batch; ++b) {
        float* gb = gt + b * g4;
        for (int64_t k = 0; k < h; ++k) {
          const float i = sigmoid(gb[k]), f = sigmoid(gb[h + k]), g = std::tanh(gb[2 * h + k]), o = sigmoid(gb[3 * h + k]);
          gb[k] = i, gb[h + k] = f, gb[2 * h + k] = g, gb[3 * h + k] = o;  // keep the activations for backward
          const float c = f * cPrev[b * h + k] + i * g;
          ct[b * h + k] = c;
          tc[b * h + k] = std::tanh(c);
          ht[b * h + k] = o * tc[b * h + k];
        }
      }
      hPrev = ht;
      cPrev = ct;
    }
    // Carry the last states into the next window, cut from this one's graph.
    std::memcpy(L.h.data(), L.output.data() + (steps - 1) * batch * h, batch * h * sizeof(float));
    std::memcpy(L.c.data(), L.cells.data() + (steps - 1) * batch * h, batch * h * sizeof(float));
    x = L.output.clone();
    dropout(x, masks_[l + 1]);
  }
  decoderInput_ = x;
  ensureShape(logits_, {rows, v});
  for (int64_t r = 0; r < rows; ++r) std::memcpy(logits_.data() + r * v, decoderBias_.value.data(), v * sizeof(float));
  gemmNT(x.data(), encoder_.value.data(), logits_.data(), rows, v, h, true);
  ensureShape(gradLogits_, logits_.shape());
  double stats[2];
  ops_.softmaxCrossEntropy(logits_.data(), targets, rows, v, gradLogits_.data(), stats);
  if (correct) *correct = static_cast<int64_t>(stats[1]);
  const double loss = stats[0];
  if (!backward) return loss;

  // Decoder: dY = dlogits·W; dW (tied, written first) = dlogitsᵀ·Y; db = Σ_rows dlogits.
  Tensor dx({rows, h});
  gemmNN(gradLogits_.data(), encoder_.value.data(), dx.data(), rows, h, v, false);
  gemmTN(gradLogits_.data(), decoderInput_.data(), encoder_.grad.data(), v, h, rows, false);
  float* db = decoderBias_.grad.data();
  std::fill(db, db + v, 0.0f);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < v; ++j) db[j] += gradLogits_.data()[r * v + j];

  for (int64_t l = static_cast<int64_t>(layers_.size()) - 1; l >= 0; --l) {
    Layer& L = layers_[l];
    dropoutBackward(dx, masks_[l + 1]);
    // dG: gradients of the gate pre-activations, step by step from the last (dh flows backwards).
    Tensor dGates({rows, g4});
    std::vector<float> dhNext(batch * h, 0.0f), dcNext(batch * h, 0.0f);
    for (int64_t t = steps - 1; t >= 0; --t) {
      const float* gt = L.gates.data() + t * batch * g4;
      const float* tc = L.tanhCells.data() + t * batch * h;
      const float* cPrev = t > 0 ? L.cells.data() + (t - 1) * batch * h : L.c0.data();
      float* dg = dGates.data() + t * batch * g4;
      for (int64_t b = 0; b < batch; ++b)
        for (int64_t k = 0; k < h; ++k) {
          const int64_t s = b * h + k;
          const float i = gt[b * g4 + k], f = gt[b * g4 + h + k], g = gt[b * g4 + 2 * h + k], o = gt[b * g4 + 3 * h + k];
          const float dh = dx.data()[t * batch * h + s] + dhNext[s];
          const float dc = dh * o * (1.0f - tc[s] * tc[s]) + dcNext[s];
          dg[b * g4 + k] = dc * g * i * (1.0f - i);
          dg[b * g4 + h + k] = dc * cPrev[s] * f * (1.0f - f);
          dg[b * g4 + 2 * h + k] = dc * i * (1.0f - g * g);
          dg[b * g4 + 3 * h + k] = dh * tc[s] * o * (1.0f - o);
          dcNext[s] = dc * f;
        }
      // dh_{t−1} = dG_t · W_hh
      gemmNN(dg, L.weightHh.value.data(), dhNext.data(), batch, h, g4, false);
    }
    // Weight gradients over all steps at once; h_{t−1} is the output shifted by one step.
    Tensor hPrev({rows, h});
    std::memcpy(hPrev.data(), L.h0.data(), batch * h * sizeof(float));
    std::memcpy(hPrev.data() + batch * h, L.output.data(), (rows - batch) * h * sizeof(float));
    gemmTN(dGates.data(), L.input.data(), L.weightIh.grad.data(), g4, h, rows, false);
    gemmTN(dGates.data(), hPrev.data(), L.weightHh.grad.data(), g4, h, rows, false);
    float* dbi = L.biasIh.grad.data();
    std::fill(dbi, dbi + g4, 0.0f);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < g4; ++j) dbi[j] += dGates.data()[r * g4 + j];
    std::memcpy(L.biasHh.grad.data(), dbi, g4 * sizeof(float));
    gemmNN(dGates.data(), L.weightIh.value.data(), dx.data(), rows, h, g4, false);
  }
  dropoutBackward(dx, masks_[0]);
  // The embedding's gradient adds to the decoder's (one tied parameter).
  for (int64_t r = 0; r < rows; ++r) {
    float* row = encoder_.grad.data() + inputs_[r] * h;
    const float* d = dx.data() + r * h;
    for (int64_t k = 0; k < h; ++k) row[k] += d[k];
  }
  return loss;
}

}  // namespace accordion

#include "models/models.h"

#include <algorithm>
#include <cmath>

namespace accordion {

// A layer's channels in a model of the given width: rounded, at least 1.
static int64_t scaled(int64_t channels, double width) {
  return std::max<int64_t>(1, std::llround(static_cast<double>(channels) * width));
}

std::vector<std::string> architectures() { return {"resnet18", "vgg19bn", "lstm"}; }

// CIFAR ResNet-18: 3×3 stem without max-pool, BasicBlocks [2, 2, 2, 2], global average pool, linear.
static std::unique_ptr<Sequential> buildResNet18(Backend& ops, int64_t classes, double width, Random& rng) {
  auto net = std::make_unique<Sequential>(ops);
  const int64_t stemPlanes = scaled(64, width);
  auto stem = std::make_unique<Conv2d>(ops, 3, stemPlanes, 3, 1, 1, false, rng);
  stem->skipInputGradient();
  net->add("conv1", std::move(stem))
      .add("bn1", std::make_unique<BatchNorm2d>(ops, stemPlanes, Activation::Relu));
  int64_t inPlanes = stemPlanes;
  const int64_t planes[4] = {64, 128, 256, 512}, strides[4] = {1, 2, 2, 2};
  for (int stage = 0; stage < 4; ++stage) {
    auto layer = std::make_unique<Sequential>(ops);
    const int64_t stagePlanes = scaled(planes[stage], width);
    for (int block = 0; block < 2; ++block) {
      layer->add(std::to_string(block),
                 std::make_unique<BasicBlock>(ops, inPlanes, stagePlanes, block == 0 ? strides[stage] : 1, rng));
      inPlanes = stagePlanes;
    }
    net->add("layer" + std::to_string(stage + 1), std::move(layer));
  }
  net->add("pool", std::make_unique<ImagesToRows>(ops, ImagesToRows::kAverage)).add("linear", std::make_unique<Linear>(ops, inPlanes, classes, rng));
  return net;
}

// VGG-19 with batch norm (configuration E), conv init N(0, √(2/(k·k·C_out))) with zero bias;
// the CIFAR-10 classifier is C→512→512→10, the CIFAR-100 one C→4096→4096→100 (C the last
// convolution's channels, 512 at width 1), with dropout of probability `dropoutP` (0.5 by default;
// 0 turns it off, the layers stay for the state_dict's indices).
static std::unique_ptr<Sequential> buildVgg19bn(Backend& ops, int64_t classes, double width, float dropoutP, Random& rng, uint64_t seed,
                                                std::vector<Random*>& streams) {
  const int cfg[] = {64, 64, 0, 128, 128, 0, 256, 256, 256, 256, 0, 512, 512, 512, 512, 0, 512, 512, 512, 512, 0};
  auto features = std::make_unique<Sequential>(ops);
  int64_t in = 3, index = 0;
  for (int channels : cfg) {
    if (channels == 0) {
      features->add(std::to_string(index++), std::make_unique<MaxPool2d>(ops, 2, 2));
      continue;
    }
    const int64_t out = scaled(channels, width);
    auto conv = std::make_unique<Conv2d>(ops, in, out, 3, 1, 1, true, rng);
    if (index == 0) conv->skipInputGradient();
    const float stddev = std::sqrt(2.0f / static_cast<float>(9 * out));
    for (int64_t i = 0; i < conv->weight.value.numel(); ++i) conv->weight.value.data()[i] = stddev * rng.normal();
    conv->bias.value.fill(0.0f);
    features->add(std::to_string(index++), std::move(conv));
    features->add(std::to_string(index), std::make_unique<BatchNorm2d>(ops, out, Activation::Relu));
    index += 2;  // the ReLU's index too, as in PyTorch's features
    in = out;
  }
  auto classifier = std::make_unique<Sequential>(ops);
  const int64_t hidden = classes > 10 ? 4096 : 512;
  uint64_t dropoutSeed = seed * 1000003 + 17;
  auto dropout = [&]() {
    auto d = std::make_unique<Dropout>(ops, dropoutP, dropoutSeed++);
    streams.push_back(&d->rng());
    return d;
  };
  int64_t c = 0;
  classifier->add(std::to_string(c++), dropout());
  classifier->add(std::to_string(c++), std::make_unique<Linear>(ops, in, hidden, rng));
  classifier->add(std::to_string(c++), std::make_unique<ReLU>(ops, true));
  classifier->add(std::to_string(c++), dropout());
  classifier->add(std::to_string(c++), std::make_unique<Linear>(ops, hidden, hidden, rng));
  classifier->add(std::to_string(c++), std::make_unique<ReLU>(ops, true));
  if (classes > 10) classifier->add(std::to_string(c++), dropout());
  classifier->add(std::to_string(c++), std::make_unique<Linear>(ops, hidden, classes, rng));

  auto net = std::make_unique<Sequential>(ops);
  net->add("features", std::move(features)).add("flatten", std::make_unique<ImagesToRows>(ops, ImagesToRows::kFlatten)).add("classifier", std::move(classifier));
  return net;
}

// A vision network: a module tree over images, its loss the softmax cross-entropy of its logits.
class VisionNetwork : public Network {
 public:
  VisionNetwork(std::string architecture, std::unique_ptr<Sequential> root, std::vector<Random*> streams, Backend& ops)
      : architecture_(std::move(architecture)), ops_(ops), root_(std::move(root)), streams_(std::move(streams)) {
    root_->collectState("", state_);
    placeState(state_, ops);
    // The containers report each child whose backward has returned: its parameters' gradients (its
    // children's included) are final.
    moduleFinished_ = [this](Module& module) {
      auto it = moduleParameters_.find(&module);
      if (it == moduleParameters_.end()) {
        std::vector<Parameter*> parameters;
        module.addParameters(parameters);
        it = moduleParameters_.emplace(&module, std::move(parameters)).first;
      }
      if (!it->second.empty()) (*ready_)(it->second);
    };
  }
  void forwardLoss(const ModelInput& input, double* status) override {
    if (input.tokens) throw invalidArgument("model '" + architecture_ + "' takes images, not token windows");
    logits_ = root_->forward(input.images);
    ensureShape(gradLogits_, logits_.shape(), ops_);
    ops_.softmaxCrossEntropy(logits_.data(), input.labels.data(), logits_.dim(0), logits_.dim(1), gradLogits_.data(), status);
  }
  void backward(const GradientsReady* ready) override {
    if (ready != ready_) root_->setBackwardHook(ready ? &moduleFinished_ : nullptr);
    ready_ = ready;
    root_->backward(gradLogits_);
  }
  const Tensor& logits() const override { return logits_; }
  void setTraining(bool training) override { root_->setTraining(training); }
  bool training() const override { return root_->training(); }
  void freezeBatchNorm(bool frozen) override { root_->freezeBatchNorm(frozen); }
  StateRefs& state() override { return state_; }
  std::vector<Random*> randomStreams() override { return streams_; }

 private:
  std::string architecture_;
  Backend& ops_;
  std::unique_ptr<Sequential> root_;
  std::vector<Random*> streams_;
  StateRefs state_;
  Tensor logits_, gradLogits_;  // the last forward's
  const GradientsReady* ready_ = nullptr;
  Module::BackwardHook moduleFinished_;
  std::map<const Module*, std::vector<Parameter*>> moduleParameters_;
};

Model::Model(const ModelSpec& spec, Backend& backend) : spec_(spec) {
  if (spec.classes < 2) throw invalidArgument("a model needs at least 2 classes, got " + std::to_string(spec.classes));
  if (!(spec.dropout >= 0.0f && spec.dropout < 1.0f))
    throw invalidArgument("dropout must be in [0, 1), got " + std::to_string(spec.dropout));
  Random rng(spec.seed);
  if (spec.architecture == "resnet18") {
    net_ = std::make_unique<VisionNetwork>(spec.architecture, buildResNet18(backend, spec.classes, spec.width, rng), std::vector<Random*>{}, backend);
  } else if (spec.architecture == "vgg19bn") {
    std::vector<Random*> streams;
    auto root = buildVgg19bn(backend, spec.classes, spec.width, spec.dropout, rng, spec.seed, streams);
    net_ = std::make_unique<VisionNetwork>(spec.architecture, std::move(root), std::move(streams), backend);
  } else if (spec.architecture == "lstm") {
    net_ = std::make_unique<LanguageModel>(LanguageModelSpec{spec.classes, spec.hidden, spec.layers, spec.dropout, spec.seed}, backend);
  } else {
    throw invalidArgument("unknown model '" + spec.architecture + "' (known: resnet18, vgg19bn, lstm)");
  }
}

}  // namespace accordion

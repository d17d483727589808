#include "train/optimizer.h"

namespace accordion {

Sgd::Sgd(std::vector<Parameter*> parameters, SgdOptions options, Backend& backend)
    : parameters_(std::move(parameters)), options_(options), backend_(backend) {
  for (Parameter* p : parameters_) buffers_.push_back(backend.zeros(p->value.shape()));
}

void Sgd::step() {
  std::vector<SgdSlot> slots;
  slots.reserve(parameters_.size());
  for (size_t k = 0; k < parameters_.size(); ++k)
    slots.push_back({parameters_[k]->value.data(), parameters_[k]->grad.data(), buffers_[k].data(), parameters_[k]->value.numel()});
  const SgdHyper hyper{static_cast<float>(options_.learningRate), static_cast<float>(options_.momentum),
                       static_cast<float>(options_.weightDecay), options_.nesterov};
  backend_.sgdUpdate(slots, hyper, !started_);
  started_ = true;
}

}  // namespace accordion

#include "compress/staged_group.h"

namespace accordion {

float* StagedGroup::toHost(const float* data, int64_t count, std::vector<float>& host) {
  host.resize(static_cast<size_t>(count));
  backend_.download(host.data(), data, static_cast<size_t>(count) * sizeof(float));
  backend_.synchronize();
  return host.data();
}

void StagedGroup::allReduceSum(float* data, int64_t count) {
  host_.allReduceSum(toHost(data, count, in_), count);
  backend_.upload(data, in_.data(), static_cast<size_t>(count) * sizeof(float));
}

void StagedGroup::allGather(const float* input, int64_t count, float* output) {
  out_.resize(static_cast<size_t>(count * size()));
  host_.allGather(toHost(input, count, in_), count, out_.data());
  backend_.upload(output, out_.data(), out_.size() * sizeof(float));
}

void StagedGroup::broadcast(float* data, int64_t count, int root) {
  host_.broadcast(toHost(data, count, in_), count, root);
  backend_.upload(data, in_.data(), static_cast<size_t>(count) * sizeof(float));
}

}  // namespace accordion

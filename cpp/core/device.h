// Where a tensor lives and where ops run: the host, or one CUDA device.
#pragma once
#include <string>

#include "core/errors.h"

namespace accordion {

struct Device {
  enum class Kind { Cpu, Cuda };
  Kind kind = Kind::Cpu;
  int index = 0;  // the CUDA device ordinal

  static Device cpu() { return {}; }
  static Device cuda(int index = 0) { return {Kind::Cuda, index}; }
  bool isCpu() const { return kind == Kind::Cpu; }
  bool isCuda() const { return kind == Kind::Cuda; }
  bool operator==(const Device& other) const { return kind == other.kind && (isCpu() || index == other.index); }
  bool operator!=(const Device& other) const { return !(*this == other); }
  std::string name() const { return isCpu() ? "cpu" : "cuda:" + std::to_string(index); }
};

// "cpu", "cuda" (device 0) or "cuda:N".
inline Device parseDevice(const std::string& text) {
  if (text == "cpu") return Device::cpu();
  if (text == "cuda") return Device::cuda(0);
  if (text.rfind("cuda:", 0) == 0 && text.size() > 5 && text.size() < 9 &&
      text.find_first_not_of("0123456789", 5) == std::string::npos)
    return Device::cuda(std::stoi(text.substr(5)));
  throw invalidArgument("unknown device '" + text + "' (expected cpu, cuda or cuda:N)");
}

}  // namespace accordion

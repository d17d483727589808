// Errors thrown by the engine core. The N-API layer turns them into JS errors carrying `code`.
#pragma once
#include <stdexcept>
#include <string>

namespace accordion {

class EngineError : public std::runtime_error {
 public:
  EngineError(std::string code, const std::string& message) : std::runtime_error(message), code_(std::move(code)) {}
  const std::string& code() const { return code_; }

 private:
  std::string code_;
};

// Bad arguments that reached the core (shapes, options): a caller's mistake, not an engine fault.
inline EngineError invalidArgument(const std::string& message) { return EngineError("ERR_INVALID_ARGUMENT", message); }
// Numerical trouble such as NaN or Inf in a loss or a gradient.
inline EngineError numericalError(const std::string& message) { return EngineError("ERR_NUMERICAL", message); }

}  // namespace accordion

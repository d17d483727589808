// The kernel lab's comparison of an output against its reference, in plain C++ (no CUDA), so that it
// can be checked on any machine: compare_check.cpp runs comparisonSelfCheck() without a GPU, and
// kernel_check runs it before its first device check (kernel_check --self-check runs it alone).
//
// The error of an output is max_i |got_i − want_i| / max(max_i |want_i|, tiny). An element that is
// NaN or ±Inf on one side only, or NaN on both, fails the output outright: the lab poisons outputs
// with NaN bytes (0xFF) before every checked launch, so an element an op never writes fails. A
// check's error is the largest over its outputs, and a NaN among them stays NaN (std::max would
// drop it).
//
// checkRow() writes a check as one line of JSON, the lab's row in gpu-check.jsonl; compare_check
// --rows prints a few, which test/native/lab.test.js parses.
#pragma once
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

namespace accordion::lab {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// The larger of two errors, NaN when either is NaN.
inline double worseError(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return kNaN;
  return a < b ? b : a;
}

// One row of the report: an op on one shape, checked and timed.
struct Check {
  std::string op, shape;
  double tolerance = 0;
  double error = 0;  // the largest over the outputs compared
  bool pass = true;
  std::vector<std::string> failures;  // what failed, one line each
  double medianUs = kNaN, gbPerS = kNaN, fractionOfCopy = kNaN, gflopPerS = kNaN;
  std::string note;     // what the op chose for the shape (a convolution's algorithms), or empty
  std::string skipped;  // why the check was left out (a tensor beyond --max-elements), or empty

  void record(double outputError, double outputTolerance, const std::string& failure) {
    error = worseError(error, outputError);
    if (!(outputError <= outputTolerance)) fail(failure);
  }
  void fail(const std::string& why) {
    pass = false;
    failures.push_back(why);
  }
};

// An element of an output, with as many digits as tell its type's values apart.
inline std::string describe(const std::string& output, size_t index, double got, double want, int digits) {
  char text[128];
  std::snprintf(text, sizeof text, "[%zu]: got %.*g, want %.*g", index, digits, got, digits, want);
  return output + text;
}

template <typename T>
void compare(Check& check, const std::string& output, const std::vector<T>& got, const std::vector<T>& want, double tolerance) {
  if (got.size() != want.size()) {
    check.record(INFINITY, tolerance, output + ": " + std::to_string(got.size()) + " values, want " + std::to_string(want.size()));
    return;
  }
  double scale = std::numeric_limits<float>::min();
  for (const T w : want)
    if (std::isfinite(w) && std::fabs(static_cast<double>(w)) > scale) scale = std::fabs(static_cast<double>(w));
  double worst = 0;
  size_t worstAt = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = got[i], w = want[i];
    if (g == w) continue;  // infinities of the same sign included
    if (!std::isfinite(g) || !std::isfinite(w)) {
      check.record(INFINITY, tolerance,
                   describe(output, i, g, w, std::numeric_limits<T>::max_digits10) + " (NaN or Inf: not written, or not finite)");
      return;
    }
    const double e = std::fabs(g - w) / scale;
    if (!(e <= worst)) worst = e, worstAt = i;  // a NaN would be kept, never skipped
  }
  check.record(worst, tolerance, worst > 0 ? describe(output, worstAt, got[worstAt], want[worstAt], std::numeric_limits<T>::max_digits10)
                                  : output);
}

inline void compare(Check& check, const std::string& output, double got, double want, double tolerance) {
  compare(check, output, std::vector<double>{got}, std::vector<double>{want}, tolerance);
}

// ---- Rows ----------------------------------------------------------------------------------------

inline std::string jsonString(const std::string& s) {
  std::string out = "\"";
  for (const char ch : s) {
    if (ch == '"' || ch == '\\') {
      out += '\\';
      out += ch;
    } else if (static_cast<unsigned char>(ch) < 0x20) {
      char escaped[8];
      std::snprintf(escaped, sizeof escaped, "\\u%04x", static_cast<unsigned>(static_cast<unsigned char>(ch)));
      out += escaped;
    } else {
      out += ch;
    }
  }
  return out + "\"";
}

// null for what was not measured, and for an error that is not a number (NaN, Inf).
inline std::string jsonNumber(double v) {
  if (!std::isfinite(v)) return "null";
  char text[32];
  std::snprintf(text, sizeof text, "%.6g", v);
  return text;
}

// A check as one JSON object on one line: the stage and op family it ran in, the op and shape, the
// verdict and error, the timings, what failed, and where present the op's choices and why it was
// skipped.
inline std::string checkRow(const Check& c, const std::string& stage, const std::string& family) {
  std::string failures;
  for (const std::string& f : c.failures) failures += (failures.empty() ? "" : ", ") + jsonString(f);
  std::string row = "{\"stage\": " + jsonString(stage) + ", \"family\": " + jsonString(family) + ", \"op\": " + jsonString(c.op) +
                    ", \"shape\": " + jsonString(c.shape) + ", \"pass\": " + (c.pass ? "true" : "false") +
                    ", \"error\": " + jsonNumber(c.error) + ", \"tolerance\": " + jsonNumber(c.tolerance) +
                    ", \"medianUs\": " + jsonNumber(c.medianUs) + ", \"gbPerS\": " + jsonNumber(c.gbPerS) +
                    ", \"fractionOfCopy\": " + jsonNumber(c.fractionOfCopy) + ", \"gflopPerS\": " + jsonNumber(c.gflopPerS) +
                    ", \"failures\": [" + failures + "]";
  if (!c.note.empty()) row += ", \"algorithms\": " + jsonString(c.note);
  if (!c.skipped.empty()) row += ", \"skipped\": " + jsonString(c.skipped);
  return row + "}";
}

// Checks compare() and Check against cases whose verdicts are known, including an output left
// unwritten (poison bytes) and NaN errors. Returns what went wrong, one line each; empty when the
// comparison is sound.
inline std::vector<std::string> comparisonSelfCheck() {
  std::vector<std::string> problems;
  const float nanF = std::numeric_limits<float>::quiet_NaN(), infF = std::numeric_limits<float>::infinity();
  // Runs compare() on one case and checks its verdict, and that the error reads as `error` says.
  enum class Error { Zero, Finite, Infinite };
  auto expect = [&](const std::string& name, const std::vector<float>& got, const std::vector<float>& want, double tolerance, bool pass,
                    Error error) {
    Check c;
    compare(c, "out", got, want, tolerance);
    const bool errorRight = error == Error::Zero       ? c.error == 0
                            : error == Error::Finite   ? std::isfinite(c.error) && c.error > 0
                                                       : std::isinf(c.error);
    if (c.pass != pass) problems.push_back(name + ": " + (c.pass ? "passed" : "failed") + ", want " + (pass ? "pass" : "fail"));
    if (!errorRight) problems.push_back(name + ": error " + std::to_string(c.error));
    if (!pass && c.failures.empty()) problems.push_back(name + ": failed without saying why");
  };
  // An output of four floats whose element `at` was never written: the lab's poison, 0xFF bytes.
  auto unwritten = [](std::vector<float> values, size_t at) {
    std::memset(&values[at], 0xFF, sizeof(float));
    return values;
  };
  const std::vector<float> want = {1.0f, -2.0f, 0.5f, 4.0f};

  expect("equal outputs", want, want, 0, true, Error::Zero);
  expect("one rounding apart, tolerance 1e-6", {1.0f, -2.0f, std::nextafter(0.5f, 1.0f), 4.0f}, want, 1e-6, true, Error::Finite);
  expect("one rounding apart, exact", {1.0f, -2.0f, std::nextafter(0.5f, 1.0f), 4.0f}, want, 0, false, Error::Finite);
  expect("beyond the tolerance", {1.0f, -2.0f, 0.6f, 4.0f}, want, 1e-3, false, Error::Finite);
  expect("the last element unwritten", unwritten(want, 3), want, 1e-3, false, Error::Infinite);
  expect("the first element unwritten", unwritten(want, 0), want, 1e-3, false, Error::Infinite);
  expect("nothing written", unwritten(unwritten(unwritten(unwritten(want, 0), 1), 2), 3), want, 1e-3, false, Error::Infinite);
  expect("reference unwritten", want, unwritten(want, 1), 1e-3, false, Error::Infinite);
  expect("both unwritten", unwritten(want, 2), unwritten(want, 2), 1e-3, false, Error::Infinite);
  expect("NaN in the output", {1.0f, nanF, 0.5f, 4.0f}, want, 1, false, Error::Infinite);
  expect("Inf in the output", {1.0f, -2.0f, infF, 4.0f}, want, 1, false, Error::Infinite);
  expect("Inf against -Inf", {1.0f, -2.0f, infF, 4.0f}, {1.0f, -2.0f, -infF, 4.0f}, 1, false, Error::Infinite);
  expect("Inf on both sides", {1.0f, -2.0f, infF, 4.0f}, {1.0f, -2.0f, infF, 4.0f}, 0, true, Error::Zero);
  expect("fewer values", {1.0f, -2.0f, 0.5f}, want, 1, false, Error::Infinite);

  // Scalars (the double overload) follow the same rules.
  {
    Check c;
    compare(c, "scalar", kNaN, 1.0, 1.0);
    if (c.pass) problems.push_back("a NaN scalar passed");
  }
  // A check's error keeps a NaN whichever output brought it, and a NaN error never passes.
  {
    Check c;
    c.record(kNaN, 1.0, "first output");
    c.record(0.5, 1.0, "second output");
    if (!std::isnan(c.error)) problems.push_back("a NaN error was replaced by a later finite one: " + std::to_string(c.error));
    if (c.pass) problems.push_back("a NaN error passed");
  }
  {
    Check c;
    c.record(0.5, 1.0, "first output");
    c.record(kNaN, 1.0, "second output");
    if (!std::isnan(c.error)) problems.push_back("a NaN error was dropped after a finite one: " + std::to_string(c.error));
    if (c.pass) problems.push_back("a NaN error passed after a finite one");
  }
  return problems;
}

}  // namespace accordion::lab

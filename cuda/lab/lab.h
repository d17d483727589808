// The kernel lab's harness (kernel_check.cu runs it): the tolerances, twins of a buffer on both
// backends, and the Lab that runs, compares and times one check (inputs.h: its random inputs and
// shapes). The checks of each op family are in checks/, a file per family, each a function
// `check<Family>(Lab&)` listed in kernel_check.cu's table.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "lab/compare.h"
#include "core/check.h"
#include "core/random.h"
#include "ops/cpu_backend.h"
#include "ops/cuda_backend.h"
#include "lab/inputs.h"

namespace accordion::lab {

// ---- Tolerances: the largest max_i |got_i − want_i| / max_i |want_i| accepted for an output ---------
// Exact where both devices do the same single float operation per element, or none: copies, fill,
// ReLU, adds, scaling, dropout, flatten, the list scan and accumulation, max-pool values and the
// routing of non-overlapping max-pool gradients, bias broadcasts, embedding gathers, and the
// embedding gradient's additions (the same ones, in the same order).
constexpr double kExact = 0;
// One rounding apart: dy·(1/(H·W)) against dy/(H·W), or up to four overlapping max-pool gradients
// summed in another order.
constexpr double kOneRounding = 1e-6;
// Global average pooling sums H·W floats in another order. The mean of random inputs shrinks like
// 1/√(H·W) while the rounding of the sum does not, so relative to the largest mean the difference
// grows like ε·√(H·W): the CPU's is 2.3e-6 from float64 at 64×64.
constexpr double kPoolingSum = 1e-5;
// Softmax cross-entropy, SGD and batch-norm inference: a few roundings per element (exp, fused
// multiply-adds on the GPU only) and the softmax denominator summed in another order.
constexpr double kFewRoundings = 1e-5;
// Batch norm's reductions over N·H·W values per channel (the statistics, Σdy and Σdy·x̂). The
// reference of the training forward and of the backward is computed in float64 on the host
// (batchNormReference), not by the CPU's oneDNN, which accumulates in float per thread: against
// float64 its batch variance is off by 2.4e-5 at (128,64,32,32) with one OpenMP thread and by
// 6e-7 with 16, so a tolerance against it would depend on the thread count. Against float64 this
// covers the GPU's own float accumulation within a block (double across blocks).
constexpr double kBatchNorm = 1e-4;
// Convolutions and linear layers: fp32 dot products of up to 4,608 terms, and weight gradients
// summed over up to 131,072 positions, in another order and blocking (the CPU's conv weight
// gradient is 2e-6 from float64 at (128,64,32,32)). TF32 must be off: it alone would differ by ~1e-3.
constexpr double kMatmul = 1e-4;
// cuDNN's transform convolutions (FFT, non-fused Winograd), which the fastest choice may take: a
// weight gradient 2.2e-3 from float64 was seen (VGG-19bn's first layer at batch 4).
constexpr double kTransformConvolution = 5e-3;
// TF32 tensor cores (options.tf32) round each input of a product to 10 mantissa bits (2⁻¹¹
// relative) and sum in fp32: over products of random signs the error grows like the output itself,
// about 1e-3 of it, against the CPU's fp32.
constexpr double kTf32 = 1e-2;
// bf16 convolutions on the GPU write bf16 (cuDNN's bf16 configuration) where the CPU writes fp32:
// each output one bf16 rounding (2⁻⁹ relative) from the CPU's.
constexpr double kBf16Result = 5e-3;
// Sums of squares are accumulated in double on both devices.
constexpr double kDoubleSum = 1e-9;
// Column sums over up to 33,278 rows: one float sum per column on the CPU, float per thread then
// double on the GPU.
constexpr double kColumnSums = 1e-5;

// Thrown when a check would need a tensor beyond --max-elements: the check is reported as skipped.
// ---- Results -------------------------------------------------------------------------------------

// Check, compare() and their self-check live in compare.h, which needs no CUDA.

// What one timed launch must do, for the rates derived from its time.
struct Work {
  double deviceBytes = 0;  // read and written in device memory: memory-bound ops
  double hostBytes = 0;    // between host and device: transfers
  double flops = 0;        // compute-bound ops
  static Work memory(double bytes) { return {bytes, 0, 0}; }
  static Work transfer(double bytes) { return {0, bytes, 0}; }
  static Work compute(double flops) { return {0, 0, flops}; }
  static Work none() { return {}; }
};

// ---- The harness -----------------------------------------------------------------------------------

// One buffer on both backends. An activation (N, C, H, W) is stored NHWC on the CPU and in the GPU
// backend's layout (NCHW, or NHWC where options.channelsLast says so) on the GPU; anything else (parameters, (N, C) and (N, K) tensors, list entries) has one layout everywhere.
// A twin of size 0 stands for an absent argument: both pointers are null.
template <typename T>
struct Twin {
  Array<T> cpu, gpu;
  std::optional<Dims> activation;
  T* on(const Backend& backend) { return backend.device().isCuda() ? gpu.data() : cpu.data(); }
  int64_t size() const { return cpu.size(); }
  size_t bytes() const { return cpu.bytes(); }
};

// One prepared op (convolution, batch norm, pooling) on both backends.
template <typename Op>
struct TwinOp {
  std::unique_ptr<Op> cpu, gpu;
  Op& on(const Backend& backend) { return backend.device().isCuda() ? *gpu : *cpu; }
};

class Events {  // CUDA events that destroy themselves
 public:
  explicit Events(size_t count) : events_(count, nullptr) {
    for (cudaEvent_t& e : events_) cuda::check(cudaEventCreate(&e), "cudaEventCreate");
  }
  ~Events() {
    for (cudaEvent_t e : events_)
      if (e) cudaEventDestroy(e);
  }
  Events(const Events&) = delete;
  Events& operator=(const Events&) = delete;
  cudaEvent_t operator[](size_t i) const { return events_[i]; }

 private:
  std::vector<cudaEvent_t> events_;
};

inline std::string formatted(const char* pattern, double value) {
  if (!std::isfinite(value)) return std::isnan(value) ? "-" : "inf";
  char text[48];
  std::snprintf(text, sizeof text, pattern, value);
  return text;
}

inline void printHeader() {
  std::printf("%-7s %9s %9s %11s %9s %7s %9s  %-29s %s\n", "result", "error", "tolerance", "median us", "GB/s", "% copy", "GFLOP/s",
              "op", "shape");
}

inline void printRow(const Check& c) {
  const char* result = !c.skipped.empty() ? "skip" : c.pass ? "ok" : "FAILED";
  std::printf("%-7s %9s %9s %11s %9s %7s %9s  %-29s %s\n", result, formatted("%.2e", c.error).c_str(),
              c.tolerance == 0 ? "exact" : formatted("%.0e", c.tolerance).c_str(), formatted("%.1f", c.medianUs).c_str(),
              formatted("%.1f", c.gbPerS).c_str(), formatted("%.1f%%", 100 * c.fractionOfCopy).c_str(),
              formatted("%.1f", c.gflopPerS).c_str(), c.op.c_str(), c.shape.c_str());
  for (const std::string& f : c.failures) std::printf("        -> %s\n", f.c_str());
  if (!c.skipped.empty()) std::printf("        -> skipped: %s\n", c.skipped.c_str());
  if (!c.note.empty()) std::printf("        -> %s\n", c.note.c_str());
  std::fflush(stdout);
}

class Lab {
 public:
  // `rows`, when open, receives every check as a line of JSON (lab::checkRow) as soon as it ends.
  Lab(CpuBackend& cpuBackend, cuda::CudaBackend& gpuBackend, uint64_t seed, int iterations, int64_t maxElements = 0,
      std::FILE* rows = nullptr, std::string stage = "lab")
      : cpu(cpuBackend),
        gpu(gpuBackend),
        random(seed, maxElements),
        iterations_(iterations),
        maxElements_(maxElements),
        rows_(rows),
        stage_(std::move(stage)) {}

  CpuBackend& cpu;
  cuda::CudaBackend& gpu;
  RandomInputs random;
  double copyGBs = kNaN;  // the yardstick for memory-bound ops, set once measured
  std::string family;     // the op family now running, for the rows
  std::string variant;    // appended to each check's shape: the GPU's activation layout when not NCHW
  std::vector<Check> results;
  std::vector<std::string> resultFamilies;  // results[i] ran in family resultFamilies[i]

  // Why the CUDA context is unusable, once a fault broke it; empty while it works.
  const std::string& lostContext() const { return lostContext_; }

  // Runs one check: `body` prepares inputs, runs both backends, compares and times. An exception
  // (an op that throws, a CUDA error) fails the check; the lab goes on with the next.
  void run(const std::string& op, const std::string& shape, double tolerance, const std::function<void(Check&)>& body) {
    Check check;
    check.op = op;
    check.shape = shape + variant;
    check.tolerance = tolerance;
    if (!lostContext_.empty()) {
      check.error = kNaN;
      check.fail("not run: the CUDA context was lost earlier (" + lostContext_ + ")");
    } else {
      try {
        body(check);
      } catch (const Skipped& e) {  // nothing compared counts: the check did not run
        check = Check{};
        check.op = op;
        check.shape = shape + variant;
        check.tolerance = tolerance;
        check.skipped = e.what();
      } catch (const std::exception& e) {
        check.error = kNaN;
        check.fail(std::string("threw: ") + e.what());
        // A fault in a kernel (an illegal address, say) breaks the CUDA context for good, and every
        // later call would fail with it: the checks after this one are reported as not run.
        cudaGetLastError();  // clears an error that does not outlive its call
        const cudaError_t status = cudaDeviceSynchronize();
        if (status != cudaSuccess) lostContext_ = cudaGetErrorString(status);
      }
    }
    printRow(check);
    if (rows_) {
      std::fprintf(rows_, "%s\n", checkRow(check, stage_, family).c_str());
      std::fflush(rows_);
    }
    results.push_back(std::move(check));
    resultFamilies.push_back(family);
  }

  template <typename T>
  Twin<T> empty(int64_t size, std::optional<Dims> activation = std::nullopt) {
    if (maxElements_ > 0 && size > maxElements_)
      throw Skipped(std::to_string(size) + " elements, beyond --max-elements " + std::to_string(maxElements_));
    return Twin<T>{Array<T>(size, cpu), Array<T>(size, gpu), activation};
  }
  Twin<float> activation(const Dims& d) { return empty<float>(d.numel(), d); }

  // Host data (NCHW when an activation) on both backends, each in its own layout.
  template <typename T>
  Twin<T> input(const std::vector<T>& host, std::optional<Dims> activation = std::nullopt) {
    Twin<T> t = empty<T>(static_cast<int64_t>(host.size()), activation);
    if (t.size() == 0) return t;
    std::vector<T> channelsLast;
    if constexpr (std::is_same_v<T, float>) {
      if (activation) {
        channelsLast.resize(host.size());
        nchwToNhwc(host.data(), channelsLast.data(), activation->n, activation->c, activation->h, activation->w);
      }
    }
    const bool converted = !channelsLast.empty();
    std::memcpy(t.cpu.data(), converted ? channelsLast.data() : host.data(), t.bytes());
    gpu.upload(t.gpu.data(), converted && gpu.channelsLast() ? channelsLast.data() : host.data(), t.bytes());
    return t;
  }

  // 0xFF bytes are a quiet NaN both as float and as double: whatever an op leaves unwritten fails
  // the comparison. Written with memset, not with the backends' fill, which is itself under test.
  template <typename T>
  void poison(Twin<T>& t) {
    if (t.size() == 0) return;
    std::memset(t.cpu.data(), 0xFF, t.bytes());
    cuda::check(cudaMemsetAsync(t.gpu.data(), 0xFF, t.bytes(), gpu.stream()), "poisoning an output");
  }

  // Poisons the outputs, then runs `op` on the CPU (the reference) and on the GPU.
  template <typename... Outputs>
  void both(const std::function<void(Backend&)>& op, Twin<Outputs>&... outputs) {
    (poison(outputs), ...);
    op(cpu);
    op(gpu);
  }

  // Poisons the outputs, then runs `op` on the GPU alone: for checks whose reference is computed on
  // the host in float64.
  template <typename... Outputs>
  void onGpu(const std::function<void(Backend&)>& op, Twin<Outputs>&... outputs) {
    (poison(outputs), ...);
    op(gpu);
  }

  // A twin's contents on the host, NCHW when an activation.
  template <typename T>
  std::vector<T> fromGpu(const Twin<T>& t) {
    std::vector<T> host(static_cast<size_t>(t.size()));
    gpu.download(host.data(), t.gpu.data(), t.bytes());
    gpu.synchronize();
    return gpu.channelsLast() ? channelsFirst(t, std::move(host)) : host;
  }
  template <typename T>
  std::vector<T> fromCpu(const Twin<T>& t) {
    std::vector<T> host(static_cast<size_t>(t.size()));
    if (t.size() == 0) return host;
    std::memcpy(host.data(), t.cpu.data(), t.bytes());
    return channelsFirst(t, std::move(host));
  }
  // `host`, a copy of twin t in channels-last order, in NCHW when t is an activation.
  template <typename T>
  static std::vector<T> channelsFirst(const Twin<T>& t, std::vector<T> host) {
    if constexpr (std::is_same_v<T, float>) {
      if (t.activation && !host.empty()) {
        std::vector<T> nchw(host.size());
        nhwcToNchw(host.data(), nchw.data(), t.activation->n, t.activation->c, t.activation->h, t.activation->w);
        return nchw;
      }
    }
    return host;
  }

  // The GPU's output against the CPU's.
  template <typename T>
  void expect(Check& check, const std::string& output, const Twin<T>& t, double tolerance) {
    compare(check, output, fromGpu(t), fromCpu(t), tolerance);
  }
  template <typename T>
  void expect(Check& check, const std::string& output, const Twin<T>& t) {
    expect(check, output, t, check.tolerance);
  }

  // Times `op` on the GPU and derives its rates from the work it must do.
  void measure(Check& check, const std::function<void(Backend&)>& op, const Work& work) {
    check.medianUs = medianUs([&] { op(gpu); });
    const double perUs = 1.0 / (check.medianUs * 1e3);  // units per µs → G units per second
    if (work.deviceBytes > 0) {
      check.gbPerS = work.deviceBytes * perUs;
      check.fractionOfCopy = check.gbPerS / copyGBs;
    } else if (work.hostBytes > 0) {
      check.gbPerS = work.hostBytes * perUs;
    }
    if (work.flops > 0) check.gflopPerS = work.flops * perUs;
  }

  // The median time of `launch` in µs between CUDA events on the backend's stream, after warm-up
  // (which also lets the libraries pick their algorithms). Host work inside `launch` that the
  // stream waits for (staged uploads, argument tables, results read back) counts: it is the op's.
  double medianUs(const std::function<void()>& launch) {
    const int warmUp = std::max(2, iterations_ / 10);
    for (int i = 0; i < warmUp; ++i) launch();
    gpu.synchronize();
    const size_t n = static_cast<size_t>(iterations_);
    Events events(2 * n);
    for (size_t i = 0; i < n; ++i) {
      cuda::check(cudaEventRecord(events[2 * i], gpu.stream()), "cudaEventRecord");
      launch();
      cuda::check(cudaEventRecord(events[2 * i + 1], gpu.stream()), "cudaEventRecord");
    }
    gpu.synchronize();  // also reports a fault in the timed launches
    std::vector<double> us(n);
    for (size_t i = 0; i < n; ++i) {
      float ms = 0;
      cuda::check(cudaEventElapsedTime(&ms, events[2 * i], events[2 * i + 1]), "cudaEventElapsedTime");
      us[i] = 1e3 * ms;
    }
    std::sort(us.begin(), us.end());
    return n % 2 ? us[n / 2] : (us[n / 2 - 1] + us[n / 2]) / 2;
  }

 private:
  int iterations_;
  int64_t maxElements_;
  std::FILE* rows_;
  std::string stage_;
  std::string lostContext_;  // why, once the CUDA context is unusable
};

// Twins of host tensors, and the spans of a list on one backend.
inline std::vector<Twin<float>> inputs(Lab& lab, const std::vector<std::vector<float>>& hosts) {
  std::vector<Twin<float>> twins;
  for (const std::vector<float>& host : hosts) twins.push_back(lab.input(host));
  return twins;
}

inline std::vector<std::vector<float>> normals(Lab& lab, const std::vector<int64_t>& sizes) {
  std::vector<std::vector<float>> hosts;
  for (int64_t size : sizes) hosts.push_back(lab.random.normal(size));
  return hosts;
}

inline std::vector<ConstSpan> constSpans(std::vector<Twin<float>>& list, const Backend& b) {
  std::vector<ConstSpan> spans;
  for (Twin<float>& t : list) spans.push_back({t.on(b), t.size()});
  return spans;
}

inline std::vector<Span> spans(std::vector<Twin<float>>& list, const Backend& b) {
  std::vector<Span> out;
  for (Twin<float>& t : list) out.push_back({t.on(b), t.size()});
  return out;
}

inline std::string indexed(const char* name, size_t i) { return std::string(name) + "[" + std::to_string(i) + "]"; }

inline std::string dims(std::initializer_list<int64_t> sizes) {
  std::string label = "(";
  for (int64_t size : sizes) label += (label.size() > 1 ? "," : "") + std::to_string(size);
  return label + ")";
}

// ---- The op families (checks/) ---------------------------------------------------------------------

void checkMemory(Lab& lab);
void checkFill(Lab& lab);
void checkRelu(Lab& lab);
void checkAdd(Lab& lab);
void checkScale(Lab& lab);
void checkDropout(Lab& lab);
void checkGlobalAvgPool(Lab& lab);
void checkFlatten(Lab& lab);
void checkLinear(Lab& lab);
void checkGemm(Lab& lab);
void checkBias(Lab& lab);
void checkEmbedding(Lab& lab);
void checkLstmCell(Lab& lab);
void checkSoftmaxCrossEntropy(Lab& lab);
void checkSgdUpdate(Lab& lab);
void checkFindNonFinite(Lab& lab);
void checkAccumulate(Lab& lab);
void checkSumsOfSquares(Lab& lab);
void checkClipTotalNorm(Lab& lab);
void checkConv2d(Lab& lab);
void checkBatchNorm2d(Lab& lab);
void checkMaxPool2d(Lab& lab);
void checkPowerSgd(Lab& lab);
void checkTopK(Lab& lab);
void checkDenseExchange(Lab& lab);
// The float64 batch-norm reference against the CPU's batch norm (no device needed): its problems.
std::vector<std::string> batchNormReferenceSelfCheck();

}  // namespace accordion::lab

// The kernel lab: every CUDA op (cuda/ops/) and compression kernel checked against
// its CPU twin (cpp/ops/) on fresh random inputs, then timed with CUDA events, in the
// manner of llm.c's dev/cuda. It needs no Node (the GPU machines have none):
//
//   kernel_check [--iterations N] [--seed S] [--json FILE] [--jsonl FILE] [--stage NAME]
//                [--only NAME[,NAME...]] [--max-elements N]
//   kernel_check --device-info     the device as one JSON line, after one kernel ran on it
//   kernel_check --self-check      the comparison and the float64 references alone, on the CPU; no device needed
//
// scripts/gpu-check.sh runs one process per op family (--only FAMILY), so that a fault that breaks
// the CUDA context of one family leaves the others measured, and collects the rows that --jsonl
// appends to its results as each check ends (flushed, so a killed process leaves every finished row).
//
// Each check runs the same inputs through a CpuBackend and a CudaBackend(0) and compares every
// output, the CPU's being the reference. Inputs are drawn in NCHW; the CPU keeps activations NHWC,
// so they are converted on the way in and its results converted back before comparing. Outputs are
// poisoned with NaN before every checked launch, so an element an op never writes fails, and the
// error metric fails any NaN or Inf that is not on both sides alike. Then the GPU op alone is timed
// on the backend's stream: the median of N launches after warm-up, with the bandwidth reached by
// memory-bound ops (against a device-to-device copy's) and the arithmetic rate of compute-bound ones.
//
// Exit status: 0 when every check passes (skipped ones included); 1 when one fails; 2 on bad usage;
// 3 when no device is usable; 4 when a fault broke the CUDA context (the checks after it not run).
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

#include "compare.h"
#include "core/check.h"
#include "core/random.h"
#include "ops/cpu_backend.h"
#include "ops/cuda_backend.h"

namespace accordion {
namespace {

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
// Sums of squares are accumulated in double on both devices.
constexpr double kDoubleSum = 1e-9;
// Column sums over up to 33,278 rows: one float sum per column on the CPU, float per thread then
// double on the GPU.
constexpr double kColumnSums = 1e-5;

// ---- Command line ----------------------------------------------------------------------------

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Thrown when a check would need a tensor beyond --max-elements: the check is reported as skipped.
struct Skipped : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct Options {
  int iterations = 50;
  std::optional<uint64_t> seed;
  std::string jsonPath;
  std::string jsonlPath;          // --jsonl: a row per check, appended as it ends
  std::string stage = "lab";      // the rows' "stage"
  std::vector<std::string> only;  // op families; empty: all
  int64_t maxElements = 0;        // --max-elements: checks with a larger tensor are skipped; 0: none
  bool help = false;
  bool selfCheckOnly = false;  // --self-check: the comparison's own check, no device needed
  bool deviceInfo = false;     // --device-info: the device as one JSON line, then exit
};

uint64_t parseUnsigned(const std::string& flag, const std::string& text, uint64_t max) {
  char* end = nullptr;
  errno = 0;
  const unsigned long long value = std::strtoull(text.c_str(), &end, 10);
  if (text.empty() || text[0] == '-' || *end != '\0' || errno == ERANGE || value > max)
    throw UsageError(flag + " takes a whole number up to " + std::to_string(max) + ", not '" + text + "'");
  return value;
}

Options parseOptions(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") {
      options.help = true;
      continue;
    }
    if (flag == "--self-check") {
      options.selfCheckOnly = true;
      continue;
    }
    if (flag == "--device-info") {
      options.deviceInfo = true;
      continue;
    }
    if (flag != "--iterations" && flag != "--seed" && flag != "--json" && flag != "--jsonl" && flag != "--stage" &&
        flag != "--only" && flag != "--max-elements")
      throw UsageError("unknown argument '" + flag + "'");
    if (i + 1 >= argc) throw UsageError(flag + " needs a value");
    const std::string value = argv[++i];
    if (flag == "--iterations") {
      options.iterations = static_cast<int>(parseUnsigned(flag, value, 100000));
      if (options.iterations == 0) throw UsageError("--iterations must be at least 1");
    } else if (flag == "--seed") {
      options.seed = parseUnsigned(flag, value, (uint64_t{1} << 53) - 1);  // exact as a JSON number
    } else if (flag == "--json") {
      options.jsonPath = value;
    } else if (flag == "--jsonl") {
      options.jsonlPath = value;
    } else if (flag == "--stage") {
      if (value.empty()) throw UsageError("--stage needs a name");
      options.stage = value;
    } else if (flag == "--max-elements") {
      options.maxElements = static_cast<int64_t>(parseUnsigned(flag, value, int64_t{1} << 40));
      if (options.maxElements == 0) throw UsageError("--max-elements must be at least 1");
    } else {
      size_t start = 0;
      while (start <= value.size()) {
        const size_t comma = std::min(value.find(',', start), value.size());
        if (comma > start) options.only.push_back(value.substr(start, comma - start));
        start = comma + 1;
      }
      if (options.only.empty()) throw UsageError("--only needs at least one name");
    }
  }
  return options;
}

// ---- Random inputs -----------------------------------------------------------------------------

// Runs body(i) for every i in [0, count) on all cores (drawing large inputs on one would take seconds).
void parallelFor(int64_t count, const std::function<void(int64_t)>& body) {
  const int64_t threads = std::min<int64_t>(count, std::max(1u, std::thread::hardware_concurrency()));
  std::atomic<int64_t> next{0};
  auto work = [&] {
    for (int64_t i = next++; i < count; i = next++) body(i);
  };
  std::vector<std::thread> pool;
  for (int64_t t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
}

uint64_t mix(uint64_t x) { return finalise(x + kGolden); }  // nearby seeds give unrelated generators

// The inputs of one run, reproducible from its seed. Each draw is cut into chunks of a fixed size,
// each from its own generator seeded by (seed, draw, chunk), so the numbers do not depend on how
// many cores draw them.
class RandomInputs {
 public:
  explicit RandomInputs(uint64_t seed, int64_t maxElements = 0) : seed_(seed), maxElements_(maxElements) {}

  std::vector<float> normal(int64_t n, float mean = 0.0f, float stddev = 1.0f) {
    return draw<float>(n, std::normal_distribution<float>(mean, stddev));
  }
  // Variances: |N(0, 1)| + 0.5.
  std::vector<float> positive(int64_t n) {
    std::vector<float> v = normal(n);
    for (float& x : v) x = std::fabs(x) + 0.5f;
    return v;
  }
  std::vector<uint8_t> bernoulli(int64_t n, double p) { return draw<uint8_t>(n, std::bernoulli_distribution(p)); }
  std::vector<int32_t> labels(int64_t n, int32_t classes) {
    return draw<int32_t>(n, std::uniform_int_distribution<int32_t>(0, classes - 1));
  }
  int64_t index(int64_t n) { return draw<int64_t>(1, std::uniform_int_distribution<int64_t>(0, n - 1))[0]; }
  float scalar() { return normal(1)[0]; }

 private:
  static constexpr int64_t kChunk = int64_t{1} << 20;

  template <typename T, typename Distribution>
  std::vector<T> draw(int64_t n, const Distribution& distribution) {
    if (maxElements_ > 0 && n > maxElements_)  // before drawing: large draws take seconds
      throw Skipped(std::to_string(n) + " elements, beyond --max-elements " + std::to_string(maxElements_));
    std::vector<T> out(static_cast<size_t>(n));
    const uint64_t stream = mix(seed_ ^ mix(++draws_));
    parallelFor((n + kChunk - 1) / kChunk, [&](int64_t chunk) {
      std::mt19937_64 engine(mix(stream + static_cast<uint64_t>(chunk)));
      Distribution d = distribution;
      const int64_t end = std::min(n, (chunk + 1) * kChunk);
      for (int64_t i = chunk * kChunk; i < end; ++i) out[static_cast<size_t>(i)] = static_cast<T>(d(engine));
    });
    return out;
  }

  uint64_t seed_, draws_ = 0;
  int64_t maxElements_;
};

// ---- Shapes --------------------------------------------------------------------------------------

struct Dims {  // an activation (N, C, H, W)
  int64_t n, c, h, w;
  int64_t numel() const { return n * c * h * w; }
  std::string label() const {
    return "(" + std::to_string(n) + "," + std::to_string(c) + "," + std::to_string(h) + "," + std::to_string(w) + ")";
  }
};

// Element counts: single elements, counts that are not multiples of 4 (the tails of vectorised
// loops), primes, a ResNet-18 activation at batch 128, and 64 Mi floats (256 MiB, far beyond the
// H100's 50 MB L2) for bandwidth.
const std::vector<int64_t> kElementCounts = {1, 3, 4, 997, 65537, 128 * 64 * 32 * 32, int64_t{64} << 20};

std::string countLabel(int64_t n) { return "n=" + std::to_string(n); }

// The parameters of CIFAR ResNet-18 (models/models.cpp) in order: 62 tensors, 11,173,962 floats.
std::vector<int64_t> resnet18ParameterSizes() {
  std::vector<int64_t> sizes = {64 * 3 * 3 * 3};
  auto batchNorm = [&](int64_t channels) { sizes.insert(sizes.end(), {channels, channels}); };
  batchNorm(64);
  int64_t in = 64;
  for (int64_t planes : {64, 128, 256, 512})
    for (int block = 0; block < 2; ++block) {
      sizes.push_back(planes * in * 9);
      batchNorm(planes);
      sizes.push_back(planes * planes * 9);
      batchNorm(planes);
      if (in != planes) {  // the 1×1 shortcut of a stage's first block
        sizes.push_back(planes * in);
        batchNorm(planes);
      }
      in = planes;
    }
  sizes.insert(sizes.end(), {10 * 512, 10});
  return sizes;
}

// The lists the per-parameter ops take: odd sizes, a real model's, and one tensor beyond L2.
struct TensorList {
  std::string label;
  std::vector<int64_t> sizes;
  int64_t total() const { return std::accumulate(sizes.begin(), sizes.end(), int64_t{0}); }
};

std::vector<TensorList> tensorLists() {
  return {{"sizes 1,3,997,4,65537", {1, 3, 997, 4, 65537}},
          {"ResNet-18 parameters (62 tensors, 11.2M)", resnet18ParameterSizes()},
          {"one tensor of 64Mi", {int64_t{64} << 20}}};
}

// ---- Results -------------------------------------------------------------------------------------

// Check, compare() and their self-check live in compare.h, which needs no CUDA.
using lab::Check;
using lab::compare;
using lab::kNaN;

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

// One buffer on both backends. An activation (N, C, H, W) is stored NHWC on the CPU and NCHW on the
// GPU; anything else (parameters, (N, C) and (N, K) tensors, list entries) has one layout everywhere.
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

std::string formatted(const char* pattern, double value) {
  if (!std::isfinite(value)) return std::isnan(value) ? "-" : "inf";
  char text[48];
  std::snprintf(text, sizeof text, pattern, value);
  return text;
}

void printHeader() {
  std::printf("%-7s %9s %9s %11s %9s %7s %9s  %-29s %s\n", "result", "error", "tolerance", "median us", "GB/s", "% copy", "GFLOP/s",
              "op", "shape");
}

void printRow(const Check& c) {
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
  std::vector<Check> results;
  std::vector<std::string> resultFamilies;  // results[i] ran in family resultFamilies[i]

  // Why the CUDA context is unusable, once a fault broke it; empty while it works.
  const std::string& lostContext() const { return lostContext_; }

  // Runs one check: `body` prepares inputs, runs both backends, compares and times. An exception
  // (an op that throws, a CUDA error) fails the check; the lab goes on with the next.
  void run(const std::string& op, const std::string& shape, double tolerance, const std::function<void(Check&)>& body) {
    Check check;
    check.op = op;
    check.shape = shape;
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
        check.shape = shape;
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
      std::fprintf(rows_, "%s\n", lab::checkRow(check, stage_, family).c_str());
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
    if constexpr (std::is_same_v<T, float>) {
      if (activation)
        nchwToNhwc(host.data(), t.cpu.data(), activation->n, activation->c, activation->h, activation->w);
      else
        std::memcpy(t.cpu.data(), host.data(), t.bytes());
    } else {
      std::memcpy(t.cpu.data(), host.data(), t.bytes());
    }
    gpu.upload(t.gpu.data(), host.data(), t.bytes());
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
    return host;
  }
  template <typename T>
  std::vector<T> fromCpu(const Twin<T>& t) {
    std::vector<T> host(static_cast<size_t>(t.size()));
    if (t.size() == 0) return host;
    if constexpr (std::is_same_v<T, float>) {
      if (t.activation) {
        nhwcToNchw(t.cpu.data(), host.data(), t.activation->n, t.activation->c, t.activation->h, t.activation->w);
        return host;
      }
    }
    std::memcpy(host.data(), t.cpu.data(), t.bytes());
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
std::vector<Twin<float>> inputs(Lab& lab, const std::vector<std::vector<float>>& hosts) {
  std::vector<Twin<float>> twins;
  for (const std::vector<float>& host : hosts) twins.push_back(lab.input(host));
  return twins;
}

std::vector<std::vector<float>> normals(Lab& lab, const std::vector<int64_t>& sizes) {
  std::vector<std::vector<float>> hosts;
  for (int64_t size : sizes) hosts.push_back(lab.random.normal(size));
  return hosts;
}

std::vector<ConstSpan> constSpans(std::vector<Twin<float>>& list, const Backend& b) {
  std::vector<ConstSpan> spans;
  for (Twin<float>& t : list) spans.push_back({t.on(b), t.size()});
  return spans;
}

std::vector<Span> spans(std::vector<Twin<float>>& list, const Backend& b) {
  std::vector<Span> out;
  for (Twin<float>& t : list) out.push_back({t.on(b), t.size()});
  return out;
}

std::string indexed(const char* name, size_t i) { return std::string(name) + "[" + std::to_string(i) + "]"; }

// ---- Memory ------------------------------------------------------------------------------------

void checkMemory(Lab& lab) {
  // Around CudaBackend's 4 MiB threshold between staged and direct uploads, and far beyond it.
  for (int64_t n : {int64_t{997}, int64_t{1} << 20, (int64_t{1} << 20) + 3, int64_t{64} << 20}) {
    const size_t bytes = static_cast<size_t>(n) * sizeof(float);
    lab.run("upload/download", countLabel(n), kExact, [&](Check& check) {
      const std::vector<float> host = lab.random.normal(n);
      Twin<float> data = lab.empty<float>(n);
      auto op = [&](Backend& b) { b.upload(data.on(b), host.data(), bytes); };
      lab.both(op, data);
      lab.expect(check, "data", data);  // downloads the GPU's copy
      lab.measure(check, op, Work::transfer(static_cast<double>(bytes)));  // the upload alone
    });
    lab.run("uploadAhead", countLabel(n), kExact, [&](Check& check) {
      const auto host = std::make_shared<const std::vector<float>>(lab.random.normal(n));
      auto roundTrip = [&](Backend& b) {
        std::shared_ptr<void> stored = b.uploadAhead(host->data(), bytes, host);
        std::vector<float> back(static_cast<size_t>(n), std::numeric_limits<float>::quiet_NaN());
        b.download(back.data(), stored.get(), bytes);
        b.synchronize();
        return back;
      };
      compare(check, "data", roundTrip(lab.gpu), roundTrip(lab.cpu), kExact);
      lab.measure(check, [&](Backend& b) { b.uploadAhead(host->data(), bytes, host); }, Work::transfer(static_cast<double>(bytes)));
    });
  }
  for (int64_t n : kElementCounts)
    lab.run("copy", countLabel(n), kExact, [&](Check& check) {
      Twin<float> src = lab.input(lab.random.normal(n)), dst = lab.empty<float>(n);
      auto op = [&](Backend& b) { b.copy(dst.on(b), src.on(b), src.bytes()); };
      lab.both(op, dst);
      lab.expect(check, "dst", dst);
      lab.measure(check, op, Work::memory(8.0 * n));  // read n + write n floats
    });
  // A CIFAR batch, and odd sizes; the CPU converts to NHWC on the way.
  for (const Dims& d : {Dims{128, 3, 32, 32}, Dims{1, 3, 5, 7}, Dims{3, 1, 1, 1}})
    lab.run("uploadImages", d.label(), kExact, [&](Check& check) {
      const std::vector<float> host = lab.random.normal(d.numel());
      Twin<float> images = lab.activation(d);
      auto op = [&](Backend& b) { b.uploadImages(host.data(), images.on(b), d.n, d.c, d.h, d.w); };
      lab.both(op, images);
      lab.expect(check, "images", images);
      lab.measure(check, op, Work::transfer(4.0 * d.numel()));
    });
}

// ---- Element-wise ops ----------------------------------------------------------------------------

void checkFill(Lab& lab) {
  for (int64_t n : kElementCounts)
    lab.run("fill", countLabel(n), kExact, [&](Check& check) {
      const float value = lab.random.scalar();
      Twin<float> data = lab.empty<float>(n);
      auto op = [&](Backend& b) { b.fill(data.on(b), n, value); };
      lab.both(op, data);
      lab.expect(check, "data", data);
      lab.measure(check, op, Work::memory(4.0 * n));  // write n floats
    });
}

void checkRelu(Lab& lab) {
  for (int64_t n : kElementCounts) {
    lab.run("relu.forward", countLabel(n), kExact, [&](Check& check) {
      Twin<float> x = lab.input(lab.random.normal(n)), y = lab.empty<float>(n);
      auto op = [&](Backend& b) { b.reluForward(x.on(b), y.on(b), n); };
      lab.both(op, y);
      lab.expect(check, "y", y);
      lab.measure(check, op, Work::memory(8.0 * n));  // read x, write y
    });
    // The models' ReLUs run in place (y = x).
    lab.run("relu.forward", countLabel(n) + ", in place", kExact, [&](Check& check) {
      Twin<float> x = lab.input(lab.random.normal(n));
      auto op = [&](Backend& b) { b.reluForward(x.on(b), x.on(b), n); };
      lab.both(op);
      lab.expect(check, "x", x);
      lab.measure(check, op, Work::memory(8.0 * n));  // read x, write x
    });
    lab.run("relu.backward", countLabel(n), kExact, [&](Check& check) {
      Twin<float> y = lab.input(lab.random.normal(n)), dy = lab.input(lab.random.normal(n)), dx = lab.empty<float>(n);
      auto op = [&](Backend& b) { b.reluBackward(y.on(b), dy.on(b), dx.on(b), n); };
      lab.both(op, dx);
      lab.expect(check, "dx", dx);
      lab.measure(check, op, Work::memory(12.0 * n));  // read y and dy, write dx
    });
  }
}

void checkAdd(Lab& lab) {
  for (int64_t n : kElementCounts) {
    lab.run("addInPlace", countLabel(n), kExact, [&](Check& check) {
      Twin<float> a = lab.input(lab.random.normal(n)), b = lab.input(lab.random.normal(n));
      auto op = [&](Backend& backend) { backend.addInPlace(a.on(backend), b.on(backend), n); };
      lab.both(op);
      lab.expect(check, "a", a);
      lab.measure(check, op, Work::memory(12.0 * n));  // read a and b, write a
    });
    lab.run("add", countLabel(n), kExact, [&](Check& check) {
      Twin<float> a = lab.input(lab.random.normal(n)), b = lab.input(lab.random.normal(n)), out = lab.empty<float>(n);
      auto op = [&](Backend& backend) { backend.add(a.on(backend), b.on(backend), out.on(backend), n); };
      lab.both(op, out);
      lab.expect(check, "out", out);
      lab.measure(check, op, Work::memory(12.0 * n));  // read a and b, write out
    });
  }
}

void checkScale(Lab& lab) {
  for (int64_t n : kElementCounts)
    lab.run("scale", countLabel(n), kExact, [&](Check& check) {
      const float s = lab.random.scalar();
      Twin<float> x = lab.input(lab.random.normal(n)), y = lab.empty<float>(n);
      auto op = [&](Backend& b) { b.scale(x.on(b), y.on(b), n, s); };
      lab.both(op, y);
      lab.expect(check, "y", y);
      lab.measure(check, op, Work::memory(8.0 * n));  // read x, write y
    });
}

void checkDropout(Lab& lab) {
  // VGG's dropout is p = 0.5 (scale 2, exact in any order); 0.3 gives a scale with a full mantissa.
  const double drop = 0.3;
  const float scale = static_cast<float>(1.0 / (1.0 - drop));
  std::vector<int64_t> counts = kElementCounts;
  counts.push_back(128 * 512);  // VGG's classifier input at batch 128
  for (int64_t n : counts) {
    lab.run("dropout.forward", countLabel(n), kExact, [&](Check& check) {
      Twin<float> x = lab.input(lab.random.normal(n)), y = lab.empty<float>(n);
      Twin<uint8_t> keep = lab.input(lab.random.bernoulli(n, 1.0 - drop));
      auto op = [&](Backend& b) { b.dropoutForward(x.on(b), keep.on(b), y.on(b), n, scale); };
      lab.both(op, y);
      lab.expect(check, "y", y);
      lab.measure(check, op, Work::memory(9.0 * n));  // read x and the byte mask, write y
    });
    lab.run("dropout.backward", countLabel(n), kExact, [&](Check& check) {
      Twin<float> dy = lab.input(lab.random.normal(n)), dx = lab.empty<float>(n);
      Twin<uint8_t> keep = lab.input(lab.random.bernoulli(n, 1.0 - drop));
      auto op = [&](Backend& b) { b.dropoutBackward(dy.on(b), keep.on(b), dx.on(b), n, scale); };
      lab.both(op, dx);
      lab.expect(check, "dx", dx);
      lab.measure(check, op, Work::memory(9.0 * n));  // read dy and the byte mask, write dx
    });
  }
}

// ---- Activation shape ops ------------------------------------------------------------------------

void checkGlobalAvgPool(Lab& lab) {
  // Odd shapes, ResNet-18's pool at batch 128, and 256 MiB of input for bandwidth.
  for (const Dims& d : {Dims{1, 1, 1, 1}, Dims{3, 5, 7, 9}, Dims{1, 3, 13, 1}, Dims{128, 512, 4, 4}, Dims{256, 64, 64, 64}}) {
    const int64_t rows = d.n * d.c;
    lab.run("globalAvgPool.forward", d.label(), kPoolingSum, [&](Check& check) {
      Twin<float> x = lab.input(lab.random.normal(d.numel()), d), y = lab.empty<float>(rows);
      auto op = [&](Backend& b) { b.globalAvgPoolForward(x.on(b), y.on(b), d.n, d.c, d.h, d.w); };
      lab.both(op, y);
      lab.expect(check, "y", y);
      lab.measure(check, op, Work::memory(4.0 * (d.numel() + rows)));  // read x, write y
    });
    lab.run("globalAvgPool.backward", d.label(), kOneRounding, [&](Check& check) {
      Twin<float> dy = lab.input(lab.random.normal(rows)), dx = lab.activation(d);
      auto op = [&](Backend& b) { b.globalAvgPoolBackward(dy.on(b), dx.on(b), d.n, d.c, d.h, d.w); };
      lab.both(op, dx);
      lab.expect(check, "dx", dx);
      lab.measure(check, op, Work::memory(4.0 * (rows + d.numel())));  // read dy, write dx
    });
  }
}

void checkFlatten(Lab& lab) {
  // Odd shapes, VGG's flatten at batch 128, and 256 MiB for bandwidth.
  for (const Dims& d : {Dims{1, 1, 1, 1}, Dims{3, 5, 7, 9}, Dims{128, 512, 1, 1}, Dims{128, 64, 8, 8}, Dims{256, 64, 64, 64}}) {
    lab.run("flatten.forward", d.label(), kExact, [&](Check& check) {
      Twin<float> x = lab.input(lab.random.normal(d.numel()), d), y = lab.empty<float>(d.numel());
      auto op = [&](Backend& b) { b.flattenForward(x.on(b), y.on(b), d.n, d.c, d.h, d.w); };
      lab.both(op, y);
      lab.expect(check, "y", y);
      lab.measure(check, op, Work::memory(8.0 * d.numel()));  // read x, write y
    });
    lab.run("flatten.backward", d.label(), kExact, [&](Check& check) {
      Twin<float> dy = lab.input(lab.random.normal(d.numel())), dx = lab.activation(d);
      auto op = [&](Backend& b) { b.flattenBackward(dy.on(b), dx.on(b), d.n, d.c, d.h, d.w); };
      lab.both(op, dx);
      lab.expect(check, "dx", dx);
      lab.measure(check, op, Work::memory(8.0 * d.numel()));  // read dy, write dx
    });
  }
}

// ---- Linear and loss -----------------------------------------------------------------------------

void checkLinear(Lab& lab) {
  struct LinearCase {
    int64_t rows, in, out;
  };
  // Odd sizes, then batch 128: ResNet-18's 512→10, VGG's 512→512, and CIFAR-100 VGG's 512→4096,
  // 4096→4096 and 4096→100.
  const LinearCase cases[] = {{1, 1, 1}, {3, 7, 5}, {61, 997, 13}, {128, 512, 10}, {128, 512, 512}, {128, 512, 4096}, {128, 4096, 4096},
                              {128, 4096, 100}};
  for (const LinearCase& s : cases) {
    const std::string label = "(" + std::to_string(s.rows) + "," + std::to_string(s.in) + ") -> " + std::to_string(s.out);
    const double flops = 2.0 * s.rows * s.in * s.out;
    const float weightScale = 1.0f / std::sqrt(static_cast<float>(s.in));
    lab.run("linear.forward", label, kMatmul, [&](Check& check) {
      Twin<float> x = lab.input(lab.random.normal(s.rows * s.in)), weight = lab.input(lab.random.normal(s.out * s.in, 0, weightScale)),
                  bias = lab.input(lab.random.normal(s.out)), y = lab.empty<float>(s.rows * s.out);
      auto op = [&](Backend& b) { b.linearForward(x.on(b), weight.on(b), bias.on(b), y.on(b), s.rows, s.in, s.out); };
      lab.both(op, y);
      lab.expect(check, "y", y);
      lab.measure(check, op, Work::compute(flops));
    });
    lab.run("linear.backward", label, kMatmul, [&](Check& check) {
      Twin<float> x = lab.input(lab.random.normal(s.rows * s.in)), weight = lab.input(lab.random.normal(s.out * s.in, 0, weightScale)),
                  dy = lab.input(lab.random.normal(s.rows * s.out));
      Twin<float> dx = lab.empty<float>(s.rows * s.in), dWeight = lab.empty<float>(s.out * s.in), dBias = lab.empty<float>(s.out);
      auto op = [&](Backend& b) {
        b.linearBackward(x.on(b), weight.on(b), dy.on(b), dx.on(b), dWeight.on(b), dBias.on(b), s.rows, s.in, s.out);
      };
      lab.both(op, dx, dWeight, dBias);
      lab.expect(check, "dx", dx);
      lab.expect(check, "dWeight", dWeight);
      lab.expect(check, "dBias", dBias);
      lab.measure(check, op, Work::compute(2 * flops + s.rows * s.out));  // dW and dx, and db
    });
  }
}

// ---- The language model's ops ---------------------------------------------------------------------

std::string dims(std::initializer_list<int64_t> sizes) {
  std::string label = "(";
  for (int64_t size : sizes) label += (label.size() > 1 ? "," : "") + std::to_string(size);
  return label + ")";
}

void checkGemm(Lab& lab) {
  struct GemmCase {
    bool transA, transB;
    int64_t m, n, k;
    bool accumulate;
  };
  std::vector<GemmCase> cases;
  // Every transposition, overwriting and accumulating, at odd sizes.
  for (bool transA : {false, true})
    for (bool transB : {false, true})
      for (bool accumulate : {false, true}) {
        cases.push_back({transA, transB, 1, 1, 1, accumulate});
        cases.push_back({transA, transB, 3, 5, 7, accumulate});
        cases.push_back({transA, transB, 61, 13, 997, accumulate});
      }
  // The LSTM 2×650 on WikiText-2 (V 33,278, BPTT 35 × batch 20 = 700 rows): the input projections of
  // a window, the recurrence of a step, the tied decoder; then backward: the decoder's dx and dW, the
  // recurrence's dh, the weight gradients, the input gradient.
  const GemmCase lstm[] = {{false, true, 700, 2600, 650, true},   {false, true, 20, 2600, 650, true},
                           {false, true, 700, 33278, 650, true},  {false, false, 700, 650, 33278, false},
                           {true, false, 33278, 650, 700, false}, {false, false, 20, 650, 2600, false},
                           {true, false, 2600, 650, 700, false},  {false, false, 700, 650, 2600, false}};
  cases.insert(cases.end(), std::begin(lstm), std::end(lstm));
  for (const GemmCase& g : cases) {
    const std::string label = std::string(g.transA ? "T" : "N") + (g.transB ? "T" : "N") + " " + dims({g.m, g.n, g.k}) +
                              (g.accumulate ? " +C" : "");
    lab.run("gemm", label, kMatmul, [&](Check& check) {
      const float scale = 1.0f / std::sqrt(static_cast<float>(g.k));
      Twin<float> a = lab.input(lab.random.normal(g.m * g.k)), b = lab.input(lab.random.normal(g.k * g.n, 0, scale));
      Twin<float> c = g.accumulate ? lab.input(lab.random.normal(g.m * g.n)) : lab.empty<float>(g.m * g.n);
      auto op = [&](Backend& backend) {
        backend.gemm(g.transA, g.transB, g.m, g.n, g.k, a.on(backend), b.on(backend), c.on(backend), g.accumulate);
      };
      if (g.accumulate)
        lab.both(op);  // C is an input too: nothing to poison
      else
        lab.both(op, c);
      lab.expect(check, "C", c);
      lab.measure(check, op, Work::compute(2.0 * g.m * g.n * g.k));
    });
  }
}

void checkBias(Lab& lab) {
  // Odd sizes, the LSTM's gate pre-activations (700, 2600) and its decoder's logits (700, 33278).
  struct BiasCase {
    int64_t rows, cols;
  };
  for (const BiasCase& size : {BiasCase{1, 1}, {3, 7}, {61, 997}, {700, 2600}, {700, 33278}}) {
    const int64_t rows = size.rows, cols = size.cols;
    lab.run("broadcastRows", dims({rows, cols}), kExact, [&](Check& check) {
      Twin<float> row = lab.input(lab.random.normal(cols)), y = lab.empty<float>(rows * cols);
      auto op = [&](Backend& b) { b.broadcastRows(row.on(b), y.on(b), rows, cols); };
      lab.both(op, y);
      lab.expect(check, "y", y);
      lab.measure(check, op, Work::memory(4.0 * (rows * cols + cols)));  // read the row, write y
    });
    lab.run("columnSums", dims({rows, cols}), kColumnSums, [&](Check& check) {
      Twin<float> x = lab.input(lab.random.normal(rows * cols)), sums = lab.empty<float>(cols);
      auto op = [&](Backend& b) { b.columnSums(x.on(b), sums.on(b), rows, cols); };
      lab.both(op, sums);
      lab.expect(check, "sums", sums);
      lab.measure(check, op, Work::memory(4.0 * (rows * cols + cols)));  // read x, write the sums
    });
  }
  lab.run("columnSums", "(33278,650): rows beyond one slice", kColumnSums, [&](Check& check) {
    const int64_t rows = 33278, cols = 650;
    Twin<float> x = lab.input(lab.random.normal(rows * cols)), sums = lab.empty<float>(cols);
    auto op = [&](Backend& b) { b.columnSums(x.on(b), sums.on(b), rows, cols); };
    lab.both(op, sums);
    lab.expect(check, "sums", sums);
    lab.measure(check, op, Work::memory(4.0 * (rows * cols + cols)));
  });
}

void checkEmbedding(Lab& lab) {
  struct EmbeddingCase {
    int64_t rows, width, entries;
  };
  // Odd sizes (with repeated ids), a window of WikiText-2 for the LSTM 2×650, and the same window over
  // 10 tokens only (long runs of one token: few blocks, each adding many rows).
  const EmbeddingCase cases[] = {{1, 1, 2}, {7, 5, 3}, {61, 997, 40}, {700, 650, 33278}, {700, 650, 10}};
  for (const EmbeddingCase& e : cases) {
    const std::string label = dims({e.rows, e.width}) + " of " + std::to_string(e.entries);
    const std::vector<int32_t> ids = lab.random.labels(e.rows, static_cast<int32_t>(e.entries));
    lab.run("embedding.forward", label, kExact, [&](Check& check) {
      Twin<float> table = lab.input(lab.random.normal(e.entries * e.width)), y = lab.empty<float>(e.rows * e.width);
      Twin<int32_t> deviceIds = lab.input(ids);
      auto op = [&](Backend& b) { b.embeddingForward(table.on(b), deviceIds.on(b), y.on(b), e.rows, e.width); };
      lab.both(op, y);
      lab.expect(check, "y", y);
      lab.measure(check, op, Work::memory(8.0 * e.rows * e.width + 4.0 * e.rows));  // read rows and ids, write y
    });
    // The same additions in the same order on both devices: exact. dTable is read and written, so
    // it starts from random values rather than poison.
    lab.run("embedding.backward", label, kExact, [&](Check& check) {
      Twin<float> dy = lab.input(lab.random.normal(e.rows * e.width)), dTable = lab.input(lab.random.normal(e.entries * e.width));
      auto op = [&](Backend& b) { b.embeddingBackward(dy.on(b), ids.data(), dTable.on(b), e.rows, e.width); };
      lab.both(op);
      lab.expect(check, "dTable", dTable);
      // Includes grouping the ids on the host and uploading them: the op's own work.
      lab.measure(check, op, Work::memory(12.0 * e.rows * e.width));  // read dy, read and write the rows
    });
  }
}

void checkLstmCell(Lab& lab) {
  // Odd sizes, one step of the LSTM 2×650 at batch 20, and a larger batch for bandwidth.
  struct CellCase {
    int64_t batch, hidden;
  };
  for (const CellCase& size : {CellCase{1, 1}, {3, 5}, {7, 33}, {20, 650}, {256, 1500}}) {
    const int64_t batch = size.batch, hidden = size.hidden, n = batch * hidden;
    // Forward: exp and tanh of the CPU's libm against CUDA's, and FMAs on the GPU.
    lab.run("lstmCell.forward", dims({batch, hidden}), kFewRoundings, [&](Check& check) {
      Twin<float> gates = lab.input(lab.random.normal(4 * n, 0, 2)), cPrev = lab.input(lab.random.normal(n));
      Twin<float> c = lab.empty<float>(n), tanhC = lab.empty<float>(n), h = lab.empty<float>(n);
      auto op = [&](Backend& b) { b.lstmCellForward(gates.on(b), cPrev.on(b), c.on(b), tanhC.on(b), h.on(b), batch, hidden); };
      lab.both(op, c, tanhC, h);  // the gates are read and written: not poisoned
      lab.expect(check, "gates", gates);
      lab.expect(check, "c", c);
      lab.expect(check, "tanhC", tanhC);
      lab.expect(check, "h", h);
      lab.measure(check, op, Work::memory(4.0 * (8 * n + 4 * n)));  // gates read and written, cPrev; c, tanhC, h
    });
    lab.run("lstmCell.backward", dims({batch, hidden}), kFewRoundings, [&](Check& check) {
      // Activations as forward keeps them: σ in (0, 1), tanh in (−1, 1).
      std::vector<float> activations = lab.random.normal(4 * n);
      for (int64_t r = 0; r < batch; ++r)
        for (int64_t j = 0; j < 4 * hidden; ++j) {
          float& a = activations[r * 4 * hidden + j];
          a = j / hidden == 2 ? std::tanh(a) : 1.0f / (1.0f + std::exp(-a));
        }
      std::vector<float> tanhCells = lab.random.normal(n);
      for (float& t : tanhCells) t = std::tanh(t);
      Twin<float> gates = lab.input(activations), tanhC = lab.input(tanhCells), cPrev = lab.input(lab.random.normal(n));
      Twin<float> dhOut = lab.input(lab.random.normal(n)), dhNext = lab.input(lab.random.normal(n)), dcNext = lab.input(lab.random.normal(n));
      Twin<float> dGates = lab.empty<float>(4 * n);
      auto op = [&](Backend& b) {
        b.lstmCellBackward(gates.on(b), tanhC.on(b), cPrev.on(b), dhOut.on(b), dhNext.on(b), dcNext.on(b), dGates.on(b), batch, hidden);
      };
      lab.both(op, dGates);  // dcNext is read and written: not poisoned
      lab.expect(check, "dGates", dGates);
      lab.expect(check, "dcNext", dcNext);
      lab.measure(check, op, Work::memory(4.0 * (4 * n + 5 * n + 4 * n + n)));  // gates and 5 states read; dGates, dcNext written
    });
  }
}

void checkSoftmaxCrossEntropy(Lab& lab) {
  struct LossCase {
    int64_t rows, classes;
  };
  // Odd sizes, CIFAR-10 and CIFAR-100 at batch 128, and a word-level vocabulary (WikiText-2's 33,278
  // words over 35×20 tokens, 93 MB of logits) for a row longer than a block, beyond L2.
  const LossCase cases[] = {{1, 2}, {3, 7}, {61, 997}, {128, 10}, {128, 100}, {700, 33278}};
  for (const LossCase& s : cases) {
    const int64_t n = s.rows * s.classes;
    lab.run("softmaxCrossEntropy", "(" + std::to_string(s.rows) + "," + std::to_string(s.classes) + ")", kFewRoundings, [&](Check& check) {
      Twin<float> logits = lab.input(lab.random.normal(n, 0, 2)), grad = lab.empty<float>(n);
      Twin<int32_t> labels = lab.input(lab.random.labels(s.rows, static_cast<int32_t>(s.classes)));
      Twin<double> stats = lab.empty<double>(2);
      auto op = [&](Backend& b) { b.softmaxCrossEntropy(logits.on(b), labels.on(b), s.rows, s.classes, grad.on(b), stats.on(b)); };
      lab.both(op, grad, stats);
      lab.expect(check, "gradLogits", grad);
      const std::vector<double> got = lab.fromGpu(stats), want = lab.fromCpu(stats);
      compare(check, "stats[0] (mean loss)", got[0], want[0], check.tolerance);
      // Arg-maxima of the same floats: no rounding, so exact (ties, the first wins, are vanishingly rare).
      compare(check, "stats[1] (rows predicted right)", got[1], want[1], kExact);
      lab.measure(check, op, Work::memory(8.0 * n + 4.0 * s.rows));  // read logits and labels, write the gradient
    });
  }
}

// ---- Per-parameter lists ---------------------------------------------------------------------------

void checkSgdUpdate(Lab& lab) {
  struct Variant {
    const char* label;
    float momentum;
    bool nesterov, first;
    double bytesPerElement;
  };
  // First steps: read p and g, write p and the momentum buffer (which the step must not read).
  // Later steps also read the buffer. Without momentum: read p and g, write p; the buffer stays.
  const Variant variants[] = {{"Nesterov, first step", 0.9f, true, true, 16},
                              {"Nesterov, later step", 0.9f, true, false, 20},
                              {"heavy ball, first step", 0.9f, false, true, 16},
                              {"heavy ball, later step", 0.9f, false, false, 20},
                              {"no momentum", 0.0f, false, false, 12}};
  for (const TensorList& list : tensorLists())
    for (const Variant& v : variants)
      lab.run("sgdUpdate", list.label + ", " + v.label, kFewRoundings, [&](Check& check) {
        const SgdHyper hyper{0.1f, v.momentum, 5e-4f, v.nesterov};
        const bool bufferWritten = v.momentum != 0.0f, bufferRead = bufferWritten && !v.first;
        std::vector<Twin<float>> values = inputs(lab, normals(lab, list.sizes)), grads = inputs(lab, normals(lab, list.sizes)),
                                 buffers = inputs(lab, normals(lab, list.sizes));
        auto op = [&](Backend& b) {
          std::vector<SgdSlot> slots;
          for (size_t k = 0; k < values.size(); ++k) slots.push_back({values[k].on(b), grads[k].on(b), buffers[k].on(b), values[k].size()});
          b.sgdUpdate(slots, hyper, v.first);
        };
        // At the first step the buffer is an output only (buf = d), so whatever it held must not matter.
        if (bufferWritten && !bufferRead)
          for (Twin<float>& buffer : buffers) lab.poison(buffer);
        lab.both(op);
        for (size_t k = 0; k < values.size(); ++k) {
          lab.expect(check, indexed("value", k), values[k]);
          lab.expect(check, indexed("momentum", k), buffers[k], bufferWritten ? check.tolerance : kExact);
        }
        lab.measure(check, op, Work::memory(v.bytesPerElement * static_cast<double>(list.total())));
      });
}

void checkFindNonFinite(Lab& lab) {
  struct Planted {
    size_t tensor;
    int64_t element;
    float value;
  };
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  for (const TensorList& list : tensorLists()) {
    const size_t count = list.sizes.size();
    auto anywhereIn = [&](size_t tensor, float value) { return Planted{tensor, lab.random.index(list.sizes[tensor]), value}; };
    struct Case {
      std::string label;
      std::vector<Planted> planted;
    };
    std::vector<Case> cases = {{"clean", {}}, {"Inf at the very last element", {{count - 1, list.sizes.back() - 1, inf}}}};
    if (count >= 2) {
      // One bad value in each half of the list: the op must report the earlier tensor.
      const size_t early = static_cast<size_t>(lab.random.index(static_cast<int64_t>(count / 2)));
      const size_t late = count / 2 + static_cast<size_t>(lab.random.index(static_cast<int64_t>(count - count / 2)));
      cases.push_back({"NaN in tensor " + std::to_string(late) + ", Inf in tensor " + std::to_string(early),
                       {anywhereIn(late, nan), anywhereIn(early, inf)}});
      cases.push_back({"NaN in tensor " + std::to_string(early) + ", -Inf in tensor " + std::to_string(late),
                       {anywhereIn(early, nan), anywhereIn(late, -inf)}});
    }
    for (const Case& c : cases)
      lab.run("findNonFinite", list.label + ", " + c.label, kExact, [&](Check& check) {
        std::vector<std::vector<float>> hosts = normals(lab, list.sizes);
        double expected = 0;
        for (const Planted& p : c.planted) {
          hosts[p.tensor][static_cast<size_t>(p.element)] = p.value;
          expected = expected == 0 ? p.tensor + 1.0 : std::min(expected, p.tensor + 1.0);
        }
        std::vector<Twin<float>> tensors = inputs(lab, hosts);
        Twin<double> firstBad = lab.empty<double>(1);
        auto op = [&](Backend& b) { b.findNonFinite(constSpans(tensors, b), firstBad.on(b)); };
        lab.both(op, firstBad);
        lab.expect(check, "firstBad", firstBad);
        compare(check, "firstBad (CPU reference against the planted values)", lab.fromCpu(firstBad)[0], expected, kExact);
        // A clean list must be read whole; with a bad value the op may stop early.
        lab.measure(check, op, c.planted.empty() ? Work::memory(4.0 * list.total()) : Work::none());
      });
  }
}

void checkAccumulate(Lab& lab) {
  for (const TensorList& list : tensorLists())
    lab.run("accumulate", list.label, kExact, [&](Check& check) {
      std::vector<Twin<float>> sums = inputs(lab, normals(lab, list.sizes)), values = inputs(lab, normals(lab, list.sizes));
      auto op = [&](Backend& b) { b.accumulate(spans(sums, b), constSpans(values, b)); };
      lab.both(op);
      for (size_t k = 0; k < sums.size(); ++k) lab.expect(check, indexed("sums", k), sums[k]);
      lab.measure(check, op, Work::memory(12.0 * list.total()));  // read sums and values, write sums
    });
}

void checkSumsOfSquares(Lab& lab) {
  for (const TensorList& list : tensorLists())
    lab.run("sumsOfSquares", list.label, kDoubleSum, [&](Check& check) {
      std::vector<Twin<float>> tensors = inputs(lab, normals(lab, list.sizes));
      const std::vector<double> want = lab.cpu.sumsOfSquares(constSpans(tensors, lab.cpu)),
                                got = lab.gpu.sumsOfSquares(constSpans(tensors, lab.gpu));
      if (got.size() != want.size())
        throw std::runtime_error(std::to_string(got.size()) + " sums for " + std::to_string(want.size()) + " tensors");
      // Each tensor's sum on its own scale: a small tensor's is not measured against a large one's.
      for (size_t k = 0; k < want.size(); ++k) compare(check, indexed("sums", k), got[k], want[k], check.tolerance);
      // Includes reading the sums back: the op returns them on the host.
      lab.measure(check, [&](Backend& b) { b.sumsOfSquares(constSpans(tensors, b)); }, Work::memory(4.0 * list.total()));
    });
}

void checkTotalSumOfSquares(Lab& lab) {
  std::vector<TensorList> lists = tensorLists();
  // The LSTM 2×650 on WikiText-2's parameters: the tied embedding, two layers, the decoder bias.
  lists.push_back({"LSTM 2x650, V 33278 parameters", {33278 * 650, 2600 * 650, 2600 * 650, 2600, 2600, 2600 * 650, 2600 * 650, 2600, 2600, 33278}});
  for (const TensorList& list : lists)
    lab.run("totalSumOfSquares", list.label, kDoubleSum, [&](Check& check) {
      std::vector<Twin<float>> tensors = inputs(lab, normals(lab, list.sizes));
      compare(check, "total", lab.gpu.totalSumOfSquares(constSpans(tensors, lab.gpu)), lab.cpu.totalSumOfSquares(constSpans(tensors, lab.cpu)),
              check.tolerance);
      // Includes reading the total back: the op returns it on the host.
      lab.measure(check, [&](Backend& b) { b.totalSumOfSquares(constSpans(tensors, b)); }, Work::memory(4.0 * list.total()));
    });
}

// ---- Gradient compression (ops/compression_kernels.h) -----------------------------------------------

// PowerSGD's matrices (rows, cols, rank), and lists of them: odd shapes, and the weights of CIFAR
// ResNet-18 viewed as (out, in·kh·kw) at the ranks Accordion switches between.
struct MatrixShape {
  int64_t rows, cols, rank;
};

struct MatrixList {
  std::string label;
  std::vector<MatrixShape> shapes;
};

std::vector<MatrixShape> resnet18Matrices(int64_t rank) {
  std::vector<std::pair<int64_t, int64_t>> views = {{64, 27}};
  int64_t in = 64;
  for (int64_t planes : {64, 128, 256, 512})
    for (int block = 0; block < 2; ++block) {
      views.push_back({planes, in * 9});
      views.push_back({planes, planes * 9});
      if (in != planes) views.push_back({planes, in});
      in = planes;
    }
  views.push_back({10, 512});
  std::vector<MatrixShape> shapes;
  for (auto [rows, cols] : views) shapes.push_back({rows, cols, std::min({rows, cols, rank})});
  return shapes;
}

std::vector<MatrixList> matrixLists() {
  std::vector<MatrixList> lists = {{"(1,7) r1, (3,5) (5,3) (33,65) r2", {{1, 7, 1}, {3, 5, 2}, {5, 3, 2}, {33, 65, 2}}}};
  for (int64_t rank : {1, 2, 4}) lists.push_back({"ResNet-18 weights, rank " + std::to_string(rank), resnet18Matrices(rank)});
  return lists;
}

template <typename T>
void poisonAll(Lab& lab, std::vector<Twin<T>>& list) {
  for (Twin<T>& t : list) lab.poison(t);
}

void expectAll(Lab& lab, Check& check, const char* name, std::vector<Twin<float>>& list, double tolerance) {
  for (size_t k = 0; k < list.size(); ++k) lab.expect(check, indexed(name, k), list[k], tolerance);
}

// Every buffer of a PowerSGD step, random, on both backends.
struct PowerSgdTwins {
  std::vector<MatrixShape> shapes;
  std::vector<Twin<float>> grad, memory, q, p, qt;

  PowerSgdTwins(Lab& lab, const std::vector<MatrixShape>& list) : shapes(list) {
    for (const MatrixShape& s : shapes) {
      grad.push_back(lab.input(lab.random.normal(s.rows * s.cols)));
      memory.push_back(lab.input(lab.random.normal(s.rows * s.cols)));
      q.push_back(lab.input(lab.random.normal(s.cols * s.rank)));
      p.push_back(lab.input(lab.random.normal(s.rows * s.rank)));
      qt.push_back(lab.input(lab.random.normal(s.rank * s.cols)));
    }
  }
  std::vector<PowerSgdMatrix> on(const Backend& b) {
    std::vector<PowerSgdMatrix> out;
    for (size_t k = 0; k < shapes.size(); ++k)
      out.push_back({grad[k].on(b), memory[k].on(b), q[k].on(b), p[k].on(b), qt[k].on(b), shapes[k].rows, shapes[k].cols, shapes[k].rank});
    return out;
  }
  double elements() const {
    double n = 0;
    for (const MatrixShape& s : shapes) n += static_cast<double>(s.rows * s.cols);
    return n;
  }
};

void checkPowerSgd(Lab& lab) {
  constexpr float kEps = 1e-8f;
  for (const MatrixList& list : matrixLists()) {
    // M = g + e, then P = M·Q: Qᵀ is the CPU's scratch, not an output.
    lab.run("powerSgd.project", list.label, kMatmul, [&](Check& check) {
      PowerSgdTwins t(lab, list.shapes);
      auto op = [&](Backend& b) { b.compression().powerSgdProject(t.on(b)); };
      poisonAll(lab, t.p);
      op(lab.cpu);
      op(lab.gpu);
      expectAll(lab, check, "M", t.memory, kExact);
      expectAll(lab, check, "P", t.p, kMatmul);
      lab.measure(check, op, Work::memory(16.0 * t.elements()));  // read g and e, write M, read M
    });
    // Orthogonalise P, then Qᵀ = P̂ᵀ·M.
    lab.run("powerSgd.projectBack", list.label, kMatmul, [&](Check& check) {
      PowerSgdTwins t(lab, list.shapes);
      auto op = [&](Backend& b) { b.compression().powerSgdProjectBack(t.on(b), kEps); };
      poisonAll(lab, t.qt);
      op(lab.cpu);
      op(lab.gpu);
      expectAll(lab, check, "P̂", t.p, kFewRoundings);
      expectAll(lab, check, "Qᵀ", t.qt, kMatmul);
      // Timed launches orthogonalise an already orthonormal P: the same work.
      lab.measure(check, op, Work::memory(4.0 * t.elements()));  // read M
    });
    // Qᵀ·(1/W), Q = (Qᵀ)ᵀ, out = P̂·Qᵀ, e = M − out.
    lab.run("powerSgd.decompress", list.label, kFewRoundings, [&](Check& check) {
      PowerSgdTwins t(lab, list.shapes);
      auto op = [&](Backend& b) { b.compression().powerSgdDecompress(t.on(b), 0.25f); };
      poisonAll(lab, t.grad);
      poisonAll(lab, t.q);
      op(lab.cpu);
      op(lab.gpu);
      expectAll(lab, check, "Qᵀ", t.qt, kExact);
      expectAll(lab, check, "Q", t.q, kExact);
      expectAll(lab, check, "out", t.grad, kFewRoundings);
      expectAll(lab, check, "e", t.memory, kFewRoundings);
      lab.measure(check, op, Work::memory(12.0 * t.elements()));  // read M, write M and out
    });
  }
}

int64_t topKCountOf(double ratio, int64_t n) { return std::max<int64_t>(1, static_cast<int64_t>(std::floor(ratio * static_cast<double>(n)))); }

void checkTopK(Lab& lab) {
  struct Case {
    std::string label;
    std::vector<int64_t> sizes;
    double ratio;
    bool ties;  // magnitudes on a coarse grid: many equal keys around the threshold
  };
  std::vector<Case> cases;
  for (const TensorList& list : tensorLists())
    for (double ratio : {0.01, 0.1}) cases.push_back({list.label + ", K=" + formatted("%g", ratio), list.sizes, ratio, false});
  cases.push_back({"sizes 1,3,997,4,65537, K=0.3, ties", {1, 3, 997, 4, 65537}, 0.3, true});
  cases.push_back({"ResNet-18 parameters, K=0.1, ties", resnet18ParameterSizes(), 0.1, true});
  for (const Case& c : cases) {
    // a = g + e; the winners' indices and values in index order; e = a − sparse(a). Exact: one add
    // per element, then the same selection.
    lab.run("topK.select", c.label, kExact, [&](Check& check) {
      std::vector<std::vector<float>> grads = normals(lab, c.sizes), memories = normals(lab, c.sizes);
      if (c.ties)
        for (auto& host : grads)
          for (float& v : host) v = std::round(v * 2.0f) / 2.0f;
      if (c.ties)
        for (auto& host : memories) std::fill(host.begin(), host.end(), 0.0f);
      std::vector<Twin<float>> grad = inputs(lab, grads), memory = inputs(lab, memories), send;
      for (int64_t n : c.sizes) send.push_back(lab.empty<float>(2 * topKCountOf(c.ratio, n)));
      auto op = [&](Backend& b) {
        std::vector<TopKTensor> tensors;
        int64_t offset = 0;
        for (size_t k = 0; k < grad.size(); ++k) {
          const int64_t count = topKCountOf(c.ratio, c.sizes[k]);
          tensors.push_back({grad[k].on(b), memory[k].on(b), send[k].on(b), c.sizes[k], count, offset});
          offset += 2 * count;
        }
        b.compression().topKSelect(tensors);
      };
      poisonAll(lab, send);
      op(lab.cpu);
      op(lab.gpu);
      expectAll(lab, check, "send", send, kExact);
      expectAll(lab, check, "e", memory, kExact);
      double total = 0;
      for (int64_t n : c.sizes) total += static_cast<double>(n);
      // Against one pass that reads g and e and writes e: the selection's further passes show as a
      // lower fraction of the copy bandwidth.
      lab.measure(check, op, Work::memory(12.0 * total));
    });
  }
  // The average of 4 workers' pairs: grad = ¼·Σ_w scatter(pairs_w), workers added in rank order.
  for (const TensorList& list : tensorLists())
    lab.run("topK.combine", list.label + ", 4 workers, K=0.1", kOneRounding, [&](Check& check) {
      constexpr int kWorkers = 4;
      std::vector<int64_t> counts, offsets;
      int64_t perWorker = 0;
      for (int64_t n : list.sizes) {
        counts.push_back(topKCountOf(0.1, n));
        offsets.push_back(perWorker);
        perWorker += 2 * counts.back();
      }
      std::vector<float> gathered(static_cast<size_t>(kWorkers * perWorker));
      std::mt19937_64 engine(lab.random.index(int64_t{1} << 40));
      for (int w = 0; w < kWorkers; ++w)
        for (size_t k = 0; k < list.sizes.size(); ++k) {
          // Distinct indices in ascending order, as a worker's selection sends them.
          std::vector<int32_t> all(static_cast<size_t>(list.sizes[k]));
          std::iota(all.begin(), all.end(), 0);
          std::shuffle(all.begin(), all.end(), engine);
          std::vector<int32_t> chosen(all.begin(), all.begin() + counts[k]);
          std::sort(chosen.begin(), chosen.end());
          const std::vector<float> values = lab.random.normal(counts[k]);
          float* block = gathered.data() + w * perWorker + offsets[k];
          std::memcpy(block, chosen.data(), chosen.size() * sizeof(float));
          std::memcpy(block + counts[k], values.data(), values.size() * sizeof(float));
        }
      Twin<float> pairs = lab.input(gathered);
      std::vector<Twin<float>> grad;
      for (int64_t n : list.sizes) grad.push_back(lab.empty<float>(n));
      auto op = [&](Backend& b) {
        std::vector<TopKTensor> tensors;
        for (size_t k = 0; k < grad.size(); ++k) tensors.push_back({grad[k].on(b), nullptr, nullptr, list.sizes[k], counts[k], offsets[k]});
        b.compression().topKCombine(tensors, pairs.on(b), kWorkers, perWorker, 0.25f);
      };
      poisonAll(lab, grad);
      op(lab.cpu);
      op(lab.gpu);
      expectAll(lab, check, "grad", grad, kOneRounding);
      lab.measure(check, op, Work::memory(4.0 * static_cast<double>(list.total()) + 4.0 * kWorkers * perWorker));
    });
}

void checkDenseExchange(Lab& lab) {
  for (const TensorList& list : tensorLists()) {
    lab.run("dense.pack", list.label, kExact, [&](Check& check) {
      std::vector<Twin<float>> tensors = inputs(lab, normals(lab, list.sizes));
      Twin<float> buffer = lab.empty<float>(list.total());
      auto op = [&](Backend& b) { b.compression().pack(spans(tensors, b), buffer.on(b)); };
      lab.both(op, buffer);
      lab.expect(check, "buffer", buffer);
      lab.measure(check, op, Work::memory(8.0 * list.total()));
    });
    lab.run("dense.unpack", list.label + ", scale 1/4", kExact, [&](Check& check) {
      Twin<float> buffer = lab.input(lab.random.normal(list.total()));
      std::vector<Twin<float>> tensors;
      for (int64_t n : list.sizes) tensors.push_back(lab.empty<float>(n));
      auto op = [&](Backend& b) { b.compression().unpack(buffer.on(b), spans(tensors, b), 0.25f); };
      poisonAll(lab, tensors);
      op(lab.cpu);
      op(lab.gpu);
      expectAll(lab, check, "tensor", tensors, kExact);
      lab.measure(check, op, Work::memory(8.0 * list.total()));
    });
  }
}

// ---- Convolution -----------------------------------------------------------------------------------

Conv2dSpec convolution(Dims in, int64_t out, int64_t kernel, int64_t stride, int64_t padding, bool bias) {
  return Conv2dSpec{in.n, in.c, in.h, in.w, out, kernel, stride, padding, bias};
}

// What cuDNN chose for a GPU convolution, per direction (ops/cuda_backend.h), for the check's row.
std::string algorithmsOf(const Conv2dOp& op) {
  const auto* choice = dynamic_cast<const cuda::ConvolutionChoice*>(&op);
  return choice ? choice->algorithms() : "";
}

void checkConv2d(Lab& lab) {
  struct ConvCase {
    Conv2dSpec spec;
    bool inputGradient;  // false for a network's first layer, whose dx is null
  };
  const ConvCase cases[] = {
      // CIFAR ResNet-18 at batch 128 (no bias): the stem, 3×3 convolutions of each stage, the
      // stride-2 convolutions and 1×1 shortcuts that open stages.
      {convolution({128, 3, 32, 32}, 64, 3, 1, 1, false), false},
      {convolution({128, 64, 32, 32}, 64, 3, 1, 1, false), true},
      {convolution({128, 64, 32, 32}, 128, 3, 2, 1, false), true},
      {convolution({128, 64, 32, 32}, 128, 1, 2, 0, false), true},
      {convolution({128, 128, 16, 16}, 128, 3, 1, 1, false), true},
      {convolution({128, 128, 16, 16}, 256, 3, 2, 1, false), true},
      {convolution({128, 256, 8, 8}, 512, 3, 2, 1, false), true},
      {convolution({128, 256, 8, 8}, 512, 1, 2, 0, false), true},
      {convolution({128, 512, 4, 4}, 512, 3, 1, 1, false), true},
      // VGG-19 (with bias): its first layer, a widening one, the last.
      {convolution({128, 3, 32, 32}, 64, 3, 1, 1, true), false},
      {convolution({128, 64, 16, 16}, 128, 3, 1, 1, true), true},
      {convolution({128, 512, 2, 2}, 512, 3, 1, 1, true), true},
      // The gradient test's states (test/gradients.test.js): VGG's first layer at batch 4, ResNet's
      // stem on 4×4 images.
      {convolution({4, 3, 32, 32}, 64, 3, 1, 1, true), false},
      {convolution({32, 3, 4, 4}, 64, 3, 1, 1, false), false},
      // Odd sizes: prime channels and extents, windows that do not tile the input.
      {convolution({1, 3, 7, 7}, 5, 3, 1, 1, true), true},
      {convolution({3, 5, 9, 11}, 7, 3, 2, 0, false), true},
      {convolution({3, 13, 17, 19}, 6, 1, 2, 0, true), true},
      {convolution({1, 1, 1, 1}, 1, 1, 1, 0, false), true},
      {convolution({2, 4, 5, 5}, 3, 3, 1, 0, true), false},
      {convolution({3, 2, 6, 6}, 3, 3, 2, 1, false), true},
  };
  // Each case with accurate convolutions (no transform algorithms), then as training chooses by
  // default (the fastest, transforms included).
  for (const bool accurate : {true, false})
  for (const ConvCase& c : cases) {
    lab.gpu.options.accurateConvolutions = accurate;
    const double tolerance = accurate ? kMatmul : kTransformConvolution;
    const Conv2dSpec& spec = c.spec;
    const Dims in{spec.batch, spec.inChannels, spec.height, spec.width},
        out{spec.batch, spec.outChannels, spec.outHeight(), spec.outWidth()};
    const std::string label = in.label() + " " + std::to_string(spec.inChannels) + "->" + std::to_string(spec.outChannels) + " k" +
                              std::to_string(spec.kernel) + " s" + std::to_string(spec.stride) + " p" + std::to_string(spec.padding) +
                              (spec.bias ? " +bias" : "") + (accurate ? "" : ", fastest");
    const double flops = 2.0 * out.numel() * spec.inChannels * spec.kernel * spec.kernel;  // per pass
    const int64_t weights = numelOf(spec.weightShape());
    // He initialisation keeps the outputs of order one whatever the fan-in.
    const float weightScale = std::sqrt(2.0f / static_cast<float>(spec.inChannels * spec.kernel * spec.kernel));
    lab.run("conv2d.forward", label, tolerance, [&](Check& check) {
      TwinOp<Conv2dOp> conv{lab.cpu.conv2d(spec), lab.gpu.conv2d(spec)};
      check.note = algorithmsOf(*conv.gpu);
      Twin<float> x = lab.input(lab.random.normal(in.numel()), in), weight = lab.input(lab.random.normal(weights, 0, weightScale)),
                  bias = spec.bias ? lab.input(lab.random.normal(spec.outChannels)) : Twin<float>{}, y = lab.activation(out);
      auto op = [&](Backend& b) { conv.on(b).forward(x.on(b), weight.on(b), bias.on(b), y.on(b)); };
      lab.both(op, y);
      lab.expect(check, "y", y);
      lab.measure(check, op, Work::compute(flops));
    });
    lab.run("conv2d.backward", label + (c.inputGradient ? "" : ", dx null"), tolerance, [&](Check& check) {
      TwinOp<Conv2dOp> conv{lab.cpu.conv2d(spec), lab.gpu.conv2d(spec)};
      check.note = algorithmsOf(*conv.gpu);
      Twin<float> x = lab.input(lab.random.normal(in.numel()), in), weight = lab.input(lab.random.normal(weights, 0, weightScale)),
                  dy = lab.input(lab.random.normal(out.numel()), out);
      Twin<float> dx = c.inputGradient ? lab.activation(in) : Twin<float>{}, dWeight = lab.empty<float>(weights),
                  dBias = spec.bias ? lab.empty<float>(spec.outChannels) : Twin<float>{};
      auto op = [&](Backend& b) { conv.on(b).backward(x.on(b), weight.on(b), dy.on(b), dx.on(b), dWeight.on(b), dBias.on(b)); };
      lab.both(op, dx, dWeight, dBias);
      if (c.inputGradient) lab.expect(check, "dx", dx);
      lab.expect(check, "dWeight", dWeight);
      if (spec.bias) lab.expect(check, "dBias", dBias);
      lab.measure(check, op, Work::compute(c.inputGradient ? 2 * flops : flops));  // dW, and dx when asked
    });
  }
}

// ---- Batch norm --------------------------------------------------------------------------------------

// Activations with a mean and spread of their own per channel, as after a convolution, so the batch
// statistics are of order one rather than noise around zero.
std::vector<float> channelActivations(RandomInputs& random, const Dims& d) {
  std::vector<float> x = random.normal(d.numel());
  const std::vector<float> mean = random.normal(d.c), spread = random.positive(d.c);
  const int64_t plane = d.h * d.w;
  for (int64_t i = 0; i < d.numel(); ++i) {
    const size_t c = static_cast<size_t>(i / plane % d.c);
    x[static_cast<size_t>(i)] = mean[c] + spread[c] * x[static_cast<size_t>(i)];
  }
  return x;
}

struct ChannelStatistics {
  std::vector<float> mean, var;  // var biased, as batch norm normalises with
};

// The batch statistics of an NCHW tensor, in double (two passes).
ChannelStatistics statisticsOf(const std::vector<float>& x, const Dims& d) {
  const int64_t plane = d.h * d.w;
  const double count = static_cast<double>(d.n * plane);
  std::vector<double> sum(static_cast<size_t>(d.c)), squares(static_cast<size_t>(d.c));
  for (int64_t i = 0; i < d.numel(); ++i) sum[static_cast<size_t>(i / plane % d.c)] += x[static_cast<size_t>(i)];
  for (int64_t i = 0; i < d.numel(); ++i) {
    const size_t c = static_cast<size_t>(i / plane % d.c);
    const double centred = x[static_cast<size_t>(i)] - sum[c] / count;
    squares[c] += centred * centred;
  }
  ChannelStatistics stats;
  for (size_t c = 0; c < sum.size(); ++c) {
    stats.mean.push_back(static_cast<float>(sum[c] / count));
    stats.var.push_back(static_cast<float>(squares[c] / count));
  }
  return stats;
}

// Gradients that depend on x̂ (half a per-channel multiple of it, plus half a per-channel offset,
// plus noise), so that mean(dy) and mean(dy·x̂), the terms through the batch statistics, are of
// order one: a backward that dropped or botched them fails by far more than the tolerance, as it
// would not against pure noise, where they are ~1/√(N·H·W).
std::vector<float> correlatedGradient(RandomInputs& random, const std::vector<float>& x, const Dims& d, const ChannelStatistics& stats,
                                      float eps) {
  std::vector<float> dy = random.normal(d.numel());
  const std::vector<float> slope = random.normal(d.c, 0, 0.5f), offset = random.normal(d.c, 0, 0.5f);
  const int64_t plane = d.h * d.w;
  for (int64_t i = 0; i < d.numel(); ++i) {
    const size_t c = static_cast<size_t>(i / plane % d.c), at = static_cast<size_t>(i);
    const float normalised = (x[at] - stats.mean[c]) / std::sqrt(stats.var[c] + eps);
    dy[at] += slope[c] * normalised + offset[c];
  }
  return dy;
}

// Batch norm in float64 on the host, NCHW: the reference of the training forward and of the
// backward (kBatchNorm), whatever the CPU's thread count. Channels are computed in parallel, each
// in a fixed order.
struct BatchNormForward {
  std::vector<float> y, batchMean, batchVar, runningMean, runningVar;
};

BatchNormForward batchNormForwardReference(const std::vector<float>& x, const Dims& d, const std::vector<float>& gamma,
                                           const std::vector<float>& beta, std::vector<float> runningMean,
                                           std::vector<float> runningVar, const BatchNormSpec& spec) {
  const int64_t plane = d.h * d.w, count = d.n * plane;
  const double momentum = spec.momentum, unbias = count > 1 ? static_cast<double>(count) / static_cast<double>(count - 1) : 1.0;
  BatchNormForward out{std::vector<float>(x.size()), std::vector<float>(static_cast<size_t>(d.c)),
                       std::vector<float>(static_cast<size_t>(d.c)), std::move(runningMean), std::move(runningVar)};
  parallelFor(d.c, [&](int64_t c) {
    auto at = [&](int64_t n, int64_t p) { return static_cast<size_t>((n * d.c + c) * plane + p); };
    double sum = 0;
    for (int64_t n = 0; n < d.n; ++n)
      for (int64_t p = 0; p < plane; ++p) sum += x[at(n, p)];
    const double mean = sum / static_cast<double>(count);
    double squares = 0;
    for (int64_t n = 0; n < d.n; ++n)
      for (int64_t p = 0; p < plane; ++p) squares += (x[at(n, p)] - mean) * (x[at(n, p)] - mean);
    const double var = squares / static_cast<double>(count), scale = gamma[c] / std::sqrt(var + spec.eps);
    for (int64_t n = 0; n < d.n; ++n)
      for (int64_t p = 0; p < plane; ++p) out.y[at(n, p)] = static_cast<float>((x[at(n, p)] - mean) * scale + beta[c]);
    const size_t k = static_cast<size_t>(c);
    out.batchMean[k] = static_cast<float>(mean);
    out.batchVar[k] = static_cast<float>(var);
    out.runningMean[k] = static_cast<float>((1 - momentum) * out.runningMean[k] + momentum * mean);
    out.runningVar[k] = static_cast<float>((1 - momentum) * out.runningVar[k] + momentum * var * unbias);
  });
  return out;
}

struct BatchNormBackward {
  std::vector<float> dx, dGamma, dBeta;
};

// dβ = Σdy, dγ = Σdy·x̂ with x̂ = (x − mean)/√(var + eps); dx = γ/√(var + eps)·(dy − dβ/M − x̂·dγ/M)
// when mean and var are the batch's statistics (M values per channel), γ/√(var + eps)·dy when they
// are constants.
BatchNormBackward batchNormBackwardReference(const std::vector<float>& x, const std::vector<float>& dy, const Dims& d,
                                             const std::vector<float>& gamma, const std::vector<float>& mean,
                                             const std::vector<float>& var, float eps, bool batchStatistics) {
  const int64_t plane = d.h * d.w;
  const double count = static_cast<double>(d.n * plane);
  BatchNormBackward out{std::vector<float>(x.size()), std::vector<float>(static_cast<size_t>(d.c)),
                        std::vector<float>(static_cast<size_t>(d.c))};
  parallelFor(d.c, [&](int64_t c) {
    auto at = [&](int64_t n, int64_t p) { return static_cast<size_t>((n * d.c + c) * plane + p); };
    const size_t k = static_cast<size_t>(c);
    const double invStd = 1 / std::sqrt(static_cast<double>(var[k]) + eps), mu = mean[k];
    double sumDy = 0, sumDyXhat = 0;
    for (int64_t n = 0; n < d.n; ++n)
      for (int64_t p = 0; p < plane; ++p) {
        sumDy += dy[at(n, p)];
        sumDyXhat += dy[at(n, p)] * (x[at(n, p)] - mu) * invStd;
      }
    const double scale = gamma[k] * invStd;
    for (int64_t n = 0; n < d.n; ++n)
      for (int64_t p = 0; p < plane; ++p) {
        const double g = dy[at(n, p)], xHat = (x[at(n, p)] - mu) * invStd;
        out.dx[at(n, p)] = static_cast<float>(batchStatistics ? scale * (g - sumDy / count - xHat * sumDyXhat / count) : scale * g);
      }
    out.dGamma[k] = static_cast<float>(sumDyXhat);
    out.dBeta[k] = static_cast<float>(sumDy);
  });
  return out;
}

void checkBatchNorm2d(Lab& lab) {
  // Odd shapes (a single value per channel and image, a batch of one), every batch norm of
  // ResNet-18 and VGG-19 at batch 128, and 256 MiB for bandwidth.
  const Dims shapes[] = {{1, 3, 5, 5},     {3, 7, 1, 1},    {3, 5, 7, 9},    {128, 64, 32, 32}, {128, 128, 16, 16},
                         {128, 256, 8, 8}, {128, 512, 4, 4}, {128, 512, 2, 2}, {256, 64, 64, 64}};
  for (const Dims& d : shapes) {
    const BatchNormSpec spec{d.n, d.c, d.h, d.w};
    const double bytes = 4.0 * d.numel();  // of one x-sized tensor
    auto makeOp = [&] { return TwinOp<BatchNorm2dOp>{lab.cpu.batchNorm2d(spec), lab.gpu.batchNorm2d(spec)}; };
    auto gammaOf = [&] { return lab.input(lab.random.normal(d.c, 1, 0.2f)); };
    auto betaOf = [&] { return lab.input(lab.random.normal(d.c, 0, 0.5f)); };

    // Against the float64 reference: the GPU op alone runs.
    lab.run("batchNorm2d.forwardTraining", d.label(), kBatchNorm, [&](Check& check) {
      std::unique_ptr<BatchNorm2dOp> bn = lab.gpu.batchNorm2d(spec);
      const std::vector<float> xHost = channelActivations(lab.random, d), gammaHost = lab.random.normal(d.c, 1, 0.2f),
                               betaHost = lab.random.normal(d.c, 0, 0.5f), runningMeanHost = lab.random.normal(d.c),
                               runningVarHost = lab.random.positive(d.c);
      Twin<float> x = lab.input(xHost, d), gamma = lab.input(gammaHost), beta = lab.input(betaHost);
      Twin<float> runningMean = lab.input(runningMeanHost), runningVar = lab.input(runningVarHost);
      Twin<float> y = lab.activation(d), batchMean = lab.empty<float>(d.c), batchVar = lab.empty<float>(d.c);
      auto op = [&](Backend& b) {
        bn->forwardTraining(x.on(b), gamma.on(b), beta.on(b), y.on(b), batchMean.on(b), batchVar.on(b), runningMean.on(b),
                            runningVar.on(b));
      };
      lab.onGpu(op, y, batchMean, batchVar);
      const BatchNormForward want = batchNormForwardReference(xHost, d, gammaHost, betaHost, runningMeanHost, runningVarHost, spec);
      compare(check, "y", lab.fromGpu(y), want.y, check.tolerance);
      compare(check, "batchMean", lab.fromGpu(batchMean), want.batchMean, check.tolerance);
      compare(check, "batchVar", lab.fromGpu(batchVar), want.batchVar, check.tolerance);
      compare(check, "runningMean", lab.fromGpu(runningMean), want.runningMean, check.tolerance);
      compare(check, "runningVar", lab.fromGpu(runningVar), want.runningVar, check.tolerance);
      lab.measure(check, op, Work::memory(3 * bytes));  // read x for the statistics and again to normalise, write y
    });
    lab.run("batchNorm2d.forwardInference", d.label(), kFewRoundings, [&](Check& check) {
      TwinOp<BatchNorm2dOp> bn = makeOp();
      Twin<float> x = lab.input(channelActivations(lab.random, d), d), gamma = gammaOf(), beta = betaOf();
      Twin<float> mean = lab.input(lab.random.normal(d.c)), var = lab.input(lab.random.positive(d.c)), y = lab.activation(d);
      auto op = [&](Backend& b) { bn.on(b).forwardInference(x.on(b), gamma.on(b), beta.on(b), mean.on(b), var.on(b), y.on(b)); };
      lab.both(op, y);
      lab.expect(check, "y", y);
      lab.measure(check, op, Work::memory(2 * bytes));  // read x, write y
    });
    for (bool batchStatistics : {true, false})
      lab.run("batchNorm2d.backward", d.label() + (batchStatistics ? ", batch statistics" : ", fixed statistics"), kBatchNorm,
              [&](Check& check) {
                std::unique_ptr<BatchNorm2dOp> bn = lab.gpu.batchNorm2d(spec);
                const std::vector<float> xHost = channelActivations(lab.random, d);
                // The forward's statistics of this x, or running ones that are constants here.
                const ChannelStatistics stats =
                    batchStatistics ? statisticsOf(xHost, d) : ChannelStatistics{lab.random.normal(d.c), lab.random.positive(d.c)};
                const std::vector<float> gammaHost = lab.random.normal(d.c, 1, 0.2f), betaHost = lab.random.normal(d.c, 0, 0.5f),
                                         dyHost = correlatedGradient(lab.random, xHost, d, stats, spec.eps);
                Twin<float> x = lab.input(xHost, d), gamma = lab.input(gammaHost), beta = lab.input(betaHost),
                            mean = lab.input(stats.mean), var = lab.input(stats.var), dy = lab.input(dyHost, d);
                Twin<float> dx = lab.activation(d), dGamma = lab.empty<float>(d.c), dBeta = lab.empty<float>(d.c);
                auto op = [&](Backend& b) {
                  bn->backward(x.on(b), dy.on(b), gamma.on(b), beta.on(b), mean.on(b), var.on(b), batchStatistics, dx.on(b),
                               dGamma.on(b), dBeta.on(b));
                };
                lab.onGpu(op, dx, dGamma, dBeta);
                const BatchNormBackward want =
                    batchNormBackwardReference(xHost, dyHost, d, gammaHost, stats.mean, stats.var, spec.eps, batchStatistics);
                compare(check, "dx", lab.fromGpu(dx), want.dx, check.tolerance);
                compare(check, "dGamma", lab.fromGpu(dGamma), want.dGamma, check.tolerance);
                compare(check, "dBeta", lab.fromGpu(dBeta), want.dBeta, check.tolerance);
                // With batch statistics: read x and dy for Σdy and Σdy·x̂, then again to write dx (5
                // passes). With fixed ones, the sums and dx fit one pass (3).
                lab.measure(check, op, Work::memory((batchStatistics ? 5 : 3) * bytes));
              });
  }
}

// ---- Max pooling -------------------------------------------------------------------------------------

void checkMaxPool2d(Lab& lab) {
  struct PoolCase {
    Dims in;
    int64_t kernel, stride, padding;
    bool ties = false;  // inputs rounded to whole numbers, so that windows hold equal maxima
  };
  const PoolCase cases[] = {
      // VGG-19's five 2×2 pools at batch 128.
      {{128, 64, 32, 32}, 2, 2, 0},
      {{128, 128, 16, 16}, 2, 2, 0},
      {{128, 256, 8, 8}, 2, 2, 0},
      {{128, 512, 4, 4}, 2, 2, 0},
      {{128, 512, 2, 2}, 2, 2, 0},
      // Overlapping 3×3 windows with stride 2 and padding 1 (ImageNet ResNet's stem pool).
      {{128, 64, 32, 32}, 3, 2, 1},
      // Odd sizes, where windows leave the last row and column out or hang over the padding.
      {{3, 5, 7, 9}, 2, 2, 0},
      {{1, 1, 3, 3}, 2, 2, 0},
      {{3, 5, 7, 9}, 3, 2, 1},
      {{1, 3, 5, 5}, 3, 2, 1},
      // Equal maxima, where the first in the window, row by row, must win (as on the CPU).
      {{3, 5, 7, 9}, 2, 2, 0, true},
      {{3, 5, 7, 9}, 3, 2, 1, true},
      {{128, 64, 32, 32}, 3, 2, 1, true},
      // 256 MiB of input for bandwidth.
      {{256, 64, 64, 64}, 2, 2, 0},
      {{256, 64, 64, 64}, 3, 2, 1},
  };
  for (const PoolCase& c : cases) {
    const Pool2dSpec spec{c.in.n, c.in.c, c.in.h, c.in.w, c.kernel, c.stride, c.padding};
    const Dims out{c.in.n, c.in.c, spec.outHeight(), spec.outWidth()};
    const std::string label = c.in.label() + " k" + std::to_string(c.kernel) + " s" + std::to_string(c.stride) + " p" +
                              std::to_string(c.padding) + (c.ties ? ", ties" : "");
    auto inputOf = [&] {
      std::vector<float> x = lab.random.normal(c.in.numel());
      if (c.ties)
        for (float& v : x) v = std::round(v);
      return x;
    };
    // Read one tensor and write the other; where each maximum came from is the implementation's
    // business and not counted.
    const double bytes = 4.0 * (c.in.numel() + out.numel());
    lab.run("maxPool2d.forward", label, kExact, [&](Check& check) {
      TwinOp<MaxPool2dOp> pool{lab.cpu.maxPool2d(spec), lab.gpu.maxPool2d(spec)};
      Twin<float> x = lab.input(inputOf(), c.in), y = lab.activation(out);
      auto op = [&](Backend& b) { pool.on(b).forward(x.on(b), y.on(b)); };
      lab.both(op, y);
      lab.expect(check, "y", y);
      lab.measure(check, op, Work::memory(bytes));
    });
    // Windows that overlap may send several gradients to one input, summed in any order.
    lab.run("maxPool2d.backward", label, c.kernel > c.stride ? kOneRounding : kExact, [&](Check& check) {
      TwinOp<MaxPool2dOp> pool{lab.cpu.maxPool2d(spec), lab.gpu.maxPool2d(spec)};
      Twin<float> x = lab.input(inputOf(), c.in), y = lab.activation(out);
      lab.both([&](Backend& b) { pool.on(b).forward(x.on(b), y.on(b)); }, y);  // where the maxima are
      Twin<float> dy = lab.input(lab.random.normal(out.numel()), out), dx = lab.activation(c.in);
      auto op = [&](Backend& b) { pool.on(b).backward(dy.on(b), dx.on(b)); };
      lab.both(op, dx);
      lab.expect(check, "dx", dx);
      lab.measure(check, op, Work::memory(bytes));
    });
  }
}

// ---- Driver --------------------------------------------------------------------------------------

struct Family {
  const char* name;
  void (*run)(Lab&);
};

const Family kFamilies[] = {
    {"memory", checkMemory},
    {"fill", checkFill},
    {"relu", checkRelu},
    {"add", checkAdd},
    {"scale", checkScale},
    {"dropout", checkDropout},
    {"globalAvgPool", checkGlobalAvgPool},
    {"flatten", checkFlatten},
    {"linear", checkLinear},
    {"gemm", checkGemm},
    {"bias", checkBias},
    {"embedding", checkEmbedding},
    {"lstmCell", checkLstmCell},
    {"softmaxCrossEntropy", checkSoftmaxCrossEntropy},
    {"sgdUpdate", checkSgdUpdate},
    {"findNonFinite", checkFindNonFinite},
    {"accumulate", checkAccumulate},
    {"sumsOfSquares", checkSumsOfSquares},
    {"totalSumOfSquares", checkTotalSumOfSquares},
    {"conv2d", checkConv2d},
    {"batchNorm2d", checkBatchNorm2d},
    {"maxPool2d", checkMaxPool2d},
    {"powerSgd", checkPowerSgd},
    {"topK", checkTopK},
    {"denseExchange", checkDenseExchange},
};

std::string familyNames() {
  std::string names;
  for (const Family& f : kFamilies) names += (names.empty() ? "" : ", ") + std::string(f.name);
  return names;
}

std::string usage() {
  return "usage: kernel_check [--iterations N] [--seed S] [--json FILE] [--jsonl FILE] [--stage NAME]\n"
         "                    [--only NAME[,NAME...]] [--max-elements N]\n"
         "       kernel_check --device-info\n"
         "       kernel_check --self-check\n"
         "Checks every CUDA op against its CPU twin on fresh random inputs, then times it on cuda:0.\n"
         "  --device-info     run one kernel on cuda:0 and print the device as one JSON line\n"
         "  --self-check      only check the comparison itself (unwritten, NaN and Inf outputs fail) and the\n"
         "                    float64 batch-norm reference against the CPU's batch norm; no GPU needed\n"
         "  --iterations N    timed launches per op after warm-up; the median is reported (default 50)\n"
         "  --seed S          the inputs of an earlier run (default: from the clock; printed)\n"
         "  --json FILE       also write the results to FILE as JSON\n"
         "  --jsonl FILE      append each check to FILE as one line of JSON as soon as it ends\n"
         "  --stage NAME      the \"stage\" of those lines (default lab)\n"
         "  --max-elements N  skip the checks that need a tensor of more than N elements (under a sanitizer)\n"
         "  --only NAMES      only these op families, comma-separated:\n"
         "                    " +
         familyNames() +
         "\n"
         "Exit status: 0 when every check passes, 1 when one fails, 2 on bad usage, 3 when no device is usable,\n"
         "4 when a fault broke the CUDA context (the checks after it are reported as not run).\n";
}

// The bandwidth of a 1 GiB device-to-device copy on the backend's stream, counting the bytes read
// and written: what memory-bound ops are measured against.
double copyBandwidth(Lab& lab) {
  const size_t bytes = size_t{1} << 30;
  std::shared_ptr<void> src = lab.gpu.allocate(bytes), dst = lab.gpu.allocate(bytes);
  cuda::check(cudaMemsetAsync(src.get(), 0, bytes, lab.gpu.stream()), "cudaMemsetAsync");
  const double us = lab.medianUs([&] {
    cuda::check(cudaMemcpyAsync(dst.get(), src.get(), bytes, cudaMemcpyDeviceToDevice, lab.gpu.stream()), "cudaMemcpyAsync");
  });
  return 2.0 * static_cast<double>(bytes) / (us * 1e3);
}

using lab::jsonNumber;
using lab::jsonString;

void writeJson(std::ofstream& out, const std::string& device, double copyGBs, uint64_t seed, int iterations, const Lab& lab,
               const std::string& stage, bool passed) {
  out << "{\n  \"device\": " << jsonString(device) << ",\n  \"copyBandwidthGBs\": " << jsonNumber(copyGBs) << ",\n  \"seed\": " << seed
      << ",\n  \"iterations\": " << iterations << ",\n  \"results\": [";
  for (size_t i = 0; i < lab.results.size(); ++i)
    out << (i ? "," : "") << "\n    " << lab::checkRow(lab.results[i], stage, lab.resultFamilies[i]);
  out << "\n  ],\n  \"passed\": " << (passed ? "true" : "false") << "\n}\n";
}

// The float64 batch-norm reference against the CPU's batch norm (oneDNN) on small shapes, where the
// CPU's float sums are exact to a few roundings: a wrong formula (a sign, the unbiased running
// variance, a missing term) fails by far more than kBatchNorm. Needs no device.
std::vector<std::string> referenceSelfCheck() {
  std::vector<std::string> problems;
  CpuBackend cpu;
  RandomInputs random(20240531);
  for (const Dims& d : {Dims{3, 5, 7, 9}, Dims{8, 16, 12, 12}, Dims{1, 3, 1, 1}}) {
    const BatchNormSpec spec{d.n, d.c, d.h, d.w};
    std::unique_ptr<BatchNorm2dOp> bn = cpu.batchNorm2d(spec);
    auto channelsLast = [&](const std::vector<float>& nchw) {
      Array<float> a(d.numel(), cpu);
      nchwToNhwc(nchw.data(), a.data(), d.n, d.c, d.h, d.w);
      return a;
    };
    auto channelsFirst = [&](const Array<float>& nhwc) {
      std::vector<float> out(static_cast<size_t>(d.numel()));
      nhwcToNchw(nhwc.data(), out.data(), d.n, d.c, d.h, d.w);
      return out;
    };
    auto vectorOf = [](const Array<float>& a) { return std::vector<float>(a.data(), a.data() + a.size()); };
    auto arrayOf = [&](const std::vector<float>& v) {
      Array<float> a(static_cast<int64_t>(v.size()), cpu);
      std::copy(v.begin(), v.end(), a.data());
      return a;
    };
    const std::vector<float> x = channelActivations(random, d), gamma = random.normal(d.c, 1, 0.2f), beta = random.normal(d.c, 0, 0.5f),
                             runningMean = random.normal(d.c), runningVar = random.positive(d.c);
    Check forward;
    {
      Array<float> xs = channelsLast(x), y(d.numel(), cpu), g = arrayOf(gamma), b = arrayOf(beta), mean(d.c, cpu), var(d.c, cpu),
                   rm = arrayOf(runningMean), rv = arrayOf(runningVar);
      bn->forwardTraining(xs.data(), g.data(), b.data(), y.data(), mean.data(), var.data(), rm.data(), rv.data());
      const BatchNormForward want = batchNormForwardReference(x, d, gamma, beta, runningMean, runningVar, spec);
      compare(forward, "y", channelsFirst(y), want.y, kBatchNorm);
      compare(forward, "batchMean", vectorOf(mean), want.batchMean, kBatchNorm);
      compare(forward, "batchVar", vectorOf(var), want.batchVar, kBatchNorm);
      compare(forward, "runningMean", vectorOf(rm), want.runningMean, kBatchNorm);
      compare(forward, "runningVar", vectorOf(rv), want.runningVar, kBatchNorm);
    }
    for (const std::string& f : forward.failures) problems.push_back("batch-norm forward reference " + d.label() + ": " + f);
    for (bool batchStatistics : {true, false}) {
      const ChannelStatistics stats = batchStatistics ? statisticsOf(x, d) : ChannelStatistics{random.normal(d.c), random.positive(d.c)};
      const std::vector<float> dy = correlatedGradient(random, x, d, stats, spec.eps);
      Array<float> xs = channelsLast(x), dys = channelsLast(dy), g = arrayOf(gamma), b = arrayOf(beta), mean = arrayOf(stats.mean),
                   var = arrayOf(stats.var), dx(d.numel(), cpu), dGamma(d.c, cpu), dBeta(d.c, cpu);
      bn->backward(xs.data(), dys.data(), g.data(), b.data(), mean.data(), var.data(), batchStatistics, dx.data(), dGamma.data(),
                   dBeta.data());
      const BatchNormBackward want = batchNormBackwardReference(x, dy, d, gamma, stats.mean, stats.var, spec.eps, batchStatistics);
      Check backward;
      compare(backward, "dx", channelsFirst(dx), want.dx, kBatchNorm);
      compare(backward, "dGamma", vectorOf(dGamma), want.dGamma, kBatchNorm);
      compare(backward, "dBeta", vectorOf(dBeta), want.dBeta, kBatchNorm);
      for (const std::string& f : backward.failures)
        problems.push_back("batch-norm backward reference " + d.label() + (batchStatistics ? " (batch statistics): " : " (fixed): ") + f);
    }
  }
  return problems;
}

// --device-info: one kernel on cuda:0 (under compute-sanitizer, whether it accepts the device),
// then the device as one line of JSON.
int deviceInfo() {
  try {
    cuda::CudaBackend gpu(0);
    Array<float> one(1, gpu);
    gpu.fill(one.data(), 1, 1.0f);
    gpu.synchronize();
    cudaDeviceProp prop{};
    cuda::check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
    int runtime = 0, driver = 0, count = 0;
    cudaRuntimeGetVersion(&runtime);
    cudaDriverGetVersion(&driver);
    cudaGetDeviceCount(&count);
    std::printf("{\"device\": %s, \"computeCapability\": \"%d.%d\", \"memoryGiB\": %.1f, \"multiprocessors\": %d, \"devices\": %d, "
                "\"runtimeVersion\": %d, \"driverVersion\": %d, \"cudnn\": %s, \"cublas\": %s}\n",
                jsonString(prop.name).c_str(), prop.major, prop.minor, prop.totalGlobalMem / 1073741824.0, prop.multiProcessorCount, count,
                runtime, driver, jsonString(cuda::cudnnStatus().version).c_str(), jsonString(cuda::cublasStatus().version).c_str());
    return 0;
  } catch (const EngineError& e) {
    const std::string code = e.code();
    std::fprintf(stderr, "kernel_check: cuda:0 is not usable: %s (%s)\n", e.what(), code.c_str());
    return code == "ERR_NO_CUDA_DEVICE" || code == "ERR_CUDA_LIBRARY" ? 3 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kernel_check: cuda:0 is not usable: %s\n", e.what());
    return 1;
  }
}

int labMain(int argc, char** argv) {
  Options options;
  try {
    options = parseOptions(argc, argv);
    for (const std::string& name : options.only)
      if (std::none_of(std::begin(kFamilies), std::end(kFamilies), [&](const Family& f) { return name == f.name; }))
        throw UsageError("no op family '" + name + "'");
  } catch (const UsageError& e) {
    std::fprintf(stderr, "kernel_check: %s\n\n%s", e.what(), usage().c_str());
    return 2;
  }
  if (options.help) {
    std::printf("%s", usage().c_str());
    return 0;
  }
  // The verdicts below are only as good as the comparison: check it first, on known cases.
  const std::vector<std::string> comparisonProblems = lab::comparisonSelfCheck();
  for (const std::string& p : comparisonProblems) std::fprintf(stderr, "kernel_check: the comparison is broken: %s\n", p.c_str());
  if (!comparisonProblems.empty()) return 1;
  if (options.selfCheckOnly) {
    const std::vector<std::string> referenceProblems = referenceSelfCheck();
    for (const std::string& p : referenceProblems) std::fprintf(stderr, "kernel_check: %s\n", p.c_str());
    if (!referenceProblems.empty()) return 1;
    std::printf("comparison self-check passed: unwritten, NaN and Inf outputs fail, and NaN errors are kept\n");
    std::printf("reference self-check passed: the float64 batch norm agrees with the CPU's\n");
    return 0;
  }
  if (options.deviceInfo) return deviceInfo();
  std::ofstream json;
  if (!options.jsonPath.empty()) {
    json.open(options.jsonPath);
    if (!json) {
      std::fprintf(stderr, "kernel_check: cannot write %s\n", options.jsonPath.c_str());
      return 2;
    }
  }
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> rows(nullptr, std::fclose);
  if (!options.jsonlPath.empty()) {
    rows.reset(std::fopen(options.jsonlPath.c_str(), "a"));
    if (!rows) {
      std::fprintf(stderr, "kernel_check: cannot append to %s: %s\n", options.jsonlPath.c_str(), std::strerror(errno));
      return 2;
    }
  }
  std::string families;
  for (const std::string& f : options.only) families += (families.empty() ? "" : ",") + f;
  if (families.empty()) families = "all";
  // A row for the whole process: how it began, or why it could not.
  auto event = [&](const std::string& fields) {
    if (!rows) return;
    std::fprintf(rows.get(), "{\"stage\": %s, \"family\": %s, %s}\n", jsonString(options.stage).c_str(), jsonString(families).c_str(),
                 fields.c_str());
    std::fflush(rows.get());
  };

  // Without a device the JSON still says why nothing was checked.
  auto unusable = [&](const std::string& why, int status) {
    std::fprintf(stderr, "kernel_check: cuda:0 is not usable: %s\n", why.c_str());
    if (json.is_open()) json << "{\n  \"error\": " << jsonString("cuda:0 is not usable: " + why) << ",\n  \"passed\": false\n}\n";
    event("\"event\": \"no device\", \"error\": " + jsonString(why));
    return status;
  };
  std::unique_ptr<cuda::CudaBackend> gpu;
  try {
    gpu = std::make_unique<cuda::CudaBackend>(0);
  } catch (const EngineError& e) {
    const std::string code = e.code();
    return unusable(std::string(e.what()) + " (" + code + ")", code == "ERR_NO_CUDA_DEVICE" || code == "ERR_CUDA_LIBRARY" ? 3 : 1);
  } catch (const std::exception& e) {
    return unusable(e.what(), 1);
  }
  CpuBackend cpu;

  cudaDeviceProp prop{};
  cuda::check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  int runtime = 0, driver = 0;
  cudaRuntimeGetVersion(&runtime);
  cudaDriverGetVersion(&driver);
  const std::string device = std::string(prop.name) + " (sm_" + std::to_string(prop.major) + std::to_string(prop.minor) + ")";
  // Microseconds since the epoch: a fresh seed every run, exact as a JSON number.
  const uint64_t seed = options.seed.value_or(static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch()).count()));
  std::printf("device %s, %.1f GiB, L2 %.0f MiB; CUDA runtime %d, driver %d\n", device.c_str(), prop.totalGlobalMem / 1073741824.0,
              prop.l2CacheSize / 1048576.0, runtime, driver);
  std::printf("seed %llu (reproduce with --seed %llu), %d timed iterations per op\n", static_cast<unsigned long long>(seed),
              static_cast<unsigned long long>(seed), options.iterations);
  if (options.maxElements > 0) std::printf("checks with a tensor of more than %lld elements are skipped\n", static_cast<long long>(options.maxElements));
  const char* ompThreads = std::getenv("OMP_NUM_THREADS");
  std::printf("CPU reference on %u cores%s%s\n", std::thread::hardware_concurrency(), ompThreads ? ", OMP_NUM_THREADS=" : "",
              ompThreads ? ompThreads : "");

  Lab lab(cpu, *gpu, seed, options.iterations, options.maxElements, rows.get(), options.stage);
  try {
    lab.copyGBs = copyBandwidth(lab);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kernel_check: measuring the copy bandwidth failed: %s\n", e.what());
    event("\"event\": \"failed\", \"error\": " + jsonString(std::string("measuring the copy bandwidth: ") + e.what()));
    return 1;
  }
  event("\"event\": \"start\", \"device\": " + jsonString(device) + ", \"copyBandwidthGBs\": " + jsonNumber(lab.copyGBs) +
        ", \"seed\": " + std::to_string(seed) + ", \"iterations\": " + std::to_string(options.iterations) +
        ", \"maxElements\": " + std::to_string(options.maxElements));
  std::printf("device-to-device copy: %.1f GB/s (read + write), the yardstick for %% copy\n\n", lab.copyGBs);
  printHeader();

  const auto started = std::chrono::steady_clock::now();
  for (const Family& family : kFamilies)
    if (options.only.empty() || std::find(options.only.begin(), options.only.end(), family.name) != options.only.end()) {
      lab.family = family.name;
      family.run(lab);
    }

  const auto count = [&](auto predicate) { return static_cast<size_t>(std::count_if(lab.results.begin(), lab.results.end(), predicate)); };
  const size_t failed = count([](const Check& c) { return !c.pass; });
  const size_t skipped = count([](const Check& c) { return !c.skipped.empty(); });
  const bool passed = failed == 0;
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  std::printf("\n%zu checks in %.0f s: %zu passed, %zu FAILED, %zu skipped\n", lab.results.size(), seconds,
              lab.results.size() - failed - skipped, failed, skipped);
  for (const Check& c : lab.results)
    if (!c.pass) std::printf("  FAILED %s %s\n", c.op.c_str(), c.shape.c_str());
  if (!lab.lostContext().empty()) std::printf("kernel_check: the CUDA context was lost: %s\n", lab.lostContext().c_str());
  event(std::string("\"event\": \"end\", \"checks\": ") + std::to_string(lab.results.size()) + ", \"failed\": " + std::to_string(failed) +
        ", \"skipped\": " + std::to_string(skipped) + ", \"seconds\": " + jsonNumber(seconds) +
        (lab.lostContext().empty() ? "" : ", \"contextLost\": " + jsonString(lab.lostContext())));
  if (json.is_open()) {
    writeJson(json, device, lab.copyGBs, seed, options.iterations, lab, options.stage, passed);
    json.close();
    if (!json) {
      std::fprintf(stderr, "kernel_check: writing %s failed\n", options.jsonPath.c_str());
      return 1;
    }
    std::printf("results written to %s\n", options.jsonPath.c_str());
  }
  if (!lab.lostContext().empty()) return 4;
  return passed ? 0 : 1;
}

}  // namespace
}  // namespace accordion

int main(int argc, char** argv) { return accordion::labMain(argc, argv); }

// The kernel lab: every CUDA op (cuda/ops/) and compression kernel checked against
// its CPU twin (cpp/ops/) on fresh random inputs, then timed with CUDA events, in the
// manner of llm.c's dev/cuda. It needs no Node (the GPU machines have none):
//
//   kernel_check [--iterations N] [--seed S] [--json FILE] [--jsonl FILE] [--stage NAME]
//                [--only NAME[,NAME...]] [--max-elements N]
//   kernel_check --device-info     the device as one JSON line, after one kernel ran on it
//   kernel_check --self-check      the comparison and the float64 references alone, on the CPU; no device needed
//
// This file is its driver: the command line, the table of op families and the results. The harness
// is lab.h (and inputs.h), each family's checks a file in checks/: a new family is a check function
// there and a row in kFamilies. The families of ops on activations run twice, on NCHW and on NHWC
// GPU activations (their rows marked ", nhwc"); the others once, on NCHW.
//
// The GPU check (scripts/gpu-check/) runs one process per op family (--only FAMILY), so that a
// fault that breaks the CUDA context of one family leaves the others measured, and collects the
// rows that --jsonl appends to its results as each check ends (flushed, so a killed process leaves
// every finished row).
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
#include "lab/lab.h"

namespace accordion::lab {
namespace {

// ---- Command line ----------------------------------------------------------------------------

struct UsageError : std::runtime_error {
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

// ---- Driver --------------------------------------------------------------------------------------

struct Family {
  const char* name;
  void (*run)(Lab&);
  bool layouts = false;  // its ops read or write activations: checked in both GPU layouts
};

const Family kFamilies[] = {
    {"memory", checkMemory},
    {"fill", checkFill},
    {"relu", checkRelu},
    {"add", checkAdd},
    {"scale", checkScale},
    {"dropout", checkDropout},
    {"globalAvgPool", checkGlobalAvgPool, true},
    {"flatten", checkFlatten, true},
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
    {"clipTotalNorm", checkClipTotalNorm},
    {"conv2d", checkConv2d, true},
    {"batchNorm2d", checkBatchNorm2d, true},
    {"maxPool2d", checkMaxPool2d, true},
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


void writeJson(std::ofstream& out, const std::string& device, double copyGBs, uint64_t seed, int iterations, const Lab& lab,
               const std::string& stage, bool passed) {
  out << "{\n  \"device\": " << jsonString(device) << ",\n  \"copyBandwidthGBs\": " << jsonNumber(copyGBs) << ",\n  \"seed\": " << seed
      << ",\n  \"iterations\": " << iterations << ",\n  \"results\": [";
  for (size_t i = 0; i < lab.results.size(); ++i)
    out << (i ? "," : "") << "\n    " << checkRow(lab.results[i], stage, lab.resultFamilies[i]);
  out << "\n  ],\n  \"passed\": " << (passed ? "true" : "false") << "\n}\n";
}

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
  const std::vector<std::string> comparisonProblems = comparisonSelfCheck();
  for (const std::string& p : comparisonProblems) std::fprintf(stderr, "kernel_check: the comparison is broken: %s\n", p.c_str());
  if (!comparisonProblems.empty()) return 1;
  if (options.selfCheckOnly) {
    const std::vector<std::string> referenceProblems = batchNormReferenceSelfCheck();
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
      for (const bool channelsLast : {false, true}) {
        if (channelsLast && !family.layouts) break;
        lab.gpu.options.channelsLast = channelsLast;
        lab.variant = channelsLast ? ", nhwc" : "";
        family.run(lab);
      }
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
}  // namespace accordion::lab

int main(int argc, char** argv) { return accordion::lab::labMain(argc, argv); }
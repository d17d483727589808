// Module entry: build and device information, the classes, and small stateless functions.
#include <cblas.h>
#include <omp.h>

#include <oneapi/dnnl/dnnl.hpp>

#include "compress/traffic.h"
#include "core/cuda.h"
#include "ops/cpu_bf16.h"
#include "ops/cpu_sgemm.h"
#include "ops/cpu_compression_kernels.h"
#include "napi/classes.h"

namespace accordion::napi {

std::atomic<int>& defaultThreads() {
  static std::atomic<int> threads{0};
  return threads;
}

struct AddonData {
  Napi::FunctionReference batcherClass, groupClass;
};

namespace {

// { loaded, path, version, error } of a library loaded at run time.
Napi::Object libraryValue(Napi::Env env, const cuda::LibraryStatus& s) {
  Napi::Object o = Napi::Object::New(env);
  o.Set("loaded", s.loaded);
  o.Set("path", s.path);
  o.Set("version", s.version);
  o.Set("error", s.error);
  return o;
}

Napi::Value buildInfo(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Napi::Object o = Napi::Object::New(env);
  const dnnl_version_t* dnnl = dnnl_version();
  o.Set("dnnl", std::to_string(dnnl->major) + "." + std::to_string(dnnl->minor) + "." + std::to_string(dnnl->patch));
  o.Set("openblas", openblas_get_config());
  o.Set("threads", omp_get_max_threads());
  Napi::Object cpu = Napi::Object::New(env);
  cpu.Set("isa", cpuIsaName());
  cpu.Set("bf16", cpuBf16Compute() == Bf16Compute::Native ? "native" : "rounded");
  cpu.Set("sgemm", sgemmLibraryName(cpuSgemmLibrary()));
  o.Set("cpu", cpu);
  Napi::Object cuda = Napi::Object::New(env);
  cuda.Set("built", cuda::built());
  cuda.Set("architectures", cuda::compiledArchitectures());
  cuda.Set("runtimeVersion", cuda::runtimeVersion());
  const cuda::LibraryStatus nccl = cuda::ncclStatus();
  cuda.Set("nccl", nccl.loaded ? Napi::Value(Napi::Boolean::New(env, true)) : Napi::Value(Napi::String::New(env, nccl.error)));
  o.Set("cuda", cuda);
  Napi::Array models = Napi::Array::New(env);
  for (const auto& name : architectures()) models.Set(models.Length(), name);
  o.Set("models", models);
  return o;
}

// { count, errorCode, error, devices: [{ name, computeCapability, memoryBytes }], cudnn, cublas, nccl }:
// the devices the driver reports and whether NVIDIA's libraries load; never throws.
Napi::Value deviceQuery(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  cuda::DeviceQuery q = cuda::queryDevices();
  Napi::Object o = Napi::Object::New(env);
  o.Set("count", q.count);
  o.Set("errorCode", q.errorCode);
  o.Set("error", q.error);
  Napi::Array devices = Napi::Array::New(env, q.devices.size());
  for (size_t i = 0; i < q.devices.size(); ++i) {
    Napi::Object d = Napi::Object::New(env);
    d.Set("name", q.devices[i].name);
    d.Set("computeCapability", std::to_string(q.devices[i].major) + "." + std::to_string(q.devices[i].minor));
    d.Set("memoryBytes", static_cast<double>(q.devices[i].memoryBytes));
    devices.Set(static_cast<uint32_t>(i), d);
  }
  o.Set("devices", devices);
  o.Set("cudnn", libraryValue(env, cuda::cudnnStatus()));
  o.Set("cublas", libraryValue(env, cuda::cublasStatus()));
  o.Set("nccl", libraryValue(env, cuda::ncclStatus()));
  return o;
}

// crossEntropy(logits: Float32Array (N×K), n, k, labels: Int32Array) → { loss, grad, correct }
Napi::Value crossEntropy(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Napi::Float32Array logits = float32Arg(info, 0, "logits");
  const int64_t n = intArg(info, 1, "n", 1, kMaxDimension), k = intArg(info, 2, "k", 1, kMaxDimension);
  Napi::Int32Array labels = int32Arg(info, 3, "labels");
  if (static_cast<int64_t>(labels.ElementLength()) != n) throw typeError(env, "labels must be an Int32Array of length n");
  Tensor z = fromJs(logits, {n, k}, env), grad({n, k});
  double stats[2];
  CpuBackend().softmaxCrossEntropy(z.data(), labels.Data(), n, k, grad.data(), stats);
  Napi::Object o = Napi::Object::New(env);
  o.Set("loss", stats[0]);
  o.Set("grad", toJs(env, grad));
  o.Set("correct", stats[1]);
  return o;
}

// orthogonalize(matrix: Float32Array (rows × cols, row-major), rows, cols, eps): modified
// Gram-Schmidt on the columns, in place (PowerSGD's orthogonalisation; exposed for tests and benchmarks).
Napi::Value orthogonalize(const Napi::CallbackInfo& info) {
  Napi::Float32Array m = float32Arg(info, 0, "matrix");
  const int64_t rows = intArg(info, 1, "rows", 1, kMaxDimension), cols = intArg(info, 2, "cols", 1, kMaxDimension);
  if (static_cast<int64_t>(m.ElementLength()) != rows * cols) throw typeError(info.Env(), "matrix must hold rows × cols floats");
  if (!info[3].IsUndefined() && !(info[3].IsNumber() && info[3].As<Napi::Number>().DoubleValue() >= 0))
    throw typeError(info.Env(), "eps must be a number ≥ 0");
  orthogonalizeColumns(m.Data(), rows, cols, info[3].IsNumber() ? info[3].As<Napi::Number>().FloatValue() : 1e-8f);
  return info.Env().Undefined();
}

// roundTo(values: Float32Array, commDtype: 'fp32' | 'bf16' | 'fp16') → Float32Array: each value
// rounded as the exchange rounds what it sends (core/precision.h), and widened back.
Napi::Value roundTo(const Napi::CallbackInfo& info) {
  Napi::Float32Array in = float32Arg(info, 0, "values");
  if (!info[1].IsString()) throw typeError(info.Env(), "commDtype must be a string");
  const Precision p = parsePrecision(info[1].As<Napi::String>().Utf8Value());
  Napi::Float32Array out = Napi::Float32Array::New(info.Env(), in.ElementLength());
  for (size_t i = 0; i < in.ElementLength(); ++i) out[i] = accordion::roundTo(p, in[i]);
  return out;
}

// exchangeTraffic(shapes: number[][], { compressor, levels: number[], bucketBytes, commDtype,
// minCompressionRate }) → { dense, denseBf16, powerSgdP, powerSgdQ, topkPairs }[]: per bucket, in the
// order they travel, the bytes one worker hands to each collective (compress/traffic.h).
Napi::Value exchangeTraffic(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (!info[0].IsArray() || !info[1].IsObject()) throw typeError(env, "expected (shapes, options)");
  Napi::Array shapes = info[0].As<Napi::Array>();
  Napi::Object o = info[1].As<Napi::Object>();
  TrafficQuery q;
  q.compressor = parseCompressor(stringOption(o, "compressor"));
  q.bucketBytes = intOption(o, "bucketBytes", 0, kMaxSafeInteger);
  q.sent = parsePrecision(stringOption(o, "commDtype"));
  q.minCompressionRate = numberOption(o, "minCompressionRate");
  if (!(q.minCompressionRate >= 0)) throw rangeError(env, "option 'minCompressionRate' must be ≥ 0");
  Napi::Value levels = o.Get("levels");
  if (!levels.IsArray() || levels.As<Napi::Array>().Length() != shapes.Length())
    throw typeError(env, "option 'levels' must hold one level per shape (" + std::to_string(shapes.Length()) + ")");
  for (uint32_t i = 0; i < shapes.Length(); ++i) {
    const std::string what = "shapes[" + std::to_string(i) + "]";
    q.shapes.push_back(shapeArg(env, shapes.Get(i), what.c_str()));
    for (int64_t d : q.shapes.back())
      if (d < 1) throw rangeError(env, what + " " + shapeString(q.shapes.back()) + " has a dimension below 1");
    Napi::Value level = levels.As<Napi::Array>().Get(i);
    if (!level.IsNumber() || !std::isfinite(level.As<Napi::Number>().DoubleValue()))
      throw typeError(env, "levels[" + std::to_string(i) + "] must be a finite number");
    q.levels.push_back(level.As<Napi::Number>().DoubleValue());
  }
  const std::vector<BucketTraffic> traffic = exchangeTraffic(q);
  Napi::Array out = Napi::Array::New(env, traffic.size());
  for (size_t b = 0; b < traffic.size(); ++b) {
    Napi::Object t = Napi::Object::New(env);
    t.Set("dense", static_cast<double>(traffic[b].dense));
    t.Set("denseBf16", static_cast<double>(traffic[b].denseBf16));
    t.Set("powerSgdP", static_cast<double>(traffic[b].powerSgdP));
    t.Set("powerSgdQ", static_cast<double>(traffic[b].powerSgdQ));
    t.Set("topkPairs", static_cast<double>(traffic[b].topkPairs));
    out.Set(static_cast<uint32_t>(b), t);
  }
  return out;
}

// checkDevice("cpu" | "cuda" | "cuda:N"): throws, with the cause's code, unless a model can run there.
Napi::Value checkDevice(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (!info[0].IsString()) throw typeError(env, "device must be a string");
  const Device device = parseDevice(info[0].As<Napi::String>().Utf8Value());
  if (device.isCuda())
    if (auto error = cuda::unusable(device.index)) throw *error;
  return env.Undefined();
}

Napi::Value setThreads(const Napi::CallbackInfo& info) {
  const int n = static_cast<int>(intArg(info, 0, "threads", 1, 4096));
  omp_set_num_threads(n);
  openblas_set_num_threads(n);
  defaultThreads() = n;
  return info.Env().Undefined();
}

}  // namespace

static bool isInstance(Napi::Value value, Napi::FunctionReference AddonData::*cls) {
  auto* data = value.Env().GetInstanceData<AddonData>();
  return value.IsObject() && value.As<Napi::Object>().InstanceOf((data->*cls).Value());
}

bool isBatcher(Napi::Value value) { return isInstance(value, &AddonData::batcherClass); }
bool isProcessGroup(Napi::Value value) { return isInstance(value, &AddonData::groupClass); }

static Napi::Object defineExports(Napi::Env env, Napi::Object exports) {
  auto* data = new AddonData();
  env.SetInstanceData(data);
  Napi::Function batcher = BatcherWrap::define(env);
  data->batcherClass = Napi::Persistent(batcher);
  exports.Set("Batcher", batcher);
  Napi::Function group = ProcessGroupWrap::define(env);
  data->groupClass = Napi::Persistent(group);
  exports.Set("ProcessGroup", group);
  exports.Set("Engine", EngineWrap::define(env));
  exports.Set("buildInfo", Napi::Function::New(env, guarded<buildInfo>));
  exports.Set("deviceQuery", Napi::Function::New(env, guarded<deviceQuery>));
  exports.Set("checkDevice", Napi::Function::New(env, guarded<checkDevice>));
  exports.Set("setThreads", Napi::Function::New(env, guarded<setThreads>));
  exports.Set("exchangeTraffic", Napi::Function::New(env, guarded<exchangeTraffic>));
  // Tools of the tests and benchmarks, apart from the library's classes: ts/testing.ts
  // (accordion-engine/testing) is their only door.
  Napi::Object testing = Napi::Object::New(env);
  testing.Set("LayerProbe", LayerProbeWrap::define(env));
  testing.Set("ReducerProbe", ReducerProbeWrap::define(env));
  testing.Set("crossEntropy", Napi::Function::New(env, guarded<crossEntropy>));
  testing.Set("orthogonalize", Napi::Function::New(env, guarded<orthogonalize>));
  testing.Set("roundTo", Napi::Function::New(env, guarded<roundTo>));
  exports.Set("testing", testing);
  return exports;
}

Napi::Object init(Napi::Env env, Napi::Object exports) {
  return guard(env, [&] { return defineExports(env, exports); });
}

}  // namespace accordion::napi

static Napi::Object InitAccordion(Napi::Env env, Napi::Object exports) { return accordion::napi::init(env, exports); }

NODE_API_MODULE(accordion, InitAccordion)

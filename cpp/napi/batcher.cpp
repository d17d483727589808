// JS class Batcher: the native prefetching data loader over images held in JS memory.
#include <cmath>

#include "napi/classes.h"

namespace accordion::napi {

constexpr int64_t kMaxBatch = (int64_t{1} << 31) - 1, kMaxWorkers = int64_t{1} << 20;

Napi::Function BatcherWrap::define(Napi::Env env) {
  return DefineClass(env, "Batcher",
                     {method<&BatcherWrap::startEpoch>("startEpoch"), method<&BatcherWrap::next>("next"),
                      getter<&BatcherWrap::batchesPerEpoch>("batchesPerEpoch"),
                      getter<&BatcherWrap::samplesPerEpoch>("samplesPerEpoch")});
}

// new Batcher(images: Uint8Array (count × 3072), labels: Int32Array, classes, options)
BatcherWrap::BatcherWrap(const Napi::CallbackInfo& info) try : GuardedWrap<BatcherWrap>(info) {
  Napi::Env env = info.Env();
  if (info.Length() < 4 || !info[0].IsTypedArray() || info[0].As<Napi::TypedArray>().TypedArrayType() != napi_uint8_array)
    throw typeError(env, "images must be a Uint8Array");
  if (!info[1].IsTypedArray() || info[1].As<Napi::TypedArray>().TypedArrayType() != napi_int32_array)
    throw typeError(env, "labels must be an Int32Array");
  const int64_t classes = intArg(info, 2, "classes", 1, kMaxClasses);
  if (!info[3].IsObject()) throw typeError(env, "options must be an object");
  auto images = info[0].As<Napi::Uint8Array>();
  auto labels = info[1].As<Napi::Int32Array>();
  const int64_t count = static_cast<int64_t>(labels.ElementLength());
  if (static_cast<int64_t>(images.ElementLength()) != count * Batcher::kImageBytes)
    throw typeError(env, "images hold " + std::to_string(images.ElementLength()) + " bytes, expected " +
                             std::to_string(count * Batcher::kImageBytes) + " for " + std::to_string(count) + " labels");
  Napi::Object o = info[3].As<Napi::Object>();
  BatcherOptions options;
  options.batchSize = intOption(o, "batchSize", 1, kMaxBatch);  // required: its default is the caller's
  options.shuffle = boolOption(o, "shuffle", true);
  options.augment = boolOption(o, "augment", true);
  options.dropLast = boolOption(o, "dropLast", false);
  options.seed = static_cast<uint64_t>(intOption(o, "seed", 0, 0, kMaxSafeInteger));
  options.worldSize = intOption(o, "worldSize", 1, 1, kMaxWorkers);
  options.rank = intOption(o, "rank", 0, 0, options.worldSize - 1);
  options.padShards = boolOption(o, "padShards", true);
  // Batches in the layout and memory of the model's device.
  const Device device = parseDevice(stringOption(o, "device", "cpu"));
  options.channelsLast = device.isCpu();
  options.pinned = !device.isCpu();
  for (const char* key : {"mean", "std"}) {
    Napi::Value v = o.Get(key);
    if (v.IsUndefined()) continue;
    if (!v.IsArray() || v.As<Napi::Array>().Length() != 3) throw typeError(env, std::string("option '") + key + "' must be 3 numbers");
    for (uint32_t c = 0; c < 3; ++c) {
      Napi::Value x = v.As<Napi::Array>().Get(c);
      const bool deviation = key[0] == 's';
      if (!x.IsNumber() || !std::isfinite(x.As<Napi::Number>().DoubleValue()) || (deviation && !(x.As<Napi::Number>().DoubleValue() > 0)))
        throw typeError(env, std::string("option '") + key + "' must be 3 finite numbers" + (deviation ? ", each positive" : ""));
      (deviation ? options.stddev : options.mean)[c] = x.As<Napi::Number>().FloatValue();
    }
  }
  imagesRef_ = Napi::Persistent(images.As<Napi::Object>());
  labelsRef_ = Napi::Persistent(labels.As<Napi::Object>());
  batcher_ = std::make_unique<Batcher>(images.Data(), labels.Data(), count, classes, options);
} catch (...) {
  rethrowAsJs(info.Env());
}

Napi::Value BatcherWrap::startEpoch(const Napi::CallbackInfo& info) {
  batcher_->startEpoch(intArg(info, 0, "epoch", 0, kMaxSafeInteger));
  return info.Env().Undefined();
}

// next() → Promise<{ images: Float32Array (N, 3, 32, 32) NCHW, labels: Int32Array } | null>: the next
// batch of the current epoch, for custom training loops and inspection.
Napi::Value BatcherWrap::next(const Napi::CallbackInfo& info) {
  if (!reader_) reader_ = std::make_unique<WorkerThread>();
  Batcher* batcher = batcher_.get();
  return schedule<std::optional<Batch>>(
      info.Env(), *reader_,
      [batcher]() -> std::optional<Batch> {
        Batch batch;
        if (!batcher->next(batch)) return std::nullopt;
        return batch;
      },
      [](Napi::Env env, std::optional<Batch>& batch) -> Napi::Value {
        if (!batch) return env.Null();
        Napi::Object o = Napi::Object::New(env);
        o.Set("images", toJs(env, batch->images, batch->channelsLast));
        Napi::Int32Array labels = Napi::Int32Array::New(env, batch->labels.size());
        std::copy(batch->labels.data(), batch->labels.data() + batch->labels.size(), labels.Data());
        o.Set("labels", labels);
        return o;
      },
      {info.This()});
}

Napi::Value BatcherWrap::batchesPerEpoch(const Napi::CallbackInfo& info) {
  return Napi::Number::New(info.Env(), static_cast<double>(batcher_->batchesPerEpoch()));
}

Napi::Value BatcherWrap::samplesPerEpoch(const Napi::CallbackInfo& info) {
  return Napi::Number::New(info.Env(), static_cast<double>(batcher_->samplesPerEpoch()));
}

}  // namespace accordion::napi

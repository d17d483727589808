// Conversions between JS values and engine types, shared by the N-API classes.
#pragma once
#include <napi.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "napi/guard.h"
#include "ops/cpu_backend.h"
#include "train/session.h"

namespace accordion::napi {

inline Napi::Error typeError(Napi::Env env, const std::string& message) {
  Napi::Error e = Napi::TypeError::New(env, message);
  e.Set("code", Napi::String::New(env, "ERR_INVALID_ARG_TYPE"));
  return e;
}

inline Napi::Error rangeError(Napi::Env env, const std::string& message) {
  Napi::Error e = Napi::RangeError::New(env, message);
  e.Set("code", Napi::String::New(env, "ERR_OUT_OF_RANGE"));
  return e;
}

// The largest integer a JS number holds exactly, and the most elements a tensor built from caller
// arguments may have (far beyond any memory: the bound keeps products of dimensions in int64).
constexpr int64_t kMaxSafeInteger = (int64_t{1} << 53) - 1;
constexpr int64_t kMaxElements = int64_t{1} << 48;

inline std::string numberText(double v) {
  char text[32];
  std::snprintf(text, sizeof text, "%.17g", v);
  return text;
}

// An integer in [min, max] (max at most kMaxSafeInteger), checked before any conversion.
inline int64_t integerValue(Napi::Env env, Napi::Value v, const std::string& what, int64_t min, int64_t max) {
  if (!v.IsNumber()) throw typeError(env, what + " must be an integer");
  const double d = v.As<Napi::Number>().DoubleValue();
  if (!std::isfinite(d) || d != std::floor(d)) throw typeError(env, what + " must be an integer, got " + numberText(d));
  if (d < static_cast<double>(min) || d > static_cast<double>(max))
    throw rangeError(env, what + " must be an integer from " + std::to_string(min) + " to " + std::to_string(max) + ", got " +
                              numberText(d));
  return static_cast<int64_t>(d);
}

inline int64_t intArg(const Napi::CallbackInfo& info, size_t i, const std::string& what, int64_t min, int64_t max) {
  return integerValue(info.Env(), info[i], what, min, max);
}

// The product of `dims`, or a range error naming `what` when it exceeds `limit` (checked as it grows,
// so it never overflows).
inline int64_t elementCount(Napi::Env env, const Shape& dims, const std::string& what, int64_t limit = kMaxElements) {
  int64_t n = 1;
  for (int64_t d : dims) {
    if (d < 0) throw rangeError(env, what + " has a negative dimension");
    if (d != 0 && n > limit / d)
      throw rangeError(env, what + " " + shapeString(dims) + " has more than " + std::to_string(limit) + " elements");
    n *= d;
  }
  return n;
}

inline Napi::Float32Array float32Arg(const Napi::CallbackInfo& info, size_t i, const char* what) {
  if (info.Length() <= i || !info[i].IsTypedArray() || info[i].As<Napi::TypedArray>().TypedArrayType() != napi_float32_array)
    throw typeError(info.Env(), std::string(what) + " must be a Float32Array");
  return info[i].As<Napi::Float32Array>();
}

inline Napi::Int32Array int32Arg(const Napi::CallbackInfo& info, size_t i, const char* what) {
  if (info.Length() <= i || !info[i].IsTypedArray() || info[i].As<Napi::TypedArray>().TypedArrayType() != napi_int32_array)
    throw typeError(info.Env(), std::string(what) + " must be an Int32Array");
  return info[i].As<Napi::Int32Array>();
}

// An array of integers, each in [min, max].
inline std::vector<int64_t> integerList(Napi::Env env, Napi::Value v, const std::string& what, int64_t min, int64_t max) {
  if (!v.IsArray()) throw typeError(env, what + " must be an array of integers");
  Napi::Array a = v.As<Napi::Array>();
  std::vector<int64_t> out;
  for (uint32_t i = 0; i < a.Length(); ++i) out.push_back(integerValue(env, a.Get(i), what + "[" + std::to_string(i) + "]", min, max));
  return out;
}

// An array of at most 8 non-negative integer dimensions whose product stays within kMaxElements.
inline Shape shapeArg(Napi::Env env, Napi::Value v, const char* what) {
  if (v.IsArray() && v.As<Napi::Array>().Length() > 8)
    throw rangeError(env, std::string(what) + " has " + std::to_string(v.As<Napi::Array>().Length()) + " dimensions, at most 8");
  Shape shape = integerList(env, v, what, 0, kMaxSafeInteger);
  elementCount(env, shape, what);
  return shape;
}

inline Napi::Array shapeValue(Napi::Env env, const Shape& shape) {
  Napi::Array a = Napi::Array::New(env, shape.size());
  for (size_t i = 0; i < shape.size(); ++i) a.Set(static_cast<uint32_t>(i), Napi::Number::New(env, static_cast<double>(shape[i])));
  return a;
}

// Reads an optional finite numeric option with a default.
inline double numberOption(Napi::Object o, const char* key, double fallback) {
  Napi::Value v = o.Get(key);
  if (v.IsUndefined()) return fallback;
  if (!v.IsNumber() || !std::isfinite(v.As<Napi::Number>().DoubleValue()))
    throw typeError(o.Env(), std::string("option '") + key + "' must be a finite number");
  return v.As<Napi::Number>().DoubleValue();
}

// Reads an optional integer option in [min, max] with a default.
inline int64_t intOption(Napi::Object o, const char* key, int64_t fallback, int64_t min, int64_t max) {
  Napi::Value v = o.Get(key);
  if (v.IsUndefined()) return fallback;
  return integerValue(o.Env(), v, std::string("option '") + key + "'", min, max);
}

inline bool boolOption(Napi::Object o, const char* key, bool fallback) {
  Napi::Value v = o.Get(key);
  if (v.IsUndefined()) return fallback;
  if (!v.IsBoolean()) throw typeError(o.Env(), std::string("option '") + key + "' must be a boolean");
  return v.As<Napi::Boolean>().Value();
}

inline std::string stringOption(Napi::Object o, const char* key, const std::string& fallback) {
  Napi::Value v = o.Get(key);
  if (v.IsUndefined()) return fallback;
  if (!v.IsString()) throw typeError(o.Env(), std::string("option '") + key + "' must be a string");
  return v.As<Napi::String>().Utf8Value();
}

// Required options, for objects whose defaults are decided above the binding (the TypeScript
// option table): a missing one is a TypeError naming it.
inline Napi::Object requiring(Napi::Object o, const char* key) {
  if (o.Get(key).IsUndefined()) throw typeError(o.Env(), std::string("option '") + key + "' is required");
  return o;
}
inline double numberOption(Napi::Object o, const char* key) { return numberOption(requiring(o, key), key, 0); }
inline int64_t intOption(Napi::Object o, const char* key, int64_t min, int64_t max) { return intOption(requiring(o, key), key, min, min, max); }
inline bool boolOption(Napi::Object o, const char* key) { return boolOption(requiring(o, key), key, false); }
inline std::string stringOption(Napi::Object o, const char* key) { return stringOption(requiring(o, key), key, ""); }

// A copy of host tensor `t` as a JS Float32Array. 4-D channels-last activations are returned in
// PyTorch's NCHW layout; parameters and channels-first activations (`channelsLast` false) already
// have PyTorch's layout.
inline Napi::Float32Array toJs(Napi::Env env, const Tensor& t, bool channelsLast = true) {
  Napi::Float32Array out = Napi::Float32Array::New(env, static_cast<size_t>(t.numel()));
  if (channelsLast && t.rank() == 4)
    nhwcToNchw(t.data(), out.Data(), t.dim(0), t.dim(1), t.dim(2), t.dim(3));
  else if (t.numel())
    std::memcpy(out.Data(), t.data(), t.numel() * sizeof(float));
  return out;
}

// A tensor from JS data in PyTorch's layout (a 4-D activation is converted to channels-last).
inline Tensor fromJs(const Napi::Float32Array& data, const Shape& shape, Napi::Env env, bool activation = true) {
  if (elementCount(env, shape, "shape") != static_cast<int64_t>(data.ElementLength()))
    throw typeError(env, "data has " + std::to_string(data.ElementLength()) + " elements but shape " + shapeString(shape) +
                             " needs " + std::to_string(numelOf(shape)));
  Tensor t(shape);
  if (activation && shape.size() == 4)
    nchwToNhwc(data.Data(), t.data(), shape[0], shape[1], shape[2], shape[3]);
  else if (t.numel())
    std::memcpy(t.data(), data.Data(), t.numel() * sizeof(float));
  return t;
}

inline Napi::Float64Array float64Array(Napi::Env env, const std::vector<double>& values) {
  Napi::Float64Array out = Napi::Float64Array::New(env, values.size());
  std::copy(values.begin(), values.end(), out.Data());
  return out;
}

inline Napi::Object stepResultValue(Napi::Env env, const StepResult& r) {
  Napi::Object o = Napi::Object::New(env);
  o.Set("floatsSent", static_cast<double>(r.floatsSent));
  o.Set("bytesSent", static_cast<double>(r.bytesSent));
  o.Set("overheadFloats", static_cast<double>(r.overheadFloats));
  o.Set("broadcastFloats", static_cast<double>(r.broadcastFloats));
  o.Set("computeSeconds", r.computeSeconds);
  o.Set("compressionSeconds", r.compressionSeconds);
  o.Set("communicationSeconds", r.communicationSeconds);
  o.Set("exchangeWaitSeconds", r.exchangeWaitSeconds);
  std::vector<double> collectives;
  for (const CollectiveTime& c : r.collectives) collectives.insert(collectives.end(), {c.bytes, c.seconds});
  o.Set("collectives", float64Array(env, collectives));
  o.Set("loss", r.loss);
  o.Set("correct", static_cast<double>(r.correct));
  o.Set("samples", static_cast<double>(r.samples));
  return o;
}

// Per parameter, its candidates' { level, error, floats, seconds } (GradientReducer::levelCosts);
// an empty list for a 1-D parameter.
inline Napi::Array levelCostsValue(Napi::Env env, const std::vector<std::vector<LevelCost>>& costs) {
  Napi::Array out = Napi::Array::New(env, costs.size());
  for (size_t i = 0; i < costs.size(); ++i) {
    Napi::Array list = Napi::Array::New(env, costs[i].size());
    for (size_t k = 0; k < costs[i].size(); ++k) {
      Napi::Object c = Napi::Object::New(env);
      c.Set("level", costs[i][k].level);
      c.Set("error", costs[i][k].error);
      c.Set("floats", static_cast<double>(costs[i][k].floats));
      c.Set("bytes", static_cast<double>(costs[i][k].bytes));
      c.Set("seconds", costs[i][k].seconds);
      list.Set(static_cast<uint32_t>(k), c);
    }
    out.Set(static_cast<uint32_t>(i), list);
  }
  return out;
}

// Lists of indices (the buckets of an overlapped exchange) as number[][].
inline Napi::Array indexListsValue(Napi::Env env, const std::vector<std::vector<size_t>>& lists) {
  Napi::Array out = Napi::Array::New(env, lists.size());
  for (size_t b = 0; b < lists.size(); ++b) {
    Napi::Array indices = Napi::Array::New(env, lists[b].size());
    for (size_t i = 0; i < lists[b].size(); ++i) indices.Set(static_cast<uint32_t>(i), static_cast<double>(lists[b][i]));
    out.Set(static_cast<uint32_t>(b), indices);
  }
  return out;
}

// Candidate levels: an array of finite numbers (the reducer checks each against its compressor).
inline std::vector<double> levelList(Napi::Env env, Napi::Value v) {
  if (!v.IsArray()) throw typeError(env, "candidates must be an array of levels");
  Napi::Array a = v.As<Napi::Array>();
  if (a.Length() == 0 || a.Length() > 64) throw rangeError(env, "candidates must hold 1 to 64 levels");
  std::vector<double> out;
  for (uint32_t i = 0; i < a.Length(); ++i) {
    Napi::Value x = a.Get(i);
    if (!x.IsNumber() || !std::isfinite(x.As<Napi::Number>().DoubleValue()))
      throw typeError(env, "candidates[" + std::to_string(i) + "] must be a finite number");
    out.push_back(x.As<Napi::Number>().DoubleValue());
  }
  return out;
}

// { allReduce: { calls, elements }, allGather: { calls, elements }, broadcast: { calls, elements },
//   barrier: { calls }, elements }: what a group's collectives carried (comm/process_group.h).
inline Napi::Object collectiveCountsValue(Napi::Env env, const CollectiveCounts& c) {
  auto kind = [&](int64_t calls, int64_t elements) {
    Napi::Object k = Napi::Object::New(env);
    k.Set("calls", static_cast<double>(calls));
    k.Set("elements", static_cast<double>(elements));
    return k;
  };
  Napi::Object o = Napi::Object::New(env);
  o.Set("allReduce", kind(c.allReduceCalls, c.allReduceElements));
  o.Set("allGather", kind(c.allGatherCalls, c.allGatherElements));
  o.Set("broadcast", kind(c.broadcastCalls, c.broadcastElements));
  Napi::Object barrier = Napi::Object::New(env);
  barrier.Set("calls", static_cast<double>(c.barrierCalls));
  o.Set("barrier", barrier);
  o.Set("elements", static_cast<double>(c.elements()));
  o.Set("bytes", static_cast<double>(c.bytes));
  return o;
}

}  // namespace accordion::napi

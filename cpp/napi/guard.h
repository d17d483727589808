// Every C++ exception that reaches a native entry point (a method, a constructor, a function, or a
// job settling a promise) becomes a JS error carrying a `code`, never a crash of the process:
// EngineError keeps its code, std::bad_alloc is ERR_OUT_OF_MEMORY, any other exception ERR_NATIVE.
#pragma once
#include <napi.h>

#include <exception>
#include <new>
#include <string>

#include "core/errors.h"

namespace accordion::napi {

inline Napi::Error makeError(Napi::Env env, const std::string& code, const std::string& message) {
  Napi::Error error = Napi::Error::New(env, message);
  error.Set("code", Napi::String::New(env, code));
  return error;
}

// The code and message of a native failure; usable on any thread.
struct Failure {
  std::string code, message;
};

inline Failure describe(std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const EngineError& e) {
    return {e.code(), e.what()};
  } catch (const std::bad_alloc&) {
    return {"ERR_OUT_OF_MEMORY", "the native code ran out of memory"};
  } catch (const std::exception& e) {
    return {"ERR_NATIVE", std::string("native failure: ") + e.what()};
  } catch (...) {
    return {"ERR_NATIVE", "native failure of an unknown kind"};
  }
}

// The JS error for `error`, on the JS thread. A JS error already made keeps its code (ERR_NATIVE
// when it has none, as for a failed N-API call).
inline Napi::Error toJsError(Napi::Env env, std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const Napi::Error& e) {
    Napi::Error js = e;
    if (!js.Value().Get("code").IsString()) js.Set("code", Napi::String::New(env, "ERR_NATIVE"));
    return js;
  } catch (...) {
    const Failure f = describe(std::current_exception());
    return makeError(env, f.code, f.message);
  }
}

// Runs `body`, rethrowing whatever it throws as a JS error with a code.
template <typename Body>
auto guard(Napi::Env env, Body&& body) -> decltype(body()) {
  try {
    return body();
  } catch (...) {
    throw toJsError(env, std::current_exception());
  }
}

// A module function whose every exception becomes a JS error: Napi::Function::New(env, guarded<f>).
template <Napi::Value (*F)(const Napi::CallbackInfo&)>
Napi::Value guarded(const Napi::CallbackInfo& info) {
  return guard(info.Env(), [&] { return F(info); });
}

// An ObjectWrap whose methods and accessors are registered through method<&T::m>(name) and
// getter<&T::m>(name), so that each runs under guard(). Constructors catch with a function-try-block:
//   T::T(const Napi::CallbackInfo& info) try : GuardedWrap<T>(info) { … } catch (...) { rethrowAsJs(info.Env()); }
template <typename T>
class GuardedWrap : public Napi::ObjectWrap<T> {
 public:
  using Napi::ObjectWrap<T>::ObjectWrap;
  using Callback = Napi::Value (T::*)(const Napi::CallbackInfo&);

 protected:
  template <Callback M>
  static Napi::ClassPropertyDescriptor<T> method(const char* name) {
    return Napi::ObjectWrap<T>::InstanceMethod(name, static_cast<Callback>(&GuardedWrap::call<M>));
  }
  template <Callback M>
  static Napi::ClassPropertyDescriptor<T> getter(const char* name) {
    return Napi::ObjectWrap<T>::InstanceAccessor(name, static_cast<Callback>(&GuardedWrap::call<M>), nullptr);
  }

 private:
  template <Callback M>
  Napi::Value call(const Napi::CallbackInfo& info) {
    return guard(info.Env(), [&] { return (static_cast<T*>(this)->*M)(info); });
  }
};

// For the handler of a constructor's function-try-block: the exception being handled, as a JS error.
[[noreturn]] inline void rethrowAsJs(Napi::Env env) { throw toJsError(env, std::current_exception()); }

}  // namespace accordion::napi

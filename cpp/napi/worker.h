// Long native work runs on one dedicated thread per engine object, never on the JS thread or the
// libuv pool; each call returns a promise that settles back on the JS thread.
#pragma once
#include <napi.h>

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "core/errors.h"
#include "napi/guard.h"

namespace accordion::napi {

class WorkerThread {
 public:
  WorkerThread() : thread_([this] { run(); }) {}
  ~WorkerThread() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    thread_.join();
  }
  void post(std::function<void()> job) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      jobs_.push_back(std::move(job));
    }
    wake_.notify_all();
  }

 private:
  void run() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (true) {
      wake_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
      if (jobs_.empty()) return;  // stopping, and every posted job has run
      auto job = std::move(jobs_.front());
      jobs_.pop_front();
      lock.unlock();
      job();
      lock.lock();
    }
  }
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::function<void()>> jobs_;
  bool stopping_ = false;
  std::thread thread_;
};

// Runs `work` on `worker`, then `settle` on the JS thread to turn its result into a JS value.
// `keepAlive` holds JS objects (input buffers, the engine itself) until the promise settles.
template <typename Result>
Napi::Promise schedule(Napi::Env env, WorkerThread& worker, std::function<Result()> work,
                       std::function<Napi::Value(Napi::Env, Result&)> settle, std::vector<Napi::Value> keepAlive = {}) {
  struct Job {
    Napi::Promise::Deferred deferred;
    std::function<Result()> work;
    std::function<Napi::Value(Napi::Env, Result&)> settle;
    std::vector<Napi::Reference<Napi::Value>> keepAlive;
    std::optional<Result> result;
    bool failed = false;
    std::string errorCode, errorMessage;
  };
  auto* job = new Job{Napi::Promise::Deferred::New(env), std::move(work), std::move(settle), {}, std::nullopt, false, "", ""};
  for (auto& v : keepAlive) job->keepAlive.push_back(Napi::Persistent(v));
  Napi::Promise promise = job->deferred.Promise();

  auto finish = [](Napi::Env env, Napi::Function, Job* job) {
    std::unique_ptr<Job> owned(job);
    if (env == nullptr) return;  // the environment is shutting down
    Napi::HandleScope scope(env);
    if (job->failed) {
      job->deferred.Reject(makeError(env, job->errorCode, job->errorMessage).Value());
      return;
    }
    try {
      job->deferred.Resolve(job->settle(env, *job->result));
    } catch (...) {
      job->deferred.Reject(toJsError(env, std::current_exception()).Value());
    }
  };
  auto tsfn = std::make_shared<Napi::ThreadSafeFunction>(
      Napi::ThreadSafeFunction::New(env, Napi::Function::New(env, [](const Napi::CallbackInfo&) {}), "accordion-job", 0, 1));
  worker.post([job, tsfn, finish] {
    try {
      job->result.emplace(job->work());
    } catch (...) {
      const Failure f = describe(std::current_exception());
      job->failed = true;
      job->errorCode = f.code;
      job->errorMessage = f.message;
    }
    tsfn->BlockingCall(job, [finish](Napi::Env env, Napi::Function fn, Job* job) { finish(env, fn, job); });
    tsfn->Release();
  });
  return promise;
}

// Disposes an object that owns (or shares) `worker`: runs `release` as its last job, then drops
// this owner's reference to the thread on the JS thread, which joins it there unless another
// owner still shares it. Later calls find `worker` empty. A second dispose resolves at once.
inline Napi::Promise retire(Napi::Env env, std::shared_ptr<WorkerThread>& worker, std::function<void()> release, Napi::Value self) {
  if (!worker) {
    auto done = Napi::Promise::Deferred::New(env);
    done.Resolve(env.Undefined());
    return done.Promise();
  }
  auto retiring = std::make_shared<std::shared_ptr<WorkerThread>>(std::move(worker));
  return schedule<bool>(
      env, **retiring,
      [release] {
        release();
        return true;
      },
      [retiring](Napi::Env env, bool&) -> Napi::Value {
        retiring->reset();
        return env.Undefined();
      },
      {self});
}

}  // namespace accordion::napi

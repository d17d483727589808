// The JS classes of the addon. One class per file: batcher.cpp, engine.cpp, layer_probe.cpp, … Each
// registers its methods through GuardedWrap (napi/guard.h), so no C++ exception escapes to N-API.
#pragma once
#include <napi.h>

#include <atomic>
#include <memory>

#include "data/batcher.h"
#include "models/layers.h"
#include "napi/convert.h"
#include "napi/guard.h"
#include "napi/worker.h"
#include "comm/gloo_group.h"
#include "train/session.h"

namespace accordion::napi {

// The thread count setThreads() set last, for engines created without one (0: OpenMP's default).
// An engine's work runs on its own thread, whose OpenMP setting is its own: the engine applies it.
std::atomic<int>& defaultThreads();

// Whether a JS value is an instance of the addon's Batcher / ProcessGroup class.
bool isBatcher(Napi::Value value);
bool isProcessGroup(Napi::Value value);

// A process group over Gloo (one per worker process), whose collectives run on its own native thread.
// An Engine given the group runs on that same thread, so every collective of a worker, from the
// training step or from JS, happens in one order.
class ProcessGroupWrap : public GuardedWrap<ProcessGroupWrap> {
 public:
  static Napi::Function define(Napi::Env env);
  explicit ProcessGroupWrap(const Napi::CallbackInfo& info);
  std::shared_ptr<WorkerThread> thread() const { return worker_; }
  // The connected group; only valid on the group's thread after ready() resolved.
  std::shared_ptr<GlooGroup> group() const { return group_; }
  // A number for the next GPU communicator built over this group: every rank builds its engines in
  // the same order, so the numbers agree and name the communicator's keys in the store.
  int nextCommunicator() { return communicators_++; }

 private:
  Napi::Value ready(const Napi::CallbackInfo& info);
  Napi::Value allReduce(const Napi::CallbackInfo& info);
  Napi::Value allGather(const Napi::CallbackInfo& info);
  Napi::Value broadcast(const Napi::CallbackInfo& info);
  Napi::Value barrier(const Napi::CallbackInfo& info);
  Napi::Value collectiveCounts(const Napi::CallbackInfo& info);
  Napi::Value dispose(const Napi::CallbackInfo& info);
  GlooGroup& connected();
  WorkerThread& worker(Napi::Env env);

  int rank_ = 0, size_ = 1;
  int communicators_ = 0;
  std::shared_ptr<WorkerThread> worker_;
  std::shared_ptr<GlooGroup> group_;  // set on the group's thread
  std::unique_ptr<Napi::ObjectReference> ready_;
};

class BatcherWrap : public GuardedWrap<BatcherWrap> {
 public:
  static Napi::Function define(Napi::Env env);
  explicit BatcherWrap(const Napi::CallbackInfo& info);
  Batcher& batcher() { return *batcher_; }

 private:
  Napi::Value startEpoch(const Napi::CallbackInfo& info);
  Napi::Value next(const Napi::CallbackInfo& info);
  Napi::Value batchesPerEpoch(const Napi::CallbackInfo& info);
  Napi::Value samplesPerEpoch(const Napi::CallbackInfo& info);
  Napi::ObjectReference imagesRef_, labelsRef_;  // the batcher reads these from its thread
  std::unique_ptr<Batcher> batcher_;
  std::unique_ptr<WorkerThread> reader_;  // serves next(), created on first use
};

// Bounds of options and arguments, checked before any arithmetic on them: class ids are int32, and
// image sizes, steps and batches fit in 31 bits.
constexpr int64_t kMaxClasses = (int64_t{1} << 31) - 1, kMaxDimension = (int64_t{1} << 31) - 1;
constexpr int64_t kMaxHidden = int64_t{1} << 20, kMaxLayers = 1024;

// A training session (model + optimiser) whose work runs on its own native thread.
class EngineWrap : public GuardedWrap<EngineWrap> {
 public:
  static Napi::Function define(Napi::Env env);
  explicit EngineWrap(const Napi::CallbackInfo& info);

 private:
  Napi::Value ready(const Napi::CallbackInfo& info);
  Napi::Value trainStep(const Napi::CallbackInfo& info);
  Napi::Value evaluate(const Napi::CallbackInfo& info);
  Napi::Value setLearningRate(const Napi::CallbackInfo& info);
  Napi::Value getState(const Napi::CallbackInfo& info);
  Napi::Value setState(const Napi::CallbackInfo& info);
  Napi::Value levels(const Napi::CallbackInfo& info);
  Napi::Value setLevels(const Napi::CallbackInfo& info);
  Napi::Value gradientNorms(const Napi::CallbackInfo& info);
  Napi::Value levelCosts(const Napi::CallbackInfo& info);
  Napi::Value dispose(const Napi::CallbackInfo& info);
  WorkerThread& worker(Napi::Env env);
  Batcher& batcherArg(const Napi::CallbackInfo& info, size_t index);

  Session& session();  // on the engine's thread only

  Napi::Value broadcastState(const Napi::CallbackInfo& info);
  Napi::Value broadcastBuffers(const Napi::CallbackInfo& info);
  Napi::Value stateDigests(const Napi::CallbackInfo& info);
  Napi::Value resetState(const Napi::CallbackInfo& info);
  Napi::Value memoryStats(const Napi::CallbackInfo& info);
  Napi::Value collectiveCounts(const Napi::CallbackInfo& info);
  Napi::Value exchangePlan(const Napi::CallbackInfo& info);
  Napi::Value forward(const Napi::CallbackInfo& info);
  Napi::Value gradients(const Napi::CallbackInfo& info);
  Napi::Value hiddenState(const Napi::CallbackInfo& info);
  Napi::Value setHiddenState(const Napi::CallbackInfo& info);

  std::unique_ptr<Session> session_;  // built and used on the engine's thread
  std::shared_ptr<WorkerThread> worker_;  // the process group's thread when the engine has one
  Napi::ObjectReference groupRef_;
  std::unique_ptr<Napi::ObjectReference> ready_;
};

// Synchronous access to one layer, for gradient checks and inspection on small shapes.
class LayerProbeWrap : public GuardedWrap<LayerProbeWrap> {
 public:
  static Napi::Function define(Napi::Env env);
  explicit LayerProbeWrap(const Napi::CallbackInfo& info);

 private:
  Napi::Value forward(const Napi::CallbackInfo& info);
  Napi::Value backward(const Napi::CallbackInfo& info);
  Napi::Value state(const Napi::CallbackInfo& info);
  Napi::Value setValue(const Napi::CallbackInfo& info);
  int64_t outputBound(Napi::Env env, const Shape& input) const;
  std::string kind_;
  std::vector<int64_t> window_;  // kernel, stride, padding of a windowed layer
  int64_t outChannels_ = 0;      // of a layer that sets them (conv2d, linear, basicblock)
  std::unique_ptr<Backend> backend_;  // the CPU's
  std::unique_ptr<Module> layer_;
  StateRefs refs_;
  Shape outputShape_;
};

// W simulated workers (threads of this process) each running a GradientReducer over an in-process
// group: tests of the compressors' multi-worker arithmetic. Synchronous, for small tensors.
class ReducerProbeWrap : public GuardedWrap<ReducerProbeWrap> {
 public:
  static Napi::Function define(Napi::Env env);
  explicit ReducerProbeWrap(const Napi::CallbackInfo& info);

 private:
  Napi::Value step(const Napi::CallbackInfo& info);
  Napi::Value memory(const Napi::CallbackInfo& info);
  Napi::Value q(const Napi::CallbackInfo& info);
  Napi::Value setQ(const Napi::CallbackInfo& info);
  Napi::Value level(const Napi::CallbackInfo& info);
  Napi::Value setLevel(const Napi::CallbackInfo& info);
  Napi::Value isCompressed(const Napi::CallbackInfo& info);
  Napi::Value floatsPerStep(const Napi::CallbackInfo& info);
  Napi::Value buckets(const Napi::CallbackInfo& info);
  Napi::Value norms(const Napi::CallbackInfo& info);
  Napi::Value levelCosts(const Napi::CallbackInfo& info);
  Napi::Value randomize(const Napi::CallbackInfo& info);
  Napi::Value setInput(const Napi::CallbackInfo& info);
  Napi::Value restart(const Napi::CallbackInfo& info);
  Napi::Value run(const Napi::CallbackInfo& info);
  GradientReducer& reducer(const Napi::CallbackInfo& info, size_t workerArg);
  size_t workerIndex(const Napi::CallbackInfo& info, size_t index);
  size_t parameterArg(const Napi::CallbackInfo& info, size_t index);

  std::vector<std::unique_ptr<Backend>> backends_;  // one per worker, on the probe's device
  std::unique_ptr<InProcessGroup> group_;
  std::shared_ptr<ProcessGroup> processGroup_;        // a real group: one worker in this process
  std::vector<std::unique_ptr<ProcessGroup>> staged_;  // on a GPU: each worker's group, staged through the host
  std::vector<std::vector<Parameter>> parameters_;  // per worker
  std::vector<std::vector<Tensor>> inputs_;         // per worker: the gradients restart() restores
  std::vector<std::unique_ptr<GradientReducer>> reducers_;
  std::vector<std::unique_ptr<BucketExchange>> exchanges_;  // with bucketBytes: each worker's bucketed exchange
};

}  // namespace accordion::napi

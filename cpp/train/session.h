// One process's training state: a model on its device, its optimiser and the step that joins them.
// On a GPU a step enqueues its work on the model's stream and waits once, where the loss is read.
#pragma once
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <memory>
#include <optional>

#include "compress/bucket_exchange.h"
#include "compress/reducer.h"
#include "data/batcher.h"
#include "models/models.h"
#include "ops/backend.h"
#include "train/optimizer.h"

namespace accordion {

struct StepResult {
  double loss = 0;  // mean over the samples
  int64_t correct = 0;
  int64_t samples = 0;
  int64_t floatsSent = 0;  // by this worker in the gradient exchange
  int64_t bytesSent = 0;   // the same floats at their size on the wire (ReducerOptions::sent)
  // The step's control traffic, not in floatsSent: the finite agreement, and rank 0's running
  // statistics broadcast before the step (`broadcastFloats` of them, sent by rank 0).
  int64_t overheadFloats = 0;
  int64_t broadcastFloats = 0;
  // Where the step's time went: forward, backward and update; compressing and decompressing;
  // waiting in collectives (the statistics' broadcast included). An overlapped exchange compresses
  // and communicates while backward runs: `exchangeWaitSeconds` is the part of the exchange the step
  // waited for after backward (all of it when the exchange follows backward), so a step takes about
  // compute + exchangeWait seconds, and the statistics' broadcast before it.
  double computeSeconds = 0, compressionSeconds = 0, communicationSeconds = 0, exchangeWaitSeconds = 0;
  // The exchange's collectives, each with the bytes this rank sent and its seconds (ReduceResult).
  std::vector<CollectiveTime> collectives;
};

// A batch in host memory as a caller gives it: `count` images in PyTorch's layout (N, 3, H, W),
// already normalised, or a (T, B) time-major window of token ids (T = steps, B = columns); `labels`
// holds the N labels or the T·B targets, or is null where only the logits are wanted (forward).
struct HostBatch {
  const float* images = nullptr;
  int64_t count = 0, height = 0, width = 0;
  const int32_t* tokens = nullptr;
  int64_t steps = 0, columns = 0;
  const int32_t* labels = nullptr;
};

// A named tensor of the session's state as raw little-endian bytes (F32 or I64).
struct StateEntry {
  std::string name;
  std::string dtype;  // "F32" | "F64" | "I64"
  Shape shape;
  std::vector<uint8_t> bytes;
};

class Session {
 public:
  // `group` carries the gradient exchange; without one the session trains alone. A group of host
  // memory (Gloo) serves a model on a GPU by staging each collective through the host, as c10d's
  // Gloo serves CUDA tensors: how several workers share one GPU, where NCCL takes one rank per GPU.
  // `threads`: the OpenMP threads of this session's work (0: OpenMP's default). With an overlapped
  // exchange (reducer.bucketBytes > 0, on the CPU, two or more workers) the
  // communication thread takes one of them and the compute threads the rest.
  // `backend`: how the device's ops are chosen (BackendOptions).
  Session(const ModelSpec& model, const SgdOptions& optimizer, const ReducerOptions& reducer = {},
          std::shared_ptr<ProcessGroup> group = nullptr, const Device& device = Device::cpu(), int threads = 0,
          const BackendOptions& backend = {});
  ~Session();
  // The split of the thread budget: compute threads, and whether a communication thread overlaps the
  // exchange with backward (with its buckets).
  int computeThreads() const;
  const BucketExchange* bucketExchange() const { return exchange_.get(); }

  Backend& backend() { return *backend_; }
  Model& model() { return model_; }
  Sgd& optimizer() { return optimizer_; }
  GradientReducer& reducer() { return *reducer_; }

  // One optimiser step from the batcher's next `microBatches` batches: forward and backward for
  // each, their mean gradient, clipping (setClipNorm), the gradient exchange (with compression) and
  // the update. A non-finite loss or gradient stops before anything is updated. Nullopt at the
  // epoch's end.
  std::optional<StepResult> trainStep(Batcher& batcher, int64_t microBatches = 1);
  // The same step over the caller's micro-batches (images or token windows, read before this
  // returns); a language model carries its hidden state from one window to the next.
  StepResult trainStep(const std::vector<HostBatch>& microBatches);
  // The loss of one pass over the batcher's current epoch, or of one batch, in evaluation mode
  // (running statistics, no dropout; a language model's state carried), without any update.
  StepResult evaluate(Batcher& batcher);
  StepResult evaluate(const HostBatch& batch);
  // Logits on the host, (N, classes) or (T·B, vocabulary), in training mode (batch statistics, which
  // batch norm also folds into its running statistics; dropout drawn) or evaluation mode; a language
  // model's hidden state is carried as by a step.
  Tensor forward(const HostBatch& batch, bool training);
  // clip_grad_norm_: before the exchange, the local gradients (after micro-batch averaging) are
  // scaled to a global norm of at most `norm`; 0 (the default) leaves them alone. A clipped gradient
  // is final only once every gradient is, so clipping exchanges after backward.
  void setClipNorm(double norm);

  // With `keep`, every step keeps a copy of the local gradients (after micro-batch averaging and
  // clipping, before the exchange and compression replace them); off by default (no copies).
  void keepGradients(bool keep);
  // The last step's kept local gradients by parameter name (F32, parameter shapes); empty before
  // the first step or without keepGradients.
  std::vector<StateEntry> localGradients();

  // The model's state_dict (names, shapes and dtypes as PyTorch's), optionally with the trainer's
  // state: momentum buffers, compressor memories, Q and levels, random streams ("optimizer.",
  // "compressor." and "rng." prefixes).
  std::vector<StateEntry> state(bool includeTrainer);
  // Copies rank `root`'s parameters and running statistics to every worker of the group.
  void broadcastState(int root);
  // Copies rank `root`'s running statistics (every buffer, packed into one broadcast) to every
  // worker; returns the floats broadcast (0 alone or without buffers).
  int64_t broadcastBuffers(int root);
  // PyTorch DDP's broadcast_buffers (on by default): with two or more workers, every training step
  // starts with broadcastBuffers(0), so each worker's forward starts from rank 0's running
  // statistics and updates its own copy from its own batch; rank 0's are the model's.
  void setBroadcastBuffers(bool on) { broadcastBuffers_ = on; }
  // A 64-bit digest of every entry of the model's state_dict (parameters, buffers, counters), in
  // order: workers that hold the same model hold the same digests.
  std::vector<std::pair<std::string, uint64_t>> stateDigests();
  ProcessGroup& group() { return *group_; }

  // Restores entries by name; every model entry must be present with the same shape and dtype.
  void loadState(const std::vector<StateEntry>& entries);

 private:
  std::unique_ptr<Backend> backend_;  // first: every tensor below lives on it
  Model model_;
  Sgd optimizer_;
  std::shared_ptr<ProcessGroup> hostGroup_;  // the host group a GPU's staged group_ runs over
  std::shared_ptr<ProcessGroup> group_;
  std::unique_ptr<GradientReducer> reducer_;
  // Gradient exchange and update after the local gradients are in place (`firstBad`: the result of
  // the reducer's finite check; `overlapped`: the bucket exchange is under way); fills the step's timings.
  void exchangeAndUpdate(StepResult& result, double computeSecondsSoFar, int64_t firstBad, bool overlapped = false);
  // The caller's batch on this session's device (labels checked against the classes).
  Batch fromHost(const HostBatch& batch);
  // The batch as the model consumes it: the batch itself on the CPU, else its copy, uploaded now
  // unless it was staged earlier.
  ModelInput onDevice(Batch& batch);
  // A step over the batches `next` yields (at most `microBatches`); `afterBackward` runs after each
  // batch's backward. Nullopt when `next` yields none.
  std::optional<StepResult> step(const std::function<bool(Batch&)>& next, const std::function<void()>& afterBackward,
                                 int64_t microBatches);
  // Loss and correct count of the batches `next` yields, in evaluation mode; `afterForward` runs after each.
  StepResult evaluate(const std::function<bool(Batch&)>& next, const std::function<void()>& afterForward, int64_t capacity);
  // Scales the local gradients to a global norm of at most clipNorm_.
  void clipGradients();
  // Starts uploading the batcher's following batch, so that the copy overlaps the work enqueued.
  void stageFollowing(Batcher& batcher);
  // The first `count` entries of the step's status array, on the host (waits for the device).
  std::vector<double> readStatus(int64_t count);

  std::vector<Tensor> accumulated_;  // micro-batch gradient sums
  bool keepGradients_ = false;
  std::vector<Tensor> localGradients_;  // copies of the last step's local gradients (keepGradients)
  Array<double> status_;             // on the device: losses, correct counts and the finite check of a step
  int threads_ = 1;
  std::unique_ptr<BucketExchange> exchange_;
  bool overlapping_ = false;  // backward of an overlapped step is running
  bool broadcastBuffers_ = true;
  double clipNorm_ = 0;
  Tensor bufferPack_;  // every buffer back to back, for broadcastBuffers
  std::map<const Parameter*, size_t> parameterIndex_;
};

}  // namespace accordion

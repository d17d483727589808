// The gradient exchange overlapped with backward, as PyTorch DDP's buckets: the parameters are
// grouped into buckets in reverse order (gradientBuckets), backward reports each parameter whose
// gradient is final, and a communication thread, one per engine, exchanges each bucket (compressed
// at its parameters' own levels) as soon as all of its gradients are in, in bucket order on every
// worker, while backward goes on with the earlier layers.
//
// Threads: the communication thread runs the compression kernels with one OpenMP thread; the thread
// that runs backward should leave it one core (Session shares out the thread budget).
#pragma once
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "compress/reducer.h"

namespace accordion {

class BucketExchange {
 public:
  BucketExchange(GradientReducer& reducer, const std::vector<Parameter*>& parameters, int64_t bucketBytes);
  ~BucketExchange();
  BucketExchange(const BucketExchange&) = delete;
  BucketExchange& operator=(const BucketExchange&) = delete;

  const std::vector<std::vector<size_t>>& buckets() const { return buckets_; }

  // A step starts: no gradient is final yet.
  void begin();
  // Backward has finished parameter `index`'s gradient (reporting one twice is harmless).
  void ready(size_t index);
  // Every gradient is final (for those backward did not report).
  void allReady();
  // Waits for every bucket, then the workers' agreement on finite gradients; the step's accounting.
  // A non-finite gradient on any worker, or a failed collective, throws (the state restored).
  ReduceResult finish();
  // Ends a step that failed on this worker before finish(): waits for the buckets already under way
  // (the other workers' collectives need them), then restores the state they changed.
  void abandon();
  // Seconds the step's exchange took on its thread: its buckets' compression and collectives, and
  // the agreement (after finish()).
  double busySeconds() const { return busy_; }

 private:
  void run();
  void markReady(size_t index);  // under mutex_

  GradientReducer& reducer_;
  std::vector<std::vector<size_t>> buckets_;
  std::vector<size_t> bucketOf_;  // per parameter
  std::mutex mutex_;
  std::condition_variable changed_;
  // Per step, under mutex_: which gradients are in, how many each bucket still waits for, how many
  // buckets the thread has exchanged, and what went wrong there.
  std::vector<char> ready_;
  std::vector<size_t> missing_;
  size_t step_ = 0, stepsDone_ = 0;
  bool stopping_ = false;
  ReduceResult result_;
  std::exception_ptr error_;
  double busy_ = 0;
  std::thread thread_;
};

}  // namespace accordion

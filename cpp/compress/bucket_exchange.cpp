#include "compress/bucket_exchange.h"

#include <omp.h>

#include <chrono>

#include "core/scheduling.h"

namespace accordion {

BucketExchange::BucketExchange(GradientReducer& reducer, const std::vector<Parameter*>& parameters, int64_t bucketBytes)
    : reducer_(reducer), buckets_(gradientBuckets(parameters, bucketBytes)), bucketOf_(parameters.size()),
      ready_(parameters.size(), 1), missing_(buckets_.size(), 0) {
  for (size_t b = 0; b < buckets_.size(); ++b)
    for (size_t i : buckets_[b]) bucketOf_[i] = b;
  thread_ = std::thread([this] { run(); });
}

BucketExchange::~BucketExchange() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  thread_.join();
}

void BucketExchange::begin() {
  std::lock_guard<std::mutex> lock(mutex_);
  std::fill(ready_.begin(), ready_.end(), 0);
  for (size_t b = 0; b < buckets_.size(); ++b) missing_[b] = buckets_[b].size();
  result_ = {};
  error_ = nullptr;
  busy_ = 0;
  reducer_.startBuckets();  // the thread is idle between steps
  ++step_;
  changed_.notify_all();
}

void BucketExchange::markReady(size_t index) {
  if (ready_.at(index)) return;
  ready_[index] = 1;
  if (--missing_[bucketOf_[index]] == 0) changed_.notify_all();
}

void BucketExchange::ready(size_t index) {
  std::lock_guard<std::mutex> lock(mutex_);
  markReady(index);
}

void BucketExchange::allReady() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (size_t i = 0; i < ready_.size(); ++i) markReady(i);
}

void BucketExchange::run() {
  omp_set_num_threads(1);  // this thread's share of the budget: the compute threads keep the rest
  const BatchScheduling batch;  // for the thread's life: a bucket's turn does not preempt backward
  std::unique_lock<std::mutex> lock(mutex_);
  size_t seen = 0;
  for (;;) {
    changed_.wait(lock, [&] { return stopping_ || step_ > seen; });
    if (stopping_) return;
    seen = step_;
    // In bucket order on every worker, so that their collectives pair up.
    for (size_t b = 0; b < buckets_.size() && !error_; ++b) {
      changed_.wait(lock, [&] { return stopping_ || missing_[b] == 0; });
      if (stopping_) return;
      lock.unlock();
      const auto start = std::chrono::steady_clock::now();
      try {
        reducer_.reduceBucket(buckets_[b], result_);
      } catch (...) {
        lock.lock();
        error_ = std::current_exception();
        break;
      }
      lock.lock();
      busy_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    }
    stepsDone_ = seen;
    changed_.notify_all();
  }
}

ReduceResult BucketExchange::finish() {
  allReady();
  std::exception_ptr error;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [&] { return stepsDone_ == step_; });
    error = error_;
  }
  if (error) {
    reducer_.restoreBuckets();
    std::rethrow_exception(error);
  }
  ReduceResult result = result_;
  const auto start = std::chrono::steady_clock::now();
  reducer_.finishBuckets(result);  // the agreement, once every bucket has travelled
  busy_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

void BucketExchange::abandon() {
  allReady();
  {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [&] { return stepsDone_ == step_; });
  }
  reducer_.restoreBuckets();
}

}  // namespace accordion

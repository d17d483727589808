// Scheduling of the threads that serve compute: the transport's socket loop and the exchange thread.
#pragma once

#include <pthread.h>
#include <sched.h>

namespace accordion {

// While alive, the calling thread runs as SCHED_BATCH, and so do the threads it starts (they
// inherit the policy). A batch thread gets the same share of the CPU, but its wake-up does not
// preempt the thread that is running: with compute on every core, a socket loop woken for each
// packet of a slow link would otherwise interrupt backward thousands of times a step, each time
// costing it its caches. The woken thread runs at the next scheduling tick instead, and takes
// what arrived meanwhile in one go. Best effort: where the policy cannot be set, nothing changes.
class BatchScheduling {
 public:
  BatchScheduling() {
    ok_ = pthread_getschedparam(pthread_self(), &policy_, &param_) == 0;
    const sched_param none{};
    if (ok_) ok_ = pthread_setschedparam(pthread_self(), SCHED_BATCH, &none) == 0;
  }
  ~BatchScheduling() {
    if (ok_) pthread_setschedparam(pthread_self(), policy_, &param_);
  }
  BatchScheduling(const BatchScheduling&) = delete;
  BatchScheduling& operator=(const BatchScheduling&) = delete;

 private:
  bool ok_ = false;
  int policy_ = SCHED_OTHER;
  sched_param param_{};
};

}  // namespace accordion

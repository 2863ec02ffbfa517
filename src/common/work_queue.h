// Work handed to threads of its own, in the order it is pushed (private to
// src/): the host load's content hashing and on_tensor deliveries, and the
// sparse loader's decoding, each beside the reads that feed it.
#ifndef TENSORLIFT_COMMON_WORK_QUEUE_H_
#define TENSORLIFT_COMMON_WORK_QUEUE_H_

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "tensorlift/status.h"

namespace tensorlift {

template <typename T>
class WorkQueue {
 public:
  struct Options {
    int threads = 1;
    // After the first error, items still pushed are dropped, not worked on
    // (else every item pushed is worked on: it may hold what to give back).
    bool skip_after_error = false;
    // The destructor (when Finish was not called) drops what is queued.
    bool drop_on_destroy = false;
  };
  WorkQueue(std::function<Status(T&)> work, Options options)
      : work_(std::move(work)), options_(options) {
    for (int t = 0; t < options.threads; ++t) threads_.emplace_back([this] { Run(); });
  }
  ~WorkQueue() { Finish(options_.drop_on_destroy).IgnoreError(); }
  WorkQueue(const WorkQueue&) = delete;
  WorkQueue& operator=(const WorkQueue&) = delete;

  // Quick: the work runs on the queue's threads.
  void Push(T item) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(std::move(item));
    }
    cv_.notify_one();
  }
  // Returns once every item queued was worked on (or at once, dropping what
  // is queued: `drop`), with the first error.
  Status Finish(bool drop = false) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      closed_ = true;
      if (drop) queue_.clear();
    }
    cv_.notify_all();
    for (std::thread& t : threads_) t.join();
    threads_.clear();
    return error_;
  }

 private:
  void Run() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return closed_ || !queue_.empty(); });
      if (queue_.empty()) return;  // Closed, and all of it done.
      T item = std::move(queue_.front());
      queue_.pop_front();
      if (!error_.ok() && options_.skip_after_error) continue;
      lock.unlock();
      Status st = work_(item);
      lock.lock();
      if (!st.ok() && error_.ok()) error_ = std::move(st);
    }
  }

  const std::function<Status(T&)> work_;
  const Options options_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<T> queue_;
  bool closed_ = false;
  Status error_;
  std::vector<std::thread> threads_;  // Last: they start once the rest is in place.
};

}  // namespace tensorlift

#endif  // TENSORLIFT_COMMON_WORK_QUEUE_H_

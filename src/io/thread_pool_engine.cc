// A pool of threads, each taking the next op and reading it with pread. The
// calling thread watches and ticks the progress.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "io/read_op.h"

namespace tensorlift {
namespace {

class ThreadPoolEngine final : public ReadEngine {
 public:
  ThreadPoolEngine(int threads, std::vector<EngineFile> files)
      : ReadEngine(std::move(files)), threads_(std::max(1, threads)) {}

  Status Run(std::span<const ReadOp> ops, ReadProgress* progress) override {
    std::atomic<size_t> next{0};
    std::atomic<bool> stop{false};
    std::mutex mu;
    std::condition_variable cv;
    Status first_error;
    int running = 0;

    auto worker = [&] {
      OpReader reader;
      while (!stop.load(std::memory_order_relaxed)) {
        const size_t i = next.fetch_add(1, std::memory_order_relaxed);
        if (i >= ops.size()) break;
        Status st = ValidFile(ops[i]);
        if (st.ok()) st = reader.Read(FileOf(ops[i]).fd, ops[i]);
        if (!st.ok()) {
          std::lock_guard<std::mutex> lock(mu);
          if (first_error.ok()) first_error = InFileOf(ops[i], st);
          stop = true;
          break;
        }
        progress->bytes_done.fetch_add(ops[i].length, std::memory_order_relaxed);
        if (progress->op_done) progress->op_done(ops[i]);
      }
      std::lock_guard<std::mutex> lock(mu);
      --running;
      cv.notify_all();
    };

    const int n = static_cast<int>(std::min<size_t>(threads_, ops.size()));
    std::vector<std::thread> pool;
    pool.reserve(n);
    {
      std::lock_guard<std::mutex> lock(mu);
      running = n;
    }
    for (int t = 0; t < n; ++t) pool.emplace_back(worker);
    {
      std::unique_lock<std::mutex> lock(mu);
      while (running > 0) {
        cv.wait_for(lock, std::chrono::milliseconds(100));
        if (progress->tick) {
          lock.unlock();
          progress->tick();
          lock.lock();
        }
      }
    }
    for (auto& t : pool) t.join();
    return first_error;
  }

 private:
  int threads_;
};

class InlineEngine final : public ReadEngine {
 public:
  using ReadEngine::ReadEngine;
  Status Run(std::span<const ReadOp> ops, ReadProgress* progress) override {
    OpReader reader;
    for (const ReadOp& op : ops) {
      Status st = ValidFile(op);
      if (st.ok()) st = reader.Read(FileOf(op).fd, op);
      if (!st.ok()) return InFileOf(op, st);
      progress->bytes_done.fetch_add(op.length, std::memory_order_relaxed);
      if (progress->op_done) progress->op_done(op);
      if (progress->tick) progress->tick();
    }
    return Status::Ok();
  }
};

}  // namespace

std::unique_ptr<ReadEngine> MakeInlineEngine(std::vector<EngineFile> files) {
  return std::make_unique<InlineEngine>(std::move(files));
}

std::unique_ptr<ReadEngine> MakeThreadPoolEngine(int threads, std::vector<EngineFile> files) {
  return std::make_unique<ThreadPoolEngine>(threads, std::move(files));
}

}  // namespace tensorlift

// A deadline for a whole cpp-httplib request. The library's time-outs bound
// each read and write, not the request: a server that dribbles its answer a
// byte at a time (a slowloris) keeps a request open for as long as it likes.
// Used by the control-plane client (control.cc) and the registry (registry.cc).
#ifndef TENSORLIFT_REMOTE_HTTP_DEADLINE_H_
#define TENSORLIFT_REMOTE_HTTP_DEADLINE_H_

#include <httplib.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

namespace tensorlift::remote {

// client.send(req, res, err), stopped at `deadline`: a watchdog thread shuts
// the client's socket down then (httplib::Client::stop, which is safe from
// another thread), and the blocked read fails. True when a complete answer
// came in time; *expired says whether the deadline stopped it.
inline bool SendBefore(httplib::Client& client, httplib::Request& req, httplib::Response& res,
                       httplib::Error& err, std::chrono::steady_clock::time_point deadline,
                       bool* expired) {
  std::mutex m;
  std::condition_variable cv;
  bool done = false;
  bool stopped = false;
  std::thread watchdog([&] {
    std::unique_lock<std::mutex> lock(m);
    if (!cv.wait_until(lock, deadline, [&] { return done; })) {
      stopped = true;
      client.stop();
    }
  });
  const bool ok = client.send(req, res, err);
  {
    std::lock_guard<std::mutex> lock(m);
    done = true;
  }
  cv.notify_one();
  watchdog.join();
  *expired = stopped && !ok;
  return ok;
}

}  // namespace tensorlift::remote

#endif  // TENSORLIFT_REMOTE_HTTP_DEADLINE_H_

// Microseconds on the steady clock (the device events' and the transfers'
// timestamps).
#ifndef TENSORLIFT_COMMON_CLOCK_H_
#define TENSORLIFT_COMMON_CLOCK_H_

#include <chrono>

namespace tensorlift {

inline double NowMicros() {
  return std::chrono::duration<double, std::micro>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace tensorlift

#endif  // TENSORLIFT_COMMON_CLOCK_H_

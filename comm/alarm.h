// What the communicator's worker thread sleeps on: woken now (a call it may run, stop), or at a
// time that another thread armed without waking it (see work_queue.cc). Both sources are counters
// (eventfd, timerfd): a wake that comes between a check and sleep() is not lost.
#pragma once
#include <cstdint>

#include "base/socket.h"

namespace braid {

class Alarm {
 public:
  Alarm();
  void wakeNow();
  // Rings in `us` microseconds (at least 1) unless armed to ring sooner already.
  void ringIn(std::int64_t us);
  // Until wakeNow() or the armed time (at once if either came since the last sleep).
  void sleep();
  // Its file descriptors, once no thread sleeps on it or arms it any more.
  void close();

 private:
  net::Fd event_, timer_;
  std::int64_t armedAt_ = 0;  // nowUs() it rings (or rang) at (callers serialize ringIn)
};

}  // namespace braid

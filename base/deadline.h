// Every blocking step in Braid is bounded: it takes a Deadline (from BRAID_TIMEOUT) and fails with a
// timeout once it has passed.
#pragma once
#include <chrono>
#include <cstdint>

namespace braid {

using Clock = std::chrono::steady_clock;

// Microseconds on the steady clock, for spin and back-off decisions.
inline std::int64_t nowUs() {
  return std::chrono::duration_cast<std::chrono::microseconds>(Clock::now().time_since_epoch()).count();
}

// Waits of this many seconds or more (BRAID_TIMEOUT=inf, 1e10, a torch timeout of years) are
// waits without a limit: about 31.7 years, far enough and still within the clock's range.
inline constexpr double kNoTimeLimitSec = 1e9;

class Deadline {
 public:
  static Deadline after(double seconds) {
    if (!(seconds < kNoTimeLimitSec)) seconds = kNoTimeLimitSec;  // and NaN
    return Deadline(Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds)));
  }
  bool expired() const { return Clock::now() >= at_; }
  // expired() for a wait that checks often (every idle pass): time this process did not run
  // between two checks (stopped with SIGSTOP, the machine suspended: a gap of over a second) does
  // not count, so a rank that resumes does not blame its peers for its own pause.
  bool expiredWhileRunning(Clock::time_point* lastCheck) {
    const Clock::time_point now = Clock::now();
    if (lastCheck->time_since_epoch().count() != 0 && now - *lastCheck > std::chrono::seconds(1))
      at_ += now - *lastCheck;
    *lastCheck = now;
    return now >= at_;
  }
  // Milliseconds left, at least 0, at most cap (for poll/epoll slices).
  int msLeft(int cap = 1 << 30) const {
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(at_ - Clock::now()).count();
    if (ms < 0) return 0;
    return ms > cap ? cap : static_cast<int>(ms);
  }
  Clock::time_point at() const { return at_; }

 private:
  explicit Deadline(Clock::time_point at) : at_(at) {}
  Clock::time_point at_;
};

}  // namespace braid

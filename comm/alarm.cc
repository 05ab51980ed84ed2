#include "comm/alarm.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include "base/deadline.h"

namespace braid {

Alarm::Alarm() {
  event_.reset(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  timer_.reset(timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC));
}

void Alarm::wakeNow() {
  std::uint64_t one = 1;
  ssize_t r = write(event_.get(), &one, sizeof(one));
  (void)r;
}

void Alarm::ringIn(std::int64_t us) {
  const std::int64_t now = nowUs(), at = now + us;
  if (armedAt_ > now && armedAt_ <= at) return;  // (one in the past has rung: arm again)
  itimerspec t{};
  us = us < 1 ? 1 : us;
  t.it_value.tv_sec = static_cast<time_t>(us / 1000000);
  t.it_value.tv_nsec = static_cast<long>(us % 1000000) * 1000;
  if (timerfd_settime(timer_.get(), 0, &t, nullptr) == 0) armedAt_ = at;
}

void Alarm::sleep() {
  pollfd fds[2] = {{event_.get(), POLLIN, 0}, {timer_.get(), POLLIN, 0}};
  // Without both descriptors (the process ran out of them), a slice of 1 ms: the caller looks at
  // its queue that often instead of never being woken.
  const int slice = event_.get() < 0 || timer_.get() < 0 ? 1 : -1;
  if (poll(fds, 2, slice) < 0) return;  // (EINTR: the caller looks again)
  std::uint64_t drain;
  while (read(event_.get(), &drain, sizeof(drain)) > 0) {}
  while (read(timer_.get(), &drain, sizeof(drain)) > 0) {}
}

void Alarm::close() {
  event_.reset();
  timer_.reset();
}

}  // namespace braid

#include "comm/alarm.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include "comm/base/deadline.h"

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
  timerfd_settime(timer_.get(), 0, &t, nullptr);
  armedAt_ = at;
}

void Alarm::sleep() {
  pollfd fds[2] = {{event_.get(), POLLIN, 0}, {timer_.get(), POLLIN, 0}};
  while (poll(fds, 2, -1) < 0) {}  // (EINTR)
  std::uint64_t drain;
  while (read(event_.get(), &drain, sizeof(drain)) > 0) {}
  while (read(timer_.get(), &drain, sizeof(drain)) > 0) {}
}

void Alarm::close() {
  event_.reset();
  timer_.reset();
}

}  // namespace braid

#include "comm/waiter.h"

#include "base/deadline.h"

#include <sched.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>

namespace braid {

Waiter::Waiter(int spinUs, bool oversubscribed) {
  // Spinning only pays when the peer runs on another core; oversubscribed, it steals the peer's core.
  spinUs_ = spinUs >= 0 ? spinUs : (oversubscribed ? 0 : 50);
  yieldUs_ = oversubscribed ? 2000 : 200;
  epoll_.reset(epoll_create1(EPOLL_CLOEXEC));
  eventFd_.reset(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = eventFd_.get();
  epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, eventFd_.get(), &ev);
}

void Waiter::addSocket(int fd) {
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET;
  ev.data.fd = fd;
  epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd, &ev);
  haveSockets_ = true;
}

void Waiter::disarm() {
  bell_->sleeping.store(0, std::memory_order_relaxed);
  for (std::atomic<bool>* f : sleepFlags_) f->store(false, std::memory_order_relaxed);
  armed_ = false;
}

void Waiter::idle() {
  std::int64_t now = nowUs();
  if (idleRounds_++ == 0) idleSince_ = now;
  std::int64_t idleFor = now - idleSince_;
  if (idleFor < spinUs_) {
    __builtin_ia32_pause();
    return;
  }
  if (idleFor < spinUs_ + yieldUs_) {
    sched_yield();
    return;
  }
  // Block in a slice that grows to 20 ms: long enough to leave the core to others, short enough
  // that notices and aborts are picked up quickly even without a wake-up.
  long sliceUs = idleFor < 10000 ? 1000 : 20000;
  if (haveSockets_) {
    if (!armed_ && !sleepFlags_.empty()) {
      // First the transports that must ask for a wake-up (ib arms its CQs) do so at the caller's
      // next pass, which also finds what came meanwhile; then the sleep.
      for (std::atomic<bool>* f : sleepFlags_) f->store(true, std::memory_order_relaxed);
      armed_ = true;
      return;
    }
    epoll_event evs[16];
    // With shared-memory peers too, nobody rings epoll for them: keep the slice at 1 ms.
    epoll_wait(epoll_.get(), evs, 16, bell_ != &ownBell_ ? 1 : static_cast<int>(sliceUs / 1000));
    std::uint64_t drain;
    while (read(eventFd_.get(), &drain, sizeof(drain)) > 0) {}
    return;
  }
  if (!armed_) {
    bell_->sleeping.store(1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    armedSeq_ = bell_->seq.load(std::memory_order_relaxed);
    armed_ = true;
    return;
  }
  bell_->sleep(armedSeq_, sliceUs);
  disarm();
}

void Waiter::wake() {
  bell_->seq.fetch_add(1, std::memory_order_seq_cst);
  syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&bell_->seq), FUTEX_WAKE, 1, nullptr, nullptr, 0);
  std::uint64_t one = 1;
  ssize_t r = write(eventFd_.get(), &one, sizeof(one));
  (void)r;
}

}  // namespace braid

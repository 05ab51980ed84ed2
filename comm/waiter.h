// How a rank waits when a progress pass moved nothing: spin (cheap when a peer is on another core),
// then yield (when ranks outnumber cores), then block in short slices on the doorbell (shm peers) or
// epoll (tcp peers). Slices stay short so that errors from the control plane and aborts are seen
// within milliseconds even if nobody rings.
#pragma once
#include <atomic>
#include <cstdint>
#include <vector>

#include "transport/doorbell.h"
#include "base/socket.h"

namespace braid {

class Waiter {
 public:
  // spinUs: how long to spin before yielding; oversubscribed: ranks outnumber cores on this host.
  Waiter(int spinUs, bool oversubscribed);
  void setDoorbell(Doorbell* mine) { bell_ = mine; }
  Doorbell* doorbell() { return bell_; }
  void addSocket(int fd);
  // Raised before a sleep on the sockets, lowered when something moves (WaitSources::beforeSleep).
  void addSleepFlag(std::atomic<bool>* flag) { sleepFlags_.push_back(flag); }

  // The last pass moved nothing: wait a little, according to how long nothing has moved. Before
  // the first sleep it only announces the sleep and returns, so that the caller checks its rings
  // once more after the announcement (that is what makes a lost wake-up impossible).
  void idle();
  // Something moved: the next idle() starts spinning again.
  void progressed() {
    if (armed_) disarm();
    idleRounds_ = 0;
  }
  // From another thread (abort, control plane): end a sleep now.
  void wake();

 private:
  Doorbell ownBell_;          // used when no shared-memory doorbell was set
  Doorbell* bell_ = &ownBell_;
  net::Fd epoll_;
  net::Fd eventFd_;
  bool haveSockets_ = false;
  std::vector<std::atomic<bool>*> sleepFlags_;
  void disarm();
  bool armed_ = false;
  std::uint32_t armedSeq_ = 0;
  std::int64_t idleSince_ = 0;
  std::uint32_t idleRounds_ = 0;
  int spinUs_;
  int yieldUs_;
};

}  // namespace braid

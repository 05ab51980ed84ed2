// A Doorbell is one futex word per rank, in memory that every rank on the host maps. Peers ring it
// after they add data to, or free space in, a ring this rank waits on; the rank sleeps on it only
// after spinning has found nothing (see comm/waiter.h). Ringing costs a fence and a load unless the
// owner is actually asleep.
#pragma once
#include <atomic>
#include <cstdint>

namespace braid {

struct alignas(64) Doorbell {
  std::atomic<std::uint32_t> seq{0};
  std::atomic<std::uint32_t> sleeping{0};

  // Called by a peer (or another thread of the owner) after publishing new state.
  void ring();
  // Owner: sleeps until rung or until timeoutUs passes, unless `seen` is already stale.
  void sleep(std::uint32_t seen, long timeoutUs);
};
static_assert(sizeof(Doorbell) == 64);

}  // namespace braid

#include "transport/doorbell.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

namespace braid {

// The ordering argument: the owner sets `sleeping`, fences, then re-checks its rings before it
// sleeps on `seq`; a ringer publishes its data, fences, then reads `sleeping`. One of the two sees
// the other, so a wake-up is never lost. Futexes here are shared (not PRIVATE): the word lives in
// memory mapped by several processes.
void Doorbell::ring() {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (sleeping.load(std::memory_order_relaxed)) {
    seq.fetch_add(1, std::memory_order_seq_cst);
    syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&seq), FUTEX_WAKE, 1, nullptr, nullptr, 0);
  }
}

void Doorbell::sleep(std::uint32_t seen, long timeoutUs) {
  timespec ts{timeoutUs / 1000000, (timeoutUs % 1000000) * 1000};
  syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&seq), FUTEX_WAIT, seen, &ts, nullptr, 0);
}

}  // namespace braid

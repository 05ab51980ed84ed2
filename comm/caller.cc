// One call at a time: which thread is inside a call of a communicator, and what happens when a
// second one comes. Two threads that call one communicator at once would each take the next
// sequence number in whatever order they happen to run, and the other ranks' threads in theirs:
// a rank's thread-A all-reduce could then meet another rank's thread-B all-reduce of the same shape
// and both would return mixed data with success. The overlap is what a rank can see, so it is
// refused, and the communicator ends on every rank so that no later call pairs wrongly. Calls from
// several threads that never overlap are allowed (a thread pool, torch's autograd threads), and
// must come in the same order on every rank: that, no rank can check (include/braid/braid.h).
#include <sys/syscall.h>
#include <unistd.h>

#include "comm/communicator.h"
#include "comm/fingerprint.h"

namespace braid {
namespace {
thread_local bool internalThread = false;

long thisThread() {
  static thread_local const long tid = static_cast<long>(::syscall(SYS_gettid));
  return tid;
}

// kind (8 bits), type (8 bits), count (48 bits, saturated): enough to name the call.
std::uint64_t pack(const CollArgs& a) {
  const std::uint64_t count = std::min<std::uint64_t>(a.count, (std::uint64_t{1} << 48) - 1);
  return (static_cast<std::uint64_t>(a.kind) << 56) | (static_cast<std::uint64_t>(a.dtype) << 48) | count;
}

std::string describe(std::uint64_t packed) {
  CollArgs a;
  a.kind = static_cast<CollKind>(packed >> 56);
  a.dtype = static_cast<DataType>((packed >> 48) & 0xff);
  a.count = packed & ((std::uint64_t{1} << 48) - 1);
  return std::string(collName(a.kind)) + "(count=" + std::to_string(a.count) + ", " + dataTypeName(a.dtype) + ")";
}
}  // namespace

void Comm::markInternalThread() { internalThread = true; }

Comm::Caller::Caller(Comm& comm, const CollArgs& a) : comm_(comm) {
  if (internalThread) return;
  const long me = thisThread();
  long holder = 0;
  if (comm.callerTid_.compare_exchange_strong(holder, me, std::memory_order_acq_rel)) {
    comm.callerCall_.store(pack(a), std::memory_order_relaxed);
    overlapsBefore_ = comm.callerOverlaps_.load(std::memory_order_acquire);
    claimed_ = true;
    return;
  }
  if (holder == me) return;  // re-entered from a callback its own wait ran
  const std::string other = describe(comm.callerCall_.load(std::memory_order_relaxed));
  refused_ = Status::InvalidUsage(
      "rank " + std::to_string(comm.rank_) + ": two threads called one communicator at once: " +
      describe(pack(a)) + " on thread " + std::to_string(me) + " while " + other + " ran on thread " +
      std::to_string(holder) + ". A communicator takes one call at a time, in the same order on every rank: "
      "give each thread a communicator of its own (braidCommSplit) or order the calls. The communicator "
      "ends here on every rank, since the two threads' calls may already have met other ranks' calls of "
      "the other thread");
  comm.callerOverlaps_.fetch_add(1, std::memory_order_acq_rel);
  comm.fail(refused_, true);
}

Status Comm::Caller::finish(Status s) const {
  if (!claimed_ || comm_.callerOverlaps_.load(std::memory_order_acquire) == overlapsBefore_) return s;
  return comm_.failure().withContext("the call that was running when another thread called");
}

Comm::Caller::~Caller() {
  if (claimed_) comm_.callerTid_.store(0, std::memory_order_release);
}

}  // namespace braid

// The one-shot all-reduce and the barrier for messages of at most 4 KiB when every rank is on this
// host: through the shared-memory mailbox (transport/mailbox.h) instead of a Plan and the
// rings. Each rank writes its input once into its own slot, waits for every peer's slot of the same
// call, and reduces the inputs in rank order 0..n-1 straight out of the slots, so every rank gets
// the same bits (as with the ring and the plan-based one-shot). An 8-byte all-reduce then costs a
// reader one cache line per peer and no plan building, which is what the small-message latency
// needs. The tuner decides where one-shot pays; this path takes over where it also fits a slot.
#include <chrono>
#include <cstring>
#include <optional>

#include "comm/communicator.h"
#include "kernels/reduce.h"
#include "transport/mailbox.h"

namespace braid {
namespace {

// The call's fingerprint in the slot's three tag words (its sequence number is the slot's).
void packTag(const Fingerprint& fp, std::size_t bytes, std::uint64_t tag[3]) {
  tag[0] = fp.count;
  tag[1] = static_cast<std::uint64_t>(static_cast<std::uint8_t>(fp.kind)) |
           static_cast<std::uint64_t>(static_cast<std::uint8_t>(fp.dtype)) << 8 |
           static_cast<std::uint64_t>(static_cast<std::uint8_t>(fp.op)) << 16 |
           static_cast<std::uint64_t>(static_cast<std::uint32_t>(fp.root)) << 32;
  tag[2] = bytes;
}

Fingerprint unpackTag(std::uint64_t seq, const std::uint64_t tag[3]) {
  Fingerprint f;
  f.count = tag[0];
  f.kind = static_cast<CollKind>(tag[1] & 0xff);
  f.dtype = static_cast<DataType>((tag[1] >> 8) & 0xff);
  f.op = static_cast<ReduceOp>((tag[1] >> 16) & 0xff);
  f.root = static_cast<std::int32_t>(static_cast<std::uint32_t>(tag[1] >> 32));
  f.seq = seq;
  return f;
}

}  // namespace

bool Comm::mailboxFits(const TunerChoice& t, std::size_t bytes) const {
  return t.algo == Algo::kOneShot && bytes <= Mailbox::kMaxBytes && link_.sharedMemory && mailbox_;
}

// Waits until ready() says so, the way the engine waits: spin, yield, then sleep on the doorbell;
// the communicator's failure and BRAID_TIMEOUT end the wait. While it waits it also looks at the
// rings for a message of this very call: a peer that took the plan path for it called something else.
template <typename Ready>
Status Comm::mailboxWait(const Fingerprint& fp, Ready ready, MailboxWait why, int peer) {
  const bool posting = why == MailboxWait::kPosting;
  Mailbox& box = *mailbox_;
  Waiter& w = *waiter_;
  w.progressed();
  std::optional<Deadline> deadline;
  Clock::time_point lastCheck{};
  int nothingMissing = 0;
  const auto what = [&] { return fp.describe() + " #" + std::to_string(fp.seq); };
  const auto waitingOn = [&] { return why == MailboxWait::kAnswer ? peer : posting ? box.firstBusyReader(fp.seq) : box.firstMissing(fp.seq); };
  // The flight recorder learns whom a failed wait was waiting for.
  const auto stuckOn = [&] {
    const int who = waitingOn();
    trace_.mailboxStuck(who, posting);
    return who;
  };
  // A wait that ends (ready, failed or timed out) counts against the peer it waited on, as the
  // engine's do: one clock read at its first idle pass and one at its end.
  struct StallNote {
    LiveProgress& l;
    Clock::time_point since{};
    ~StallNote() {
      if (since.time_since_epoch().count() != 0)
        l.stalled(l.waitPeer.load(std::memory_order_relaxed),
                  static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - since).count()));
    }
  } stall{live_.progress()};
  for (std::uint32_t round = 1;; ++round) {
    if (ready()) return Status::Ok();
    if (failedFast()) {
      stuckOn();
      return failure().withContext(failedOn(fp, rank_));
    }
    if (round % 256 == 0 && why != MailboxWait::kAnswer) {  // (a send/recv's number is not a collective's)
      Status s = ringMessageFor(fp);
      if (!s.ok()) return s;
    }
    w.idle();
    if (!deadline) {  // the first idle pass: whom it waits on, for braid status (LiveProgress)
      deadline = Deadline::after(config_.timeoutSec);
      LiveProgress& l = live_.progress();
      l.waitPeer.store(waitingOn(), std::memory_order_relaxed);
      l.waitSending.store(posting, std::memory_order_relaxed);
      l.waitChannel.store(0, std::memory_order_relaxed);
      l.waitStep.store(0, std::memory_order_relaxed);
      stall.since = Clock::now();
    }
    if (!deadline->expiredWhileRunning(&lastCheck)) continue;
    if (ready()) return Status::Ok();  // it came after all (checked once more, after the clock)
    const int who = stuckOn();
    if (who < 0 && ++nothingMissing < 1000) continue;  // nothing missing any more: a next pass finds it ready
    return explainTimeout(what(), "rank " + std::to_string(rank_) + " waited " +
                                      (why == MailboxWait::kAnswer ? "for the answer to its CUDA IPC offer from rank "
                                       : posting                   ? "for its mailbox slot to be read by rank "
                                                                   : "to receive from rank ") +
                                      std::to_string(who) + " (shm mailbox)");
  }
}

Status Comm::waitForAnswer(const Fingerprint& fp, int peer, const std::function<bool()>& ready) {
  return mailboxWait(fp, ready, MailboxWait::kAnswer, peer);
}

// A header of call `fp` waiting in a ring from some peer: that peer ran the call as a plan, so it
// called something other than this rank's mailbox call. Or a peer's farewell that names another
// last call: it made no such call. (A farewell after this very call is no mismatch: that peer
// posted its slot, read the others' and destroyed, all while this rank was between two looks.)
Status Comm::ringMessageFor(const Fingerprint& fp) {
  return forEachWaitingHeader([&](int p, const WireHeader& h) {
    Fingerprint theirs = fingerprintOf(h);
    if (isFarewell(h))
      return theirs.seq == fp.seq && theirs.sameCall(fp) ? Status::Ok()
                                                         : Status::InvalidUsage(farewellMismatch(rank_, fp, p, theirs));
    if (h.seq != fp.seq || theirs.kind == CollKind::kSendRecv) return Status::Ok();
    return Status::InvalidUsage(mismatchText(rank_, callAs(fp), p, callAs(theirs)));
  });
}

Status Comm::mailboxAllReduce(const CollArgs& a, const Fingerprint& fp) {
  Mailbox& box = *mailbox_;
  const std::size_t bytes = a.count * dataTypeSize(a.dtype);
  const std::uint64_t seq = fp.seq;
  // Each step tries once before it enters the wait loop: in a busy loop of small calls the slot
  // is free and the peers' messages are there or a few spins away.
  Status s;
  if (!box.canPost(seq)) s = mailboxWait(fp, [&] { return box.canPost(seq); }, MailboxWait::kPosting);
  if (s.ok()) {
    if (bytes) std::memcpy(box.payloadFor(seq), a.send, bytes);
    std::uint64_t tag[3];
    packTag(fp, bytes, tag);
    box.publish(seq, tag);
    std::vector<const MailboxSlot*>& in = mailboxIn_;
    in.resize(static_cast<std::size_t>(nranks_));
    for (int q = 0; q < nranks_ && s.ok(); ++q) {
      if (q == rank_) continue;
      const MailboxSlot*& got = in[static_cast<std::size_t>(q)];
      if (!(got = box.arrived(q, seq))) s = mailboxWait(fp, [&] { return (got = box.arrived(q, seq)) != nullptr; }, MailboxWait::kArrival);
      if (s.ok() && (got->seq.load(std::memory_order_relaxed) != seq || got->tag[0] != tag[0] || got->tag[1] != tag[1] ||
                     got->tag[2] != tag[2]))
        s = Status::InvalidUsage(
            mismatchText(rank_, callAs(fp), q, callAs(unpackTag(got->seq.load(std::memory_order_relaxed), got->tag))));
    }
    if (s.ok() && bytes) {
      auto input = [&](int q) -> const std::byte* {
        return q == rank_ ? box.payloadFor(seq) : in[static_cast<std::size_t>(q)]->payload;
      };
      kernels::reduce(a.recv, input(0), input(1), a.count, a.dtype, a.op);
      for (int q = 2; q < nranks_; ++q) kernels::reduce(a.recv, a.recv, input(q), a.count, a.dtype, a.op);
      if (a.op == ReduceOp::kAvg) kernels::divide(a.recv, a.count, a.dtype, nranks_);
    }
    if (s.ok()) box.finished(seq);
  }
  if (s.ok()) {
    for (int q = 0; q < nranks_; ++q)
      if (q != rank_) peerBytes(q, bytes, bytes);
    return s;
  }
  fail(s, !failed_.load());  // a failure that came as a notice is not reported back
  return s;
}

}  // namespace braid

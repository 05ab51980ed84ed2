#include "transport/mailbox.h"

#include <algorithm>

namespace braid {

Mailbox::Mailbox(MailboxArea* areas, Doorbell* bells, int rank, int nranks)
    : areas_(areas), bells_(bells), rank_(rank), nranks_(nranks), knownDone_(static_cast<std::size_t>(nranks), 0) {}

bool Mailbox::canPost(std::uint64_t seq) {
  const std::uint64_t previous = written_[seq & 1];
  if (previous == 0) return true;
  for (int r = 0; r < nranks_; ++r) {
    if (r == rank_) continue;
    std::uint64_t& known = knownDone_[static_cast<std::size_t>(r)];
    if (known >= previous) continue;
    known = std::max(known, area(r).done.load(std::memory_order_acquire));
    if (known < previous) return false;
  }
  return true;
}

void Mailbox::publish(std::uint64_t seq, const std::uint64_t tag[3]) {
  MailboxSlot& s = mine().slot[seq & 1];
  std::copy(tag, tag + 3, s.tag);
  s.seq.store(seq, std::memory_order_release);
  written_[seq & 1] = seq;
  ringPeers();
}

const MailboxSlot* Mailbox::arrived(int peer, std::uint64_t seq) {
  const MailboxSlot& s = area(peer).slot[seq & 1];
  const std::uint64_t got = s.seq.load(std::memory_order_acquire);
  if (got < seq) return nullptr;
  // The peer posted `got` only after it had finished every call before it.
  std::uint64_t& known = knownDone_[static_cast<std::size_t>(peer)];
  known = std::max(known, got - 1);
  return &s;
}

void Mailbox::finished(std::uint64_t seq) {
  mine().done.store(seq, std::memory_order_release);
  ringPeers();  // a writer may be waiting for its slot
}

int Mailbox::firstMissing(std::uint64_t seq) const {
  for (int r = 0; r < nranks_; ++r)
    if (r != rank_ && area(r).slot[seq & 1].seq.load(std::memory_order_acquire) < seq) return r;
  return -1;
}

int Mailbox::firstBusyReader(std::uint64_t seq) const {
  const std::uint64_t previous = written_[seq & 1];
  for (int r = 0; r < nranks_; ++r)
    if (r != rank_ && std::max(knownDone_[static_cast<std::size_t>(r)], area(r).done.load(std::memory_order_acquire)) < previous)
      return r;
  return -1;
}

void Mailbox::answer(int to, std::uint64_t value) {
  area(to).answer.store(value, std::memory_order_release);
  bells_[to].ring();
}

// One fence for all peers (Doorbell::ring fences for each): publish, fence, then look who sleeps.
void Mailbox::ringPeers() {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  for (int r = 0; r < nranks_; ++r) {
    Doorbell& b = bells_[r];
    if (r != rank_ && b.sleeping.load(std::memory_order_relaxed)) b.ring();
  }
}

}  // namespace braid

// Small messages between the ranks of one host without a ring: each rank owns two slots in the
// host's doorbell segment, and a message is written once into one of them for every peer to read.
// The slot's sequence number is written last (release) in the slot's first cache line, next to a
// 24-byte tag and the first 32 payload bytes, so an 8-byte message costs its readers one cache line
// each, where a ring costs the line of the data, the head counter, and the tail counter on the way
// back. Open MPI's shared-memory "fast boxes" rest on the same observation.
//
// Slot k % 2 holds the message with sequence number k. A writer reuses a slot only after every
// reader is done with the message it held (two calls earlier): it learns that for free when it reads
// a later message from that reader (a rank posts call k only after it finished call k - 1), and
// otherwise from the reader's `done` word. Sequence numbers must grow by at least one per post
// and must be the same on every rank for the same call (the communicator's collective count).
//
// The mailbox moves bytes only; what the tag means is up to the caller (comm/algorithms/mailbox.cc).
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "transport/doorbell.h"

namespace braid {

struct alignas(64) MailboxSlot {
  static constexpr std::size_t kPayload = 4096 + 32;  // 4 KiB, plus what fits beside the header
  std::atomic<std::uint64_t> seq{0};
  std::uint64_t tag[3] = {};
  std::byte payload[kPayload];
};
static_assert(sizeof(MailboxSlot) == 65 * 64);

struct alignas(64) MailboxArea {
  alignas(64) std::atomic<std::uint64_t> done{0};  // the last sequence number this rank finished reading
  MailboxSlot slot[2];
  // A peer's answer to this rank's latest point-to-point offer (CUDA IPC send/recv, comm/cuda/cuda_ipc.cc).
  // A rank has at most one offer out at a time, so one word serves every peer.
  alignas(64) std::atomic<std::uint64_t> answer{0};
};

class Mailbox {
 public:
  static constexpr std::size_t kMaxBytes = MailboxSlot::kPayload;
  // `areas` and `bells`: one per rank of the communicator, indexed by rank (only the ranks of this
  // host are touched, and the mailbox is only used when that is every rank).
  Mailbox(MailboxArea* areas, Doorbell* bells, int rank, int nranks);

  // Writer. True when the slot for `seq` may be written: every peer finished reading the message
  // that slot held before. Re-reads the peers' `done` words only when needed.
  bool canPost(std::uint64_t seq);
  // The payload area of this rank's slot for `seq`: write the message there, then publish().
  std::byte* payloadFor(std::uint64_t seq) { return mine().slot[seq & 1].payload; }
  // Publishes this rank's message `seq` with its tag and wakes sleeping peers.
  void publish(std::uint64_t seq, const std::uint64_t tag[3]);

  // Reader. The peer's slot for `seq`, or null while its message has not arrived. A slot whose
  // sequence number is neither `seq` nor older means the peer runs ahead (a mismatch the caller
  // reports); it is returned as it is so that its tag can be shown.
  const MailboxSlot* arrived(int peer, std::uint64_t seq);
  // This rank has read every message of `seq`: peers may reuse those slots.
  void finished(std::uint64_t seq);
  // The first peer whose message `seq` has not arrived (-1: none), to say who a wait is for.
  int firstMissing(std::uint64_t seq) const;
  // The first peer that still reads the slot `seq` needs (-1: none).
  int firstBusyReader(std::uint64_t seq) const;

  // Point-to-point answers (outside the rings, which are FIFO): `value` into rank `to`'s answer
  // word, waking it; and this rank's own word as it reads now.
  void answer(int to, std::uint64_t value);
  std::uint64_t answerReceived() const { return mine().answer.load(std::memory_order_acquire); }
  // Before an offer: no answer left from an earlier one can be read as this one's.
  void clearAnswer() { mine().answer.store(0, std::memory_order_relaxed); }

 private:
  MailboxArea& area(int r) const { return areas_[r]; }
  MailboxArea& mine() const { return areas_[rank_]; }
  void ringPeers();
  MailboxArea* areas_;
  Doorbell* bells_;
  int rank_, nranks_;
  std::uint64_t written_[2] = {0, 0};      // the sequence number each of my slots last held
  std::vector<std::uint64_t> knownDone_;   // per peer: a sequence number it is known to have finished
};

}  // namespace braid

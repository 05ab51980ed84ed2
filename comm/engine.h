// The engine runs one collective as a Plan: per (peer, channel, direction) a FIFO queue of
// messages. A message may depend on another one: it may only move bytes that the other has already
// finished (a send forwards what a receive has reduced, a reduction waits for its local operand),
// which pipelines every algorithm at the granularity of `chunk` bytes without explicit chunk loops.
// The calling thread drives the plan to completion itself (no hand-off), spinning then sleeping
// through the Waiter when nothing moves.
#pragma once
#include <atomic>
#include <cstddef>
#include <memory>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "braid/status.hpp"
#include "braid/types.hpp"
#include "base/deadline.h"
#include "comm/fingerprint.h"

namespace braid {

class Connection;
class Waiter;

// Copies between this rank's own buffers. Below largeCopyBytes() memcpy; from there on streaming
// stores that bypass the cache (kernels/copy.h): 1 MiB, or 1/32 of the L3 that tuning uses if that
// is more (topology::tuningL3Bytes: a figure a VM reports that no CPU has counts as 32 MiB; on the
// VM type that reports 508 MiB per vCPU, streaming from 16 MiB made 1-4 MiB 4-rank all-reduces
// half as fast as from 1 MiB, docs/PERFORMANCE.md). A collective's copy shares the cache with its other buffers and the peers' (and, on shared
// machines, other tenants'): on the 32 MiB L3 of the CI machine type the 2-rank all-gather's own
// block was copied faster past the cache from 1 MiB up (docs/PERFORMANCE.md).
std::size_t largeCopyBytes();
void copyLocal(void* dst, const void* src, std::size_t bytes);

// What a running plan shows an observer (comm/live.h, braid status): the executing thread writes
// it with relaxed stores (no read-modify-write: it is the only writer), any thread reads it.
struct LiveProgress {
  std::atomic<std::uint64_t> bytes{0};     // payload bytes sent and received, every call so far
  std::atomic<std::int32_t> waitPeer{-1};  // the peer the plan waited on when it last went idle (-1: none)
  std::atomic<std::int32_t> waitChannel{0};
  std::atomic<std::uint32_t> waitStep{0};
  std::atomic<bool> waitSending{false};
  // Per peer (sized by setPeers before any plan runs): bytes sent and received, and nanoseconds
  // a plan waited with that peer the one it waited on.
  std::unique_ptr<std::atomic<std::uint64_t>[]> peerBytes, peerStallNs;
  std::atomic<std::uint64_t> stallNs{0};  // the sum over the peers (braid perf's busy time)
  int peers = 0;
  void setPeers(int n) {
    peerBytes = std::make_unique<std::atomic<std::uint64_t>[]>(static_cast<std::size_t>(n));
    peerStallNs = std::make_unique<std::atomic<std::uint64_t>[]>(static_cast<std::size_t>(n));
    peers = n;
  }
  static void bump(std::atomic<std::uint64_t>& a, std::uint64_t by) {
    a.store(a.load(std::memory_order_relaxed) + by, std::memory_order_relaxed);
  }
  void add(std::size_t n) { bump(bytes, n); }
  void add(int peer, std::size_t n) {
    bump(bytes, n);
    if (peer >= 0 && peer < peers) bump(peerBytes[peer], n);
  }
  void stalled(int peer, std::uint64_t ns) {
    bump(stallNs, ns);  // (a wait whose peer is not known still counts)
    if (peer >= 0 && peer < peers) bump(peerStallNs[peer], ns);
  }
};

struct Op {
  enum Kind : std::uint8_t { kSend, kRecvCopy, kRecvReduce };
  Kind kind;
  bool finalDivide = false;  // avg: divide by nranks as the last reduction step writes
  bool started = false;      // header sent / received and checked
  bool complete = false;
  bool expected = false;     // receive: the channel was told where the payload goes (Channel::expect)
  int peer = -1;
  int channel = 0;
  int dep = -1;              // op whose finished bytes gate this one
  int after = 0;             // starts only once ops [0, after) are complete (Plan::fence)
  int fp = -1;               // index of its own fingerprint in the plan (Plan::setFingerprint); -1: the plan's
  std::uint32_t step = 0;
  const std::byte* src = nullptr;  // send: source; reduce: local operand
  std::byte* dst = nullptr;        // receives
  std::size_t bytes = 0;
  std::size_t done = 0;            // payload bytes finished
  std::size_t hdrDone = 0;
  std::size_t padDone = 0;
  WireHeader hdr{};                // send: built at start; receive: as read
};

class Plan {
 public:
  void reset(const Fingerprint& f, std::uint64_t commTag, int rank, int nranks, std::size_t chunk);
  int send(int peer, int channel, const void* src, std::size_t bytes, int dep = -1);
  int recvCopy(int peer, int channel, void* dst, std::size_t bytes, int dep = -1);
  int recvReduce(int peer, int channel, void* dst, const void* local, std::size_t bytes, int dep = -1,
                 bool finalDivide = false);
  // A copy between this rank's own buffers that no message waits for (the all-gather's own block,
  // the broadcast root's output): the engine does it in pieces while it would otherwise wait, so it
  // overlaps the transfers instead of delaying the first send.
  void localCopy(void* dst, const void* src, std::size_t bytes);
  // Every op added from now on starts only once every op added before has completed: a step of
  // an algorithm whose sends carry what several earlier receives brought (comm/algorithms/bruck.cc).
  void fence() { fence_ = static_cast<int>(ops_.size()); }
  // From now on a message of no bytes is not posted (send and receive return -1): for algorithms
  // whose small calls leave most blocks empty (the ring's and the hierarchical plans when the
  // count is below the ranks), where both ends know the block is empty. Not for a count of 0,
  // whose empty messages are what lets each rank check the others' calls.
  void skipEmptyMessages() { skipEmpty_ = true; }
  // This plan's copies (local ones, and receives copied out of a transport's buffer) belong to a
  // collective whose output is at least largeCopyBytes(), though each message may be smaller (the
  // all-gather's blocks): copy them past the cache too.
  void streamCopies() { streamCopies_ = true; }
  // Where the engine counts this plan's bytes and notes the peer it waits on (kept across reset).
  void setLive(LiveProgress* live) { live_ = live; }
  // Gives op `index` (a send or receive) a fingerprint of its own, and makes it message 0 of that
  // call: a group's sends and receives run as one plan, each numbered and checked as the call it
  // would be alone. The others carry the plan's.
  void setFingerprint(int index, const Fingerprint& f);
  const Fingerprint& fingerprint() const { return fp_; }
  const Fingerprint& fingerprintOf(const Op& op) const { return op.fp < 0 ? fp_ : opFps_[static_cast<std::size_t>(op.fp)]; }
  bool empty() const { return ops_.empty(); }
  int numOps() const { return static_cast<int>(ops_.size()); }
  // Calls f(peer) for each queue: every peer the plan sends to or receives from (repeats allowed).
  template <typename F>
  void forEachPeer(F f) const {
    for (std::size_t i = 0; i < numQueues_; ++i) f(queues_[i].peer);
  }
  // Calls f(op, index, position) for each message of the plan, queue by queue: its index among
  // the plan's ops (what Op::dep names) and its position in its (peer, channel, direction) queue,
  // which is how a send meets its receive on the other rank (the simulator's counts, sim/).
  template <typename F>
  void forEachMessage(F f) const {
    for (std::size_t i = 0; i < numQueues_; ++i)
      for (std::size_t k = 0; k < queues_[i].ops.size(); ++k) {
        const int o = queues_[i].ops[k];
        f(ops_[static_cast<std::size_t>(o)], o, k);
      }
  }

 private:
  friend class Engine;
  friend struct PlanRunner;
  friend class FlightRecorder;  // reads the messages' progress after a run (comm/trace.cc)
  struct Queue {
    int peer;
    int channel;
    bool sending;
    std::vector<int> ops;
    std::size_t head = 0;
  };
  int add(Op op);
  // Queues [0, numQueues_) belong to the current plan, receives before sends (a pass then sees
  // the bytes a receive just finished when it reaches the sends gated on them). Queues past
  // numQueues_ are kept from earlier plans only so that their vectors' memory is reused: building
  // a plan allocates nothing once the communicator has run a call of the same shape.
  std::vector<Queue>::iterator findQueue(int peer, int channel, bool sending);
  Fingerprint fp_;
  std::vector<Fingerprint> opFps_;  // setFingerprint's
  std::uint64_t commTag_ = 0;
  int rank_ = 0;
  int nranks_ = 1;
  std::size_t chunk_ = 1 << 18;
  bool streamCopies_ = false;
  bool skipEmpty_ = false;
  int fence_ = 0;
  std::size_t firstOpen_ = 0;  // ops before it are complete (the engine's fence check)
  LiveProgress* live_ = nullptr;
  // Whether a copy of `bytes` of this plan goes past the cache (streamCopies, largeCopyBytes).
  bool streams(std::size_t bytes) const { return streamCopies_ || bytes >= largeCopyBytes(); }
  struct LocalCopy {
    std::byte* dst;
    const std::byte* src;
    std::size_t bytes;
    std::size_t done;
    bool large;  // copied past the cache, piece by piece
  };
  // Copies one piece of the first unfinished local copy; false when none is left.
  bool copyPiece();
  std::vector<Op> ops_;
  std::vector<LocalCopy> copies_;
  std::vector<Queue> queues_;
  std::size_t numQueues_ = 0;
};

// What the engine needs from the communicator: connections, the waiter, and the failure flag.
class EngineHost {
 public:
  virtual ~EngineHost() = default;
  virtual Connection* connection(int peer) = 0;
  virtual Waiter& waiter() = 0;
  // Non-ok once the communicator has failed (a notice from another rank, or an abort).
  virtual Status failure() = 0;
  virtual bool failedFast() const = 0;  // a relaxed load, checked on every pass
  virtual double timeoutSec() const = 0;
  // The host `peer` is on, when that is not this rank's ("" on this host): errors name it.
  virtual std::string remoteHostOf(int peer) const = 0;
  // The deadline passed; `detail` says what this rank waited for. The host may ask the other ranks
  // who else is waiting, to name the rank that is silent. `moving`: data still moved after the call
  // first had to wait (then no rank is silent: the call is slower than the limit allows).
  virtual Status explainTimeout(const std::string& what, const std::string& detail, bool moving = false) = 0;
};

// A peer's connection broke: that may only be the peer reacting to a failure elsewhere, which the
// store is announcing right now. Waits up to 0.5 s for the communicator to learn of it, so that the
// error names the root cause (the rank that died, the mismatched call) rather than the messenger.
void waitForNotice(EngineHost& host);

class Engine {
 public:
  // Runs the plan to completion; on failure returns a Status naming the collective, its sequence
  // number, this rank, and the peer and transport involved.
  static Status run(Plan& plan, EngineHost& host);
  // One pass of run without waiting: every message advanced as far as it goes now, or a piece
  // of local copying done when nothing moved. True once the plan is complete; *moved: something
  // moved. For a driver that runs many ranks' plans in turn on one thread (sim/), which
  // decides itself when nothing can move any more; the host's waiter and clock are not used.
  static Result<bool> pass(Plan& plan, EngineHost& host, bool* moved = nullptr);
  // BRAID_TIMEOUT passed while the plan waits: names the call, the peer, channel and transport
  // this rank waits on and how far its part got, and asks the host who is silent
  // (EngineHost::explainTimeout). What run does when its deadline expires; the simulator calls it
  // when virtual time reaches the deadline. `moving`: data still moved in the limit's second half.
  static Status timedOut(Plan& plan, EngineHost& host, bool moving);

 private:
  // Notes on plan.live_ the peer the plan waits on now (it went idle after moving).
  static void noteWait(const Plan& plan, std::span<const Plan::Queue> queues);
  static const Plan::Queue* stuckQueue(std::span<const Plan::Queue> queues);
};

}  // namespace braid

// The point-to-point side of ProcessGroupBraid: send, recv, isend, irecv and batch_isend_irecv,
// with gloo's and MPI's matching (a receive takes the oldest message of its tag from its source,
// whatever order the sends were made in) over Braid, which matches a pair's messages in call order.
//
// Sends and receives are held back until one of their Works is waited on or polled, or another
// call is made on the group (flush). Then, per flush:
//  1. receives are met first from the messages that arrived earlier without a receive (held);
//  2. a manifest exchange on Braid's reserved tag kManifestTag: to every peer this flush sends to,
//     the (tag, element count, dtype) of each message, in order; from every peer a receive still
//     waits on, its manifest (synchronous: the next step needs the sizes);
//  3. one Braid batch (sendRecvBatch: no order of posting deadlocks) of every send and of every
//     message announced to this rank: a message whose tag a waiting receive asked for lands in that
//     receive's buffer, another in a new held tensor;
//  4. receives that still wait repeat 2-3 with their peers' next manifests, after the batch.
// A pair's stream is therefore manifest, its messages, manifest, its messages..., read in the order
// written. The last batch is not waited on here: the Works complete with it.
//
// A receive from any rank (recvAnysource, peer kAnySource) runs after the rest of its flush: a
// held message of its tag from any rank (the lowest such rank), else, once the calls queued before
// it have run, the first rank with bytes waiting here (Communicator::hasIncoming, polled in turn
// from this rank's right), whose manifest is read as above: a message of the tag meets the
// receive, others are held, and it polls again, within the group's timeout.
#pragma once
#include <ATen/ATen.h>

#include <climits>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "braid/braid.hpp"
#include "work.h"

namespace braid::torch_backend {

// The Braid tag of manifests; a user's send or receive with it is refused.
inline constexpr int kManifestTag = INT_MIN;
// The peer of a receive from any rank (not -1: a recv from rank -1 is refused as out of range).
inline constexpr int kAnySource = INT_MIN;

class P2pQueue {
 public:
  P2pQueue(braid::Communicator* comm, int rank, int size, double timeoutSec)
      : comm_(comm), rank_(rank), size_(size), timeoutSec_(timeoutSec) {}

  // Queues one send (isSend) or receive of `buf` (dense; a receive's Work copies it into the
  // user's tensor itself) with `peer` under `tag`; `work` completes when it is done.
  void push(bool isSend, at::Tensor buf, int peer, int tag, c10::intrusive_ptr<WorkBraid> work);
  // Hands Braid everything queued (above). Safe from any thread; one flush runs at a time.
  void flush();
  // Before the communicator goes: queued sends go out, queued receives fail (nobody waited on
  // them), and later flushes fail whatever is queued.
  void close();

 private:
  struct Entry {
    bool isSend;
    at::Tensor buf;
    int peer;
    int tag;
    c10::intrusive_ptr<WorkBraid> work;
  };
  struct Held {  // a message that arrived before a receive asked for it
    at::Tensor data;
    braid::Work filled;  // the batch that receives it
  };
  struct Announced {  // one entry of a peer's manifest
    int tag;
    int64_t count;
    at::ScalarType type;
  };
  // What a flush decided, done after it lets go of flushMu_ (completing a Work runs its future's
  // callbacks, which may call into this group).
  struct Outcome {
    std::vector<std::pair<c10::intrusive_ptr<WorkBraid>, braid::Work>> attach;
    std::vector<std::pair<c10::intrusive_ptr<WorkBraid>, braid::Status>> fail;
  };

  // flush and close: takes what is queued, runs it (closing: receives fail), then completes Works.
  void drain(bool closing);
  // oneRound: read the waiting receives' peers' manifests once (a receive from any rank polls again
  // rather than wait for that peer's next one).
  void run(std::vector<Entry>& batch, bool closing, Outcome& out, bool oneRound = false);
  // A receive from any rank (above).
  void runAnySource(const Entry& r, Outcome& out);
  // Step 1 for one receive: true when a held message met it (or failed it).
  bool fromHeld(const Entry& r, Outcome& out);
  // Step 2: sends our manifests (first round) and reads the peers' of `waiting` into `announced`.
  braid::Status exchangeManifests(const std::map<int, std::vector<const Entry*>>& sendsTo,
                                  const std::vector<const Entry*>& waiting,
                                  std::map<int, std::vector<Announced>>& announced);
  // Names the messages held from `peer`, for an error.
  std::string heldFrom(int peer) const;
  std::string mismatch(const Entry& r, int64_t count, at::ScalarType type) const;

  std::mutex mu_;  // entries_, comm_
  std::vector<Entry> entries_;
  braid::Communicator* comm_;
  const int rank_, size_;
  const double timeoutSec_;
  std::mutex flushMu_;                                   // one flush at a time: its Braid calls keep one order
  std::map<int, std::map<int, std::deque<Held>>> held_;  // peer -> tag -> in arrival order (under flushMu_)
};

}  // namespace braid::torch_backend

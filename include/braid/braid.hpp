// Braid's C++ API. Errors are values (Status / Result<T>); nothing throws.
//
//   auto comm = braid::Communicator::fromEnv();          // torchrun / braid run variables
//   if (!comm.ok()) { std::cerr << comm.status().toString() << "\n"; return 1; }
//   braid::Work w = comm->allReduce(in, out, n, braid::DataType::kFloat32, braid::ReduceOp::kSum);
//   ... overlap other work ...
//   braid::Status s = w.wait();
//
// Calls that return Work run in call order on the communicator's worker thread (or, when wait()
// is called on one that has not started, on the waiting thread, with those queued before it when
// the wait has no timeout: a blocking call costs no hand-off); the buffers must stay valid until
// wait() or test() says the work is done. A call nobody waits on starts within 50 us (2 ms on a
// host whose ranks outnumber its CPUs, or at the next call made meanwhile).
// CUDA (builds with -Dcuda): buffers may be device memory; the call is then ordered with `stream`
// (a cudaStream_t; nullptr is the legacy default stream): it starts after the work queued on the
// stream before it, and work queued after it sees its result. The Work finishes with the call. With
// host buffers a non-null stream is waited for first, then the call runs as without one.
// A Communicator is a shared handle: copies refer to the same group; the last copy ends it: the
// asynchronous calls still queued run first, then it closes (braidCommDestroy's check that every
// rank's calls matched, and its wait for the others, are not made).
#pragma once
#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "braid/braid.h"
#include "braid/status.hpp"
#include "braid/types.hpp"

namespace braid {

class Comm;
struct WorkState;

class BRAID_EXPORT Work {
 public:
  Work() = default;
  // Waits at most timeoutSec (negative: until done; every call is bounded by BRAID_TIMEOUT anyway).
  // Returns the call's status, or timeout if it is still running (the work goes on).
  Status wait(double timeoutSec = -1);
  bool test();              // done?
  Status status() const;    // the result once done; in progress before
  // Calls f with the result once the work is done: at once, on this thread, if it is already;
  // otherwise on the thread that finishes it (the communicator's worker, or a thread whose wait ran
  // the call). f may make calls on the same communicator, blocking ones too, and wait for them (a
  // DDP comm hook's chained all-reduce): the call it completes is over when f runs. Calls made from
  // f are ordered among the others by when they are made: keep that the same on every rank. f may
  // also drop the communicator's last handle (it then ends once f returns, on the worker, without
  // the farewell that destroy() makes). For futures (c10d's Work::getFuture) and completion queues.
  void onDone(std::function<void(const Status&)> f);

 private:
  friend class Communicator;
  explicit Work(std::shared_ptr<WorkState> s) : state_(std::move(s)) {}
  std::shared_ptr<WorkState> state_;
};

// Settings of one communicator that a program chooses in code rather than in the environment.
struct CommOptions {
  // Seconds any blocking step of this communicator may wait before it fails with a timeout (as
  // BRAID_TIMEOUT, which still wins when set: the operator's override). 0: BRAID_TIMEOUT or its default.
  double timeoutSec = 0;
};

struct StoreOptions {
  std::string host = "127.0.0.1";  // where the rendezvous store listens
  int port = 29500;
  bool isHost = false;             // this process runs the store (normally rank 0)
};

// braidMemAlloc / braidMemFree (see braid.h): memory that makes large all-reduces zero-copy.
BRAID_EXPORT Result<void*> memAlloc(std::size_t bytes);
BRAID_EXPORT Status memFree(void* ptr);

// One send or receive of a batch (Communicator::sendRecvBatch).
struct PeerOp {
  enum Kind { kSend, kRecv };
  Kind kind;
  void* buf;  // a send reads it, a receive writes it
  std::size_t count;
  DataType type;
  int peer;
  // Messages between two ranks match in order, as NCCL's do; a tag must equal the tag of the call
  // it matches, or both ranks fail naming both calls (a tag never reorders here; the torch
  // backend matches by tag on top, as gloo does: docs/PYTORCH.md).
  int tag = 0;
};

class BRAID_EXPORT Communicator {
 public:
  static Result<Communicator> fromEnv(const CommOptions& options = {});
  static Result<Communicator> fromUniqueId(const braidUniqueId& id, int nranks, int rank,
                                           const CommOptions& options = {});
  static Result<Communicator> fromStore(const StoreOptions& store, int nranks, int rank,
                                        const CommOptions& options = {});

  int rank() const;
  int size() const;
  // "shm", "tcp" or "self": how this rank reaches `peer`.
  std::string transportTo(int peer) const;
  // What this rank is doing now, as JSON: the call it is in and since when, the bytes it has moved,
  // the peer it last waited on, its calls by collective (the record it gives `braid status`).
  std::string statusRecord() const;
  // braidCommSplit (see braid.h): every rank calls it; nullopt for BRAID_SPLIT_NOCOLOR. `options`
  // adjust the new communicator's settings, which start as this one's.
  Result<std::optional<Communicator>> split(int color, int key, const CommOptions& options = {});

  Work allReduce(const void* send, void* recv, std::size_t count, DataType t, ReduceOp op, void* stream = nullptr);
  Work allGather(const void* send, void* recv, std::size_t sendCount, DataType t, void* stream = nullptr);
  Work reduceScatter(const void* send, void* recv, std::size_t recvCount, DataType t, ReduceOp op, void* stream = nullptr);
  Work broadcast(const void* send, void* recv, std::size_t count, DataType t, int root, void* stream = nullptr);
  Work reduce(const void* send, void* recv, std::size_t count, DataType t, ReduceOp op, int root, void* stream = nullptr);
  Work send(const void* buf, std::size_t count, DataType t, int peer, void* stream = nullptr);
  Work recv(void* buf, std::size_t count, DataType t, int peer, void* stream = nullptr);
  Work barrier();
  // Sends and receives that run together as one group (braidGroupStart/End), in one Work: they
  // finish whatever order each rank lists them in (every rank sending before it receives, say).
  // Each is matched with its peer's calls one for one, in order per pair, as it would be alone.
  // Host buffers.
  Work sendRecvBatch(const std::vector<PeerOp>& ops, void* stream = nullptr);
  // braidAllToAll and braidAllToAllv (see braid.h); the four vectors have size() entries each and
  // are copied, so they need not outlive the call.
  Work allToAll(const void* send, void* recv, std::size_t count, DataType t, void* stream = nullptr);
  Work allToAllv(const void* send, const std::vector<std::size_t>& sendCounts, const std::vector<std::size_t>& sendDispls,
                 void* recv, const std::vector<std::size_t>& recvCounts, const std::vector<std::size_t>& recvDispls,
                 DataType t, void* stream = nullptr);

  // Returns once every call queued on this communicator has run, with the calls their Work
  // callbacks queued meanwhile (what braidCommDestroy does first). The calling thread runs queued
  // calls itself while the worker is idle. Callbacks that need a lock the caller holds (Python's
  // GIL, say) must not be waited for with it held.
  void finishQueued();
  // Whether bytes from `peer` wait here that no call has taken yet: the start of a message it sent
  // this rank, which a receive posted now would take. False for a peer this rank is not connected
  // to yet (BRAID_CONNECT). Waits for a call running on another thread to end; for receive-from-any
  // (braid_torch's recv without src), after the calls queued before it have run (finishQueued).
  bool hasIncoming(int peer);
  // Ends the communicator at once (see braidCommAbort).
  void abort();
  // The error that ended the communicator, or ok.
  Status asyncError() const;

  // For the C API.
  std::shared_ptr<Comm> impl() const { return impl_; }
  explicit Communicator(std::shared_ptr<Comm> impl) : impl_(std::move(impl)) {}

 private:
  std::shared_ptr<Comm> impl_;
};

}  // namespace braid

// The CUDA proxy of one communicator: a thread that runs the calls with device buffers, in call
// order, ordered with the callers' streams: through CUDA IPC when every rank is on this host
// (comm/cuda/cuda_ipc.cc), else staged through pinned host memory and the host collectives.
//
// For each call, enqueue() (on the caller's thread) puts two things on the caller's stream and queues
// the call: a "ready" signal (the stream has finished everything before the call) and a hold (the
// stream waits until the proxy says "done"). The proxy waits for "ready", runs the call
// (Comm::runDevice: IPC, or runStaged's pipelined copies around the host collective) and says
// "done"; the stream resumes and later work sees the result. Two mechanisms (BRAID_CUDA_WAIT):
//   value   ready = an event recorded on the stream; hold = cuStreamWaitValue32 on a word of mapped
//           pinned memory that the proxy sets to the call's sequence number when it is done.
//   hostfn  one host function (cudaLaunchHostFunc): it signals ready, then blocks until done.
// Every wait is bounded (BRAID_TIMEOUT). Only built with CUDA.
#pragma once
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "braid/status.hpp"
#include "comm/algorithms/algorithms.h"

namespace braid {

class Comm;
struct WorkState;

// Staged calls move in pieces of at least this many bytes (of the larger buffer), so that copying
// one piece overlaps the collective on the one before. A first guess, to be measured on a GPU.
inline constexpr std::size_t kStagePieceBytes = 4 << 20;

class CudaProxy : public std::enable_shared_from_this<CudaProxy> {
 public:
  struct Op;
  struct Pinned;
  // A captured call: its graph node's argument. It outlives the proxy (a graph may be launched at
  // any time, even after the communicator is gone): kept until the process ends, about 100 bytes.
  struct Captured {
    std::weak_ptr<CudaProxy> proxy;
    CollArgs args;
  };

  // Starts the proxy thread for `device` (its copies run on a non-blocking stream of that device).
  static Result<std::shared_ptr<CudaProxy>> start(Comm& comm, int device);
  ~CudaProxy();

  int device() const { return device_; }
  // Queues `a` (device buffers, already validated) behind the work on `stream`. Returns at once; an
  // error here means nothing was queued. `work`, if given, finishes with the call's status.
  Status enqueue(const CollArgs& a, void* stream, std::shared_ptr<WorkState> work);
  // `stream` is being captured into a CUDA graph: puts one host-function node there that, each time
  // the graph reaches it, queues `a` as a new call and holds the stream until the proxy has run it
  // (replay()). Nothing runs now, except that pinned memory for a staged replay is allocated (the
  // capture must be in relaxed mode). A replay's failure fails the communicator, so the next call
  // reports it. From the first capture on, every call of this proxy is queued when its stream
  // reaches it (so a call after a graph launch on the same stream waits behind the graph's calls),
  // and the proxy no longer frees memory when idle (a graph's call may arrive at any time).
  Status enqueueCaptured(const CollArgs& a, void* stream);
  // From a node on CUDA's callback thread: queues `op` (ready: the stream has reached it) and
  // waits until it is done, bounded like every hold; an op of a stopped proxy is aborted. Touches
  // host state only: a host function must not call CUDA.
  void queueAndWait(const std::shared_ptr<Op>& op);
  // A captured call's node: the call prepared and queued as a new call (queueAndWait).
  void replay(const CollArgs& a);
  // Waits until every queued call (and every call whose stream has yet to reach it) has finished,
  // at most `seconds`.
  Status drain(double seconds);
  // Ends the thread. abortive: queued calls fail at once (their streams are released); otherwise
  // they finish first (bounded by BRAID_TIMEOUT each).
  void stop(bool abortive);

 private:
  CudaProxy(Comm& comm, int device) : comm_(comm), device_(device) {}
  // The op for `a`: its pinned layout, and how many pieces a staged run takes. Host state only.
  std::shared_ptr<Op> prepare(const CollArgs& a) const;
  void loop();
  void process(Op& op);
  void releaseCuda();
  // The staged path (see cuda_proxy.cc): pinned memory placed, then copies in, runHost per piece,
  // copies out, pipelined.
  Status placeStaging(Op& op);
  // Grows the pinned buffer to at least `bytes` (the outgrown one is retired). Allocates without
  // mu_ held (an allocation may synchronize the device, and once graphs exist a stream may be
  // waiting in one of this proxy's nodes for mu_), then swaps the buffer in under it.
  Status growPinned(std::size_t bytes);
  Status runStaged(Op& op, const std::function<Status(const CollArgs&)>& runHost);
  Status waitReady(Op& op);
  // Holds `stream` until op is done; false (nothing queued) if the mechanism is not available.
  Status holdWithValue(Op& op, void* stream, bool* held);
  Status holdWithHostFn(const std::shared_ptr<Op>& op, void* stream);
  // Queues `op` when `stream` reaches it (a host-function node that calls queueAndWait). Called
  // with mu_ held through `lock`, which it releases before the CUDA call.
  Status queueWhenReached(const std::shared_ptr<Op>& op, void* stream, std::unique_lock<std::mutex>& lock);

  Comm& comm_;
  const int device_;
  void* stream_ = nullptr;  // cudaStream_t, non-blocking: never waits on the callers' streams
  void* outStream_ = nullptr;  // the staged path's copies back to the device (stream_ copies in)
  void* events_[4] = {};       // cudaEvent_t: the staged path's two "in" and two "out" events
  std::size_t maxPitch_ = std::size_t{1} << 30;  // the largest pitch of a 2-D copy (cudaDevAttrMaxPitch)
  // The value mechanism: cuStreamWaitValue32 from the driver (null: not available or not wanted),
  // the word the callers' streams wait on (mapped pinned memory, never freed: a stream may still
  // read it after the communicator is gone), and the sequence number of the last call queued.
  void* waitValue_ = nullptr;
  unsigned* doneWord_ = nullptr;
  unsigned long long doneWordDev_ = 0;
  unsigned seq_ = 0;
  // Ready events whose record completed, for the next calls' holds (under mu_): a call makes and
  // destroys none, and the proxy's part of a call has no event call after the stream reached it.
  std::vector<void*> spareEvents_;

  std::mutex mu_;
  std::mutex growMu_;  // one growPinned at a time (taken before mu_, never under it)
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Op>> queue_;
  bool busy_ = false;
  bool stopping_ = false;
  bool abortive_ = false;
  std::thread thread_;
  // Staging memory: the proxy runs one call at a time, so one buffer serves them all, grown by
  // enqueue() before the call's stream is held (except for calls that go through CUDA IPC; a staged
  // fallback of those grows it in placeStaging). Buffers outgrown are kept until the proxy is idle:
  // freeing pinned memory may synchronize the device, which must never happen while a stream is held.
  std::shared_ptr<Pinned> pinned_;
  std::vector<std::shared_ptr<Pinned>> retired_;
  bool shareStaging_ = true;  // false once cudaHostRegister refused braidMemAlloc memory (see Pinned)
  // Under mu_: calls captured into graphs so far (from the first, calls are queued when their stream
  // reaches them), and calls made that their streams have not reached yet (drain waits for them).
  int capturedCalls_ = 0;
  int deferred_ = 0;
};

}  // namespace braid

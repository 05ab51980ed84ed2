// The CUDA proxy of one communicator: a thread that moves calls with device buffers through pinned
// host memory and the host collectives, in call order, ordered with the callers' streams.
//
// For each call: enqueue() (on the caller's thread) launches a host function on the caller's stream
// and queues the call. When the stream reaches it, every earlier kernel and copy on the stream is
// done: the host function tells the proxy "ready" and then blocks the stream until the proxy says
// "done". The proxy copies device -> pinned, runs the host collective (Comm::runBlocking), copies
// pinned -> device and says "done"; the stream resumes and later work sees the result.
// Every wait is bounded (BRAID_TIMEOUT). Only built with CUDA.
#pragma once
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "braid/status.hpp"
#include "comm/algorithms/algorithms.h"

namespace braid {

class Comm;
struct WorkState;

class CudaProxy {
 public:
  struct Op;
  struct Pinned;

  // Starts the proxy thread for `device` (its copies run on a non-blocking stream of that device).
  static Result<std::shared_ptr<CudaProxy>> start(Comm& comm, int device);
  ~CudaProxy();

  int device() const { return device_; }
  // Queues `a` (device buffers, already validated) behind the work on `stream`. Returns at once; an
  // error here means nothing was queued. `work`, if given, finishes with the call's status.
  Status enqueue(const CollArgs& a, void* stream, std::shared_ptr<WorkState> work);
  // Waits until every queued call has finished, at most `seconds`.
  Status drain(double seconds);
  // Ends the thread. abortive: queued calls fail at once (their streams are released); otherwise
  // they finish first (bounded by BRAID_TIMEOUT each).
  void stop(bool abortive);

 private:
  CudaProxy(Comm& comm, int device) : comm_(comm), device_(device) {}
  void loop();
  void process(Op& op);
  Status stage(Op& op, bool in);

  Comm& comm_;
  const int device_;
  void* stream_ = nullptr;  // cudaStream_t, non-blocking: never waits on the callers' streams

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Op>> queue_;
  bool busy_ = false;
  bool stopping_ = false;
  bool abortive_ = false;
  std::thread thread_;
  // Staging memory: the proxy runs one call at a time, so one buffer (grown by enqueue(), on the
  // caller's thread) serves them all. Buffers outgrown are kept until the proxy is idle: freeing
  // pinned memory may synchronize the device, which must never happen while a stream is held.
  std::shared_ptr<Pinned> pinned_;
  std::vector<std::shared_ptr<Pinned>> retired_;
};

}  // namespace braid

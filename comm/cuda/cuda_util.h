// Small helpers that every CUDA file of comm/ shares (CUDA builds only).
#pragma once
#include <cuda_runtime.h>

#include <string>

#include "braid/status.hpp"

namespace braid::cuda {

// "CALL failed: cudaErrorX: text", the words every CUDA error of Braid's uses.
std::string failedText(const char* call, cudaError_t e);
// braidCudaError with failedText.
Status failed(const char* call, cudaError_t e);

// A poll's result (cudaEventQuery, cudaStreamQuery), passed through. "Not ready" is not an error,
// but the runtime keeps it as the thread's last error, where a later check of a launch with
// cudaGetLastError (ours or the program's) would read it as one: that is cleared here.
cudaError_t polled(cudaError_t e);

// The pause between two polls of GPU work: yield for the first 200 us (the work is usually a short
// copy or kernel, and the 8-byte all-reduce's latency is a sum of such waits), then sleep in 20 us
// steps, and in 500 us steps once 10 ms have passed. Measured from construction, not counted in
// polls: a yield's cost varies by orders of magnitude with the machine's load.
class PollPause {
 public:
  PollPause();
  void operator()();

 private:
  long long start_ns_;
};

// Waits until everything queued on `stream` has finished, polling (PollPause between polls), at most
// `seconds`: a wedged device must not hang a Braid thread. `what` names the work in the errors.
Status waitForStream(cudaStream_t stream, double seconds, const char* what);
// The same for one event.
Status waitForEvent(cudaEvent_t event, double seconds, const char* what);

// Makes `device` the calling thread's current device for the scope, and the previous one again at
// its end (a negative device: no change). error() says if that failed (and failedCall() which call),
// in which case nothing changed.
class DeviceScope {
 public:
  explicit DeviceScope(int device);
  ~DeviceScope();
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;
  cudaError_t error() const { return error_; }
  const char* failedCall() const { return failedCall_; }

 private:
  int previous_ = -1;
  bool switched_ = false;
  cudaError_t error_ = cudaSuccess;
  const char* failedCall_ = "";
};

}  // namespace braid::cuda

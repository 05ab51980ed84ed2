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

// Waits until everything queued on `stream` has finished, polling (spin, then 20 us steps), at most
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
